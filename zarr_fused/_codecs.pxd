# cython: language_level=3
# The codec-chain kernel (_codecs.pyx) as the batch and shard modules see it:
# the status a failed task leaves, the decode and encode tasks, the per-thread
# workspace and the chain kernel that runs one task.

from libc.stdint cimport uint8_t

from zarr_fused cimport _deflate as ld
from zarr_fused cimport _zlib as zl
from zarr_fused._phase_times cimport PhaseTimes
from zarr_fused cimport _zstd as zs

cdef enum CompressorKind:
    COMP_NONE = 0
    COMP_ZSTD = 1
    COMP_GZIP = 2
    COMP_BLOSC = 3
    COMP_ZLIB = 4
    COMP_LZ4 = 5

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
    ZF_ERR_LZ4 = 13
    ZF_ERR_SHUFFLE = 14

# How a task failed: a StatusCode, two numbers and a static message that
# status_error() turns into the exception (their meaning depends on the code).
cdef struct Status:
    int code
    Py_ssize_t a
    Py_ssize_t b
    const char* msg

# One chunk to decode into (a region of) the output.
cdef struct DecodeTask:
    const char* path  # read the payload from this file (NULL: ``src``)
    const uint8_t* src  # the payload, ``src_len`` bytes
    Py_ssize_t src_len
    Py_ssize_t nbytes  # the decoded chunk's size
    char* dst  # the first output element of the region
    Py_ssize_t src_offset  # the first selected element in the decoded chunk
    Py_ssize_t* shape  # ndim entries each: the region, in the batch's dims
    Py_ssize_t* src_strides
    Py_ssize_t* dst_strides
    int ndim
    bint direct  # the decompressor may write into ``dst`` itself
    bint missing  # fill the region instead
    bint was_missing  # out: the file was missing, the region filled
    Py_ssize_t chunk  # the inner chunk (shards): linear index in the shard
    Status status

# One chunk to encode from the value written.
cdef struct EncodeTask:
    const char* path  # also write the result to this file (atomically)
    const char* src  # the chunk's first element, in stored (transposed) order
    Py_ssize_t* shape
    Py_ssize_t* src_strides
    int ndim
    Py_ssize_t nbytes
    Py_ssize_t swap_unit  # reverse bytes in units of this size (0: none)
    bint contiguous  # ``src`` is the stored bytes as they are
    bint check_fill  # skip the chunk when it is all fill value
    bint was_fill  # out: it was, nothing encoded
    uint8_t* dst  # ``dst_cap`` bytes for the result (NULL: the thread's IO buffer)
    Py_ssize_t dst_cap
    Py_ssize_t out_len  # out: the encoded length
    Status status

cdef class Workspace:
    cdef zs.ZSTD_DCtx* dctx
    cdef zs.ZSTD_CCtx* cctx
    cdef zl.z_stream inflater
    cdef bint inflater_ready
    cdef ld.libdeflate_decompressor* fast_inflater
    cdef zl.z_stream deflater
    cdef int deflater_level
    cdef int deflater_wbits
    cdef bint deflater_ready
    cdef uint8_t* scratch
    cdef size_t scratch_cap
    cdef uint8_t* shuffled
    cdef size_t shuffled_cap
    cdef uint8_t* io_buf
    cdef size_t io_cap
    cdef uint8_t* reserve(self, size_t n) noexcept nogil
    cdef uint8_t* reserve_io(self, size_t n) noexcept nogil
    cdef uint8_t* reserve_shuffled(self, size_t n) noexcept nogil

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
    cdef readonly int acceleration
    cdef readonly Py_ssize_t byte_shuffle
    cdef readonly int outer_crcs
    cdef readonly int inner_crcs
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t swap_unit
    cdef int decode_payload(self, Workspace ws, const uint8_t* src, Py_ssize_t n,
                            Py_ssize_t nbytes, uint8_t* direct_dst,
                            const uint8_t** out, Status* st) noexcept nogil
    cdef void run_decode(self, Workspace ws, DecodeTask* task, const char* fill,
                         PhaseTimes* acc) noexcept nogil
    cdef void run_encode(self, Workspace ws, EncodeTask* task, const char* fill) noexcept nogil
    cdef int reserve_output(self, Workspace ws, EncodeTask* task) noexcept nogil
    cdef void finish_encode(self, Workspace ws, EncodeTask* task, uint8_t* data) noexcept nogil
    cdef Py_ssize_t encode_bound(self, Py_ssize_t nbytes) noexcept nogil


cdef object status_error(Status* st, object where)

cdef const uint8_t[::1] as_bytes_view(obj)


cdef inline void c_strides(int ndim, const Py_ssize_t* shape, Py_ssize_t itemsize,
                           Py_ssize_t* out) noexcept nogil:
    """The byte strides of a C-contiguous block of ``shape``."""
    cdef int i
    cdef Py_ssize_t s = itemsize
    for i in range(ndim - 1, -1, -1):
        out[i] = s
        s *= shape[i]
