"""zarr_fused._dtypes, and the arrays it exists for: datetime64 /
timedelta64 without a unit in big-endian order, where NumPy neither
allocates nor casts in the requested byte order."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from zarr_fused._dtypes import element_bytes, empty, in_byte_order

from helpers import BATCHED, FUSED, chunk_items, make_store, with_pipeline

# NumPy deprecates implicit unit-less datetime conversions; the values here
# are built from int64 views and never rely on them.
pytestmark = pytest.mark.filterwarnings("ignore:The 'generic' unit:DeprecationWarning")

DTYPES = [">M8", ">m8", "<M8", "<m8", ">M8[s]", ">m8[10ms]", ">i8"]


def _int_view(values: np.ndarray) -> np.ndarray:
    """The stored integer of each element, whatever the label's byte order."""
    return values.view(values.dtype.byteorder.replace("|", "=") + "i8")


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_keeps_the_byte_order(dtype: str) -> None:
    assert empty((3, 2), np.dtype(dtype)).dtype == np.dtype(dtype)
    assert empty((), np.dtype(dtype)).dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_element_bytes_is_the_value_in_the_dtypes_byte_order(dtype: str) -> None:
    d = np.dtype(dtype)
    for count in (0, 5, -(2**63)):
        expected = np.array([count], dtype=d.byteorder + "i8").tobytes()
        assert element_bytes(_fill_value(dtype, count), d) == expected, (dtype, count)


def test_element_bytes_of_other_kinds_matches_numpy() -> None:
    for dtype, value in [
        (">f4", np.nan),
        ("<c8", 1 - 2j),
        (">U3", "ab"),
        ("S2", b"x"),
        ("?", True),
        (">u2", 7),
    ]:
        element = np.empty((), dtype)
        element[()] = value
        assert element_bytes(value, np.dtype(dtype)) == element.tobytes(), dtype


@pytest.mark.parametrize("dtype", [">M8", ">m8"])
def test_in_byte_order_reverses_bytes_across_byte_orders(dtype: str) -> None:
    big = np.array([1, 2, -3], ">i8").view(dtype)
    little = in_byte_order(big, np.dtype(dtype).newbyteorder())
    assert little.dtype == np.dtype(dtype).newbyteorder()
    np.testing.assert_array_equal(little.view("<i8"), [1, 2, -3])
    assert in_byte_order(big, big.dtype) is big


LAYOUTS = {
    "chunks": {"chunks": (2, 3)},
    "shards": {"chunks": (2, 3), "shards": (4, 6)},
    "zstd": {"chunks": (2, 3), "compressors": [ZstdCodec(level=1)]},
}


def _create(store: Any, dtype: str, fill: Any, layout: str) -> zarr.Array:
    return zarr.create_array(store, shape=(5, 7), dtype=dtype, fill_value=fill, **LAYOUTS[layout])


def _fill_value(dtype: str, count: int | None) -> Any:
    """A fill value of ``dtype`` holding ``count`` (None: zarr's default)."""
    if count is None:
        return None
    return np.array(count, "i8").view(np.dtype(dtype).newbyteorder("="))[()]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["memory", "local"])
@pytest.mark.parametrize("fill", [None, 0, 5], ids=["NaT", "0", "5"])
@pytest.mark.parametrize("dtype", [">M8", ">m8", "<M8", ">M8[s]"])
def test_partial_writes_and_fill_values_match_zarr(
    tmp_path: Path, dtype: str, fill: int | None, kind: str, layout: str
) -> None:
    """Issue 12, items 1-2: a partial overwrite of a stored chunk of ``>M8``
    stored its untouched part byte-swapped, and missing chunks read as a
    byte-swapped fill value."""
    fill_value = _fill_value(dtype, fill)
    first = np.random.default_rng(12).integers(-99, 99, (2, 3)).astype(">i8").view(dtype)
    stores = {}
    for name, path in (("ours", FUSED), ("zarr", BATCHED)):
        store = make_store(kind, tmp_path, name)
        with with_pipeline(path):
            a = _create(store, dtype, fill_value, layout)
            a[0:2, 0:3] = first
            a[1:2, 1:3] = np.array([[7, -8]], ">i8").view(dtype)
            a[3, 4] = np.array(9, ">i8").view(dtype)
        stores[name] = store
    assert chunk_items(stores["ours"]) == chunk_items(stores["zarr"])
    expected = None
    for reader in (BATCHED, FUSED):
        for store in stores.values():
            with with_pipeline(reader):
                got = zarr.open_array(store, mode="r")[...]
            if expected is None:
                expected = _int_view(got)
            np.testing.assert_array_equal(_int_view(got), expected)
    selections = [
        lambda a: a.get_orthogonal_selection(([0, 3, 4], [1, 4])),
        lambda a: a.vindex[[0, 1, 4], [0, 2, 6]],
        lambda a: a.get_mask_selection(np.eye(5, 7, dtype=bool)),
        lambda a: a.blocks[1],
        lambda a: a[1:4:2, ::3],
    ]
    for select in selections:
        with with_pipeline(BATCHED):
            want = select(zarr.open_array(stores["zarr"], mode="r"))
        with with_pipeline(FUSED):
            got = select(zarr.open_array(stores["ours"], mode="r"))
        np.testing.assert_array_equal(_int_view(got), _int_view(want))


def test_issue_12_reproduction() -> None:
    """The issue's own example, read back by zarr's pipeline."""
    store = zarr.storage.MemoryStore()
    with with_pipeline(FUSED):
        a = zarr.create_array(store, shape=(4,), chunks=(2,), dtype=">M8", fill_value=0)
        a[0:2] = np.array([1, 1], ">i8").view(">M8")
        a[1:2] = np.array([2], ">i8").view(">M8")
    with with_pipeline(BATCHED), warnings.catch_warnings():
        got = zarr.open_array(store, mode="r")[0:2]
    np.testing.assert_array_equal(_int_view(got), [1, 2])


@pytest.mark.parametrize("dtype", [">M8", ">m8"])
def test_missing_chunks_read_the_fill_value(dtype: str) -> None:
    for fill, expected in ((None, -(2**63)), (5, 5)):
        store = zarr.storage.MemoryStore()
        with with_pipeline(FUSED):
            a = zarr.create_array(
                store, shape=(4,), chunks=(2,), dtype=dtype, fill_value=_fill_value(dtype, fill)
            )
            np.testing.assert_array_equal(_int_view(a[...]), [expected] * 4)
            np.testing.assert_array_equal(
                _int_view(a.get_orthogonal_selection([0, 3])), [expected] * 2
            )


def test_sharded_inner_chunks_of_big_endian_generic_datetime() -> None:
    """The sharded writer merges partly covered inner chunks itself."""
    stores = {}
    for name, path in (("ours", FUSED), ("zarr", BATCHED)):
        store = zarr.storage.MemoryStore()
        with with_pipeline(path):
            a = zarr.create_array(
                store,
                shape=(8,),
                dtype=">m8",
                fill_value=np.timedelta64(3),
                shards=(8,),
                chunks=(2,),
            )
            a[0:3] = np.array([1, 2, 3], ">i8").view(">m8")
            a[1:5] = np.array([4, 5, 6, 7], ">i8").view(">m8")
        stores[name] = store
    assert chunk_items(stores["ours"]) == chunk_items(stores["zarr"])
