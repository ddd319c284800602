# cython: language_level=3
# Little-endian 32-bit integers in byte streams, whatever the host's byte
# order and the pointer's alignment: numcodecs' LZ4 size header and the
# vlen frames' counts and lengths (_codecs, _vlen).
from libc.stdint cimport uint8_t, uint32_t


cdef inline uint32_t load_le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline void store_le32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xff
    p[1] = (v >> 8) & 0xff
    p[2] = (v >> 16) & 0xff
    p[3] = (v >> 24) & 0xff
