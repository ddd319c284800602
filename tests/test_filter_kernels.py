"""The native filter kernels (`zarr_fused._filters`) against numcodecs.

Each kernel must give numcodecs' bytes exactly, special values included
(NaN payloads, -0.0, infinities, integer wrap-around), release the GIL and
refuse arrays it cannot take before it runs.
"""

from __future__ import annotations

from typing import Any

import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarr_fused import _filters
from zarr_fused._filter_stages import quantize_scale

from helpers.gil import spins_during

DTYPES = ["|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"]


def sample(dtype: str, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype[1] == "f":
        value = (rng.standard_normal(size) * 1e4).astype(dtype)
        value[:8] = [-0.0, np.nan, np.inf, -np.inf, 0.0, 1e-30, -1e30, np.nan]
        # a NaN with a payload other than NumPy's
        value.view(f"<u{value.itemsize}")[7] |= 1
        return value
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
def test_delta_encode_matches_numcodecs(dtype: str) -> None:
    value = sample(dtype, 4099, 1)
    out = np.empty_like(value)
    _filters.delta(value, out, True)
    assert out.tobytes() == numcodecs.Delta(dtype=dtype).encode(value).tobytes()


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
def test_delta_decode_matches_numcodecs(dtype: str) -> None:
    encoded = sample(dtype, 4099, 2)
    out = np.empty_like(encoded)
    _filters.delta(encoded, out, False)
    assert out.tobytes() == numcodecs.Delta(dtype=dtype).decode(encoded).tobytes()


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in ("<i2", "<f8")])
def test_delta_decode_in_place(dtype: str) -> None:
    encoded = sample(dtype, 100, 3)
    expected = numcodecs.Delta(dtype=dtype).decode(encoded.copy())
    _filters.delta(encoded, encoded, False)
    assert encoded.tobytes() == expected.tobytes()


DELTA_ASTYPES = [
    ("<i4", "<i2"),
    ("<i8", "|i1"),
    ("<u2", "<i2"),
    ("<i2", "<u4"),
    ("|u1", "<i4"),
    ("<u8", "<u2"),
    ("<f8", "<f4"),
]


@pytest.mark.parametrize("encode", [True, False], ids=["encode", "decode"])
@pytest.mark.parametrize(
    ("dtype", "astype"), [pytest.param(*p, id="-".join(p)) for p in DELTA_ASTYPES]
)
def test_delta_astype_matches_numcodecs(dtype: str, astype: str, encode: bool) -> None:
    """Differences in ``dtype`` cast to ``astype`` (integers wrap); the
    decoding sums in the wider type, as NumPy's cumsum with ``out=`` does."""
    codec = numcodecs.Delta(dtype=dtype, astype=astype)
    value = sample(dtype if encode else astype, 4099, 11)
    if encode and dtype[1] != "f":  # a first element astype holds (NumPy refuses others)
        value[0] = 3
    with np.errstate(all="ignore"):
        expected = codec.encode(value) if encode else codec.decode(value)
    out = np.empty(value.shape, dtype=astype if encode else dtype)
    assert _filters.delta(value, out, encode) == _filters.FilterStatus.FILTER_OK
    assert out.tobytes() == np.asarray(expected).tobytes()


@pytest.mark.parametrize(
    ("dtype", "astype", "first"), [("<i4", "<i2", 40000), ("<u2", "<i2", 40000), ("<i2", "<u4", -1)]
)
def test_delta_astype_first_element_unfit_refused(dtype: str, astype: str, first: int) -> None:
    """A first element ``astype`` cannot hold, which NumPy refuses (an
    OverflowError from numcodecs) or wraps (negative into unsigned): the
    kernel reports it, the caller runs numcodecs' code."""
    value = np.array([first, first + 1], dtype=dtype)
    status = _filters.delta(value, np.empty(2, astype), True)
    assert status == _filters.FilterStatus.FILTER_OUT_OF_RANGE


def test_delta_single_element() -> None:
    value = np.array([-0.0], "<f4")
    out = np.empty_like(value)
    _filters.delta(value, out, True)
    assert out.tobytes() == value.tobytes()


@pytest.mark.parametrize(
    ("src", "out", "encode", "error"),
    [
        pytest.param(np.zeros(4, "<i4"), np.zeros(3, "<i4"), False, ValueError, id="short-out"),
        pytest.param(np.zeros(4, "<i4"), np.zeros(5, "<i4"), False, ValueError, id="long-out"),
        pytest.param(np.zeros(0, "<i4"), np.zeros(0, "<i4"), False, ValueError, id="empty"),
        pytest.param(np.zeros(4, "<i4"), np.zeros(4, "<f4"), False, TypeError, id="dtypes"),
        pytest.param(np.zeros(4, "<f8"), np.zeros(4, "<f4"), False, TypeError, id="f4-to-f8"),
        pytest.param(np.zeros(4, ">i4"), np.zeros(4, ">i4"), False, TypeError, id="big-endian"),
        pytest.param(np.zeros(4, "<f2"), np.zeros(4, "<f2"), False, TypeError, id="float16"),
        pytest.param(np.zeros(4, "<c8"), np.zeros(4, "<c8"), False, TypeError, id="complex"),
        pytest.param(
            np.zeros((4, 4), "<i4")[:, ::2],
            np.zeros((4, 2), "<i4"),
            False,
            ValueError,
            id="strided-src",
        ),
    ],
)
def test_delta_refuses(src: np.ndarray, out: np.ndarray, encode: bool, error: type) -> None:
    before = out.copy()
    with pytest.raises(error):
        _filters.delta(src, out, encode)
    assert out.tobytes() == before.tobytes()


