"""`zarr_fused.read_regions`: many regions as one planned batch, against
``array[sel]`` read with zarr's own BatchedCodecPipeline."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numcodecs import Blosc
from numcodecs import Zstd as NumcodecsZstd
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.errors import ChunkNotFoundError
from zarr.storage import MemoryStore, WrapperStore

import zarr_fused
from zarr_fused import regions as regions_module

from helpers import BATCHED, FUSED, assert_same_values, make_store, with_pipeline
from helpers.s3_stores import new_prefix, open_store

# -- arrays -------------------------------------------------------------------------------


def _sharded(store: Any, shape: tuple[int, ...], shards: Any, inner: Any, dtype: str) -> Any:
    return zarr.create_array(
        store,
        shape=shape,
        dtype=dtype,
        chunks=shards,
        serializer=ShardingCodec(
            chunk_shape=inner,
            codecs=[BytesCodec(), ZstdCodec(level=1)],
            index_codecs=[BytesCodec(), Crc32cCodec()],
        ),
        compressors=None,
        fill_value=7,
    )


def _create(store: Any, geometry: str) -> Any:
    """An array of ``geometry``, created through zarr_fused."""
    if geometry == "sharded":
        return _sharded(store, (40, 36, 20), (16, 12, 20), (8, 6, 5), "uint16")
    if geometry == "sharded-2d":
        return _sharded(store, (50, 33), (20, 22), (5, 11), "<i4")
    if geometry == "v3":
        return zarr.create_array(
            store, shape=(45, 31, 10), chunks=(8, 7, 10), dtype="<f8", fill_value=-1.5
        )
    if geometry == "v3-fortran":
        return zarr.create_array(
            store,
            shape=(33, 21),
            chunks=(8, 5),
            dtype="int16",
            fill_value=3,
            config={"order": "F"},
        )
    if geometry == "v2-zstd":
        return zarr.create_array(
            store,
            shape=(37, 29),
            chunks=(6, 8),
            dtype="<u4",
            fill_value=9,
            zarr_format=2,
            compressors=NumcodecsZstd(level=1),
        )
    if geometry == "v2-blosc-f":
        return zarr.create_array(
            store,
            shape=(30, 26),
            chunks=(7, 9),
            dtype="<i8",
            fill_value=0,
            zarr_format=2,
            compressors=Blosc(cname="lz4", clevel=1),
            order="F",
        )
    raise AssertionError(geometry)


GEOMETRIES = ["sharded", "sharded-2d", "v3", "v3-fortran", "v2-zstd", "v2-blosc-f"]


def _filled(store: Any, geometry: str, seed: int, holes: bool = True) -> np.ndarray:
    """Create the array of ``geometry`` in ``store`` and write random values,
    leaving some chunks or shards unwritten (read as the fill value) when
    ``holes``; returns the values written where written."""
    rng = np.random.default_rng(seed)
    with with_pipeline(FUSED):
        arr = _create(store, geometry)
        data = rng.integers(0, 1000, size=arr.shape).astype(arr.dtype)
        if holes:
            # the first axis' last third stays unwritten (whole chunks or
            # shards missing, and edge ones)
            cut = arr.shape[0] * 2 // 3
            arr[:cut] = data[:cut]
        else:
            arr[...] = data
    return data


def _open(store: Any, pipeline: str) -> Any:
    with with_pipeline(pipeline):
        return zarr.open_array(store, mode="r")


def _expected(store: Any, selections: list[Any]) -> list[Any]:
    oracle = _open(store, BATCHED)
    return [oracle[sel] for sel in selections]


def _random_selections(shape: tuple[int, ...], n: int, seed: int) -> list[Any]:
    """``n`` regions: boxes (some overlapping, some on edge chunks), empty
    ones and integer-indexed ones."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for k in range(n):
        sel: list[Any] = []
        for size in shape:
            kind = k % 5
            if kind == 3 and len(sel) == 0:
                sel.append(int(rng.integers(-size, size)))  # an int drops the axis
                continue
            start = int(rng.integers(0, size))
            length = 0 if kind == 4 and len(sel) == 1 else int(rng.integers(1, max(2, size // 2)))
            sel.append(slice(start, min(size, start + length)))
        out.append(tuple(sel))
    return out


def _assert_all(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert type(g) is type(e)
        assert_same_values(g, e)


# -- values against zarr --------------------------------------------------------------------


@pytest.mark.parametrize("geometry", [pytest.param(g, id=g) for g in GEOMETRIES])
@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in ("local", "memory")])
def test_regions_equal_zarr(tmp_path: Path, geometry: str, kind: str) -> None:
    store = make_store(kind, tmp_path)
    _filled(store, geometry, seed=3)
    arr = _open(store, FUSED)
    selections = _random_selections(arr.shape, 40, seed=5)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


@pytest.mark.parametrize("geometry", [pytest.param(g, id=g) for g in GEOMETRIES])
def test_regions_into_out_buffers(tmp_path: Path, geometry: str) -> None:
    store = make_store("local", tmp_path)
    _filled(store, geometry, seed=11)
    arr = _open(store, FUSED)
    selections = _random_selections(arr.shape, 15, seed=12)
    expected = _expected(store, selections)
    out = [np.full(np.shape(e), 1, dtype=arr.dtype) for e in expected]
    got = zarr_fused.read_regions(arr, selections, out=out)
    assert all(g is o for g, o in zip(got, out, strict=True))
    for g, e in zip(got, expected, strict=True):
        assert_same_values(g, np.asarray(e))


def test_all_integer_regions_are_zero_dimensional(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "sharded", seed=1)
    arr = _open(store, FUSED)
    selections = [(3, 4, 5), (-1, -1, -1), (39, 0, 19)]
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


def test_whole_array_and_ellipsis(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "sharded", seed=2)
    arr = _open(store, FUSED)
    selections = [Ellipsis, (Ellipsis, 3), (2, Ellipsis), slice(5, 9), 4, ()]
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


@given(data=st.data())
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@pytest.mark.parametrize("geometry", [pytest.param(g, id=g) for g in ("sharded", "v3", "v2-zstd")])
def test_region_sets_equal_zarr_hypothesis(tmp_path: Path, geometry: str, data: Any) -> None:
    store = _hypothesis_store(tmp_path, geometry)
    arr = _open(store, FUSED)
    selections = data.draw(st.lists(_selection(arr.shape), min_size=0, max_size=12))
    if selections and data.draw(st.booleans()):
        selections.append(selections[0])  # the same region twice
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


_STORES: dict[tuple[str, str], Any] = {}


def _hypothesis_store(tmp_path: Path, geometry: str) -> Any:
    """One array per geometry for all of a hypothesis test's examples."""
    key = (str(tmp_path), geometry)
    if key not in _STORES:
        store = MemoryStore()
        _filled(store, geometry, seed=21)
        _STORES[key] = store
    return _STORES[key]


def _axis(size: int) -> st.SearchStrategy[Any]:
    index = st.integers(-size, size - 1)
    bound = st.integers(-size - 2, size + 2) | st.none()
    return index | st.builds(slice, bound, bound)


def _selection(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.integers(0, len(shape)).flatmap(
        lambda n: st.tuples(*(_axis(size) for size in shape[:n]))
    )


def _picks_selections(shape: tuple[int, ...], n: int, seed: int) -> list[Any]:
    """``n`` selections with one sorted integer array (repeats, negative
    indices, sparse and dense runs, empty) on a varying axis, slices and
    integers on the others."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for k in range(n):
        axis = k % len(shape)
        size = shape[axis]
        count = int(rng.integers(0, 2 * size)) if k % 7 else 0
        index = np.sort(rng.integers(0, size, count))
        if k % 3 == 1:
            index = index - size  # the same indices, counted from the end
        sel: list[Any] = []
        for d, extent in enumerate(shape):
            if d == axis:
                sel.append(index)
            elif k % 5 == 2:
                sel.append(int(rng.integers(0, extent)))
            else:
                start = int(rng.integers(0, extent))
                sel.append(slice(start, start + int(rng.integers(1, extent))))
        out.append(tuple(sel))
    return out


@pytest.mark.parametrize("geometry", [pytest.param(g, id=g) for g in GEOMETRIES])
def test_integer_array_regions_equal_zarr(tmp_path: Path, geometry: str) -> None:
    """One sorted integer array per selection, as zarr reads it (an
    orthogonal selection; with integers only beside it, a coordinate one),
    planned with the basic regions in one batch."""
    store = make_store("local", tmp_path)
    _filled(store, geometry, seed=31)
    arr = _open(store, FUSED)
    selections = _picks_selections(arr.shape, 30, seed=32) + _random_selections(
        arr.shape, 10, seed=33
    )
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))
    out = [np.zeros(np.shape(e), dtype=arr.dtype) for e in _expected(store, selections)]
    got = zarr_fused.read_regions(arr, selections, out=out)
    assert all(g is o for g, o in zip(got, out, strict=True))
    _assert_all(got, [np.asarray(e) for e in _expected(store, selections)])


def test_integer_array_reads_only_the_keys_holding_an_index(tmp_path: Path) -> None:
    """Indices far apart along the first axis read the shards that hold
    them, not the ones between."""
    memory = MemoryStore()
    _filled(memory, "sharded", seed=34, holes=False)
    arr = _open(_Counting(memory), FUSED)
    counting = arr.async_array.store_path.store
    selection = (np.array([1, 2, 39]), slice(0, 5), slice(0, 5))
    _assert_all(zarr_fused.read_regions(arr, [selection]), _expected(memory, [selection]))
    # shards of 16 along the first axis: 0 and 2, not 1
    assert sorted({key for key, _ in counting.gets}) == ["c/0/0/0", "c/2/0/0"]


# -- what falls back to array[sel] ------------------------------------------------------------


def test_array_on_zarrs_pipeline_reads_one_by_one(tmp_path: Path) -> None:
    store = make_store("local", tmp_path)
    _filled(store, "sharded", seed=4)
    arr = _open(store, BATCHED)
    selections = _random_selections(arr.shape, 10, seed=6)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


def test_selections_outside_the_plan_read_one_by_one(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "sharded", seed=8)
    arr = _open(store, FUSED)
    selections = [
        (slice(0, 30, 4), slice(2, 9)),  # a step
        (slice(3, 20), 4, slice(1, 6)),
        (np.array([30, 1, 5]),),  # an unsorted integer array
        (slice(2, 12), slice(0, 30), slice(0, 20)),
    ]
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((40, 0, 0), id="int-past-end"),
        pytest.param((0, 0, 0, 0), id="too-many-axes"),
    ],
)
def test_bad_selection_raises_zarrs_error(tmp_path: Path, selection: Any) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "sharded", seed=9)
    arr = _open(store, FUSED)
    with pytest.raises(IndexError):
        _open(store, BATCHED)[selection]
    with pytest.raises(IndexError):
        zarr_fused.read_regions(arr, [(slice(0, 2),), selection])


# -- out= checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_out", "error"),
    [
        pytest.param(lambda: [np.zeros((3, 4, 5), "uint16")], ValueError, id="count"),
        pytest.param(lambda: [np.zeros((3, 4, 6), "uint16")] * 2, ValueError, id="shape"),
        pytest.param(lambda: [np.zeros((3, 4, 5), "int32")] * 2, ValueError, id="dtype"),
        pytest.param(lambda: [[0] * 5] * 2, TypeError, id="not-ndarray"),
    ],
)
def test_out_buffers_are_checked(tmp_path: Path, make_out: Any, error: type) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "sharded", seed=10)
    arr = _open(store, FUSED)
    selections = [(slice(0, 3), slice(0, 4), slice(0, 5)), (slice(9, 12), slice(1, 5), slice(3, 8))]
    with pytest.raises(error):
        zarr_fused.read_regions(arr, selections, out=make_out())


def test_read_only_out_buffer_is_refused(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "v3", seed=13)
    arr = _open(store, FUSED)
    buf = np.zeros((2, 3, 10), "<f8")
    buf.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        zarr_fused.read_regions(arr, [(slice(0, 2), slice(0, 3))], out=[buf])


# -- the plan ---------------------------------------------------------------------------------


def test_missing_chunks_raise_when_zarr_would(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _filled(store, "v3", seed=14)
    with zarr.config.set({"array.read_missing_chunks": False}):
        arr = _open(store, FUSED)
        with pytest.raises(ChunkNotFoundError):
            _open(store, BATCHED)[40:44]
        with pytest.raises(ChunkNotFoundError):
            zarr_fused.read_regions(arr, [(slice(0, 3),), (slice(40, 44),)])


def test_waves_of_staging_give_the_same_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store("local", tmp_path)
    _filled(store, "sharded", seed=15)
    arr = _open(store, FUSED)
    # a few blocks per wave
    monkeypatch.setattr(regions_module, "STAGING_BYTES", 16 * 12 * 20 * 2 * 3)
    selections = _random_selections(arr.shape, 30, seed=16)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


@pytest.mark.parametrize("block_bytes", [pytest.param(b, id=str(b)) for b in (1, 4000, 1 << 20)])
def test_new_results_cut_from_shared_blocks_do_not_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    """Results cut from shared allocations (one each, a few per block, all
    in one) hold zarr's values, in zarr's memory order, and no two share a
    byte."""
    monkeypatch.setattr(regions_module, "RESULT_BLOCK_BYTES", block_bytes)
    for geometry in ("sharded", "v3-fortran"):
        store = make_store("memory", tmp_path)
        _filled(store, geometry, seed=41)
        arr = _open(store, FUSED)
        selections = _random_selections(arr.shape, 25, seed=42)
        got = zarr_fused.read_regions(arr, selections)
        expected = _expected(store, selections)
        _assert_all(got, expected)
        for g, e in zip(got, expected, strict=True):
            assert g.flags.c_contiguous == e.flags.c_contiguous
            assert g.flags.f_contiguous == e.flags.f_contiguous
        sized = [g for g in got if g.size]
        for a, b in itertools.combinations(sized, 2):
            assert not np.shares_memory(a, b)


class _Counting(WrapperStore[Any]):
    """Every read the pipeline makes of a key: its whole-key and ranged
    gets, and the number of ranges of each coalesced request."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.gets: list[tuple[str, Any]] = []
        self.ranges: list[tuple[str, int]] = []

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        if not key.endswith(("zarr.json", ".zarray", ".zattrs")):
            self.gets.append((key, byte_range))
        return self._store.get_sync(key, prototype=prototype, byte_range=byte_range)

    def get_ranges_sync(self, key: str, byte_ranges: Any, **kwargs: Any) -> Any:
        self.ranges.append((key, len(byte_ranges)))
        inner = self._store
        return inner.get_ranges_sync(key, byte_ranges, **kwargs)


def test_each_shard_index_and_inner_chunk_is_fetched_once(tmp_path: Path) -> None:
    """Many overlapping regions in one shard: one index read and one
    coalesced request of the touched inner chunks, each once."""
    memory = MemoryStore()
    _filled(memory, "sharded", seed=17, holes=False)
    store = _Counting(memory)
    arr = _open(store, FUSED)
    counting = arr.async_array.store_path.store
    # 12 regions inside the inner chunks (0..1, 0..1, 0) of shard (0, 0, 0):
    # 4 inner chunks, every one touched by several regions
    selections = [
        (slice(i % 4, 9 + i % 6), slice(i % 3, 7 + i % 4), slice(0, 5)) for i in range(12)
    ]
    got = zarr_fused.read_regions(arr, selections)
    _assert_all(got, _expected(memory, selections))
    assert [key for key, _ in counting.gets] == ["c/0/0/0"]  # the index
    assert counting.ranges == [("c/0/0/0", 4)]


def test_each_chunk_is_fetched_once_unsharded(tmp_path: Path) -> None:
    memory = MemoryStore()
    _filled(memory, "v3", seed=18, holes=False)
    arr = _open(_Counting(memory), FUSED)
    counting = arr.async_array.store_path.store
    selections = [(slice(i, 12 + i), slice(2 * i, 10 + i)) for i in range(6)]
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(memory, selections))
    keys = [key for key, _ in counting.gets]
    assert sorted(keys) == sorted(set(keys))
    assert len(keys) == 8  # the chunks the regions overlap, of 8 x 7


# -- object stores ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in ("obstore", "s3fs")])
@pytest.mark.parametrize("geometry", [pytest.param(g, id=g) for g in ("sharded", "v3")])
def test_regions_on_s3_equal_zarr(proxy: Any, kind: str, geometry: str) -> None:
    """A moto S3 server, through zarr's ObjectStore (obstore) and
    FsspecStore (s3fs): the async path of the pipeline reads the batch."""
    pytest.importorskip("obstore.store" if kind == "obstore" else "s3fs")
    store = open_store(kind, proxy, new_prefix())
    _filled(store, geometry, seed=19)
    arr = _open(store, FUSED)
    selections = _random_selections(arr.shape, 20, seed=20)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


# -- the fan-out read ------------------------------------------------------------------------


def _no_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the staging design fail, so a test shows the fan-out read ran."""

    def staging(*args: Any) -> None:
        raise AssertionError("the staging read ran")

    monkeypatch.setattr(regions_module, "_read_planned", staging)


def _fan_out_array(store: Any, variant: str) -> Any:
    """A sharded uint16 array of ``variant``: edge shards and edge inner
    chunks on every axis."""
    inner_codecs: list[Any] = [BytesCodec(), ZstdCodec(level=1)]
    location = "end"
    order = "C"
    if variant == "crc32c":
        inner_codecs.append(Crc32cCodec())
    elif variant == "index-start":
        location = "start"
    elif variant == "fortran":
        order = "F"
    elif variant == "raw":
        inner_codecs = [BytesCodec(endian="big")]
    return zarr.create_array(
        store,
        shape=(37, 26, 19),
        dtype="uint16",
        chunks=(16, 12, 10),
        serializer=ShardingCodec(
            chunk_shape=(8, 4, 5),
            codecs=inner_codecs,
            index_codecs=[BytesCodec(), Crc32cCodec()],
            index_location=location,
        ),
        compressors=None,
        fill_value=11,
        config={"order": order},
    )


FAN_OUT_VARIANTS = ["zstd", "crc32c", "index-start", "fortran", "raw"]


def _fan_out_filled(store: Any, variant: str, seed: int) -> np.ndarray:
    """The array of ``variant`` with holes: shards never written, and inner
    chunks missing inside written shards (all fill value: not stored)."""
    rng = np.random.default_rng(seed)
    with with_pipeline(FUSED):
        arr = _fan_out_array(store, variant)
        data = rng.integers(0, 60000, size=arr.shape).astype(arr.dtype)
        data[:8, :4, :5] = 11  # one inner chunk of fill value: not stored
        arr[:32] = data[:32]  # the shards from row 32 on stay missing
    return data


def _fan_out_hypothesis_store(tmp_path: Path, variant: str, seed: int) -> Any:
    """One fan-out array of ``variant`` for all of a hypothesis test's
    examples."""
    key = (str(tmp_path), f"fan-out {variant}")
    if key not in _STORES:
        store = MemoryStore()
        _fan_out_filled(store, variant, seed=seed)
        _STORES[key] = store
    return _STORES[key]


def _shared_regions(shape: tuple[int, ...], n: int, seed: int) -> list[Any]:
    """``n`` small unaligned boxes, many in the same few inner chunks, some
    equal, some on the array's edge, some with a dropped axis or picks."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for k in range(n):
        sel: list[Any] = []
        for d, size in enumerate(shape):
            start = int(rng.integers(0, size))
            if k % 6 == 5:
                start = size - 1 - int(rng.integers(0, 3))  # at the edge
            stop = min(size, start + int(rng.integers(1, 12)))
            if k % 7 == 3 and d == 1:
                sel.append(start)
            elif k % 9 == 4 and d == 0:
                sel.append(np.sort(rng.integers(0, size, int(rng.integers(1, 9)))))
            else:
                sel.append(slice(start, stop))
        out.append(tuple(sel))
    return out + out[:3]  # the same regions again


@pytest.mark.parametrize("variant", [pytest.param(v, id=v) for v in FAN_OUT_VARIANTS])
@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in ("local", "memory")])
def test_fan_out_equals_zarr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str, kind: str
) -> None:
    store = make_store(kind, tmp_path)
    _fan_out_filled(store, variant, seed=51)
    arr = _open(store, FUSED)
    selections = _shared_regions(arr.shape, 60, seed=52)
    expected = _expected(store, selections)
    _no_staging(monkeypatch)
    _assert_all(zarr_fused.read_regions(arr, selections), expected)
    out = [np.full(np.shape(e), 3, dtype=arr.dtype) for e in expected]
    got = zarr_fused.read_regions(arr, selections, out=out)
    assert all(g is o for g, o in zip(got, out, strict=True))
    _assert_all(got, [np.asarray(e) for e in expected])


