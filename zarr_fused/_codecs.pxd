# cython: language_level=3
# Shared declarations of the codec-chain kernels (the sharded read engine
# drives the same tasks over the inner chunks of a shard).

from libc.stdint cimport uint8_t

cimport numpy as cnp

from zarr_fused cimport _zlib as zl
from zarr_fused cimport _zstd as zs
from zarr_fused._scatter cimport ZF_MAX_DIMS

cdef enum CompressorKind:
    COMP_NONE = 0
    COMP_ZSTD = 1
    COMP_GZIP = 2
    COMP_BLOSC = 3
    COMP_ZLIB = 4

cdef enum StatusCode:
    ZF_OK = 0
    ZF_ERR_CRC_SHORT = 1
    ZF_ERR_CRC = 2
    ZF_ERR_SIZE = 3
    ZF_ERR_ZSTD = 4
    ZF_ERR_CLAIM = 5
    ZF_ERR_GZIP = 6
    ZF_ERR_BLOSC = 7
    ZF_ERR_NOMEM = 8
    ZF_ERR_TOO_LARGE = 9
    ZF_ERR_ENCODE = 10
    ZF_ERR_IO = 11
    ZF_ERR_MORE = 12

cdef struct Status:
    int code
    Py_ssize_t a
    Py_ssize_t b
    const char* msg

cdef struct DecodeTask:
    const char* path
    const uint8_t* src
    Py_ssize_t src_len
    Py_ssize_t nbytes
    char* dst
    Py_ssize_t src_offset
    Py_ssize_t* shape
    Py_ssize_t* src_strides
    Py_ssize_t* dst_strides
    int ndim
    bint direct
    bint missing
    bint was_missing
    Py_ssize_t chunk
    Status status

cdef struct EncodeTask:
    const char* path
    const char* src
    Py_ssize_t* shape
    Py_ssize_t* src_strides
    int ndim
    Py_ssize_t nbytes
    Py_ssize_t swap_unit
    bint contiguous
    bint check_fill
    bint was_fill
    uint8_t* dst
    Py_ssize_t dst_cap
    Py_ssize_t out_len
    Status status

cdef class Workspace:
    cdef zs.ZSTD_DCtx* dctx
    cdef zs.ZSTD_CCtx* cctx
    cdef zl.z_stream inflater
    cdef bint inflater_ready
    cdef zl.z_stream deflater
    cdef int deflater_level
    cdef int deflater_wbits
    cdef bint deflater_ready
    cdef uint8_t* scratch
    cdef size_t scratch_cap
    cdef unsigned char* io_buf
    cdef size_t io_cap
    cdef uint8_t* reserve(self, size_t n) noexcept nogil
    cdef uint8_t* reserve_io(self, size_t n) noexcept nogil

cpdef Workspace workspace()

cdef class ChainKernel:
    cdef readonly int compressor
    cdef readonly int level
    cdef readonly bint checksum
    cdef readonly str cname
    cdef char cname_c[32]
    cdef readonly int clevel
    cdef readonly int shuffle
    cdef readonly int typesize
    cdef readonly Py_ssize_t blocksize
    cdef readonly int outer_crcs
    cdef readonly int inner_crcs
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t swap_unit
    cdef int decode_payload(self, Workspace ws, const uint8_t* src, Py_ssize_t n,
                            Py_ssize_t nbytes, uint8_t* direct_dst,
                            const uint8_t** out, Status* st) noexcept nogil
    cdef void run_decode(self, Workspace ws, DecodeTask* task, const char* fill) noexcept nogil
    cdef void run_encode(self, Workspace ws, EncodeTask* task, const char* fill) noexcept nogil
    cdef int _reserve_output(self, Workspace ws, EncodeTask* task) noexcept nogil
    cdef void finish_encode(self, Workspace ws, EncodeTask* task, uint8_t* data) noexcept nogil
    cdef Py_ssize_t encode_bound(self, Py_ssize_t nbytes) noexcept nogil


cdef class ChunkLayout:
    cdef readonly int ndim
    cdef readonly Py_ssize_t nbytes
    cdef readonly bint transposed
    cdef Py_ssize_t shape[ZF_MAX_DIMS]
    cdef Py_ssize_t strides[ZF_MAX_DIMS]
    cdef Py_ssize_t stored_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t perm[ZF_MAX_DIMS]

cdef class DecodeBatch:
    cdef ChainKernel kernel
    cdef DecodeTask* tasks
    cdef Py_ssize_t* dims
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef int max_ndim
    cdef list refs
    cdef list keys
    cdef bytes fill
    cdef object describe
    cdef DecodeTask* _next(self) except NULL
    cdef bint is_direct(self, DecodeTask* t, ChunkLayout layout) noexcept
    cdef int _target(self, DecodeTask* t, cnp.ndarray out, object out_selection,
                     Py_ssize_t* shape) except -2
    cdef object _add(self, payload, bytes path, ChunkLayout layout, chunk_selection,
                     cnp.ndarray out, out_selection, tuple drop_axes, key)
    cdef const char* fill_ptr(self)
    cdef Py_ssize_t run_range(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                              const char* fill) noexcept nogil
    cdef object raise_failed(self, Py_ssize_t failed)

cdef class EncodeBatch:
    cdef ChainKernel kernel
    cdef EncodeTask* tasks
    cdef Py_ssize_t* dims
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef int max_ndim
    cdef list refs
    cdef list outputs
    cdef list keys
    cdef object describe
    cdef bytes fill
    cdef object arena
    cdef Py_ssize_t arena_used

cdef Py_ssize_t contiguous_run(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                               Py_ssize_t itemsize) noexcept nogil

cdef tuple as_selection_tuple(selection)

cdef int select_basic(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                      object selection, Py_ssize_t* offset, Py_ssize_t* out_shape,
                      Py_ssize_t* out_strides) except -2

cdef object status_error(Status* st, object where)
