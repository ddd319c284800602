"""zarr_fused against zarr's own pipeline, the oracle: values and stored bytes.

Every test writes the same data through zarr_fused and through zarr's
BatchedCodecPipeline, then checks that the stored chunks are byte-identical
(where zarr_fused claims identity, `byte_identical`), that each pipeline reads back what the
other wrote, and that reads through zarr_fused match NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.errors import ChunkNotFoundError

from zarr_fused.cli.identity import byte_identical

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store, with_pipeline

# -- what we vary ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Codec configuration of an array (everything but shape and dtype)."""

    kwargs: dict[str, Any]
    sharded: bool = False

    def create(self, store: Any, geometry: Geometry, dtype: Any, **extra: Any) -> zarr.Array:
        kwargs = dict(self.kwargs)
        chunks = geometry.chunks
        if self.sharded:
            if "serializer" in kwargs and isinstance(kwargs["serializer"], ShardingCodec):
                chunks = geometry.shards
            else:
                kwargs["shards"] = geometry.shards
        kwargs.update(extra)
        if "filters" in kwargs and kwargs["filters"] == "transpose":
            kwargs["filters"] = [TransposeCodec(order=tuple(reversed(range(len(geometry.shape)))))]
        return zarr.create_array(store, shape=geometry.shape, chunks=chunks, dtype=dtype, **kwargs)


def _sharding(shape_of: str, **kwargs: Any) -> Any:
    return {"serializer": shape_of, **kwargs}


LAYOUTS = {
    "raw": Layout({"compressors": None}),
    "raw-bigendian": Layout({"compressors": None, "serializer": BytesCodec(endian="big")}),
    "zstd": Layout({"compressors": ZstdCodec(level=1)}),
    "zstd-checksum": Layout({"compressors": ZstdCodec(level=3, checksum=True)}),
    "gzip": Layout({"compressors": GzipCodec(level=1)}),
    "blosc-lz4": Layout({"compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")}),
    "crc32c": Layout({"compressors": Crc32cCodec()}),
    "transpose": Layout({"compressors": None, "filters": "transpose"}),
    "sharded": Layout({"compressors": None}, sharded=True),
    "sharded-zstd": Layout({"compressors": ZstdCodec(level=1)}, sharded=True),
    "sharded-start-crc": Layout(
        {"compressors": None, "serializer": "sharding-start-crc"}, sharded=True
    ),
}


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...]


GEOMETRIES = {
    "0d": Geometry((), (), ()),
    "1d-edge": Geometry((17,), (5,), (10,)),
    "2d-edge": Geometry((13, 7), (4, 3), (8, 6)),
    "3d": Geometry((9, 8, 7), (4, 4, 3), (8, 8, 6)),
    "one-chunk": Geometry((6, 5), (6, 5), (6, 5)),
}

DTYPES = [
    "bool",
    "int8",
    "<u2",
    ">i4",
    "<i8",
    "<f2",
    ">f4",
    "<f8",
    ">c8",
    "<c16",
    "<M8[ns]",
    ">m8[s]",
    "<U3",
]


def _resolve(layout: Layout, geometry: Geometry) -> Layout:
    """Build codecs that depend on the geometry (inner chunk shape)."""
    if layout.kwargs.get("serializer") == "sharding-start-crc":
        kwargs = dict(layout.kwargs)
        kwargs["serializer"] = ShardingCodec(
            chunk_shape=geometry.chunks,
            codecs=[BytesCodec(), Crc32cCodec()],
            index_location="start",
        )
        return Layout(kwargs, layout.sharded)
    return layout


def sample(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Data with every awkward value its dtype has, and some all-zero chunks."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    if dtype.kind == "b":
        flat = rng.random(n) > 0.5
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype.newbyteorder("="))
    elif dtype.kind == "f":
        flat = rng.normal(0, 1e3, n)
        specials = [np.nan, -0.0, np.inf, -np.inf]
        flat[: min(n, 4)] = specials[: min(n, 4)]
    elif dtype.kind == "c":
        flat = rng.normal(0, 1e3, n) + 1j * rng.normal(0, 1e3, n)
        if n:
            flat[0] = complex(np.nan, -0.0)
    elif dtype.kind in "mM":
        flat = rng.integers(-(2**40), 2**40, n).view(dtype.newbyteorder("="))
    elif dtype.kind == "U":
        letters = np.array(list("abcxyz\u00e9\u4e2d"))
        flat = np.array(
            ["".join(rng.choice(letters, rng.integers(0, 4))) for _ in range(n)], dtype=dtype
        )
    else:  # pragma: no cover
        raise AssertionError(dtype)
    data = np.asarray(flat).astype(dtype).reshape(shape)
    if data.ndim >= 1 and data.shape[0] > 6:
        data[:4] = np.zeros((), dtype=dtype)  # whole chunks equal to the fill value
    return data


