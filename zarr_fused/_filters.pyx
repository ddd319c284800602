# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native array->array filters, run with the GIL released.

Each kernel gives the very bytes numcodecs gives for the same filter, so
a chain with a native filter stores what zarr stores:

``delta``
    numcodecs' ``Delta`` with ``astype`` equal to ``dtype``: the first
    element as it is, then each element minus the one before it; decoding
    is the running sum (``np.cumsum``), started from the first element so
    a leading ``-0.0`` survives. Integers wrap around, as NumPy's do: they
    are computed as unsigned integers of the same size, whose arithmetic
    is the two's complement one without undefined overflow. Floats are
    summed in their own precision, in order, as NumPy's accumulate does.

The ``def`` wrappers check the arrays (contiguous, same size, a supported
data type) before a kernel runs; the kernels cannot fail.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cimport numpy as cnp

cnp.import_array()


ctypedef fused delta_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double


cdef void _delta_encode(const delta_t* src, delta_t* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    dst[0] = src[0]
    for i in range(1, n):
        dst[i] = src[i] - src[i - 1]


cdef void _delta_decode(const delta_t* src, delta_t* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef delta_t acc = src[0]
    dst[0] = acc
    for i in range(1, n):
        acc = acc + src[i]
        dst[i] = acc


cdef int _delta_kind(cnp.ndarray src, cnp.ndarray out) except -1:
    """The kernel for these arrays: 1, 2, 4, 8 (integers of that size),
    -4 (float32), -8 (float64)."""
    cdef str kind = src.dtype.kind
    if src.dtype != out.dtype or not src.dtype.isnative:
        raise TypeError("delta: input and output must share one native-order data type")
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("delta: arrays must be C-contiguous, the output writeable")
    if src.size != out.size or src.size == 0:
        raise ValueError("delta: input and output must have the same, non-zero size")
    if kind in "iu" and src.dtype.itemsize in (1, 2, 4, 8):
        return src.dtype.itemsize
    if kind == "f" and src.dtype.itemsize in (4, 8):
        return -src.dtype.itemsize
    raise TypeError(f"delta: no kernel for {src.dtype}")


cdef void _delta_run(int kind, bint encode, const void* src, void* dst,
                     Py_ssize_t n) noexcept nogil:
    if kind == 1:
        if encode:
            _delta_encode(<const uint8_t*>src, <uint8_t*>dst, n)
        else:
            _delta_decode(<const uint8_t*>src, <uint8_t*>dst, n)
    elif kind == 2:
        if encode:
            _delta_encode(<const uint16_t*>src, <uint16_t*>dst, n)
        else:
            _delta_decode(<const uint16_t*>src, <uint16_t*>dst, n)
    elif kind == 4:
        if encode:
            _delta_encode(<const uint32_t*>src, <uint32_t*>dst, n)
        else:
            _delta_decode(<const uint32_t*>src, <uint32_t*>dst, n)
    elif kind == 8:
        if encode:
            _delta_encode(<const uint64_t*>src, <uint64_t*>dst, n)
        else:
            _delta_decode(<const uint64_t*>src, <uint64_t*>dst, n)
    elif kind == -4:
        if encode:
            _delta_encode(<const float*>src, <float*>dst, n)
        else:
            _delta_decode(<const float*>src, <float*>dst, n)
    else:
        if encode:
            _delta_encode(<const double*>src, <double*>dst, n)
        else:
            _delta_decode(<const double*>src, <double*>dst, n)


def delta(cnp.ndarray src, cnp.ndarray out, bint encode):
    """numcodecs' ``Delta`` (``astype`` equal to ``dtype``) over ``src``
    into ``out``, in C order: its encode with ``encode``, else its decode.
    Both arrays are C-contiguous, of one native-order integer, float32 or
    float64 data type and the same non-zero size; ``out`` may be ``src``.
    """
    cdef int kind = _delta_kind(src, out)
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    if encode and s == d:
        raise ValueError("delta: encode needs an output apart from its input")
    with nogil:
        _delta_run(kind, encode, s, d, n)
    return out
