# cython: language_level=3
# The filter kernels (_filters.pyx) as the batch modules see them: a chain
# of array->array steps run on one chunk's items with the GIL released,
# so the shard engine filters inner chunks inside its nogil sections.

from libc.stdint cimport int64_t, uint64_t

from zarr_fused._cast_value cimport CastPlan

# What a kernel that can refuse its input returns.
cpdef enum FilterStatus:
    FILTER_OK = 0
    FILTER_OUT_OF_RANGE = 1

cdef enum FilterKind:
    FK_DELTA = 1
    FK_FIXEDSCALEOFFSET = 2
    FK_QUANTIZE = 3
    FK_BITROUND = 4
    FK_SCALE_OFFSET = 5
    FK_ASTYPE = 6
    FK_CAST_VALUE = 7

# At most this many filters in one chain (more go through the hybrid chain).
cdef enum:
    FILTER_MAX_STEPS = 8

# The item types the kernels take, as a step names them.
cdef enum ItemType:
    IT_I8 = 0
    IT_I16 = 1
    IT_I32 = 2
    IT_I64 = 3
    IT_U8 = 4
    IT_U16 = 5
    IT_U32 = 6
    IT_U64 = 7
    IT_F32 = 8
    IT_F64 = 9

# One filter: ``code`` is the ItemType of the items before it, as the
# kernel computes them (delta's integers and bitround's floats as the
# unsigned type of their size), ``encoded_code`` the one after it.
cdef struct FilterStep:
    int kind
    int code
    int encoded_code
    Py_ssize_t itemsize  # of the items before the step
    Py_ssize_t encoded_itemsize  # of the items after it
    double offset
    double scale
    int64_t ioffset  # scale_offset on integers (uint64: the bits)
    int64_t iscale
    int maskbits
    CastPlan cast_encode  # cast_value: its two directions (see _cast_value.pxd)
    CastPlan cast_decode

# Where a chunk decoded in rows stands between two rows (`FilterChain.decode_rows`):
# delta's running sum, the bytes of one item.
cdef struct FilterCarry:
    bint started
    uint64_t acc

cdef class FilterChain:
    cdef FilterStep steps[FILTER_MAX_STEPS]
    cdef readonly int n
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t encoded_itemsize
    cdef readonly Py_ssize_t max_itemsize
    cdef readonly bint may_refuse  # a step's decoding may refuse a stored value
    # the one step whose decoding changes the items, item by item, or -1
    cdef readonly int elementwise_step
    # the step `decode_rows` runs (the steps after it decode in `decode_head`), or -1
    cdef readonly int row_step
    cdef readonly bint rows_in_order  # `decode_rows` needs a whole chunk's rows in order
    cdef const void* decode(self, const void* src, void* a, void* b,
                            Py_ssize_t count) noexcept nogil
    cdef int decode_checked(self, const void* src, void* a, void* b, Py_ssize_t count,
                            const void** out) noexcept nogil
    cdef int encode(self, void* a, void* b, Py_ssize_t count,
                    const void** out) noexcept nogil
    cdef int decode_head(self, const void* src, void* a, void* b, Py_ssize_t count,
                         const void** out) noexcept nogil
    cdef int decode_rows(self, const char* src, Py_ssize_t src_step, char* dst,
                         Py_ssize_t dst_step, Py_ssize_t rows, Py_ssize_t n,
                         FilterCarry* carry) noexcept nogil
    cdef int _decode_down_to(self, int last, const void* src, void* a, void* b,
                             Py_ssize_t count, const void** out) noexcept nogil