def write_through(
    path: str, store: Any, layout: Layout, geometry: Geometry, data: np.ndarray, **extra: Any
) -> zarr.Array:
    with with_pipeline(path):
        arr = layout.create(
            store, geometry, data.dtype, fill_value=np.zeros((), data.dtype)[()], **extra
        )
        arr[...] = data
    return arr


def read_through(path: str, store: Any, selection: Any = Ellipsis) -> np.ndarray:
    with with_pipeline(path):
        return np.asarray(zarr.open_array(store, mode="r")[selection])


def assert_same_chunks(ours: Any, theirs: Any) -> None:
    """The same chunk keys; the same bytes wherever zarr_fused claims them
    (`zarr_fused.cli.identity.byte_identical`: compressed bytes depend on the
    library versions at hand, gzip headers on zarr's clock)."""
    ours_items, theirs_items = chunk_items(ours), chunk_items(theirs)
    assert sorted(ours_items) == sorted(theirs_items)
    with with_pipeline(BATCHED):
        codecs = zarr.open_array(theirs, mode="r").metadata.codecs
    if byte_identical(codecs):
        for key in theirs_items:
            assert ours_items[key] == theirs_items[key], f"stored bytes of {key} differ"


def check_against_oracle(
    tmp_path: Path, kind: str, layout: Layout, geometry: Geometry, data: np.ndarray
) -> None:
    layout = _resolve(layout, geometry)
    ours = make_store(kind, tmp_path, "fused")
    oracle = make_store(kind, tmp_path, "oracle")
    write_through(FUSED, ours, layout, geometry, data)
    write_through(BATCHED, oracle, layout, geometry, data)
    if kind == "zip":
        ours.close()
        oracle.close()
        ours = zarr.storage.ZipStore(tmp_path / "fused.zip", mode="r")
        oracle = zarr.storage.ZipStore(tmp_path / "oracle.zip", mode="r")

    assert_same_chunks(ours, oracle)

    expected = read_through(BATCHED, oracle)
    assert_same_values(expected, data, byte_order=False)
    assert_same_values(read_through(FUSED, ours), expected)
    assert_same_values(read_through(FUSED, oracle), expected)
    assert_same_values(read_through(BATCHED, ours), expected)


# -- dtype x codec layout -----------------------------------------------------------


@pytest.mark.parametrize("layout", [pytest.param(v, id=k) for k, v in LAYOUTS.items()])
@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
def test_dtype_layout_matches_zarr(tmp_path: Path, dtype: str, layout: Layout) -> None:
    geometry = GEOMETRIES["2d-edge"]
    check_against_oracle(tmp_path, "memory", layout, geometry, sample(dtype, geometry.shape))


# -- geometry x codec layout --------------------------------------------------------


@pytest.mark.parametrize("layout", [pytest.param(v, id=k) for k, v in LAYOUTS.items()])
@pytest.mark.parametrize("geometry", [pytest.param(v, id=k) for k, v in GEOMETRIES.items()])
def test_geometry_layout_matches_zarr(tmp_path: Path, geometry: Geometry, layout: Layout) -> None:
    if geometry.shape == () and (layout.sharded or "filters" in layout.kwargs):
        pytest.skip("zarr has no 0-d sharding or transpose")
    check_against_oracle(tmp_path, "local", layout, geometry, sample(">i4", geometry.shape, 1))


# -- every store kind --------------------------------------------------------------


@pytest.mark.parametrize(
    "layout",
    [pytest.param(LAYOUTS[k], id=k) for k in ("raw", "zstd", "sharded", "sharded-start-crc")],
)
@pytest.mark.parametrize("kind", ["memory", "local", "zip", "nosync"])
def test_store_kinds_match_zarr(tmp_path: Path, kind: str, layout: Layout) -> None:
    geometry = GEOMETRIES["3d"]
    check_against_oracle(tmp_path, kind, layout, geometry, sample("<f4", geometry.shape, 2))


@pytest.mark.parametrize("kind", ["memory", "nosync"])
def test_variable_length_strings_match_zarr(tmp_path: Path, kind: str) -> None:
    data = np.array([["a", "", "hello"], ["\u00e9t\u00e9", "x" * 40, "z"]] * 3, dtype=object)
    results = {}
    for path in (FUSED, BATCHED):
        store = make_store(kind, tmp_path, path)
        with with_pipeline(path):
            arr = zarr.create_array(store, shape=data.shape, chunks=(2, 2), dtype=str)
            arr[...] = data
            arr[1:3, 1] = ["new", "values"]
            results[path] = (np.asarray(arr[...]), chunk_items(store))
    assert results[FUSED][1] == results[BATCHED][1]
    assert results[FUSED][0].tolist() == results[BATCHED][0].tolist()


