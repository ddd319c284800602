# cython: language_level=3
# liblz4 (lz4.h): the block API numcodecs' LZ4 codec calls.

cdef extern from "lz4.h" nogil:
    int LZ4_MAX_INPUT_SIZE
    int LZ4_versionNumber()
    const char* LZ4_versionString()
    int LZ4_compressBound(int inputSize)
    int LZ4_compress_fast(const char* src, char* dst, int srcSize, int dstCapacity,
                          int acceleration)
    int LZ4_decompress_safe(const char* src, char* dst, int compressedSize, int dstCapacity)