def test_delta_encode_in_place_refused() -> None:
    value = np.arange(5, dtype="<i4")
    with pytest.raises(ValueError, match="apart"):
        _filters.delta(value, value, True)
    assert value.tolist() == [0, 1, 2, 3, 4]


def test_delta_read_only_output_refused() -> None:
    out = np.zeros(4, "<i4")
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _filters.delta(np.zeros(4, "<i4"), out, False)


@pytest.mark.parametrize("encode", [True, False], ids=["encode", "decode"])
def test_delta_releases_the_gil(encode: bool) -> None:
    value = np.arange(50 * 2**20 // 8, dtype="<i8")
    out = np.empty_like(value)
    assert spins_during(lambda: _filters.delta(value, out, encode), attempts=5) > 1000


# numcodecs.fixedscaleoffset: float32/float64 to an integer type

FSO_TYPES = ["|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]
FSO_PARAMS = [
    pytest.param(273.15, 100.0, id="kelvin"),
    pytest.param(0, 2, id="int-scale"),
    pytest.param(-50.5, 0.5, id="half"),
    pytest.param(7, 1000, id="milli"),
]


def in_range(dtype: str, astype: str, offset: float, scale: float, seed: int) -> np.ndarray:
    """Values whose encoding fits ``astype`` (by numcodecs' arithmetic),
    with halves to round and the ends of its range."""
    info = np.iinfo(astype)
    bits = 8 * info.dtype.itemsize
    lo, hi = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1)) if info.min else (0.0, 2.0**bits)
    rng = np.random.default_rng(seed)
    steps = rng.integers(max(info.min, -(2**52)), min(info.max, 2**52), size=2000).astype("<f8")
    steps[:4] = [lo, hi - 1, 0, 1]
    steps[4:1000] += 0.5  # ties: rounded half to even
    value = (steps / scale + offset).astype(dtype)
    rounded = np.around((value - offset) * scale)
    return value[(rounded >= lo) & (rounded < hi)]


@pytest.mark.parametrize(("offset", "scale"), FSO_PARAMS)
@pytest.mark.parametrize("astype", [pytest.param(a, id=a) for a in FSO_TYPES])
@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_fixedscaleoffset_encode_matches_numcodecs(
    dtype: str, astype: str, offset: float, scale: float
) -> None:
    codec = numcodecs.FixedScaleOffset(offset=offset, scale=scale, dtype=dtype, astype=astype)
    value = in_range(dtype, astype, offset, scale, 5)
    assert value.size > 1000
    out = np.empty(value.shape, astype)
    assert (
        _filters.fixedscaleoffset_encode(value, out, offset, scale)
        == _filters.FilterStatus.FILTER_OK
    )
    assert out.tobytes() == codec.encode(value).tobytes()


@pytest.mark.parametrize(("offset", "scale"), FSO_PARAMS)
@pytest.mark.parametrize("astype", [pytest.param(a, id=a) for a in FSO_TYPES])
@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_fixedscaleoffset_decode_matches_numcodecs(
    dtype: str, astype: str, offset: float, scale: float
) -> None:
    codec = numcodecs.FixedScaleOffset(offset=offset, scale=scale, dtype=dtype, astype=astype)
    encoded = sample(astype, 3001, 6)
    out = np.empty(encoded.shape, dtype)
    _filters.fixedscaleoffset_decode(encoded, out, offset, scale)
    assert out.tobytes() == codec.decode(encoded).tobytes()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(np.nan, id="nan"),
        pytest.param(np.inf, id="inf"),
        pytest.param(-np.inf, id="-inf"),
        pytest.param(400.0, id="above"),
        pytest.param(-129.0, id="below"),
        pytest.param(127.5, id="rounds-above"),
    ],
)
def test_fixedscaleoffset_encode_reports_out_of_range(bad: float) -> None:
    value = np.linspace(-100, 100, 50)
    value[17] = bad
    out = np.empty(value.shape, "|i1")
    assert (
        _filters.fixedscaleoffset_encode(value, out, 0.0, 1.0)
        == _filters.FilterStatus.FILTER_OUT_OF_RANGE
    )


def test_fixedscaleoffset_encode_range_ends_fit() -> None:
    value = np.array([-128.0, 127.0, -128.4, 127.4, 0.5, -0.5, 1.5])
    out = np.empty(value.shape, "|i1")
    assert _filters.fixedscaleoffset_encode(value, out, 0.0, 1.0) == _filters.FilterStatus.FILTER_OK
    assert out.tolist() == [-128, 127, -128, 127, 0, 0, 2]


@pytest.mark.parametrize(
    ("src", "out", "error"),
    [
        pytest.param(np.zeros(4, "<f8"), np.zeros(3, "<i2"), ValueError, id="short-out"),
        pytest.param(np.zeros(4, "<f8"), np.zeros(4, "<f4"), TypeError, id="float-out"),
        pytest.param(np.zeros(4, "<i4"), np.zeros(4, "<i2"), TypeError, id="int-in"),
        pytest.param(np.zeros(4, ">f8"), np.zeros(4, "<i2"), TypeError, id="big-endian"),
        pytest.param(np.zeros(4, "<f2"), np.zeros(4, "<i2"), TypeError, id="float16"),
        pytest.param(np.zeros((4, 4), "<f8")[:, ::2], np.zeros(8, "<i2"), ValueError, id="strided"),
    ],
)
def test_fixedscaleoffset_encode_refuses(src: np.ndarray, out: np.ndarray, error: type) -> None:
    before = out.copy()
    with pytest.raises(error):
        _filters.fixedscaleoffset_encode(src, out, 0.0, 1.0)
    assert out.tobytes() == before.tobytes()


