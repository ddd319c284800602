# cython: language_level=3
# libzstd (zstd.h): the declarations zarr_fused uses.

cdef extern from "zstd.h" nogil:
    ctypedef struct ZSTD_CCtx:
        pass
    ctypedef struct ZSTD_DCtx:
        pass
    ctypedef enum ZSTD_cParameter:
        ZSTD_c_compressionLevel
        ZSTD_c_checksumFlag
    ctypedef enum ZSTD_ResetDirective:
        ZSTD_reset_session_only
        ZSTD_reset_parameters
        ZSTD_reset_session_and_parameters
    unsigned int ZSTD_MAGICNUMBER
    unsigned long long ZSTD_CONTENTSIZE_UNKNOWN
    unsigned long long ZSTD_CONTENTSIZE_ERROR
    unsigned ZSTD_versionNumber()
    const char* ZSTD_versionString()
    size_t ZSTD_compressBound(size_t srcSize)
    unsigned ZSTD_isError(size_t code)
    const char* ZSTD_getErrorName(size_t code)
    int ZSTD_minCLevel()
    int ZSTD_maxCLevel()
    ZSTD_CCtx* ZSTD_createCCtx()
    size_t ZSTD_freeCCtx(ZSTD_CCtx* cctx)
    ZSTD_DCtx* ZSTD_createDCtx()
    size_t ZSTD_freeDCtx(ZSTD_DCtx* dctx)
    size_t ZSTD_CCtx_setParameter(ZSTD_CCtx* cctx, ZSTD_cParameter param, int value)
    size_t ZSTD_CCtx_reset(ZSTD_CCtx* cctx, ZSTD_ResetDirective reset)
    size_t ZSTD_compress2(ZSTD_CCtx* cctx, void* dst, size_t dstCapacity,
                          const void* src, size_t srcSize)
    size_t ZSTD_decompressDCtx(ZSTD_DCtx* dctx, void* dst, size_t dstCapacity,
                               const void* src, size_t srcSize)
    unsigned long long ZSTD_getFrameContentSize(const void* src, size_t srcSize)
    size_t ZSTD_findFrameCompressedSize(const void* src, size_t srcSize)

cdef extern from "zstd_errors.h" nogil:
    ctypedef enum ZSTD_ErrorCode:
        ZSTD_error_dstSize_tooSmall
    ZSTD_ErrorCode ZSTD_getErrorCode(size_t functionResult)