def test_fan_out_into_strided_out_buffers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers that are views with steps and reversed axes."""
    store = make_store("memory", tmp_path)
    _fan_out_filled(store, "zstd", seed=53)
    arr = _open(store, FUSED)
    selections = [(slice(3, 20), slice(2, 25), slice(0, 19)), (slice(30, 37), 5, slice(4, 9))]
    expected = [np.asarray(e) for e in _expected(store, selections)]
    parents = [np.zeros((2 * e.shape[0], *e.shape[1:]), arr.dtype) for e in expected]
    out = [p[::2][..., ::-1] for p in parents]
    _no_staging(monkeypatch)
    zarr_fused.read_regions(arr, selections, out=out)
    for o, e in zip(out, expected, strict=True):
        assert_same_values(o[..., ::-1], e[..., ::-1])
    assert not parents[0][1::2].any()  # nothing written between the rows


def test_fan_out_corrupt_inner_chunk_names_it(tmp_path: Path) -> None:
    store = make_store("memory", tmp_path)
    _fan_out_filled(store, "crc32c", seed=55)
    key = "c/0/1/0"
    raw = bytearray(store._store_dict[key].to_bytes())
    raw[5] ^= 0xFF  # inside the first stored inner chunk
    store._store_dict[key] = type(store._store_dict[key]).from_bytes(bytes(raw))
    arr = _open(store, FUSED)
    with pytest.raises(Exception, match=r"shard .*c/0/1/0"):
        zarr_fused.read_regions(arr, [(slice(0, 16), slice(12, 24), slice(0, 19))])


def test_fan_out_fetches_each_inner_chunk_once(tmp_path: Path) -> None:
    """Overlapping regions over two shards: one index read per shard and
    one request of the touched inner chunks each, every chunk in it once."""
    memory = MemoryStore()
    _fan_out_filled(memory, "zstd", seed=56)
    arr = _open(_Counting(memory), FUSED)
    counting = arr.async_array.store_path.store
    selections = [
        (slice(1 + i % 5, 10 + i % 7), slice(i % 3, 6 + i % 4), slice(7 + i % 2, 14))
        for i in range(20)
    ]
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(memory, selections))
    assert sorted(key for key, _ in counting.gets) == ["c/0/0/0", "c/0/0/1"]
    # rows 1..16 (2 inner chunks), columns 0..9 (3), depth 7..14 (2 per shard)
    assert sorted(counting.ranges) == [("c/0/0/0", 6), ("c/0/0/1", 6)]


def test_fan_out_inside_stats_keeps_the_counted_path(tmp_path: Path) -> None:
    store = make_store("local", tmp_path)
    _fan_out_filled(store, "zstd", seed=57)
    arr = _open(store, FUSED)
    selections = _shared_regions(arr.shape, 20, seed=58)
    with zarr_fused.stats() as counters:
        got = zarr_fused.read_regions(arr, selections)
    _assert_all(got, _expected(store, selections))
    assert counters.bytes_decoded > 0


def test_fan_out_kernel_refuses_targets_outside(tmp_path: Path) -> None:
    """`fan_out` checks every target against its chunk and destination."""
    from zarr_fused._native import shard_kernels

    store = make_store("memory", tmp_path)
    _fan_out_filled(store, "zstd", seed=59)
    arr = _open(store, FUSED)
    chain = arr.async_array.codec_pipeline.plan.reader.chain
    layout = chain.layout((8, 4, 5))
    dst = np.zeros((4, 4, 4), np.uint16)
    dests = shard_kernels.Destinations([dst], 3, 2)
    units = np.array([0], np.intp)
    starts = np.array([0, 1], np.intp)
    for row in (
        [0, 0, 0, 0, 0, 0, 0, 5, 4, 4],
        [0, 6, 0, 0, 0, 0, 0, 3, 1, 1],
        [1, 0, 0, 0, 0, 0, 0, 1, 1, 1],
    ):
        targets = np.array([row], np.intp)
        with pytest.raises(ValueError, match="target 0"):
            shard_kernels.fan_out(
                chain.kernel, layout, None, None, units, starts, targets, dests, b"\0\0", "k", repr
            )
    ok = np.array([[0, 0, 0, 0, 1, 1, 1, 3, 3, 3]], np.intp)
    shard_kernels.fan_out(
        chain.kernel, layout, None, None, units, starts, ok, dests, b"\x01\x00", "k", repr
    )
    assert (dst[1:, 1:, 1:] == 1).all() and dst[0].sum() == 0


@given(data=st.data())
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_fan_out_region_sets_hypothesis(tmp_path: Path, data: Any) -> None:
    store = _fan_out_hypothesis_store(tmp_path, "crc32c", seed=60)
    arr = _open(store, FUSED)
    boxes = st.tuples(
        *(st.tuples(st.integers(0, n - 1), st.integers(1, 14)) for n in arr.shape)
    ).map(lambda axes: tuple(slice(a, a + n) for a, n in axes))
    selections = data.draw(st.lists(boxes | _selection(arr.shape), min_size=1, max_size=16))
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


def test_zip_store_keeps_the_staging_read(tmp_path: Path) -> None:
    """A ZipStore (no synchronous IO) reads through the pipeline's async path."""
    store = make_store("zip", tmp_path)
    _fan_out_filled(store, "zstd", seed=61)
    store.close()
    arr = _open(zarr.storage.ZipStore(tmp_path / "data.zip", mode="r"), FUSED)
    selections = _shared_regions(arr.shape, 30, seed=62)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(arr.store, selections))