@pytest.mark.parametrize(
    ("src", "out", "error"),
    [
        pytest.param(np.zeros(4, "<i2"), np.zeros(5, "<f8"), ValueError, id="long-out"),
        pytest.param(np.zeros(4, "<f4"), np.zeros(4, "<f8"), TypeError, id="float-in"),
        pytest.param(np.zeros(4, "<i2"), np.zeros(4, "<i4"), TypeError, id="int-out"),
        pytest.param(np.zeros(4, ">i2"), np.zeros(4, "<f8"), TypeError, id="big-endian"),
    ],
)
def test_fixedscaleoffset_decode_refuses(src: np.ndarray, out: np.ndarray, error: type) -> None:
    before = out.copy()
    with pytest.raises(error):
        _filters.fixedscaleoffset_decode(src, out, 0.0, 1.0)
    assert out.tobytes() == before.tobytes()


# numcodecs.bitround and numcodecs.quantize: float chunks, encoding only


def float_sample(dtype: str, size: int, seed: int) -> np.ndarray:
    """Floats over many magnitudes, with NaNs (one with a payload),
    infinities, signed zeros and subnormals."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # float16's range ends at 65504: infinities
        value = (rng.standard_normal(size) * 10.0 ** rng.integers(-6, 6, size)).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    value[:9] = [-0.0, np.nan, np.inf, -np.inf, 0.0, tiny, -tiny, np.finfo(dtype).max, np.nan]
    value.view(f"<u{value.itemsize}")[8] |= 1
    return value


@pytest.mark.parametrize("keepbits", [0, 1, 5, 9])
def test_bitround_f2_matches_numcodecs(keepbits: int) -> None:
    value = float_sample("<f2", 3000, keepbits)
    out = np.empty_like(value)
    _filters.bitround(value, out, 10 - keepbits)
    assert out.tobytes() == numcodecs.BitRound(keepbits=keepbits).encode(value).tobytes()


@pytest.mark.parametrize("keepbits", [0, 1, 7, 10, 16, 22])
def test_bitround_f4_matches_numcodecs(keepbits: int) -> None:
    value = float_sample("<f4", 3000, keepbits)
    out = np.empty_like(value)
    _filters.bitround(value, out, 23 - keepbits)
    assert out.tobytes() == numcodecs.BitRound(keepbits=keepbits).encode(value).tobytes()


@pytest.mark.parametrize("keepbits", [0, 1, 10, 23, 40, 51])
def test_bitround_f8_matches_numcodecs(keepbits: int) -> None:
    value = float_sample("<f8", 3000, keepbits)
    out = np.empty_like(value)
    _filters.bitround(value, out, 52 - keepbits)
    assert out.tobytes() == numcodecs.BitRound(keepbits=keepbits).encode(value).tobytes()


def test_bitround_in_place() -> None:
    value = float_sample("<f4", 100, 9)
    expected = numcodecs.BitRound(keepbits=3).encode(value).tobytes()
    _filters.bitround(value, value, 20)
    assert value.tobytes() == expected


@pytest.mark.parametrize(
    ("src", "maskbits", "error"),
    [
        pytest.param(np.zeros(4, "<f4"), 0, ValueError, id="none-cleared"),
        pytest.param(np.zeros(4, "<f4"), 24, ValueError, id="beyond-mantissa"),
        pytest.param(np.zeros(4, "<f2"), 11, ValueError, id="beyond-f2"),
        pytest.param(np.zeros(4, "<i4"), 3, TypeError, id="integers"),
        pytest.param(np.zeros(4, ">f4"), 3, TypeError, id="big-endian"),
    ],
)
def test_bitround_refuses(src: np.ndarray, maskbits: int, error: type) -> None:
    out = np.ones_like(src)
    with pytest.raises(error):
        _filters.bitround(src, out, maskbits)
    assert np.all(out == 1)


def test_bitround_output_type_refused() -> None:
    with pytest.raises(TypeError):
        _filters.bitround(np.zeros(4, "<f4"), np.zeros(4, "<f8"), 3)


@pytest.mark.parametrize("digits", [-3, 0, 1, 3, 6, 10])
@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_quantize_matches_numcodecs(dtype: str, digits: int) -> None:
    value = float_sample(dtype, 3000, digits + 20)
    out = np.empty_like(value)
    _filters.quantize(value, out, quantize_scale(digits))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = numcodecs.Quantize(digits=digits, dtype=dtype).encode(value)
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("digits", [pytest.param(d, id=str(d)) for d in range(-8, 25)])
def test_quantize_scale_matches_numcodecs(digits: int) -> None:
    # the power of two numcodecs multiplies by: quantizing 1.0 / 2**60 to it
    value = np.array([2.0**-60, 1.0], "<f8")
    scale = quantize_scale(digits)
    expected = numcodecs.Quantize(digits=digits, dtype="<f8").encode(value)
    assert np.array_equal(np.around(value * scale) / scale, expected)


@pytest.mark.parametrize(
    ("src", "out", "error"),
    [
        pytest.param(np.zeros(4, "<f4"), np.zeros(4, "<f8"), TypeError, id="types"),
        pytest.param(np.zeros(4, "<f2"), np.zeros(4, "<f2"), TypeError, id="float16"),
        pytest.param(np.zeros(4, "<f8"), np.zeros(2, "<f8"), ValueError, id="short-out"),
    ],
)
def test_quantize_refuses(src: np.ndarray, out: np.ndarray, error: type) -> None:
    with pytest.raises(error):
        _filters.quantize(src, out, 8.0)


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda v, o: _filters.fixedscaleoffset_encode(v, o, 3.0, 10.0), id="fso-enc"),
        pytest.param(lambda v, o: _filters.bitround(v, v, 20), id="bitround"),
        pytest.param(lambda v, o: _filters.quantize(v, v, 1024.0), id="quantize"),
    ],
)
def test_float_kernels_release_the_gil(run: Any) -> None:
    value = np.zeros(50 * 2**20 // 8, dtype="<f8")
    out = np.empty(value.shape, "<i8")
    assert spins_during(lambda: run(value, out), attempts=5) > 1000


def test_fixedscaleoffset_decode_releases_the_gil() -> None:
    encoded = np.zeros(50 * 2**20 // 8, dtype="<i8")
    out = np.empty(encoded.shape, "<f8")
    assert (
        spins_during(lambda: _filters.fixedscaleoffset_decode(encoded, out, 3.0, 10.0), attempts=5)
        > 1000
    )


# -- zarr's scale_offset and numcodecs' astype ------------------------------------------

SCALE_OFFSETS = [(0, 1), (273.15, 0.1), (-20, 4), (1.5, 100), (3, -2.5)]


@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
@pytest.mark.parametrize(("offset", "scale"), SCALE_OFFSETS)
@pytest.mark.parametrize("encode", [True, False], ids=["encode", "decode"])
def test_scale_offset_matches_zarr(dtype: str, offset: float, scale: float, encode: bool) -> None:
    from zarr.codecs import scale_offset as zso

    value = sample(dtype, 4099, 7)
    o, s = np.dtype(dtype).type(offset), np.dtype(dtype).type(scale)
    with np.errstate(all="ignore"):
        if encode:
            expected = zso._encode(value, o, s)
        else:
            expected = zso._decode(value, o, s, scale_repr=scale)
    out = np.empty_like(value)
    _filters.scale_offset(value, out, float(o), float(s), encode)
    assert out.tobytes() == expected.tobytes()


# integers: zarr computes in int64 (which wraps) and checks the type's
# range; uint64 exactly; decoding first checks the division is exact
INT_SCALE_OFFSETS = [(0, 1), (7, 1), (3, 2), (-5, -3), (1, -1), (100, 7), (-1, -1)]


def zarr_scale_offset(value: np.ndarray, offset: int, scale: int, encode: bool) -> Any:
    """zarr's result for ``value``, or the ValueError it raises."""
    from zarr.codecs import scale_offset as zso

    o, s = value.dtype.type(offset), value.dtype.type(scale)
    try:
        with np.errstate(all="ignore"):
            if encode:
                return zso._encode(value, o, s)
            return zso._decode(value, o, s, scale_repr=scale)
    except ValueError as error:
        return error