# -- selections ----------------------------------------------------------------------

SELECTION_LAYOUTS = [
    pytest.param(LAYOUTS[k], id=k)
    for k in ("raw", "raw-bigendian", "zstd", "transpose", "sharded", "sharded-start-crc")
]

_MASK = np.random.default_rng(7).random((13, 7)) > 0.6
READS: dict[str, tuple[str, Any]] = {
    "all": ("basic", Ellipsis),
    "steps": ("basic", (slice(1, 12, 3), slice(None, None, 2))),
    "int-drops-axis": ("basic", (5, slice(2, 6))),
    "negative-int": ("basic", (-1, -2)),
    "edge-only": ("basic", (slice(12, 13), slice(6, 7))),
    "empty": ("basic", (slice(3, 3), slice(None))),
    "orthogonal-ints": ("oindex", ([0, 3, 7, 12, 3], [1, 1, 5])),
    "orthogonal-bool": ("oindex", (np.arange(13) % 3 == 0, slice(1, 6))),
    "orthogonal-int-scalar": ("oindex", (np.array([12, 0, 4]), 2)),
    "coordinate": ("vindex", (np.array([0, 3, 12, 12]), np.array([1, 5, 6, 0]))),
    "mask": ("vindex", _MASK),
    "block": ("blocks", (slice(1, 3), 1)),
    "block-all": ("blocks", Ellipsis),
}


def _apply(arr: Any, how: str, selection: Any) -> Any:
    target = arr if how == "basic" else getattr(arr, how)
    return target[selection]


def _numpy_equivalent(data: np.ndarray, arr: zarr.Array, how: str, selection: Any) -> np.ndarray:
    if how == "basic":
        return data[selection]
    if how == "oindex":
        return data[
            np.ix_(
                *[
                    np.arange(s)[sel] if not isinstance(sel, int) else [sel]
                    for s, sel in zip(data.shape, selection)
                ]
            )
        ].reshape(np.asarray(arr.oindex[selection]).shape)
    if how == "vindex":
        return data[selection]
    if how == "blocks":
        # blocks over the array's outer grid (shards for sharded arrays)
        grid = arr.shards or arr.chunks
        sel = selection if isinstance(selection, tuple) else (selection,)
        if sel == (Ellipsis,):
            return data
        slices = []
        for dim, (s, size) in enumerate(zip(sel, grid)):
            if isinstance(s, int):
                slices.append(slice(s * size, (s + 1) * size))
            else:
                slices.append(slice(s.start * size, s.stop * size))
        slices += [slice(None)] * (data.ndim - len(slices))
        return data[tuple(slices)]
    raise AssertionError(how)


@pytest.mark.parametrize("read", [pytest.param(v, id=k) for k, v in READS.items()])
@pytest.mark.parametrize("layout", SELECTION_LAYOUTS)
def test_read_selections_match_zarr(tmp_path: Path, layout: Layout, read: tuple[str, Any]) -> None:
    how, selection = read
    geometry = GEOMETRIES["2d-edge"]
    layout = _resolve(layout, geometry)
    data = sample(">f8", geometry.shape, 3)
    store = make_store("local", tmp_path)
    write_through(BATCHED, store, layout, geometry, data)
    with with_pipeline(BATCHED):
        expected = np.asarray(_apply(zarr.open_array(store, mode="r"), how, selection))
    with with_pipeline(FUSED):
        arr = zarr.open_array(store, mode="r")
        got = np.asarray(_apply(arr, how, selection))
    assert_same_values(got, expected)
    assert_same_values(got, _numpy_equivalent(data, arr, how, selection), byte_order=False)


# name: (indexing kind, selection, value: "array" of new values, or a scalar)
WRITES: dict[str, tuple[str, Any, Any]] = {
    "steps": ("basic", (slice(1, 12, 3), slice(None, None, 2)), "array"),
    "int-drops-axis": ("basic", (5, slice(2, 6)), "array"),
    "edge-only": ("basic", (slice(12, 13), slice(6, 7)), "array"),
    "scalar-broadcast": ("basic", Ellipsis, 7),
    "orthogonal-ints": ("oindex", ([0, 3, 7, 12], [1, 5]), "array"),
    "orthogonal-bool": ("oindex", (np.arange(13) % 3 == 0, slice(1, 6)), "array"),
    "coordinate": ("vindex", (np.array([0, 3, 12]), np.array([1, 5, 6])), "array"),
    "mask": ("vindex", _MASK, "array"),
    "block": ("blocks", (1, slice(0, 2)), "array"),
    "to-fill-value": ("basic", (slice(0, 8), slice(None)), 0),
}


def _assign(arr: Any, how: str, selection: Any, value: Any) -> None:
    target = arr if how == "basic" else getattr(arr, how)
    target[selection] = value