# -- the native plan of plain selections --------------------------------------------------


def _no_region_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the per-region parse fail, so a test shows the native plan ran."""

    def parse(*args: Any) -> None:
        raise AssertionError("the per-region plan ran")

    monkeypatch.setattr(regions_module, "_region", parse)


def _assert_native_plan_reads(
    monkeypatch: pytest.MonkeyPatch, store: Any, arr: Any, selections: list[Any]
) -> None:
    """``selections`` read by `read_regions` through the native plan alone
    (no staging read, no per-region parse) give zarr's values."""
    expected = _expected(store, selections)
    _no_staging(monkeypatch)
    _no_region_parse(monkeypatch)
    _assert_all(zarr_fused.read_regions(arr, selections), expected)


PLAIN_CASES = {
    # inner chunks 8x4x5 in shards 16x12x10 of a 37x26x19 array
    "edge-chunks": [(slice(30, 37), slice(20, 26), slice(15, 19)), (slice(36, 37), 25, 18)],
    "across-shards": [(slice(10, 20), slice(8, 16), slice(6, 14)), (slice(0, 37),) * 3],
    "ints-drop-axes": [(3, slice(2, 9), slice(0, 4)), (slice(1, 5), -1, 2), (0, 5, slice(9, 11))],
    "negative-none-bounds": [
        (slice(-5, None), slice(None, -20), slice(-100, 100)),
        (slice(None), slice(-3, -1), slice(None, 4)),
    ],
    "empty": [(slice(5, 5), slice(0, 3), slice(0, 3)), (slice(9, 2), 1, slice(30, 40))],
    "missing-shards": [(slice(32, 37), slice(0, 26), slice(3, 8)), (33, 1, 1)],
    "numpy-integers": [(np.int64(4), slice(np.int32(1), np.uint8(9)), slice(2, 3))],
    "one-all-integers": [(1, 2, 3), (slice(0, 2), slice(0, 2), slice(0, 2))],
}