def int_scale_offset_cases() -> list[Any]:
    cases = []
    for dtype in FSO_TYPES:
        for offset, scale in INT_SCALE_OFFSETS:
            if dtype[1] == "u" and (offset < 0 or scale < 0):
                continue
            for encode in (True, False):
                name = f"{dtype}-{offset}-{scale}-{'encode' if encode else 'decode'}"
                cases.append(pytest.param(dtype, offset, scale, encode, id=name))
    return cases


@pytest.mark.parametrize(("dtype", "offset", "scale", "encode"), int_scale_offset_cases())
def test_scale_offset_int_matches_zarr(dtype: str, offset: int, scale: int, encode: bool) -> None:
    """Values zarr takes: the same bytes (int64 wrap-around included)."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(abs(offset) + 10 * abs(scale))
    low, high = int(info.min), int(info.max)
    # the quotients q with q * scale in the type's range
    q_lo, q_hi = (
        sorted((-(-low // scale), high // scale))
        if scale > 0
        else sorted((-(-high // scale), low // scale))
    )
    if dtype == "<i8":  # zarr's int64 arithmetic wraps, unchecked
        drawn = rng.integers(low, high, 4099, dtype=dtype, endpoint=True)
        value = drawn if encode else (drawn // scale) * scale
    elif encode:  # x - offset among the quotients, x in range
        lo, hi = max(q_lo + offset, low), min(q_hi + offset, high)
        value = rng.integers(lo, hi, 4099, dtype=dtype, endpoint=True)
    else:  # q + offset in range, stored q * scale
        lo, hi = max(q_lo, low - offset), min(q_hi, high - offset)
        q = rng.integers(lo, hi, 4099, dtype="<i8" if hi < 2**63 else dtype, endpoint=True)
        value = (q.astype(object) * scale).astype(dtype)
    expected = zarr_scale_offset(value, offset, scale, encode)
    assert not isinstance(expected, ValueError)
    out = np.empty_like(value)
    assert (
        _filters.scale_offset(value, out, offset, scale, encode) == _filters.FilterStatus.FILTER_OK
    )
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize("offset", [2**62, -(2**63), 2**63 - 1])
def test_scale_offset_int64_offset_only_wraps_as_zarr(offset: int) -> None:
    """Decoding int64 with scale 1 (its own loop): the sums wrap as zarr's
    int64 arithmetic does."""
    info = np.iinfo("<i8")
    edges = [info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max]
    drawn = np.random.default_rng(62).integers(info.min, info.max, 4099, dtype="<i8")
    value = np.concatenate([np.array(edges, dtype="<i8"), drawn])
    expected = zarr_scale_offset(value, offset, 1, False)
    out = np.empty_like(value)
    assert _filters.scale_offset(value, out, offset, 1, False) == _filters.FilterStatus.FILTER_OK
    assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    ("dtype", "values", "offset", "scale", "encode"),
    [
        pytest.param("|i1", [100, 1], 0, 2, True, id="i1-overflow"),
        pytest.param("|u1", [3, 2], 3, 1, True, id="u1-below-offset"),
        pytest.param("<u4", [2**32 - 1], 0, 2**32 - 1, True, id="u4-int64-wraps-negative"),
        pytest.param("<u8", [2**63], 0, 2, True, id="u8-overflow"),
        pytest.param("<u8", [1], 2, 1, True, id="u8-below-offset"),
        pytest.param("<i2", [6, 7], 0, 3, False, id="i2-remainder"),
        pytest.param("<u8", [7], 0, 2, False, id="u8-remainder"),
        pytest.param("<u8", [2**64 - 1], 1, 1, False, id="u8-decode-overflow"),
        pytest.param("<u2", [65535], 1, 1, False, id="u2-decode-overflow"),
    ],
)
def test_scale_offset_int_refuses_what_zarr_refuses(
    dtype: str, values: list[int], offset: int, scale: int, encode: bool
) -> None:
    value = np.array(values, dtype=dtype)
    assert isinstance(zarr_scale_offset(value, offset, scale, encode), ValueError)
    status = _filters.scale_offset(value, np.empty_like(value), offset, scale, encode)
    assert status == _filters.FilterStatus.FILTER_OUT_OF_RANGE


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from(FSO_TYPES),
    offset=st.integers(-(2**64), 2**64),
    scale=st.integers(-(2**64), 2**64),
    encode=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_scale_offset_int_property(
    dtype: str, offset: int, scale: int, encode: bool, seed: int
) -> None:
    """Any parameters the type holds, any values: the kernel refuses what
    zarr refuses and gives zarr's bytes for the rest."""
    info = np.iinfo(dtype)
    offset = min(max(offset, int(info.min)), int(info.max))
    scale = min(max(scale, int(info.min)), int(info.max)) or 1
    value = sample(dtype, 64, seed)
    value[::3] >>= 4 * value.itemsize  # small values, which often fit
    expected = zarr_scale_offset(value, offset, scale, encode)
    out = np.empty_like(value)
    status = _filters.scale_offset(value, out, offset, scale, encode)
    if isinstance(expected, ValueError):
        assert status == _filters.FilterStatus.FILTER_OUT_OF_RANGE
    else:
        assert status == _filters.FilterStatus.FILTER_OK
        assert out.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    ("offset", "scale"),
    [
        pytest.param(0.5, 1, id="float-offset"),
        pytest.param(300, 1, id="offset-outside-i1"),
        pytest.param(0, 0, id="zero-scale"),
    ],
)
def test_scale_offset_int_parameters_refused(offset: Any, scale: Any) -> None:
    with pytest.raises(ValueError):
        _filters.scale_offset(np.zeros(4, "|i1"), np.zeros(4, "|i1"), offset, scale, True)


