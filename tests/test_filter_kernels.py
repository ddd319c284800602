"""The native filter kernels (`zarr_fused._filters`) against numcodecs.

Each kernel must give numcodecs' bytes exactly, special values included
(NaN payloads, -0.0, infinities, integer wrap-around), release the GIL and
refuse arrays it cannot take before it runs.
"""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest

from zarr_fused import _filters

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
        pytest.param(np.zeros(4, "<i4"), np.zeros(4, "<u4"), False, TypeError, id="dtypes"),
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
