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

``scale_offset``
    zarr's ``scale_offset`` on float32 or float64: ``(x - offset) * scale``
    to encode, ``x / scale + offset`` to decode, in the data's own float
    type (IEEE arithmetic, as NumPy's; NaN and infinities pass through).

``astype``
    numcodecs' ``AsType`` between float64 and float32: C's conversions,
    which round to nearest as NumPy's ``astype`` does.

`FilterChain` strings these together for the batch kernels: the steps of
an inner chain, run on each chunk inside their nogil sections.

The ``def`` wrappers check the arrays (contiguous, sizes, a supported
data type) before a kernel runs; only ``fixedscaleoffset``'s encoding can
fail, with a status.
"""

from libc.math cimport rint, rintf
from libc.string cimport memcpy, memset
from libc.stdint cimport (
    int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t,
)

cimport numpy as cnp

from zarr_fused._cast_value cimport CAST_OK, CastSpec, cast_run

import numpy as np

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


cdef void _scale_offset_encode(const float_t* src, float_t* dst, Py_ssize_t n, float_t offset,
                               float_t scale) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = (src[i] - offset) * scale


cdef void _scale_offset_decode(const float_t* src, float_t* dst, Py_ssize_t n, float_t offset,
                               float_t scale) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = src[i] / scale + offset


def scale_offset(cnp.ndarray src, cnp.ndarray out, double offset, double scale, bint encode):
    """zarr's ``scale_offset`` over ``src`` (float32 or float64) into
    ``out`` (the same type; may be ``src``): its encoding with ``encode``,
    else its decoding. ``offset`` and ``scale`` are the codec's values as
    the data type holds them (a float32's are exact as doubles)."""
    cdef int size = _float_size(src, "scale_offset")
    if out.dtype != src.dtype:
        raise TypeError(f"scale_offset: output {out.dtype} is not {src.dtype}")
    _check_pair(src, out, "scale_offset")
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    with nogil:
        _scale_offset_run(size, encode, s, d, n, offset, scale)
    return out


cdef void _scale_offset_run(int size, bint encode, const void* s, void* d, Py_ssize_t n,
                            double offset, double scale) noexcept nogil:
    if size == 4 and encode:
        _scale_offset_encode(<const float*>s, <float*>d, n, <float>offset, <float>scale)
    elif size == 4:
        _scale_offset_decode(<const float*>s, <float*>d, n, <float>offset, <float>scale)
    elif encode:
        _scale_offset_encode(<const double*>s, <double*>d, n, offset, scale)
    else:
        _scale_offset_decode(<const double*>s, <double*>d, n, offset, scale)


cdef void _astype_run(int size, int to_size, const void* s, void* d, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef const double* s8 = <const double*>s
    cdef const float* s4 = <const float*>s
    if size == 8 and to_size == 4:
        for i in range(n):
            (<float*>d)[i] = <float>s8[i]
    elif size == 4 and to_size == 8:
        for i in range(n):
            (<double*>d)[i] = <double>s4[i]
    else:
        memcpy(d, s, <size_t>(n * size))


def astype(cnp.ndarray src, cnp.ndarray out):
    """numcodecs' ``AsType`` cast of ``src`` into ``out``, both float32 or
    float64 (native order), C order, the same size; ``out`` apart from
    ``src`` when the sizes differ."""
    cdef int size = _float_size(src, "astype")
    cdef int to_size = _float_size(out, "astype")
    _check_pair(src, out, "astype")
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    if size != to_size and s == d:
        raise ValueError("astype: a cast between sizes needs an output apart from its input")
    with nogil:
        _astype_run(size, to_size, s, d, n)
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


# -- chains of filters, for the batch kernels -------------------------------------------


cdef void _decode_step(const FilterStep* s, const void* src, void* dst,
                       Py_ssize_t n) noexcept nogil:
    if s.kind == FK_DELTA:
        _delta_run(s.code, False, src, dst, n)
    elif s.kind == FK_SCALE_OFFSET:
        _scale_offset_run(s.code, False, src, dst, n, s.offset, s.scale)
    elif s.kind == FK_ASTYPE:
        _astype_run(s.encoded_code, s.code, src, dst, n)
    elif s.kind == FK_CAST_VALUE:
        cast_run(&s.cast_decode, src, dst, n)  # a step whose decoding cannot fail
    elif s.code == 4:
        _fso_decode_from(s.encoded_code, src, <float*>dst, n, s.offset, s.scale)
    else:
        _fso_decode_from(s.encoded_code, src, <double*>dst, n, s.offset, s.scale)


cdef FilterStatus _encode_step(const FilterStep* s, const void* src, void* dst,
                               Py_ssize_t n) noexcept nogil:
    if s.kind == FK_DELTA:
        _delta_run(s.code, True, src, dst, n)
    elif s.kind == FK_SCALE_OFFSET:
        _scale_offset_run(s.code, True, src, dst, n, s.offset, s.scale)
    elif s.kind == FK_ASTYPE:
        _astype_run(s.code, s.encoded_code, src, dst, n)
    elif s.kind == FK_CAST_VALUE:
        if cast_run(&s.cast_encode, src, dst, n) != CAST_OK:
            return FILTER_OUT_OF_RANGE
    elif s.kind == FK_FIXEDSCALEOFFSET:
        if s.code == 4:
            return _fso_encode_to(s.encoded_code, <const float*>src, dst, n, s.offset, s.scale,
                                  s.lo, s.hi)
        return _fso_encode_to(s.encoded_code, <const double*>src, dst, n, s.offset, s.scale,
                              s.lo, s.hi)
    elif s.kind == FK_QUANTIZE:
        if s.code == 4:
            _quantize(<const float*>src, <float*>dst, n, <float>s.scale)
        else:
            _quantize(<const double*>src, <double*>dst, n, s.scale)
    elif s.code == 2:
        _bitround(<const uint16_t*>src, <uint16_t*>dst, n, s.maskbits)
    elif s.code == 4:
        _bitround(<const uint32_t*>src, <uint32_t*>dst, n, s.maskbits)
    else:
        _bitround(<const uint64_t*>src, <uint64_t*>dst, n, s.maskbits)
    return FILTER_OK


_FLOAT_SIZES = {("f", 2): 2, ("f", 4): 4, ("f", 8): 8}


cdef int _float_code(object dtype, str name) except -1:
    """4 or 8: the item size of ``dtype``, a native float32 or float64."""
    code = _FLOAT_SIZES.get((dtype.kind, dtype.itemsize), 0)
    if code not in (4, 8) or not dtype.isnative:
        raise TypeError(f"{name}: no kernel for {dtype}")
    return code


cdef int _set_step(FilterStep* s, tuple step) except -1:
    """Fill ``s`` from a `FilterChain` step, checked."""
    cdef int bits
    kind, dtype = step[0], np.dtype(step[1])
    if not dtype.isnative:
        raise TypeError(f"{kind}: no kernel for {dtype}")
    memset(s, 0, sizeof(FilterStep))
    s.itemsize = s.encoded_itemsize = dtype.itemsize
    if kind == "delta":
        s.kind = FK_DELTA
        s.code = dtype.itemsize if dtype.kind in "iu" else -dtype.itemsize
        if dtype.kind not in "iuf" or s.code not in (1, 2, 4, 8, -4, -8):
            raise TypeError(f"delta: no kernel for {dtype}")
    elif kind == "fixedscaleoffset":
        astype = np.dtype(step[2])
        s.kind = FK_FIXEDSCALEOFFSET
        s.code = _float_code(dtype, kind)
        code = _INT_CODES.get((astype.kind, astype.itemsize))
        if code is None or not astype.isnative:
            raise TypeError(f"fixedscaleoffset: no kernel for {dtype} to {astype}")
        s.encoded_code = code
        s.encoded_itemsize = astype.itemsize
        s.offset, s.scale = step[3], step[4]
        bits = 8 * astype.itemsize
        s.lo = 0.0 if astype.kind == "u" else -(2.0 ** (bits - 1))
        s.hi = 2.0 ** bits if astype.kind == "u" else 2.0 ** (bits - 1)
    elif kind == "quantize":
        s.kind = FK_QUANTIZE
        s.code = _float_code(dtype, kind)
        s.scale = step[2]
    elif kind == "bitround":
        s.kind = FK_BITROUND
        s.code = _FLOAT_SIZES.get((dtype.kind, dtype.itemsize), 0)
        s.maskbits = step[2]
        if s.code == 0:
            raise TypeError(f"bitround: no kernel for {dtype}")
        if not 1 <= s.maskbits <= {2: 10, 4: 23, 8: 52}[s.code]:
            raise ValueError(f"bitround: {s.maskbits} bits to clear")
    elif kind == "scale_offset":
        s.kind = FK_SCALE_OFFSET
        s.code = _float_code(dtype, kind)
        s.offset, s.scale = step[2], step[3]
    elif kind == "astype":
        s.kind = FK_ASTYPE
        s.code = _float_code(dtype, kind)
        s.encoded_code = _float_code(np.dtype(step[2]), kind)
        s.encoded_itemsize = s.encoded_code
    elif kind == "cast_value":
        _set_cast_step(s, dtype, step[2], step[3])
    else:
        raise ValueError(f"no filter kernel {kind!r}")
    return 0


cdef int _set_cast_step(FilterStep* s, object dtype, CastSpec enc, CastSpec dec) except -1:
    # the batches' decode has no way to report a failed value, so only a
    # decoding no stored value can fail runs here
    if enc.src != dtype or dec.dst != dtype or enc.dst != dec.src or dec.can_fail:
        raise ValueError(f"cast_value: no chain step for {dtype} with these plans")
    s.kind = FK_CAST_VALUE
    s.encoded_itemsize = enc.dst.itemsize
    s.cast_encode = enc.plan
    s.cast_decode = dec.plan
    return 0


cdef class FilterChain:
    """numcodecs filters in their encode order, run on a chunk's items in
    C order by `decode` and `encode` (nogil, over two scratch buffers of
    ``count * max_itemsize`` bytes each that the caller provides).

    Built from steps ``(kind, dtype, ...)``, each checked here so the
    kernels take any chunk: ``("delta", dtype)``, ``("fixedscaleoffset",
    dtype, astype, offset, scale)``, ``("quantize", dtype, scale)``,
    ``("bitround", dtype, maskbits)``, ``("scale_offset", dtype, offset,
    scale)``, ``("astype", dtype, encoded)``, every ``dtype`` the item type
    before its step (native byte order).
    """

    def __init__(self, steps):
        steps = list(steps)
        if not 0 < len(steps) <= FILTER_MAX_STEPS:
            raise ValueError(f"a filter chain has 1 to {FILTER_MAX_STEPS} steps")
        self.n = 0
        self.max_itemsize = 0
        for step in steps:
            _set_step(&self.steps[self.n], tuple(step))
            if self.n and self.steps[self.n].itemsize != self.steps[self.n - 1].encoded_itemsize:
                raise ValueError("a step's input is not the step before's output")
            self.max_itemsize = max(self.max_itemsize, self.steps[self.n].itemsize,
                                    self.steps[self.n].encoded_itemsize)
            self.n += 1
        self.itemsize = self.steps[0].itemsize
        self.encoded_itemsize = self.steps[self.n - 1].encoded_itemsize

    cdef const void* decode(self, const void* src, void* a, void* b,
                            Py_ssize_t count) noexcept nogil:
        """Undo the steps on ``count`` encoded items at ``src`` (which may be
        ``a`` or ``b``); returns where the decoded items are (``src`` when
        every step's decoding leaves the items as they are)."""
        cdef const void* cur = src
        cdef void* dst
        cdef int i
        for i in range(self.n - 1, -1, -1):
            # quantize and bitround decode to the items as they are
            if self.steps[i].kind == FK_QUANTIZE or self.steps[i].kind == FK_BITROUND:
                continue
            dst = b if cur == <const void*>a else a
            _decode_step(&self.steps[i], cur, dst, count)
            cur = dst
        return cur

    cdef int encode(self, void* a, void* b, Py_ssize_t count,
                    const void** out) noexcept nogil:
        """Run the steps on ``count`` items at ``a``; ``out[0]`` is where the
        encoded items are (``a`` or ``b``). Returns `FILTER_OUT_OF_RANGE`
        when fixedscaleoffset or cast_value meets a value it cannot encode
        (the caller then runs zarr's code on the chunk), else `FILTER_OK`."""
        cdef void* cur = a
        cdef void* dst
        cdef int i
        for i in range(self.n):
            dst = b if cur == a else a
            if _encode_step(&self.steps[i], cur, dst, count) != FILTER_OK:
                return FILTER_OUT_OF_RANGE
            cur = dst
        out[0] = cur
        return FILTER_OK