ASTYPE_TYPES = [*FSO_TYPES, "<f4", "<f8"]


def astype_values(decoded: str, encoded: str, seed: int) -> np.ndarray:
    """Values of ``decoded`` whose cast to ``encoded`` NumPy defines (for
    a float to an integer type: an integral part the type holds)."""
    if decoded[1] != "f":
        return sample(decoded, 4099, seed)
    value = sample(decoded, 4099, seed)
    if encoded[1] != "f":
        info = np.iinfo(encoded)
        lo, hi = max(float(info.min), -1e15), min(float(info.max), 1e15)
        rng = np.random.default_rng(seed)
        value = rng.uniform(lo, hi, 4099).astype(decoded)
        value[:4] = [-0.0, 0.75, -0.75, lo]
        value = value[(value >= lo) & (value < hi)]
    return value


@pytest.mark.parametrize("encoded", [pytest.param(d, id=d) for d in ASTYPE_TYPES])
@pytest.mark.parametrize("decoded", [pytest.param(d, id=d) for d in ASTYPE_TYPES])
def test_astype_matches_numcodecs(decoded: str, encoded: str) -> None:
    """Every pair, both ways: NumPy's casts (integers wrap, floats round)."""
    codec = numcodecs.AsType(encode_dtype=encoded, decode_dtype=decoded)
    value = astype_values(decoded, encoded, 8)
    with np.errstate(all="ignore"):
        expected = codec.encode(value)
    out = np.empty(value.shape, dtype=encoded)
    assert _filters.astype(value, out) == _filters.FilterStatus.FILTER_OK
    assert out.tobytes() == np.asarray(expected).tobytes()
    stored = astype_values(encoded, decoded, 9)
    back = np.empty(stored.shape, dtype=decoded)
    assert _filters.astype(stored, back) == _filters.FilterStatus.FILTER_OK
    with np.errstate(all="ignore"):
        assert back.tobytes() == np.asarray(codec.decode(stored)).tobytes()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 128.0, -129.0, 1e30])
@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_astype_float_to_int_refuses_unfit(dtype: str, bad: float) -> None:
    """C leaves these casts undefined (NumPy's result is the platform's)."""
    value = np.array([1.0, bad, 2.0]).astype(dtype)
    status = _filters.astype(value, np.empty(3, "|i1"))
    assert status == _filters.FilterStatus.FILTER_OUT_OF_RANGE