@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in PLAIN_CASES])
def test_plain_selections_take_the_native_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    store = make_store("memory", tmp_path)
    _fan_out_filled(store, "crc32c", seed=71)
    arr = _open(store, FUSED)
    _assert_native_plan_reads(monkeypatch, store, arr, PLAIN_CASES[case])


def test_one_selection_outside_the_native_plan_plans_all_by_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list, a step, an Ellipsis or a short tuple among plain selections:
    all of them go the per-region way, with the same values."""
    store = make_store("local", tmp_path)
    _fan_out_filled(store, "zstd", seed=72)
    arr = _open(store, FUSED)
    plain = [(slice(0, 9), slice(3, 7), 4), (slice(20, 30), slice(0, 26), slice(0, 19))]
    for odd in ((slice(0, 9, 2), 1, 1), (Ellipsis, 3), (slice(1, 3),), ([1, 2], 0, 0)):
        selections = [*plain, odd]
        _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))


def _parsed(selection: Any, shape: tuple[int, ...]) -> Any:
    """What the per-region parse makes of ``selection``: (lo, hi, dropped)."""
    region = regions_module._region(selection, shape)
    if region is None or region.picks is not None:
        return None
    dropped = [d in region.dropped for d in range(len(shape))]
    return list(region.lo), list(region.hi), dropped


@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_plain_boxes_agree_with_the_per_region_parse(data: Any) -> None:
    from zarr_fused._native import region_kernels

    assert region_kernels is not None
    shape = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple))
    axis = st.one_of(
        _axis(max(shape) + 1),
        st.builds(slice, st.integers(-12, 12), st.integers(-12, 12), st.sampled_from([1, 2])),
        st.just(Ellipsis),
    )
    selections = data.draw(
        st.lists(st.lists(axis, min_size=len(shape), max_size=len(shape)).map(tuple), max_size=4)
    )
    boxes = region_kernels.plain_boxes(selections, shape)
    parsed = [_parsed(sel, shape) for sel in selections]
    if boxes is None:
        assert any(
            p is None or any(item is Ellipsis for item in sel)
            for p, sel in zip(parsed, selections, strict=True)
        )
        return
    lo, hi, dropped = boxes
    assert parsed == [
        (a.tolist(), b.tolist(), c.tolist()) for a, b, c in zip(lo, hi, dropped, strict=True)
    ]


def _targets_by_unit(lo: Any, hi: Any, shape: Any, outer: Any, inner: Any) -> dict[Any, Any]:
    """Reference plan: per (shard, inner chunk), the sorted target rows."""
    per_shard = tuple(o // i for o, i in zip(outer, inner, strict=True))
    out: dict[Any, list[list[int]]] = {}
    for r, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if any(x >= y for x, y in zip(a, b, strict=True)):
            continue
        spans = [range(x // n, (y - 1) // n + 1) for x, y, n in zip(a, b, inner, strict=True)]
        for c in itertools.product(*spans):
            c_lo = [max(x, k * n) for x, k, n in zip(a, c, inner, strict=True)]
            c_hi = [min(y, (k + 1) * n) for y, k, n in zip(b, c, inner, strict=True)]
            shard = tuple(k // p for k, p in zip(c, per_shard, strict=True))
            lin = int(
                np.ravel_multi_index([k % p for k, p in zip(c, per_shard, strict=True)], per_shard)
            )
            row = [r, *(x - k * n for x, k, n in zip(c_lo, c, inner, strict=True))]
            row += [x - s for x, s in zip(c_lo, a, strict=True)]
            row += [y - x for x, y in zip(c_lo, c_hi, strict=True)]
            out.setdefault((shard, lin), []).append(row)
    return {k: sorted(v) for k, v in out.items()}


@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_fan_out_targets_match_a_reference_plan(data: Any) -> None:
    from zarr_fused._native import region_kernels

    assert region_kernels is not None
    nd = data.draw(st.integers(1, 3))
    inner = tuple(data.draw(st.integers(1, 4)) for _ in range(nd))
    outer = tuple(i * data.draw(st.integers(1, 3)) for i in inner)
    shape = tuple(data.draw(st.integers(1, 20)) for _ in range(nd))
    box = st.tuples(*(st.tuples(st.integers(0, n), st.integers(0, n)) for n in shape))
    boxes = data.draw(st.lists(box, max_size=8))
    lo = np.array([[min(a, b) for a, b in bx] for bx in boxes], np.int64).reshape(-1, nd)
    hi = np.array([[max(a, b) for a, b in bx] for bx in boxes], np.int64).reshape(-1, nd)
    targets, units, starts, shards, shard_units = region_kernels.fan_out_targets(
        lo, hi, None, None, shape, outer, inner
    )
    grid = tuple(-(-n // o) for n, o in zip(shape, outer, strict=True))
    got: dict[Any, Any] = {}
    assert list(shards) == sorted(set(shards.tolist()))  # store order, each once
    for s, shard in enumerate(shards.tolist()):
        coords = tuple(int(c) for c in np.unravel_index(shard, grid))
        run = units[shard_units[s] : shard_units[s + 1]].tolist()
        assert run == sorted(set(run))
        for u in range(shard_units[s], shard_units[s + 1]):
            rows = targets[starts[u] : starts[u + 1]].tolist()
            got[(coords, int(units[u]))] = sorted(rows)
    assert got == _targets_by_unit(lo, hi, shape, outer, inner)


@pytest.mark.parametrize(
    "lo, hi, message",
    [
        pytest.param([[-1, 0]], [[2, 2]], "outside", id="negative"),
        pytest.param([[0, 0]], [[11, 2]], "outside", id="past-the-end"),
        pytest.param([[0, 0, 0]], [[1, 1, 1]], "lo and hi", id="axes"),
    ],
)
def test_fan_out_targets_refuses_boxes_outside(lo: Any, hi: Any, message: str) -> None:
    from zarr_fused._native import region_kernels

    assert region_kernels is not None
    with pytest.raises(ValueError, match=message):
        region_kernels.fan_out_targets(
            np.array(lo, np.int64), np.array(hi, np.int64), None, None, (10, 10), (4, 4), (2, 2)
        )


def test_fan_out_targets_refuses_a_grid_that_does_not_tile() -> None:
    from zarr_fused._native import region_kernels

    assert region_kernels is not None
    box = np.zeros((1, 2), np.int64)
    with pytest.raises(ValueError, match="do not tile"):
        region_kernels.fan_out_targets(box, box, None, None, (10, 10), (4, 5), (2, 2))


@given(data=st.data())
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_plain_region_sets_hypothesis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: Any
) -> None:
    store = _fan_out_hypothesis_store(tmp_path, "zstd", seed=73)
    arr = _open(store, FUSED)
    selections = data.draw(
        st.lists(st.tuples(*(_axis(n) for n in arr.shape)), min_size=0, max_size=16)
    )
    with monkeypatch.context() as patch:
        _assert_native_plan_reads(patch, store, arr, selections)


@pytest.mark.parametrize(
    ("path_off", "selections"),
    [
        pytest.param(_no_staging, [(slice(0, 3),), (slice(33, 35), 0)], id="fan-out"),
        pytest.param(
            _no_region_parse,
            [(slice(0, 3), slice(0, 26), slice(0, 19)), (33, slice(0, 2), 0)],
            id="native-plan",
        ),
    ],
)
def test_missing_shard_raises_when_zarr_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_off: Any, selections: list[Any]
) -> None:
    """A selection in a shard never written raises zarr's error without
    ``array.read_missing_chunks``, on the fan-out read (the staging read
    off) and on the native plan of plain selections (the per-region parse
    off); an inner chunk missing in a stored shard reads as the fill value."""
    store = make_store("local", tmp_path)
    _fan_out_filled(store, "zstd", seed=54)
    path_off(monkeypatch)
    with zarr.config.set({"array.read_missing_chunks": False}):
        arr = _open(store, FUSED)
        with pytest.raises(ChunkNotFoundError):
            _open(store, BATCHED)[selections[-1]]
        with pytest.raises(ChunkNotFoundError, match="c/2/0/0"):
            zarr_fused.read_regions(arr, selections)
        # a missing inner chunk in a stored shard reads as the fill value
        inner = [(slice(0, 8), slice(0, 4), slice(0, 5))]
        _assert_all(zarr_fused.read_regions(arr, inner), _expected(store, inner))
