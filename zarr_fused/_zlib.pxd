# cython: language_level=3
# zlib (zlib.h): the declarations zarr_fused uses.

cdef extern from "zlib.h" nogil:
    ctypedef struct z_stream:
        unsigned char* next_in
        unsigned int avail_in
        unsigned long total_in
        unsigned char* next_out
        unsigned int avail_out
        unsigned long total_out
        const char* msg
        void* zalloc
        void* zfree
        void* opaque
    ctypedef struct gz_header:
        int text
        unsigned long time
        int xflags
        int os
        unsigned char* extra
        unsigned int extra_len
        unsigned int extra_max
        unsigned char* name
        unsigned int name_max
        unsigned char* comment
        unsigned int comm_max
        int hcrc
        int done
    int Z_OK
    int Z_STREAM_END
    int Z_NEED_DICT
    int Z_BUF_ERROR
    int Z_DATA_ERROR
    int Z_MEM_ERROR
    int Z_STREAM_ERROR
    int Z_NO_FLUSH
    int Z_FINISH
    int Z_DEFLATED
    int Z_DEFAULT_STRATEGY
    int MAX_WBITS
    const char* zlibVersion()
    int inflateInit2(z_stream* strm, int windowBits)
    int inflate(z_stream* strm, int flush)
    int inflateReset(z_stream* strm)
    int inflateReset2(z_stream* strm, int windowBits)
    int inflateEnd(z_stream* strm)
    int deflateInit2(z_stream* strm, int level, int method, int windowBits, int memLevel,
                     int strategy)
    int deflate(z_stream* strm, int flush)
    int deflateReset(z_stream* strm)
    int deflateEnd(z_stream* strm)
    int deflateSetHeader(z_stream* strm, gz_header* head)
    unsigned long compressBound(unsigned long sourceLen)
