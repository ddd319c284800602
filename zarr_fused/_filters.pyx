# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native array->array filters, run with the GIL released.

Each kernel gives the very bytes numcodecs (or zarr) gives for the same
filter, so a chain with a native filter stores what zarr stores:

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
    zarr's ``scale_offset``: ``(x - offset) * scale`` to encode, ``x /
    scale + offset`` to decode. On float32 and float64 in the data's own
    float type (IEEE arithmetic, as NumPy's; NaN and infinities pass
    through). On integers as zarr computes them: in int64, which wraps
    (so int64 data wraps, as zarr's does), the result checked against the
    data type's range; uint64 exactly. Decoding first checks the division
    is exact. A value zarr refuses (out of range, a remainder) is reported
    (`FILTER_OUT_OF_RANGE`): the caller runs zarr's code, which raises.

``astype``
    numcodecs' ``AsType`` between any two of the integer types, float32
    and float64: C's conversions, which are NumPy's (integers wrap, floats
    round to nearest). A float whose integral part the integer type cannot
    hold (NaN, an infinity) has a platform-defined cast and is reported,
    as fixedscaleoffset's are.

The kernels are written once each over fused types; `_dispatch` is the
one place that turns a step's item type numbers into C types. A kernel call
is a `FilterStep` (built and checked by `_set_step` from a tuple), so the
``def`` wrappers and `FilterChain` share one parser. The wrappers check
the arrays (contiguous, sizes, the step's data types) before a kernel
runs.
"""

from libc.math cimport ldexp, rint, rintf, trunc
from libc.string cimport memcpy, memset
from libc.stdint cimport (
    INT64_MAX, INT64_MIN, UINT64_MAX,
    int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t,
)

cimport numpy as cnp

from zarr_fused._cast_value cimport CAST_OK, CastSpec, cast_run
from zarr_fused._item_types cimport (
    float_a as float_t,
    int_a as int_t,
    item_a as in_t,
    item_b as out_t,
)

import numpy as np

cnp.import_array()


# the types delta computes in: integers as unsigned, whose wrap-around is defined
ctypedef fused delta_t:
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double


ctypedef fused bits_t:
    uint16_t
    uint32_t
    uint64_t


#: the kernels' item type numbers by (kind, item size)
_ITEM_TYPES = {
    ("i", 1): IT_I8, ("i", 2): IT_I16, ("i", 4): IT_I32, ("i", 8): IT_I64,
    ("u", 1): IT_U8, ("u", 2): IT_U16, ("u", 4): IT_U32, ("u", 8): IT_U64,
    ("f", 4): IT_F32, ("f", 8): IT_F64,
}
#: the unsigned type of each size: delta's and bitround's arithmetic
_UNSIGNED = {1: IT_U8, 2: IT_U16, 4: IT_U32, 8: IT_U64}
#: mantissa bits of the float types bitround takes, by item size
_MANTISSA = {2: 10, 4: 23, 8: 52}


# -- the kernels, each over the C types it takes ----------------------------------------


cdef inline float_t _round(float_t v) noexcept nogil:
    if float_t is float:
        return rintf(v)
    else:
        return rint(v)


cdef inline void _int_bounds(int_t* tag, double* lo, double* hi) noexcept nogil:
    """[lo, hi): the integral values ``int_t`` holds, as doubles (exact)."""
    cdef int bits = 8 * <int>sizeof(int_t)
    if <int_t>-1 < 0:
        lo[0], hi[0] = -ldexp(1.0, bits - 1), ldexp(1.0, bits - 1)
    else:
        lo[0], hi[0] = 0.0, ldexp(1.0, bits)


cdef void _delta_encode(const delta_t* src, delta_t* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    dst[0] = src[0]
    for i in range(1, n):
        dst[i] = <delta_t>(src[i] - src[i - 1])


cdef void _delta_decode(const delta_t* src, delta_t* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef delta_t acc = src[0]
    dst[0] = acc
    for i in range(1, n):
        acc = <delta_t>(acc + src[i])
        dst[i] = acc


cdef void _delta_decode_run(const delta_t* src, delta_t* dst, Py_ssize_t n,
                            FilterCarry* carry) noexcept nogil:
    """`_delta_decode` of the next ``n`` (> 0) items of a chunk, the sum
    so far in ``carry``: a chunk's first item starts the sum as it is."""
    cdef Py_ssize_t i, first = 0
    cdef delta_t acc
    if carry.started:
        memcpy(&acc, &carry.acc, sizeof(delta_t))
    else:
        acc = src[0]
        dst[0] = acc
        first = 1
        carry.started = True
    for i in range(first, n):
        acc = <delta_t>(acc + src[i])
        dst[i] = acc
    memcpy(&carry.acc, &acc, sizeof(delta_t))


cdef void _delta_decode_rows(const char* src, Py_ssize_t src_step, char* dst,
                             Py_ssize_t dst_step, Py_ssize_t rows, Py_ssize_t n,
                             FilterCarry* carry, delta_t tag) noexcept nogil:
    """`_delta_decode_run` of ``rows`` runs of ``n`` (> 0) items each, the
    next one ``src_step`` and ``dst_step`` bytes on: the sum stays in a
    register from row to row, with no call or carry between them (``tag``
    names the item type only)."""
    cdef Py_ssize_t r = 0, i
    cdef const delta_t* s
    cdef delta_t* d
    cdef delta_t acc
    if not carry.started:
        _delta_decode_run(<const delta_t*>src, <delta_t*>dst, n, carry)
        r = 1
    memcpy(&acc, &carry.acc, sizeof(delta_t))
    while r < rows:
        s = <const delta_t*>(src + r * src_step)
        d = <delta_t*>(dst + r * dst_step)
        for i in range(n):
            acc = <delta_t>(acc + s[i])
            d[i] = acc
        r += 1
    memcpy(&carry.acc, &acc, sizeof(delta_t))


cdef void _bitround(const bits_t* src, bits_t* dst, Py_ssize_t n, int maskbits) noexcept nogil:
    cdef bits_t low = (<bits_t>1 << maskbits) - 1
    cdef bits_t half = (<bits_t>1 << (maskbits - 1)) - 1
    cdef bits_t b
    cdef Py_ssize_t i
    for i in range(n):
        b = src[i]
        b = <bits_t>(b + ((b >> maskbits) & 1) + half)
        dst[i] = <bits_t>(b & ~low)


cdef void _quantize(const float_t* src, float_t* dst, Py_ssize_t n, float_t scale) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = _round(scale * src[i]) / scale


cdef void _scale_offset_float(const float_t* src, float_t* dst, Py_ssize_t n, float_t offset,
                              float_t scale, bint encode) noexcept nogil:
    cdef Py_ssize_t i
    if encode:
        for i in range(n):
            dst[i] = (src[i] - offset) * scale
    else:
        for i in range(n):
            dst[i] = src[i] / scale + offset


cdef FilterStatus _scale_offset_int(const int_t* src, int_t* dst, Py_ssize_t n, int64_t offset,
                                    int64_t scale, bint encode) noexcept nogil:
    # zarr widens to int64, whose arithmetic NumPy wraps: computed here as
    # uint64, whose wrap-around is defined C, then checked against the
    # type's range (which int64 itself always passes, as in zarr)
    # Below 64 bits, values and scale are exact doubles, and a double
    # division (far cheaper than an integer one) is exact when the scale
    # divides: its quotient times the scale gives the value back iff so.
    cdef Py_ssize_t i
    cdef int64_t w, q, lo = INT64_MIN, hi = INT64_MAX
    cdef double flo, fhi
    if int_t is not int64_t:
        _int_bounds(dst, &flo, &fhi)
        lo, hi = <int64_t>flo, <int64_t>fhi - 1
    elif scale == 1 and not encode:
        # an offset alone: no quotient to check, and int64 holds every
        # sum, so the loop needs no integer division and vectorizes
        for i in range(n):
            dst[i] = <int64_t>(<uint64_t>src[i] + <uint64_t>offset)
        return FILTER_OK
    for i in range(n):
        w = <int64_t>src[i]
        if encode:
            w = <int64_t>((<uint64_t>w - <uint64_t>offset) * <uint64_t>scale)
        elif scale == -1:  # the one quotient that can overflow (INT64_MIN): NumPy wraps it
            w = <int64_t>(<uint64_t>offset - <uint64_t>w)
        else:
            if int_t is int64_t:
                q = w // scale
            else:
                q = <int64_t>(<double>w / <double>scale)
            if q * scale != w:
                return FILTER_OUT_OF_RANGE
            w = <int64_t>(<uint64_t>q + <uint64_t>offset)
        if w < lo or w > hi:
            return FILTER_OUT_OF_RANGE
        dst[i] = <int_t>w
    return FILTER_OK


cdef FilterStatus _scale_offset_u64(const uint64_t* src, uint64_t* dst, Py_ssize_t n,
                                    uint64_t offset, uint64_t scale, bint encode) noexcept nogil:
    # zarr computes uint64 exactly (Python integers) and checks the range
    cdef Py_ssize_t i
    cdef uint64_t x
    for i in range(n):
        x = src[i]
        if encode:
            if x < offset or x - offset > UINT64_MAX // scale:
                return FILTER_OUT_OF_RANGE
            dst[i] = (x - offset) * scale
        else:
            if x % scale or x // scale > UINT64_MAX - offset:
                return FILTER_OUT_OF_RANGE
            dst[i] = x // scale + offset
    return FILTER_OK


cdef FilterStatus _cast(const in_t* src, out_t* dst, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef double lo, hi, t
    if (in_t is float or in_t is double) and not (out_t is float or out_t is double):
        # C leaves a float whose integral part the type cannot hold undefined
        _int_bounds(dst, &lo, &hi)
        for i in range(n):
            t = trunc(<double>src[i])
            if not (t >= lo and t < hi):  # NaN fails both comparisons
                return FILTER_OUT_OF_RANGE
            dst[i] = <out_t>src[i]
    else:
        for i in range(n):
            dst[i] = <out_t>src[i]
    return FILTER_OK


cdef inline bint _fits(in_t v, out_t* tag) noexcept nogil:
    """Whether the integer ``v`` is an ``out_t`` value."""
    cdef out_t c = <out_t>v
    return <in_t>c == v and (c < 0) == (v < 0)


cdef FilterStatus _delta_cast(const in_t* src, out_t* dst, Py_ssize_t n,
                              bint encode) noexcept nogil:
    # numcodecs' Delta with astype: differences in the data's type (integers
    # wrap: computed as uint64, cut to the type), cast to astype. Its first
    # element is set as a scalar, which NumPy refuses (or wraps, negative
    # into unsigned) when astype cannot hold it: left to numcodecs' code.
    # Decoding sums in the wider type (NumPy's cumsum with out=), integers
    # modulo 2**64 (`_set_step` takes no pair NumPy would sum as floats).
    cdef Py_ssize_t i
    cdef uint64_t acc
    cdef double facc
    cdef FilterStatus status = FILTER_OK
    if (in_t is float or in_t is double) and (out_t is float or out_t is double):
        if encode:
            dst[0] = <out_t>src[0]
            for i in range(1, n):
                dst[i] = <out_t>(src[i] - src[i - 1])
        else:
            facc = <double>src[0]
            dst[0] = <out_t>facc
            for i in range(1, n):
                facc = facc + <double>src[i]
                dst[i] = <out_t>facc
    elif in_t is float or in_t is double or out_t is float or out_t is double:
        status = FILTER_OUT_OF_RANGE  # `_set_step` takes no such pair
    elif encode and not _fits(src[0], dst):
        status = FILTER_OUT_OF_RANGE
    elif encode:
        dst[0] = <out_t>src[0]
        for i in range(1, n):
            dst[i] = <out_t><in_t>(<uint64_t><int64_t>src[i] - <uint64_t><int64_t>src[i - 1])
    else:
        acc = <uint64_t><int64_t>src[0]
        dst[0] = <out_t>acc
        for i in range(1, n):
            acc = acc + <uint64_t><int64_t>src[i]
            dst[i] = <out_t>acc
    return status


cdef FilterStatus _fso_encode(const float_t* src, int_t* dst, Py_ssize_t n, float_t offset,
                              float_t scale) noexcept nogil:
    cdef Py_ssize_t i
    cdef float_t v
    cdef double lo, hi
    _int_bounds(dst, &lo, &hi)
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


# -- one dispatch: item type numbers to C types -----------------------------------------


cdef FilterStatus _same(const FilterStep* p, bint encode, const in_t* s, in_t* d,
                        Py_ssize_t n) noexcept nogil:
    """The steps whose items keep their type."""
    if p.kind == FK_DELTA:
        # signed integers come as the unsigned type of their size (`_set_step`)
        if in_t is int8_t or in_t is int16_t or in_t is int32_t or in_t is int64_t:
            return FILTER_OUT_OF_RANGE
        elif encode:
            _delta_encode(s, d, n)
        else:
            _delta_decode(s, d, n)
    elif p.kind == FK_SCALE_OFFSET:
        if in_t is float or in_t is double:
            _scale_offset_float(s, d, n, <in_t>p.offset, <in_t>p.scale, encode)
        elif in_t is uint64_t:
            return _scale_offset_u64(s, d, n, <uint64_t>p.ioffset, <uint64_t>p.iscale, encode)
        else:
            return _scale_offset_int(s, d, n, p.ioffset, p.iscale, encode)
    elif p.kind == FK_QUANTIZE:
        if in_t is float or in_t is double:
            _quantize(s, d, n, <in_t>p.scale)
    elif p.kind == FK_BITROUND:
        if in_t is uint16_t or in_t is uint32_t or in_t is uint64_t:
            _bitround(s, d, n, p.maskbits)
    return FILTER_OK


cdef FilterStatus _pair(const FilterStep* p, bint encode, const in_t* s, out_t* d,
                        Py_ssize_t n) noexcept nogil:
    """The steps that change the items' type."""
    cdef FilterStatus status = FILTER_OK
    if p.kind == FK_ASTYPE:
        status = _cast(s, d, n)
    elif p.kind == FK_DELTA:
        status = _delta_cast(s, d, n, encode)
    elif in_t is float or in_t is double:
        if not (out_t is float or out_t is double):
            status = _fso_encode(s, d, n, <in_t>p.offset, <in_t>p.scale)
    elif out_t is float or out_t is double:
        _fso_decode(s, d, n, p.offset, p.scale)
    return status


# A step's item types are resolved one at a time by the one ladder below:
# `_dispatch` with no type known yet (``_Unknown``) turns the input's number
# into a C type, then again with it known turns the output's, and `_typed`
# runs the kernels on the two.
cdef struct _Unknown:
    char unused


ctypedef fused known_t:
    _Unknown
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double


cdef FilterStatus _typed(const FilterStep* p, bint encode, const void* s, void* d, Py_ssize_t n,
                         known_t* first, out_t* second) noexcept nogil:
    if known_t is _Unknown:
        return _dispatch(p, encode, s, d, n, second)
    elif p.code == p.encoded_code and p.kind != FK_ASTYPE:
        return _same(p, encode, <const known_t*>s, <known_t*>d, n)
    else:
        return _pair(p, encode, <const known_t*>s, <out_t*>d, n)


cdef FilterStatus _dispatch(const FilterStep* p, bint encode, const void* s, void* d,
                            Py_ssize_t n, known_t* first) noexcept nogil:
    cdef int t
    if known_t is _Unknown:
        t = p.code if encode else p.encoded_code
    else:
        t = p.encoded_code if encode else p.code
    if t == IT_I8:
        return _typed(p, encode, s, d, n, first, <int8_t*>NULL)
    if t == IT_I16:
        return _typed(p, encode, s, d, n, first, <int16_t*>NULL)
    if t == IT_I32:
        return _typed(p, encode, s, d, n, first, <int32_t*>NULL)
    if t == IT_I64:
        return _typed(p, encode, s, d, n, first, <int64_t*>NULL)
    if t == IT_U8:
        return _typed(p, encode, s, d, n, first, <uint8_t*>NULL)
    if t == IT_U16:
        return _typed(p, encode, s, d, n, first, <uint16_t*>NULL)
    if t == IT_U32:
        return _typed(p, encode, s, d, n, first, <uint32_t*>NULL)
    if t == IT_U64:
        return _typed(p, encode, s, d, n, first, <uint64_t*>NULL)
    if t == IT_F32:
        return _typed(p, encode, s, d, n, first, <float*>NULL)
    return _typed(p, encode, s, d, n, first, <double*>NULL)


cdef inline FilterStatus _run(const FilterStep* p, bint encode, const void* s, void* d,
                              Py_ssize_t n) noexcept nogil:
    """Step ``p`` over ``n`` items at ``s`` into ``d``: its encoding with
    ``encode``, else its decoding."""
    if p.kind == FK_CAST_VALUE:  # its own kernel and plan (_cast_value.pyx)
        if cast_run(&p.cast_encode if encode else &p.cast_decode, s, d, n) != CAST_OK:
            return FILTER_OUT_OF_RANGE
        return FILTER_OK
    return _dispatch(p, encode, s, d, n, <_Unknown*>NULL)


# -- steps: parsed and checked once -----------------------------------------------------


cdef int _item_type(object dtype, str name, str kinds) except -1:
    """The kernels' number for ``dtype``, native order, of one of ``kinds``."""
    dtype = np.dtype(dtype)
    code = _ITEM_TYPES.get((dtype.kind, dtype.itemsize))
    if code is None or not dtype.isnative or dtype.kind not in kinds:
        raise TypeError(f"{name}: no kernel for {dtype}")
    return code


cdef int _set_int_params(FilterStep* s, object dtype, object offset, object scale) except -1:
    """scale_offset's integer offset and scale, which ``dtype`` must hold."""
    info = np.iinfo(dtype)
    for value in (offset, scale):
        if type(value) is not int or not info.min <= value <= info.max:
            raise ValueError(f"scale_offset: {value!r} is not a {dtype} value")
    if scale == 0:
        raise ValueError("scale_offset: a zero scale")
    # uint64's above INT64_MAX keep their bits (the kernel reads them unsigned)
    s.ioffset = <int64_t>(<uint64_t>offset) if offset > INT64_MAX else <int64_t>offset
    s.iscale = <int64_t>(<uint64_t>scale) if scale > INT64_MAX else <int64_t>scale
    return 0


cdef int _set_step(FilterStep* s, tuple step) except -1:
    """Fill ``s`` from a `FilterChain` step, checked."""
    kind, dtype = step[0], np.dtype(step[1])
    memset(s, 0, sizeof(FilterStep))
    s.encoded_code = -1
    s.itemsize = s.encoded_itemsize = dtype.itemsize
    if kind == "delta":
        s.kind = FK_DELTA
        s.code = _item_type(dtype, kind, "iuf")
        astype = np.dtype(step[2]) if len(step) > 2 else dtype
        if astype != dtype:
            s.encoded_code = _item_type(astype, kind, "iuf")
            s.encoded_itemsize = astype.itemsize
            # NumPy sums uint64 and a signed type as float64
            floats = dtype.kind == "f"
            if (astype.kind == "f") != floats or (
                    np.result_type(dtype, astype).kind == "f") != floats or (
                    floats and dtype.itemsize < astype.itemsize):
                raise TypeError(f"delta: no kernel for {dtype} with astype {astype}")
        elif dtype.kind in "iu":  # wrapping arithmetic
            s.code = _UNSIGNED[dtype.itemsize]
    elif kind == "fixedscaleoffset":
        s.kind = FK_FIXEDSCALEOFFSET
        s.code = _item_type(dtype, kind, "f")
        s.encoded_code = _item_type(step[2], kind, "iu")
        s.encoded_itemsize = np.dtype(step[2]).itemsize
        s.offset, s.scale = step[3], step[4]
    elif kind == "quantize":
        s.kind = FK_QUANTIZE
        s.code = _item_type(dtype, kind, "f")
        s.scale = step[2]
    elif kind == "bitround":
        s.kind = FK_BITROUND
        s.maskbits = step[2]
        if dtype.kind != "f" or dtype.itemsize not in _MANTISSA or not dtype.isnative:
            raise TypeError(f"bitround: no kernel for {dtype}")
        if not 1 <= s.maskbits <= _MANTISSA[dtype.itemsize]:
            raise ValueError(f"bitround: {s.maskbits} bits to clear, outside "
                             f"1..{_MANTISSA[dtype.itemsize]}")
        s.code = _UNSIGNED[dtype.itemsize]
    elif kind == "scale_offset":
        s.kind = FK_SCALE_OFFSET
        s.code = _item_type(dtype, kind, "iuf")
        if dtype.kind == "f":
            s.offset, s.scale = step[2], step[3]
        else:
            _set_int_params(s, dtype, step[2], step[3])
    elif kind == "astype":
        s.kind = FK_ASTYPE
        s.code = _item_type(dtype, kind, "iuf")
        s.encoded_code = _item_type(step[2], kind, "iuf")
        s.encoded_itemsize = np.dtype(step[2]).itemsize
    elif kind == "cast_value":
        _set_cast_step(s, dtype, step[2], step[3])
    else:
        raise ValueError(f"no filter kernel {kind!r}")
    if s.encoded_code == -1:  # the items keep their type
        s.encoded_code = s.code
    return 0


cdef int _set_cast_step(FilterStep* s, object dtype, CastSpec enc, CastSpec dec) except -1:
    if enc.src != dtype or dec.dst != dtype or enc.dst != dec.src:
        raise ValueError(f"cast_value: its plans do not cast {dtype} and back")
    s.kind = FK_CAST_VALUE
    s.encoded_itemsize = enc.dst.itemsize
    s.cast_encode = enc.plan
    s.cast_decode = dec.plan
    return 0


cdef FilterStatus _run_arrays(tuple step, cnp.ndarray src, cnp.ndarray out,
                              bint encode) except *:
    """Run ``step`` over ``src`` into ``out`` once both are checked."""
    cdef FilterStep s
    _set_step(&s, step)
    name = step[0]
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{name}: arrays must be C-contiguous, the output writeable")
    if src.size != out.size or src.size == 0:
        raise ValueError(f"{name}: input and output must have the same, non-zero size")
    cdef const void* sp = cnp.PyArray_DATA(src)
    cdef void* dp = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    cdef FilterStatus status
    if sp == dp and (s.itemsize != s.encoded_itemsize or (encode and s.kind == FK_DELTA)):
        raise ValueError(f"{name}: this needs an output apart from its input")
    with nogil:
        status = _run(&s, encode, sp, dp, n)
    return status


def delta(cnp.ndarray src, cnp.ndarray out, bint encode):
    """numcodecs' ``Delta`` over ``src`` into ``out``, in C order: its
    encode with ``encode`` (``src`` of its ``dtype``, ``out`` of its
    ``astype``), else its decode (the other way). Both arrays are
    C-contiguous, of native-order integer, float32 or float64 types (with
    ``astype`` another type: integers to integers, or float64 to float32)
    and the same non-zero size; ``out`` may be ``src`` when decoding to a
    type of the same size. Returns `FILTER_OUT_OF_RANGE` when the first
    element does not fit ``astype`` (NumPy refuses it), else `FILTER_OK`."""
    before, after = (src, out) if encode else (out, src)
    return _run_arrays(("delta", before.dtype, after.dtype), src, out, encode)


def fixedscaleoffset_encode(cnp.ndarray src, cnp.ndarray out, double offset, double scale):
    """numcodecs' ``FixedScaleOffset`` encoding of ``src`` (float32 or
    float64) into ``out`` (an integer type), in C order. Returns
    `FILTER_OUT_OF_RANGE` when a rounded value does not fit ``out``'s type
    (``out`` is then partly written), else `FILTER_OK`."""
    return _run_arrays(("fixedscaleoffset", src.dtype, out.dtype, offset, scale), src, out, True)


def fixedscaleoffset_decode(cnp.ndarray src, cnp.ndarray out, double offset, double scale):
    """numcodecs' ``FixedScaleOffset`` decoding of ``src`` (an integer
    type) into ``out`` (float32 or float64), in C order."""
    _run_arrays(("fixedscaleoffset", out.dtype, src.dtype, offset, scale), src, out, False)
    return out


def bitround(cnp.ndarray src, cnp.ndarray out, int maskbits):
    """numcodecs' ``BitRound`` encoding of ``src`` (a native-order float16,
    float32 or float64) into ``out`` (the same type; may be ``src``), with
    ``maskbits`` (1 up to the mantissa's bits) mantissa bits cleared."""
    if src.dtype != out.dtype:
        raise TypeError(f"bitround: no kernel for {src.dtype} into {out.dtype}")
    _run_arrays(("bitround", src.dtype, maskbits), src, out, True)
    return out


def quantize(cnp.ndarray src, cnp.ndarray out, double scale):
    """numcodecs' ``Quantize`` encoding (without ``astype``) of ``src``
    (float32 or float64) into ``out`` (the same type; may be ``src``), with
    ``scale`` the power of two numcodecs derives from its ``digits``."""
    if out.dtype != src.dtype:
        raise TypeError(f"quantize: output {out.dtype} is not {src.dtype}")
    _run_arrays(("quantize", src.dtype, scale), src, out, True)
    return out


def scale_offset(cnp.ndarray src, cnp.ndarray out, offset, scale, bint encode):
    """zarr's ``scale_offset`` over ``src`` (an integer type, float32 or
    float64) into ``out`` (the same type; may be ``src``): its encoding with
    ``encode``, else its decoding. ``offset`` and ``scale`` are the codec's
    values as the data type holds them (Python integers for an integer
    type; a float32's are exact as doubles). Returns `FILTER_OUT_OF_RANGE`
    when zarr would refuse a value (``out`` is then partly written), else
    `FILTER_OK`."""
    if out.dtype != src.dtype:
        raise TypeError(f"scale_offset: output {out.dtype} is not {src.dtype}")
    return _run_arrays(("scale_offset", src.dtype, offset, scale), src, out, encode)


def astype(cnp.ndarray src, cnp.ndarray out):
    """numcodecs' ``AsType`` cast of ``src`` into ``out``, each an integer
    type, float32 or float64 (native order), C order, the same size;
    ``out`` apart from ``src`` when the sizes differ. Returns
    `FILTER_OUT_OF_RANGE` when a float's integral part does not fit
    ``out``'s integer type (``out`` is then partly written), else
    `FILTER_OK`."""
    return _run_arrays(("astype", src.dtype, out.dtype), src, out, True)


# -- chains of filters, for the batch kernels -------------------------------------------


cdef bint _decodes_everything(tuple step) except -1:
    """Whether the step's decoding takes every stored value (a chain's
    decoding cannot refuse a chunk, see `FilterChain`)."""
    kind, dtype = step[0], np.dtype(step[1])
    if kind == "cast_value":
        return not (<CastSpec?>step[3]).can_fail
    if kind == "astype":
        return not (np.dtype(step[2]).kind == "f" and dtype.kind in "iu")
    if kind != "scale_offset" or dtype.kind == "f":
        return True
    offset, scale = step[2], step[3]
    if scale not in (1, -1):  # a stored value may not divide exactly
        return False
    if dtype == np.int64:  # zarr's int64 arithmetic wraps, unchecked
        return True
    info = np.iinfo(dtype)
    ends = (info.min * scale + offset, info.max * scale + offset)
    return info.min <= min(ends) and max(ends) <= info.max


cdef int _elementwise_step(const FilterStep* steps, int n) noexcept:
    """The one step of ``steps`` whose decoding changes the items, when it
    maps each item to one value on its own (not delta's running sum), else
    -1. Quantize and bitround decode to the items as they are."""
    cdef int i, found = -1
    for i in range(n):
        if steps[i].kind == FK_QUANTIZE or steps[i].kind == FK_BITROUND:
            continue
        if found >= 0:
            return -1
        found = i
    if found >= 0 and steps[found].kind in (FK_FIXEDSCALEOFFSET, FK_SCALE_OFFSET, FK_ASTYPE):
        return found
    return -1


cdef int _row_step(const FilterStep* steps, int elementwise) noexcept:
    """The step whose decoding runs row by row into the output: the
    elementwise one (the others leave the items as they are), else the
    first, unless that is a delta into another type (it sums in a wider
    one, see `_delta_cast`): -1."""
    if elementwise >= 0:
        return elementwise
    if steps[0].kind == FK_DELTA and steps[0].code != steps[0].encoded_code:
        return -1
    return 0


cdef class FilterChain:
    """numcodecs filters in their encode order, run on a chunk's items in
    C order by `decode` and `encode` (nogil, over two scratch buffers of
    ``count * max_itemsize`` bytes each that the caller provides).

    Built from steps ``(kind, dtype, ...)``, each checked here so the
    kernels take any chunk: ``("delta", dtype)``, ``("fixedscaleoffset",
    dtype, astype, offset, scale)``, ``("quantize", dtype, scale)``,
    ``("bitround", dtype, maskbits)``, ``("scale_offset", dtype, offset,
    scale)``, ``("astype", dtype, encoded)``, ``("cast_value", dtype,
    encode, decode)`` (two `zarr_fused._cast_value.CastSpec`), every
    ``dtype`` the item type before its step (native byte order). `decode`
    has no way to refuse a chunk, so a step whose decoding could refuse a
    stored value (an integer scale_offset that may meet a remainder or
    leave the range, an astype from floats to integers, a cast_value that
    can fail) is refused here (ValueError), unless ``refusing`` is set:
    such a chain (``may_refuse``) decodes with `decode_checked`, which
    reports the chunk it refuses.
    """

    def __init__(self, steps, *, bint refusing=False):
        steps = list(steps)
        if not 0 < len(steps) <= FILTER_MAX_STEPS:
            raise ValueError(f"a filter chain has 1 to {FILTER_MAX_STEPS} steps")
        self.n = 0
        self.max_itemsize = 0
        for step in steps:
            step = tuple(step)
            _set_step(&self.steps[self.n], step)
            if not _decodes_everything(step):
                if not refusing:
                    raise ValueError(f"{step[0]}: its decoding may refuse a stored value")
                self.may_refuse = True
            if self.n and self.steps[self.n].itemsize != self.steps[self.n - 1].encoded_itemsize:
                raise ValueError("a step's input is not the step before's output")
            self.max_itemsize = max(self.max_itemsize, self.steps[self.n].itemsize,
                                    self.steps[self.n].encoded_itemsize)
            self.n += 1
        self.itemsize = self.steps[0].itemsize
        self.encoded_itemsize = self.steps[self.n - 1].encoded_itemsize
        self.elementwise_step = _elementwise_step(self.steps, self.n)
        self.row_step = _row_step(self.steps, self.elementwise_step)
        self.rows_in_order = self.row_step >= 0 and self.steps[self.row_step].kind == FK_DELTA

    cdef const void* decode(self, const void* src, void* a, void* b,
                            Py_ssize_t count) noexcept nogil:
        """Undo the steps on ``count`` encoded items at ``src`` (which may be
        ``a`` or ``b``); returns where the decoded items are (``src`` when
        every step's decoding leaves the items as they are). For a chain
        built without ``refusing``, whose decoding cannot refuse; a chain
        that may refuse decodes with `decode_checked`, as this would return
        a refused chunk's items half decoded."""
        cdef const void* out
        self._decode_down_to(0, src, a, b, count, &out)
        return out

    cdef int decode_head(self, const void* src, void* a, void* b, Py_ssize_t count,
                         const void** out) noexcept nogil:
        """Undo the steps after `row_step` on a chunk's ``count`` items as
        `decode_checked` does (``out[0]`` may be ``src`` itself): what is
        left is `decode_rows`'s, row by row."""
        return self._decode_down_to(self.row_step + 1, src, a, b, count, out)

    cdef int decode_rows(self, const char* src, Py_ssize_t src_step, char* dst,
                         Py_ssize_t dst_step, Py_ssize_t rows, Py_ssize_t n,
                         FilterCarry* carry) noexcept nogil:
        """`row_step`'s decoding of ``rows`` rows of ``n`` (> 0) items, the
        first at ``src`` (as `decode_head` left the items) and ``dst``
        (apart), each next one ``src_step`` and ``dst_step`` bytes on, for a
        chain whose `row_step` is not -1: each row of a chunk lands in its
        own place in the output with no copy in between. The step is chosen
        once per call, not once per row (a chunk's rows may be a few items
        each). Delta (`rows_in_order`) takes a whole chunk's rows in order
        over its calls, ``carry`` zeroed before the first; any other step
        any rows. `FILTER_OUT_OF_RANGE` when the step refuses a value in a
        row (``dst`` then holds the rows before it and a part of it), else
        `FILTER_OK`."""
        cdef const FilterStep* p = &self.steps[self.row_step]
        cdef Py_ssize_t r
        if p.kind == FK_DELTA:
            if p.code == IT_U8:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <uint8_t>0)
            elif p.code == IT_U16:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <uint16_t>0)
            elif p.code == IT_U32:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <uint32_t>0)
            elif p.code == IT_U64:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <uint64_t>0)
            elif p.code == IT_F32:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <float>0)
            else:
                _delta_decode_rows(src, src_step, dst, dst_step, rows, n, carry, <double>0)
            return FILTER_OK
        if p.kind == FK_QUANTIZE or p.kind == FK_BITROUND:
            for r in range(rows):
                memcpy(dst + r * dst_step, src + r * src_step, <size_t>(n * p.itemsize))
            return FILTER_OK
        for r in range(rows):
            if _run(p, False, src + r * src_step, dst + r * dst_step, n) != FILTER_OK:
                return FILTER_OUT_OF_RANGE
        return FILTER_OK

    cdef int decode_checked(self, const void* src, void* a, void* b, Py_ssize_t count,
                            const void** out) noexcept nogil:
        """`decode` for a chain that may refuse a stored value: ``out[0]`` is
        where the decoded items are. Returns `FILTER_OUT_OF_RANGE` when a
        step refuses one (an integer scale_offset's remainder or range, a
        float astype or cast_value into integers; the caller then runs
        zarr's code on the chunk, which raises or decodes it), else
        `FILTER_OK`. A refused chunk's ``out[0]`` is the scratch buffer the
        refusing step was writing, partly written: meaningless items, but
        ``count * max_itemsize`` bytes a caller may read."""
        return self._decode_down_to(0, src, a, b, count, out)

    cdef int _decode_down_to(self, int last, const void* src, void* a, void* b,
                             Py_ssize_t count, const void** out) noexcept nogil:
        """Undo steps ``n - 1`` down to ``last`` as `decode_checked` does."""
        cdef const void* cur = src
        cdef void* dst
        cdef int i
        for i in range(self.n - 1, last - 1, -1):
            # quantize and bitround decode to the items as they are
            if self.steps[i].kind == FK_QUANTIZE or self.steps[i].kind == FK_BITROUND:
                continue
            dst = b if cur == <const void*>a else a
            if _run(&self.steps[i], False, cur, dst, count) != FILTER_OK:
                out[0] = dst
                return FILTER_OUT_OF_RANGE
            cur = dst
        out[0] = cur
        return FILTER_OK

    cdef int encode(self, void* a, void* b, Py_ssize_t count,
                    const void** out) noexcept nogil:
        """Run the steps on ``count`` items at ``a``; ``out[0]`` is where the
        encoded items are (``a`` or ``b``). Returns `FILTER_OUT_OF_RANGE`
        when a step refuses a value (fixedscaleoffset or astype meeting a
        value the integer type cannot hold, scale_offset leaving the range,
        cast_value failing on it; the caller then runs zarr's code on the
        chunk), else `FILTER_OK`."""
        cdef void* cur = a
        cdef void* dst
        cdef int i
        for i in range(self.n):
            dst = b if cur == a else a
            if _run(&self.steps[i], True, cur, dst, count) != FILTER_OK:
                return FILTER_OUT_OF_RANGE
            cur = dst
        out[0] = cur
        return FILTER_OK