def test_astype_float_to_int_range_ends_fit() -> None:
    value = np.array([127.99, -128.99, -0.5, 255.5])
    out = np.empty(2, "|i1")
    assert _filters.astype(value[:2], out) == _filters.FilterStatus.FILTER_OK
    assert out.tolist() == [127, -128]
    out = np.empty(2, "|u1")
    assert _filters.astype(value[2:], out) == _filters.FilterStatus.FILTER_OK
    assert out.tolist() == [0, 255]


def test_astype_refuses_other_types_and_aliasing() -> None:
    value = np.arange(8, dtype="<f8")
    with pytest.raises(TypeError):
        _filters.astype(value, np.empty(8, dtype="<f2"))
    with pytest.raises(TypeError):
        _filters.astype(value, np.empty(8, dtype=">i4"))
    with pytest.raises(ValueError, match="apart"):
        _filters.astype(value, value.view("<f4")[:8])


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda v, o: _filters.astype(v, o), id="astype-i8-f8"),
        pytest.param(lambda v, o: _filters.scale_offset(v, v, 3, 2, True), id="scale-offset-i8"),
    ],
)
def test_int_kernels_release_the_gil(run: Any) -> None:
    value = np.zeros(50 * 2**20 // 8, dtype="<i8")
    out = np.empty(value.shape, "<f8")
    assert spins_during(lambda: run(value, out), attempts=5) > 1000


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(("scale_offset", "<i8", 5, 1), id="i8-scale-1"),
        pytest.param(("scale_offset", "<i8", -(2**63), -1), id="i8-scale-minus-1"),
        pytest.param(("scale_offset", "<i2", -1, -1), id="i2-negate"),
        pytest.param(("scale_offset", "<u4", 0, 1), id="u4-identity"),
        pytest.param(("astype", "<f8", "<i4"), id="float-to-int"),
        pytest.param(("astype", "<i8", "<u1"), id="int-narrowing"),
        pytest.param(("delta", "<i4", "<i2"), id="delta-astype-int"),
        pytest.param(("delta", "<f8", "<f4"), id="delta-astype-float"),
    ],
)
def test_filter_chain_takes_steps_that_decode_everything(step: tuple[Any, ...]) -> None:
    assert _filters.FilterChain([step]).n == 1


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([("delta", "<f2")], id="delta-f2"),
        pytest.param([("fixedscaleoffset", "<f8", "<f4", 0.0, 1.0)], id="fso-to-float"),
        pytest.param([("bitround", "<f4", 24)], id="bitround-too-many-bits"),
        pytest.param([("scale_offset", "<i4", 0.0, 1.0)], id="scale-offset-int-float-params"),
        pytest.param([("scale_offset", "<i4", 0, 3)], id="scale-offset-remainder"),
        pytest.param([("scale_offset", "<u2", 1, 1)], id="scale-offset-out-of-range"),
        pytest.param([("astype", "<u1", "<f4")], id="astype-decodes-float-to-int"),
        pytest.param([("astype", "<f8", "<f2")], id="astype-f2"),
        pytest.param([("astype", "<f8", "<f4"), ("delta", "<f8")], id="mismatched-steps"),
        pytest.param([], id="empty"),
    ],
)
def test_filter_chain_refuses_bad_steps(steps: list[Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        _filters.FilterChain(steps)


def test_batch_refused_chunk_without_hook_names_key() -> None:
    """A batch with filters that meets a chunk fixedscaleoffset cannot
    encode, and has no hook to encode it otherwise, raises naming it."""
    from zarr_fused._codec_batch import ChunkLayout, EncodeBatch
    from zarr_fused._codecs import ChainKernel

    kernel = ChainKernel(compressor=None, outer_crcs=0, inner_crcs=0, itemsize=2, swap_unit=0)
    batch = EncodeBatch(kernel, 1, 1)
    batch.set_filters(_filters.FilterChain([("fixedscaleoffset", "<f8", "<i2", 0.0, 1.0)]))
    batch.add(np.array([1.0, np.nan]), ChunkLayout((2,), 8), False, "c/0")
    with pytest.raises(ValueError, match="'c/0': the filters refused"):
        batch.run()


@pytest.mark.parametrize(
    ("steps", "step"),
    [
        pytest.param([("scale_offset", "<i8", 1000, -1)], 0, id="scale-offset"),
        pytest.param([("fixedscaleoffset", "<f8", "<i2", 280.0, 100.0)], 0, id="fso"),
        pytest.param([("astype", "<f8", "<f4")], 0, id="astype"),
        pytest.param([("bitround", "<f4", 10), ("astype", "<f4", "<f8")], 1, id="bitround-astype"),
        pytest.param([("delta", "<i4")], -1, id="delta"),
        pytest.param([("bitround", "<f4", 10)], -1, id="bitround-alone"),
        pytest.param([("astype", "<f8", "<f4"), ("astype", "<f4", "<f8")], -1, id="two-steps"),
    ],
)
def test_filter_chain_elementwise_step(steps: list[Any], step: int) -> None:
    assert _filters.FilterChain(steps).elementwise_step == step


FSO = ("fixedscaleoffset", "<f8", "<i2", 280.0, 100.0)
FSO_CODEC = numcodecs.FixedScaleOffset(offset=280, scale=100, dtype="<f8", astype="<i2")


def _batch_decode(
    stored: np.ndarray,
    chunk_selection: Any,
    out: np.ndarray,
    out_selection: Any,
    refuse: Any = None,
    steps: tuple[Any, ...] = (FSO,),
) -> None:
    """Decode the C-order chunk of encoded items ``stored`` (no compressor)
    through a filtered `DecodeBatch` into ``out[out_selection]``."""
    from zarr_fused._codec_batch import ChunkLayout, DecodeBatch
    from zarr_fused._codecs import ChainKernel

    filters = _filters.FilterChain(list(steps), refusing=refuse is not None)
    kernel = ChainKernel(
        compressor=None, outer_crcs=0, inner_crcs=0, itemsize=stored.itemsize, swap_unit=0
    )
    batch = DecodeBatch(kernel, 1, out.ndim)
    batch.set_filters(filters, refuse)
    layout = ChunkLayout(stored.shape, out.itemsize)
    payload = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    assert batch.add(payload, layout, chunk_selection, out, out_selection, (), "c/0")
    batch.run()


# rows of 48 float64 (384 bytes) go straight into the output; a step along
# the rows, rows under 256 bytes or an F-order output through the scratch
ROW_CASES = [
    pytest.param((slice(0, 5), slice(0, 48)), (slice(1, 6), slice(10, 58)), "C", id="whole"),
    pytest.param((slice(1, 4), slice(3, 45)), (slice(0, 3), slice(0, 42)), "C", id="part"),
    pytest.param((slice(0, 5, 2), slice(0, 48)), (slice(2, 8, 2), slice(1, 49)), "C", id="step"),
    pytest.param((slice(0, 5), slice(0, 48, 2)), (slice(0, 5), slice(0, 24)), "C", id="row-step"),
    pytest.param((slice(0, 5), slice(8, 28)), (slice(0, 5), slice(0, 20)), "C", id="short-rows"),
    pytest.param((slice(0, 5), slice(0, 48)), (slice(1, 6), slice(10, 58)), "F", id="f-order"),
]


@pytest.mark.parametrize(("chunk_selection", "out_selection", "order"), ROW_CASES)
def test_batch_filters_rows_into_place(
    chunk_selection: tuple[slice, ...], out_selection: tuple[slice, ...], order: str
) -> None:
    rng = np.random.default_rng(11)
    values = (280 + rng.standard_normal((5, 48))).astype("<f8")
    stored = np.frombuffer(FSO_CODEC.encode(values), "<i2").reshape(values.shape)
    out = np.full((8, 100), -7.0, order=order)
    expected = out.copy()
    expected[out_selection] = FSO_CODEC.decode(stored.tobytes()).reshape(5, 48)[chunk_selection]
    _batch_decode(stored, chunk_selection, out, out_selection)
    np.testing.assert_array_equal(out, expected)


def test_batch_filters_rows_into_place_3d() -> None:
    rng = np.random.default_rng(12)
    values = (280 + rng.standard_normal((3, 4, 40))).astype("<f8")
    stored = np.frombuffer(FSO_CODEC.encode(values), "<i2").reshape(values.shape)
    out = np.zeros((4, 6, 50))
    chunk_selection = (slice(1, 3), slice(0, 4), slice(2, 38))
    out_selection = (slice(0, 2), slice(1, 5), slice(10, 46))
    expected = out.copy()
    expected[out_selection] = FSO_CODEC.decode(stored.tobytes()).reshape(3, 4, 40)[chunk_selection]
    _batch_decode(stored, chunk_selection, out, out_selection)
    np.testing.assert_array_equal(out, expected)


def test_batch_row_refused_midway_takes_the_hooks_values() -> None:
    """A row the step refuses after others went into the output (rows of
    320 bytes go straight there): the region ends up holding the hook's
    values, every row of it."""
    stored = np.arange(5 * 80, dtype="<i4").reshape(5, 80) * 3
    stored[3, 7] = 1  # scale 3 leaves a remainder: refused
    hooked = np.arange(5 * 80, dtype="<i4").reshape(5, 80) + 10_000
    calls: list[str] = []

    def refuse(payload: np.ndarray, where: str) -> np.ndarray:
        calls.append(where)
        assert payload.tobytes() == stored.tobytes()
        return hooked

    out = np.zeros((5, 92), "<i4")
    _batch_decode(
        stored,
        (slice(0, 5), slice(0, 80)),
        out,
        (slice(0, 5), slice(12, 92)),
        refuse,
        (("scale_offset", "<i4", 0, 3),),
    )
    assert calls == ["'c/0'"]
    np.testing.assert_array_equal(out[:, 12:], hooked)
    np.testing.assert_array_equal(out[:, :12], 0)


@pytest.mark.parametrize(
    ("steps", "row_step", "in_order"),
    [
        pytest.param([FSO], 0, False, id="fso"),
        pytest.param(
            [("bitround", "<f4", 10), ("astype", "<f4", "<f8")], 1, False, id="bitround-astype"
        ),
        pytest.param([("bitround", "<f4", 10)], 0, False, id="bitround-alone"),
        pytest.param([("delta", "<i4")], 0, True, id="delta"),
        pytest.param([FSO, ("delta", "<i2")], 0, False, id="fso-delta"),
        pytest.param([("delta", "<i4"), ("astype", "<i4", "<i8")], 0, True, id="delta-astype"),
        pytest.param([("delta", "<i4", "<i2")], -1, False, id="delta-into-i2"),
    ],
)
def test_filter_chain_row_step(steps: list[Any], row_step: int, in_order: bool) -> None:
    chain = _filters.FilterChain(steps)
    assert (chain.row_step, chain.rows_in_order) == (row_step, in_order)


# the steps of a chain, numcodecs' filters that decode it, the values' type
# and the encoded items'
ROW_CHAINS = {
    "delta-i4": ([("delta", "<i4")], lambda: [numcodecs.Delta(dtype="<i4")], "<i4", "<i4"),
    "fso-delta": (
        [FSO, ("delta", "<i2")],
        lambda: [FSO_CODEC, numcodecs.Delta(dtype="<i2")],
        "<f8",
        "<i2",
    ),
}


def _chain_decoded(name: str, stored: np.ndarray) -> np.ndarray:
    """numcodecs' decoding of the chunk of encoded items ``stored``."""
    _, codecs, dtype, _ = ROW_CHAINS[name]
    data: Any = stored.tobytes()
    for codec in reversed(codecs()):
        data = codec.decode(data)
    return np.frombuffer(np.asarray(data).tobytes(), dtype).reshape(stored.shape)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in ROW_CHAINS])
