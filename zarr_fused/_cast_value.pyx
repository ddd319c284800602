# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""zarr's ``cast_value`` codec on native numeric types, GIL released.

Each value goes through the steps of cast-value-rs 0.5 (zarr's backend),
found by probing it (`tests/test_cast_value.py` checks every pair of types
against it), so a chain with a native cast stores what zarr stores:

1. the ``scalar_map`` entries, first match wins (a NaN key matches any
   NaN; ``-0.0`` matches ``0.0``);
2. float to integer: NaN and the infinities fail, whatever the mode; the
   value is rounded to an integer by the rounding mode (ties to even or
   away from zero, or towards zero, +inf, -inf), then compared exactly with
   the target's bounds: ``clamp`` pins it to them, ``wrap`` takes the
   integer modulo 2**64 and keeps the target's low bits, no mode fails;
3. integer to integer: the same, in the source type against the target's
   bounds clipped to the source's; ``wrap`` keeps the low bits;
4. integer to float: C's conversion (nearest, ties to even); another
   rounding mode moves an inexact result to the neighbour it asks for,
   decided exactly on the integer's bits;
5. float to float: a widening or same-size cast is exact. float64 to
   float32 rounds by the mode (C's nearest conversion, then the neighbour
   the mode asks for); a finite value of magnitude 2**128 or more, or one
   the mode rounds to an infinity, overflows: ``clamp`` gives the signed
   infinity, no mode fails. NaN and the infinities pass.

`CastSpec` holds one direction's settings, checked and converted in
Python; `cast` runs it on a C-contiguous array. float16 and the types
NumPy lacks are not here: their casts run zarr's code.
"""

from libc.math cimport copysign, fabs, fmod, INFINITY, isfinite, isinf, nextafter, nextafterf
from libc.stdint cimport (
    int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t,
)
from libc.string cimport memcpy, memset

cimport numpy as cnp

from zarr_fused._item_types cimport (
    float_a as fsrc_t,
    float_b as fdst_t,
    int_a as isrc_t,
    int_b as idst_t,
    item_a as src_t,
    item_b as dst_t,
)

import numpy as np

cnp.import_array()

cdef enum:
    NEAREST_EVEN = 0
    TOWARDS_ZERO = 1
    TOWARDS_POSITIVE = 2
    TOWARDS_NEGATIVE = 3
    NEAREST_AWAY = 4

cdef enum:
    OOR_NONE = 0
    OOR_CLAMP = 1
    OOR_WRAP = 2

#: the kernels' type numbers, by NumPy type name
TYPE_CODES = {
    "int8": 0, "int16": 1, "int32": 2, "int64": 3,
    "uint8": 4, "uint16": 5, "uint32": 6, "uint64": 7,
    "float32": 8, "float64": 9,
}
ROUNDING_MODES = {
    "nearest-even": NEAREST_EVEN, "towards-zero": TOWARDS_ZERO,
    "towards-positive": TOWARDS_POSITIVE, "towards-negative": TOWARDS_NEGATIVE,
    "nearest-away": NEAREST_AWAY,
}
OUT_OF_RANGE_MODES = {None: OOR_NONE, "clamp": OOR_CLAMP, "wrap": OOR_WRAP}
MAX_ENTRIES = CAST_MAX_ENTRIES


#: 2**64 and 2**63, exact as doubles
cdef double TWO_64 = 18446744073709551616.0
cdef double TWO_63 = 9223372036854775808.0
#: 2**52: a double of this magnitude or more is an integer
cdef double TWO_52 = 4503599627370496.0
#: float32's overflow threshold: a float64 of this magnitude or more overflows
cdef double TWO_128 = 340282366920938463463374607431768211456.0


cdef inline void _load(const uint64_t* bits, src_t* out) noexcept nogil:
    # memcpy, not a cast of the pointer: the plan's fields are uint64_t
    memcpy(out, bits, sizeof(src_t))


cdef inline double _round(double v, int mode) noexcept nogil:
    """``v`` (finite) rounded to an integer by ``mode``: its truncation
    (one conversion) moved by comparisons that compile without branches,
    as random fractions would defeat a branch predictor (libm's rint and
    floor are calls on the baseline x86-64 this is built for). A float32
    rounds alike as a double: each mode is a function of the exact value."""
    cdef double t, r
    if not fabs(v) < TWO_52:
        return v  # an integer already
    t = <double><int64_t>v
    r = v - t  # exact: |r| < 1, and t is 0 or within a factor of two of v
    if mode == TOWARDS_ZERO:
        return t
    if mode == TOWARDS_POSITIVE:
        return t + <double>(r > 0)
    if mode == TOWARDS_NEGATIVE:
        return t - <double>(r < 0)
    if mode == NEAREST_AWAY:
        return t + copysign(<double>(fabs(r) >= 0.5), v)
    # nearest-even: adding 2**52 to the magnitude leaves no fraction bits,
    # so the addition itself rounds (the default rounding mode, ties to even)
    return copysign((fabs(v) + TWO_52) - TWO_52, v)


cdef inline uint64_t _mod_two_64(double d) noexcept nogil:
    """The integer ``d`` modulo 2**64 (``fmod`` is exact, and so is the
    last addition, whose operands are within a factor of two)."""
    cdef double m = fmod(d, TWO_64)
    if m >= 0:
        return <uint64_t>m
    if m >= -TWO_63:
        return <uint64_t><int64_t>m
    return <uint64_t>(m + TWO_64)


cdef inline CastStatus _f2i(fsrc_t v, idst_t* out, const CastPlan* p) noexcept nogil:
    cdef double d = <double>v
    if not isfinite(d):
        return CAST_NAN_OR_INF
    d = _round(d, p.rounding)
    if d < p.flo or d >= p.fhi:
        if p.out_of_range == OOR_CLAMP:
            _load(&p.dmin if d < p.flo else &p.dmax, out)
        elif p.out_of_range == OOR_WRAP:
            out[0] = <idst_t>_mod_two_64(d)
        else:
            return CAST_OUT_OF_RANGE
    else:
        out[0] = <idst_t>d
    return CAST_OK


cdef inline CastStatus _i2i(isrc_t v, idst_t* out, const CastPlan* p) noexcept nogil:
    cdef isrc_t lo, hi
    _load(&p.lo, &lo)
    _load(&p.hi, &hi)
    if v < lo or v > hi:
        if p.out_of_range == OOR_CLAMP:
            v = lo if v < lo else hi
        elif p.out_of_range != OOR_WRAP:
            return CAST_OUT_OF_RANGE
    # wrap: C's conversion keeps the low bits (GCC and Clang define the
    # signed case so)
    out[0] = <idst_t>v
    return CAST_OK


cdef inline fdst_t _next(fdst_t v, double towards) noexcept nogil:
    if fdst_t is float:
        return nextafterf(v, <float>towards)
    else:
        return nextafter(v, towards)


cdef inline fdst_t _directed(fdst_t r, double val, int mode) noexcept nogil:
    """float64 ``val`` cast to float32 by ``mode``, ``r`` its nearest-even
    cast (both seen as doubles exactly, so the comparisons are exact)."""
    cdef double got = <double>r
    cdef fdst_t other
    if got == val or mode == NEAREST_EVEN:
        return r
    if mode == TOWARDS_ZERO:
        return _next(r, 0.0) if fabs(got) > fabs(val) else r
    if mode == TOWARDS_POSITIVE:
        return _next(r, INFINITY) if got < val else r
    if mode == TOWARDS_NEGATIVE:
        return _next(r, -INFINITY) if got > val else r
    # nearest-away: only a tie that nearest-even sent towards zero moves
    other = _next(r, INFINITY if val > got else -INFINITY)
    if (got + <double>other) / 2.0 == val and fabs(<double>other) > fabs(got):
        return other
    return r


cdef inline CastStatus _f2f(fsrc_t v, fdst_t* out, const CastPlan* p) noexcept nogil:
    cdef fdst_t r = <fdst_t>v
    if sizeof(fdst_t) < sizeof(fsrc_t) and isfinite(v):
        if fabs(<double>v) < TWO_128:
            r = _directed(r, <double>v, p.rounding)
        if fabs(<double>v) >= TWO_128 or isinf(r):
            if p.out_of_range != OOR_CLAMP:
                return CAST_OUT_OF_RANGE
            r = <fdst_t>copysign(INFINITY, <double>v)
    out[0] = r
    return CAST_OK


cdef inline CastStatus _i2f(isrc_t v, fdst_t* out, const CastPlan* p) noexcept nogil:
    cdef fdst_t r = <fdst_t>v
    cdef int mantissa = 24 if fdst_t is float else 53
    cdef bint negative = v < 0
    cdef uint64_t size, half, low
    cdef int cut
    cdef bint up
    cdef double magnitude
    out[0] = r
    if p.rounding == NEAREST_EVEN:
        return CAST_OK
    size = (<uint64_t>0 - <uint64_t>v) if negative else <uint64_t>v
    if size >> mantissa == 0:
        return CAST_OK  # exact
    # the bits below the mantissa's last one: zero when the cast is exact,
    # ``half`` when it is a tie
    cut = 1
    while cut < 64 - mantissa and size >> (mantissa + cut):
        cut += 1
    half = <uint64_t>1 << (cut - 1)
    low = size & ((half << 1) - 1)
    if low == 0:
        return CAST_OK
    magnitude = fabs(<double>r)
    up = magnitude >= TWO_64 or <uint64_t>magnitude > size  # nearest went away from zero
    if p.rounding == TOWARDS_ZERO and up:
        r = _next(r, 0.0)
    elif p.rounding == TOWARDS_POSITIVE and (up == negative):
        r = _next(r, INFINITY)
    elif p.rounding == TOWARDS_NEGATIVE and (up != negative):
        r = _next(r, -INFINITY)
    elif p.rounding == NEAREST_AWAY and low == half and not up:
        r = _next(r, -INFINITY if negative else INFINITY)
    out[0] = r
    return CAST_OK


cdef inline bint _mapped(src_t v, dst_t* out, const CastPlan* p) noexcept nogil:
    cdef Py_ssize_t k
    cdef src_t key
    for k in range(p.n_entries):
        _load(&p.entries[k].src, &key)
        if (src_t is float or src_t is double) and key != key:
            if v != v:
                _load(&p.entries[k].dst, out)
                return True
        elif v == key:
            _load(&p.entries[k].dst, out)
            return True
    return False


cdef inline CastStatus _one(src_t v, dst_t* out, const CastPlan* p) noexcept nogil:
    if src_t is float or src_t is double:
        if dst_t is float or dst_t is double:
            return _f2f(v, out, p)
        else:
            return _f2i(v, out, p)
    else:
        if dst_t is float or dst_t is double:
            return _i2f(v, out, p)
        else:
            return _i2i(v, out, p)


cdef void _int_to_float_nearest(const src_t* s, dst_t* d, Py_ssize_t n,
                                const CastPlan* p) noexcept nogil:
    """An integer to float cast by nearest-even, which cannot fail: a plain
    conversion loop, then one pass per scalar_map entry, the last entry
    first so the first match wins (both loops vectorize)."""
    cdef Py_ssize_t i, k
    cdef src_t key
    cdef dst_t value
    for i in range(n):
        d[i] = <dst_t>s[i]
    for k in range(p.n_entries - 1, -1, -1):
        _load(&p.entries[k].src, &key)
        _load(&p.entries[k].dst, &value)
        for i in range(n):
            if s[i] == key:
                d[i] = value


cdef CastStatus _cast(const src_t* s, dst_t* d, Py_ssize_t n, const CastPlan* plan) noexcept nogil:
    # a local copy: the compiler may keep its fields in registers, as no
    # store into ``d`` can change it
    cdef CastPlan p = plan[0]
    cdef Py_ssize_t i
    cdef CastStatus status
    if not (src_t is float or src_t is double):
        if (dst_t is float or dst_t is double) and p.rounding == NEAREST_EVEN:
            _int_to_float_nearest(s, d, n, &p)
            return CAST_OK
    if p.n_entries == 0:
        for i in range(n):
            status = _one(s[i], &d[i], &p)
            if status != CAST_OK:
                return status
        return CAST_OK
    for i in range(n):
        if not _mapped(s[i], &d[i], &p):
            status = _one(s[i], &d[i], &p)
            if status != CAST_OK:
                return status
    return CAST_OK


cdef CastStatus _cast_from(const src_t* s, void* d, Py_ssize_t n,
                           const CastPlan* p) noexcept nogil:
    cdef int code = p.dst_code
    if code == 0:
        return _cast(s, <int8_t*>d, n, p)
    if code == 1:
        return _cast(s, <int16_t*>d, n, p)
    if code == 2:
        return _cast(s, <int32_t*>d, n, p)
    if code == 3:
        return _cast(s, <int64_t*>d, n, p)
    if code == 4:
        return _cast(s, <uint8_t*>d, n, p)
    if code == 5:
        return _cast(s, <uint16_t*>d, n, p)
    if code == 6:
        return _cast(s, <uint32_t*>d, n, p)
    if code == 7:
        return _cast(s, <uint64_t*>d, n, p)
    if code == 8:
        return _cast(s, <float*>d, n, p)
    return _cast(s, <double*>d, n, p)


cdef CastStatus cast_run(const CastPlan* p, const void* s, void* d,
                         Py_ssize_t n) noexcept nogil:
    """Cast ``n`` items at ``s`` (the plan's source type) into ``d`` (its
    target type); stops at the first value that fails."""
    cdef int code = p.src_code
    if code == 0:
        return _cast_from(<const int8_t*>s, d, n, p)
    if code == 1:
        return _cast_from(<const int16_t*>s, d, n, p)
    if code == 2:
        return _cast_from(<const int32_t*>s, d, n, p)
    if code == 3:
        return _cast_from(<const int64_t*>s, d, n, p)
    if code == 4:
        return _cast_from(<const uint8_t*>s, d, n, p)
    if code == 5:
        return _cast_from(<const uint16_t*>s, d, n, p)
    if code == 6:
        return _cast_from(<const uint32_t*>s, d, n, p)
    if code == 7:
        return _cast_from(<const uint64_t*>s, d, n, p)
    if code == 8:
        return _cast_from(<const float*>s, d, n, p)
    return _cast_from(<const double*>s, d, n, p)


cdef uint64_t _bits(object value, object dtype) except? 0:
    """``value`` as a ``dtype`` item, in the first bytes of a uint64."""
    cdef uint64_t out = 0
    cdef bytes raw = np.array(value, dtype=dtype).tobytes()
    memcpy(&out, <const char*>raw, len(raw))
    return out


def _type_code(dtype, str role):
    code = TYPE_CODES.get(dtype.name) if dtype.isnative else None
    if code is None:
        raise TypeError(f"cast_value: no kernel for {role} type {dtype}")
    return code


def _bounds(src, dst):
    """(lo, hi) of an integer ``dst`` as ``src`` values: its bounds clipped
    to an integer source's range; for a float source (which compares as a
    double) its minimum and the power of two past its maximum."""
    info = np.iinfo(dst)
    if src.kind == "f":
        return float(info.min), float(info.max + 1)
    own = np.iinfo(src)
    return max(info.min, own.min), min(info.max, own.max)


def _can_fail(src, dst, int out_of_range, entries) -> bool:
    if dst.kind == "f":
        narrows = src.kind == "f" and dst.itemsize < src.itemsize
        return narrows and out_of_range != OOR_CLAMP
    if src.kind == "f":
        keys = [k for k, _ in entries]
        unmapped = not any(k != k for k in keys) or not {float("inf"), float("-inf")} <= set(keys)
        return unmapped or out_of_range == OOR_NONE
    if out_of_range != OOR_NONE:
        return False
    info, own = np.iinfo(dst), np.iinfo(src)
    return own.min < info.min or own.max > info.max


cdef class CastSpec:
    """One direction of a ``cast_value`` codec: items of ``src`` cast to
    ``dst`` (native-order NumPy numeric types the kernel has), with a
    rounding mode, an out-of-range mode (None, ``"clamp"``, ``"wrap"``)
    and ``entries``, the scalar map's (source, target) pairs as zarr hands
    them to its backend (Python numbers; at most `MAX_ENTRIES`). Raises
    TypeError or ValueError for anything else. ``can_fail`` tells whether
    some input makes the cast fail (a NaN to an integer, a value out of an
    integer's range without a mode, a float64 overflowing float32).

    Rust's ``as`` and C's conversions agree on everything the kernel casts
    (every integer converts exactly or to nearest-even, and each float
    conversion is a single IEEE rounding); the exact comparisons above
    avoid the conversions C leaves undefined."""

    def __init__(self, src, dst, str rounding, out_of_range, entries):
        src, dst = np.dtype(src), np.dtype(dst)
        entries = list(entries)
        memset(&self.plan, 0, sizeof(CastPlan))
        self.plan.src_code = _type_code(src, "source")
        self.plan.dst_code = _type_code(dst, "target")
        if rounding not in ROUNDING_MODES:
            raise ValueError(f"cast_value: unknown rounding mode {rounding!r}")
        if out_of_range not in OUT_OF_RANGE_MODES:
            raise ValueError(f"cast_value: unknown out_of_range mode {out_of_range!r}")
        if len(entries) > CAST_MAX_ENTRIES:
            raise ValueError(f"cast_value: more than {CAST_MAX_ENTRIES} scalar_map entries")
        self.plan.rounding = ROUNDING_MODES[rounding]
        self.plan.out_of_range = OUT_OF_RANGE_MODES[out_of_range]
        for i, (key, value) in enumerate(entries):
            self.plan.entries[i].src = _checked_bits(key, src)
            self.plan.entries[i].dst = _checked_bits(value, dst)
        self.plan.n_entries = len(entries)
        if dst.kind in "iu":
            lo, hi = _bounds(src, dst)
            if src.kind == "f":
                self.plan.flo, self.plan.fhi = lo, hi
            else:
                self.plan.lo, self.plan.hi = _bits(lo, src), _bits(hi, src)
            info = np.iinfo(dst)
            self.plan.dmin, self.plan.dmax = _bits(info.min, dst), _bits(info.max, dst)
        self.src, self.dst = src, dst
        self.can_fail = _can_fail(src, dst, self.plan.out_of_range, entries)


cdef uint64_t _checked_bits(object value, object dtype) except? 0:
    """A scalar_map value as the backend takes it: an integer type takes a
    Python int in its range, a float type a Python float (float32 rounds
    it to nearest, overflowing to an infinity, as Rust's ``as`` does)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if type(value) is not int or not info.min <= value <= info.max:
            raise TypeError(f"cast_value: scalar_map value {value!r} is not a {dtype}")
        return _bits(value, dtype)
    if type(value) is not float:
        raise TypeError(f"cast_value: scalar_map value {value!r} is not a float")
    with np.errstate(over="ignore"):
        return _bits(np.array(value).astype(dtype), dtype)


def cast(cnp.ndarray src, cnp.ndarray out, CastSpec spec):
    """Cast ``src`` (of ``spec.src``) into ``out`` (of ``spec.dst``), both
    C-contiguous and of the same size. Returns `CAST_OK`, or the status of
    the first value that failed (``out`` is then partly written)."""
    if src.dtype != spec.src or out.dtype != spec.dst:
        raise TypeError(f"cast_value: {src.dtype} to {out.dtype} with a plan for "
                        f"{spec.src} to {spec.dst}")
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("cast_value: arrays must be C-contiguous, the output writeable")
    if src.size != out.size:
        raise ValueError("cast_value: input and output must have the same size")
    if src.itemsize != out.itemsize and cnp.PyArray_DATA(src) == cnp.PyArray_DATA(out):
        raise ValueError("cast_value: a cast between sizes needs an output apart from its input")
    cdef const void* s = cnp.PyArray_DATA(src)
    cdef void* d = cnp.PyArray_DATA(out)
    cdef Py_ssize_t n = src.size
    cdef CastStatus status
    with nogil:
        status = cast_run(&spec.plan, s, d, n)
    return status