@pytest.mark.parametrize("write", [pytest.param(v, id=k) for k, v in WRITES.items()])
@pytest.mark.parametrize("layout", SELECTION_LAYOUTS)
@pytest.mark.parametrize("write_empty_chunks", [False, True], ids=["wec-false", "wec-true"])
def test_write_selections_match_zarr(
    tmp_path: Path, layout: Layout, write: tuple[str, Any, Any], write_empty_chunks: bool
) -> None:
    how, selection, value_kind = write
    geometry = GEOMETRIES["2d-edge"]
    layout = _resolve(layout, geometry)
    data = sample("<i4", geometry.shape, 4)
    stores = {}
    for path in (FUSED, BATCHED):
        store = make_store("memory", tmp_path)
        arr = write_through(
            path,
            store,
            layout,
            geometry,
            data,
            config={"write_empty_chunks": write_empty_chunks},
        )
        with with_pipeline(path):
            shape = np.asarray(_apply(arr, how, selection)).shape
            value: Any = value_kind
            if value_kind == "array":
                value = np.arange(int(np.prod(shape)), dtype="<i4").reshape(shape) + 100
            _assign(arr, how, selection, value)
        stores[path] = store
    assert_same_chunks(stores[FUSED], stores[BATCHED])
    assert_same_values(read_through(FUSED, stores[FUSED]), read_through(BATCHED, stores[BATCHED]))


# -- missing chunks and shards ----------------------------------------------------------


@pytest.mark.parametrize("layout", SELECTION_LAYOUTS)
def test_missing_chunks_fill_like_zarr(tmp_path: Path, layout: Layout) -> None:
    geometry = GEOMETRIES["2d-edge"]
    layout = _resolve(layout, geometry)
    results = {}
    for path in (FUSED, BATCHED):
        store = make_store("memory", tmp_path)
        with with_pipeline(path):
            arr = layout.create(store, geometry, "<f8", fill_value=-2.5)
            arr[2:5, 1:4] = 3.0  # touches a few chunks of one shard; the rest stays missing
            results[path] = (np.asarray(arr[...]), np.asarray(arr[9:, 5:]), store)
    assert_same_values(results[FUSED][0], results[BATCHED][0])
    assert_same_values(results[FUSED][1], results[BATCHED][1])
    assert_same_chunks(results[FUSED][2], results[BATCHED][2])


@pytest.mark.parametrize("layout", SELECTION_LAYOUTS)
def test_read_missing_chunks_false_raises_like_zarr(tmp_path: Path, layout: Layout) -> None:
    geometry = GEOMETRIES["2d-edge"]
    layout = _resolve(layout, geometry)
    store = make_store("memory", tmp_path)
    with with_pipeline(FUSED):
        arr = layout.create(
            store, geometry, "<f8", fill_value=0.0, config={"read_missing_chunks": False}
        )
        arr[0:4, 0:3] = 1.0
        with pytest.raises(ChunkNotFoundError):
            arr[...]
        assert_same_values(arr[0:4, 0:3], np.ones((4, 3)))


# -- property test over the combinations --------------------------------------------

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.testing.strategies import basic_indices


@st.composite
def cases(draw: st.DrawFn) -> tuple[Geometry, str, Layout, Any]:
    ndim = draw(st.integers(1, 3))
    chunks = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    per_shard = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    shards = tuple(c * k for c, k in zip(chunks, per_shard))
    shape = tuple(draw(st.integers(1, 3 * s)) for s in shards)
    geometry = Geometry(shape, chunks, shards)
    dtype = draw(st.sampled_from(DTYPES[:-1]))
    name = draw(st.sampled_from(list(LAYOUTS)))
    selection = draw(basic_indices(shape=shape))
    return geometry, dtype, LAYOUTS[name], selection


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_property_roundtrip_and_partial_write(tmp_path_factory: Any, case: Any, seed: int) -> None:
    geometry, dtype, layout, selection = case
    layout = _resolve(layout, geometry)
    data = sample(dtype, geometry.shape, seed)
    tmp = tmp_path_factory.mktemp("prop")
    stores = {}
    for path in (FUSED, BATCHED):
        store = make_store("memory", tmp)
        arr = write_through(path, store, layout, geometry, data)
        with with_pipeline(path):
            region = np.asarray(arr[selection])
            arr[selection] = sample(dtype, region.shape, seed + 1) if region.ndim else region
        stores[path] = store
    assert_same_chunks(stores[FUSED], stores[BATCHED])
    expected = read_through(BATCHED, stores[BATCHED])
    assert_same_values(read_through(FUSED, stores[FUSED]), expected)
    assert_same_values(read_through(FUSED, stores[FUSED], selection), expected[selection])