@pytest.mark.parametrize(("chunk_selection", "out_selection", "order"), ROW_CASES)
def test_batch_chain_rows_into_place(
    name: str, chunk_selection: tuple[slice, ...], out_selection: tuple[slice, ...], order: str
) -> None:
    """A chain whose first step decodes row by row after the others
    (delta's running sum only over a whole chunk's rows, in order)."""
    steps, _, dtype, encoded = ROW_CHAINS[name]
    stored = np.random.default_rng(13).integers(-50, 50, size=(5, 48)).astype(encoded)
    out = np.full((8, 100), -7, dtype=dtype, order=order)
    expected = out.copy()
    expected[out_selection] = _chain_decoded(name, stored)[chunk_selection]
    _batch_decode(stored, chunk_selection, out, out_selection, steps=tuple(steps))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in ROW_CHAINS])
@pytest.mark.parametrize(
    ("out_shape", "chunk_selection", "out_selection"),
    [
        pytest.param((8, 48), (slice(0, 5), slice(0, 48)), (slice(2, 7), slice(None)), id="2d"),
        pytest.param(
            (2, 5, 48), (slice(0, 5), slice(0, 48)), (1, slice(None), slice(None)), id="int-index"
        ),
        pytest.param((8, 48), (slice(1, 4), slice(0, 48)), (slice(0, 3), slice(None)), id="part"),
    ],
)
def test_batch_chain_rows_run_on(
    name: str,
    out_shape: tuple[int, ...],
    chunk_selection: tuple[Any, ...],
    out_selection: tuple[Any, ...],
) -> None:
    """Rows contiguous on both sides run on into one: values as numcodecs'."""
    steps, _, dtype, encoded = ROW_CHAINS[name]
    stored = np.random.default_rng(14).integers(-50, 50, size=(5, 48)).astype(encoded)
    out = np.full(out_shape, -7, dtype=dtype)
    expected = out.copy()
    expected[out_selection] = _chain_decoded(name, stored)[chunk_selection]
    _batch_decode(stored, chunk_selection, out, out_selection, steps=tuple(steps))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in ROW_CHAINS])
