# cython: language_level=3
# libdeflate (libdeflate.h): the whole-buffer zlib and gzip decompressors
# zarr_fused reads with (encoding stays zlib's, for zarr's stored bytes).

from libc.stddef cimport size_t

cdef extern from "libdeflate.h" nogil:
    const char* LIBDEFLATE_VERSION_STRING
    struct libdeflate_decompressor:
        pass
    enum libdeflate_result:
        LIBDEFLATE_SUCCESS
        LIBDEFLATE_BAD_DATA
        LIBDEFLATE_SHORT_OUTPUT
        LIBDEFLATE_INSUFFICIENT_SPACE
    libdeflate_decompressor* libdeflate_alloc_decompressor()
    void libdeflate_free_decompressor(libdeflate_decompressor* d)
    libdeflate_result libdeflate_zlib_decompress_ex(
        libdeflate_decompressor* d, const void* src, size_t in_nbytes, void* out,
        size_t out_nbytes_avail, size_t* actual_in_nbytes_ret, size_t* actual_out_nbytes_ret)
    libdeflate_result libdeflate_gzip_decompress_ex(
        libdeflate_decompressor* d, const void* src, size_t in_nbytes, void* out,
        size_t out_nbytes_avail, size_t* actual_in_nbytes_ret, size_t* actual_out_nbytes_ret)
