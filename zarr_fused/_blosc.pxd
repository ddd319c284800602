# cython: language_level=3
# c-blosc 1.x (blosc.h): the declarations zarr_fused uses.

cdef extern from "blosc.h" nogil:
    int BLOSC_MAX_OVERHEAD
    const char* BLOSC_VERSION_STRING
    int blosc_compress_ctx(int clevel, int doshuffle, size_t typesize, size_t nbytes,
                           const void* src, void* dest, size_t destsize,
                           const char* compressor, size_t blocksize, int numinternalthreads)
    int blosc_decompress_ctx(const void* src, void* dest, size_t destsize, int numinternalthreads)
    const char* blosc_list_compressors()
    const char* blosc_get_version_string()
    int blosc_get_complib_info(const char* compname, char** complib, char** version)