@pytest.mark.parametrize(
    ("out_shape", "out_selection"),
    [
        pytest.param((5, 6, 9), (slice(1, 4), slice(2, 6), slice(3, 8)), id="3d"),
        pytest.param((5, 2, 6, 9), (slice(1, 4), 1, slice(2, 6), slice(3, 8)), id="int-index"),
        pytest.param((3, 4, 5), (slice(None), slice(None), slice(None)), id="run-on"),
    ],
)
def test_batch_chain_short_rows_3d(
    name: str, out_shape: tuple[int, ...], out_selection: tuple[Any, ...]
) -> None:
    """A whole 3-D chunk of rows of 5 items: the rows along one axis go to
    the chain in one call, the outer axis steps between such calls (delta's
    sum carried across both); values as numcodecs'."""
    steps, _, dtype, encoded = ROW_CHAINS[name]
    stored = np.random.default_rng(15).integers(-50, 50, size=(3, 4, 5)).astype(encoded)
    out = np.full(out_shape, -7, dtype=dtype)
    expected = out.copy()
    expected[out_selection] = _chain_decoded(name, stored)
    whole = (slice(0, 3), slice(0, 4), slice(0, 5))
    _batch_decode(stored, whole, out, out_selection, steps=tuple(steps))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param((("delta", "<i4"), ("scale_offset", "<i4", 0, 3)), id="refused-before-rows"),
        pytest.param((("scale_offset", "<i4", 0, 3), ("delta", "<i4")), id="refused-in-a-row"),
    ],
)
def test_batch_chain_refused_takes_the_hooks_values(steps: tuple[Any, ...]) -> None:
    """A refusing chain of two steps: the refusal in the steps decoded
    first or in a row written in place, the region holds the hook's values."""
    stored = np.zeros((5, 80), "<i4")
    stored[3, 7] = 1  # a remainder of 3, delta-decoded or not
    hooked = np.arange(5 * 80, dtype="<i4").reshape(5, 80) + 10_000

    def refuse(payload: np.ndarray, where: str) -> np.ndarray:
        assert payload.tobytes() == stored.tobytes()
        return hooked

    out = np.zeros((5, 92), "<i4")
    _batch_decode(
        stored, (slice(0, 5), slice(0, 80)), out, (slice(0, 5), slice(12, 92)), refuse, steps
    )
    np.testing.assert_array_equal(out[:, 12:], hooked)
    np.testing.assert_array_equal(out[:, :12], 0)
