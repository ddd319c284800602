# cython: language_level=3
# The filter kernels (_filters.pyx) as the batch modules see them: a chain
# of array->array steps run on one chunk's items with the GIL released,
# so the shard engine filters inner chunks inside its nogil sections.

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

# One filter: ``code`` is the kernel's data type number of the items before
# it (delta: 1, 2, 4, 8 integers, -4, -8 floats; the float kernels: the
# float's item size), ``encoded_code`` the integer type fixedscaleoffset
# encodes to (astype: the float's item size it casts to).
cdef struct FilterStep:
    int kind
    int code
    int encoded_code
    Py_ssize_t itemsize  # of the items before the step
    Py_ssize_t encoded_itemsize  # of the items after it
    double offset
    double scale
    double lo  # fixedscaleoffset: the encoded type's range [lo, hi)
    double hi
    int maskbits
    CastPlan cast_encode  # cast_value: its two directions (see _cast_value.pxd)
    CastPlan cast_decode

cdef class FilterChain:
    cdef FilterStep steps[FILTER_MAX_STEPS]
    cdef readonly int n
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t encoded_itemsize
    cdef readonly Py_ssize_t max_itemsize
    cdef const void* decode(self, const void* src, void* a, void* b,
                            Py_ssize_t count) noexcept nogil
    cdef int encode(self, void* a, void* b, Py_ssize_t count,
                    const void** out) noexcept nogil
