# cython: language_level=3
# CRC-32C (_crc32c.h, compiled into each module that cimports this): the
# declarations zarr_fused uses. The header keeps its tables and the chosen
# implementation in static storage, so every module calls zf_crc32c_init()
# once at import before its first checksum.

from libc.stdint cimport uint8_t, uint32_t

cdef extern from "_crc32c.h" nogil:
    void zf_crc32c_init()
    uint32_t zf_crc32c(const uint8_t* p, size_t n)
    uint32_t zf_crc32c_with(int force, const uint8_t* p, size_t n)
    const char* zf_crc32c_name()
