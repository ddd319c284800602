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

``fixedscaleoffset``
    numcodecs' ``FixedScaleOffset`` from float32 or float64 to an integer
    type. Encoding computes ``(x - offset) * scale`` in the float type of
    the data (NumPy casts the Python scalars to it), rounds half to even
    (``np.around`` is ``rint``) and casts. A rounded value the integer type
    cannot hold (NaN, an infinity, out of range) makes NumPy's cast
    platform-defined, so the kernel reports it (`FILTER_OUT_OF_RANGE`)
    and the caller runs numcodecs' code on that chunk instead. Decoding
    is ``enc / scale + offset`` in float64 (NumPy's true division of
    integers), cast to the float type.

``bitround``
    numcodecs' ``BitRound`` on float16, float32 or float64 bits: round
    half to even at bit ``maskbits`` of the mantissa, then clear the bits
    below it, as unsigned integers (NumPy's signed addition wraps alike).

``quantize``
    numcodecs' ``Quantize`` without ``astype``: ``rint(x * scale) / scale``
    in the data's own float type, ``scale`` the power of two numcodecs
    derives from ``digits`` (`zarr_fused._filter_stages` computes it).

The ``def`` wrappers check the arrays (contiguous, sizes, a supported
data type) before a kernel runs; only ``fixedscaleoffset``'s encoding can
fail, with a status.
"""

from libc.math cimport rint, rintf
from libc.stdint cimport (
    int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t,
)

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


cpdef enum FilterStatus:
    FILTER_OK = 0
    FILTER_OUT_OF_RANGE = 1


ctypedef fused float_t:
    float
    double


ctypedef fused int_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t


ctypedef fused bits_t:
    uint16_t
    uint32_t
    uint64_t


#: integer data types by (kind, item size), as the kernels number them
_INT_CODES = {
    ("i", 1): 0, ("i", 2): 1, ("i", 4): 2, ("i", 8): 3,
    ("u", 1): 4, ("u", 2): 5, ("u", 4): 6, ("u", 8): 7,
}


cdef inline float_t _round(float_t v) noexcept nogil:
    if float_t is float:
        return rintf(v)
    else:
        return rint(v)


cdef FilterStatus _fso_encode(const float_t* src, int_t* dst, Py_ssize_t n, float_t offset,
                              float_t scale, float_t lo, float_t hi) noexcept nogil:
    cdef Py_ssize_t i
    cdef float_t v
    for i in range(n):
        v = _round((src[i] - offset) * scale)
        # NaN fails both comparisons: refused like an out-of-range value
        if not (v >= lo and v < hi):
            return FILTER_OUT_OF_RANGE
        dst[i] = <int_t>v
    return FILTER_OK


cdef void _fso_decode(const int_t* src, float_t* dst, Py_ssize_t n, double offset,
                      double scale) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = <float_t>(<double>src[i] / scale + offset)


cdef FilterStatus _fso_encode_to(int code, const float_t* s, void* d, Py_ssize_t n,
                                 double offset, double scale, double lo,
                                 double hi) noexcept nogil:
    cdef float_t o = <float_t>offset, k = <float_t>scale, a = <float_t>lo, b = <float_t>hi
    if code == 0:
        return _fso_encode(s, <int8_t*>d, n, o, k, a, b)
    if code == 1:
        return _fso_encode(s, <int16_t*>d, n, o, k, a, b)
    if code == 2:
        return _fso_encode(s, <int32_t*>d, n, o, k, a, b)
    if code == 3:
        return _fso_encode(s, <int64_t*>d, n, o, k, a, b)
    if code == 4:
        return _fso_encode(s, <uint8_t*>d, n, o, k, a, b)
    if code == 5:
        return _fso_encode(s, <uint16_t*>d, n, o, k, a, b)
    if code == 6:
        return _fso_encode(s, <uint32_t*>d, n, o, k, a, b)
    return _fso_encode(s, <uint64_t*>d, n, o, k, a, b)


cdef void _fso_decode_from(int code, const void* s, float_t* d, Py_ssize_t n,
                           double offset, double scale) noexcept nogil:
    if code == 0:
        _fso_decode(<const int8_t*>s, d, n, offset, scale)
    elif code == 1:
        _fso_decode(<const int16_t*>s, d, n, offset, scale)
    elif code == 2:
        _fso_decode(<const int32_t*>s, d, n, offset, scale)
    elif code == 3:
        _fso_decode(<const int64_t*>s, d, n, offset, scale)
    elif code == 4:
        _fso_decode(<const uint8_t*>s, d, n, offset, scale)
    elif code == 5:
        _fso_decode(<const uint16_t*>s, d, n, offset, scale)
    elif code == 6:
        _fso_decode(<const uint32_t*>s, d, n, offset, scale)
    else:
        _fso_decode(<const uint64_t*>s, d, n, offset, scale)


cdef int _float_size(cnp.ndarray a, str name) except -1:
    """4 or 8: the item size of ``a``, a native-order float32 or float64."""
    if a.dtype.kind != "f" or a.dtype.itemsize not in (4, 8) or not a.dtype.isnative:
        raise TypeError(f"{name}: no kernel for {a.dtype}")
    return a.dtype.itemsize


cdef int _int_code(cnp.ndarray a, str name) except -1:
    """The kernels' number for the data type of ``a``, a native-order integer."""
    code = _INT_CODES.get((a.dtype.kind, a.dtype.itemsize))
    if code is None or not a.dtype.isnative:
        raise TypeError(f"{name}: no kernel for {a.dtype}")
    return code


cdef int _check_pair(cnp.ndarray src, cnp.ndarray out, str name) except -1:
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{name}: arrays must be C-contiguous, the output writeable")
    if src.size != out.size:
        raise ValueError(f"{name}: input and output must have the same size")
    return 0


def fixedscaleoffset_encode(cnp.ndarray src, cnp.ndarray out, double offset, double scale):
    """numcodecs' ``FixedScaleOffset`` encoding of ``src`` (float32 or
    float64) into ``out`` (an integer type), in C order. Returns
    `FILTER_OUT_OF_RANGE` when a rounded value does not fit ``out``'s type
    (``out`` is then partly written), else `FILTER_OK`."""
    cdef int size = _float_size(src, "fixedscaleoffset")
    cdef int code = _int_code(out, "fixedscaleoffset")
    _check_pair(src, out, "fixedscaleoffset")
    cdef int bits = 8 * out.dtype.itemsize
    cdef double lo = 0.0 if out.dtype.kind == "u" else -(2.0 ** (bits - 1))
    cdef double hi = 2.0 ** bits if out.dtype.kind == "u" else 2.0 ** (bits - 1)
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    cdef FilterStatus status
    with nogil:
        if size == 4:
            status = _fso_encode_to(code, <const float*>s, d, n, offset, scale, lo, hi)
        else:
            status = _fso_encode_to(code, <const double*>s, d, n, offset, scale, lo, hi)
    return status


def fixedscaleoffset_decode(cnp.ndarray src, cnp.ndarray out, double offset, double scale):
    """numcodecs' ``FixedScaleOffset`` decoding of ``src`` (an integer
    type) into ``out`` (float32 or float64), in C order."""
    cdef int code = _int_code(src, "fixedscaleoffset")
    cdef int size = _float_size(out, "fixedscaleoffset")
    _check_pair(src, out, "fixedscaleoffset")
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    with nogil:
        if size == 4:
            _fso_decode_from(code, s, <float*>d, n, offset, scale)
        else:
            _fso_decode_from(code, s, <double*>d, n, offset, scale)
    return out


cdef void _bitround(const bits_t* src, bits_t* dst, Py_ssize_t n, int maskbits) noexcept nogil:
    cdef bits_t low = (<bits_t>1 << maskbits) - 1
    cdef bits_t half = (<bits_t>1 << (maskbits - 1)) - 1
    cdef bits_t b
    cdef Py_ssize_t i
    for i in range(n):
        b = src[i]
        b = <bits_t>(b + ((b >> maskbits) & 1) + half)
        dst[i] = <bits_t>(b & ~low)


def bitround(cnp.ndarray src, cnp.ndarray out, int maskbits):
    """numcodecs' ``BitRound`` encoding of ``src`` (a native-order float16,
    float32 or float64) into ``out`` (the same type; may be ``src``), with
    ``maskbits`` (1 up to the mantissa's bits) mantissa bits cleared."""
    if src.dtype != out.dtype or src.dtype.kind != "f" or not src.dtype.isnative:
        raise TypeError(f"bitround: no kernel for {src.dtype} into {out.dtype}")
    _check_pair(src, out, "bitround")
    cdef int mantissa = {2: 10, 4: 23, 8: 52}.get(src.dtype.itemsize, 0)
    if not 1 <= maskbits <= mantissa:
        raise ValueError(f"bitround: {maskbits} bits to clear, outside 1..{mantissa}")
    cdef int size = src.dtype.itemsize
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    with nogil:
        if size == 2:
            _bitround(<const uint16_t*>s, <uint16_t*>d, n, maskbits)
        elif size == 4:
            _bitround(<const uint32_t*>s, <uint32_t*>d, n, maskbits)
        else:
            _bitround(<const uint64_t*>s, <uint64_t*>d, n, maskbits)
    return out


cdef void _quantize(const float_t* src, float_t* dst, Py_ssize_t n, float_t scale) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = _round(scale * src[i]) / scale


def quantize(cnp.ndarray src, cnp.ndarray out, double scale):
    """numcodecs' ``Quantize`` encoding (without ``astype``) of ``src``
    (float32 or float64) into ``out`` (the same type; may be ``src``), with
    ``scale`` the power of two numcodecs derives from its ``digits``."""
    cdef int size = _float_size(src, "quantize")
    if out.dtype != src.dtype:
        raise TypeError(f"quantize: output {out.dtype} is not {src.dtype}")
    _check_pair(src, out, "quantize")
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    with nogil:
        if size == 4:
            _quantize(<const float*>s, <float*>d, n, <float>scale)
        else:
            _quantize(<const double*>s, <double*>d, n, scale)
    return out
