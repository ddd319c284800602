"""The native sharded read path: index checks, IO pattern, selections, memory."""

from __future__ import annotations

import os
import struct
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore
from zarr.testing.strategies import basic_indices, orthogonal_indices

from zarr_fused import _shard_index as index_kernels
from zarr_fused.errors import CorruptChunkError, CorruptShardError
from zarr_fused.shard.read import ShardReader

from helpers import (
    BATCHED,
    FUSED,
    SIDE_BY_SIDE_CODECS,
    assert_same_values,
    chunk_spec,
    make_store,
    reference,
    with_pipeline,
)
from helpers.shards import ALWAYS_DETECTED, CORRUPTIONS, corrupt, index_entries, with_index

PROTO = default_buffer_prototype()


def _sharded(
    store: Any,
    *,
    shape=(16, 12),
    shards=(8, 6),
    inner=(4, 3),
    dtype="<i4",
    index_location="end",
    inner_codecs=None,
    index_codecs=None,
    **kwargs: Any,
) -> zarr.Array:
    serializer = ShardingCodec(
        chunk_shape=inner,
        codecs=inner_codecs or [BytesCodec()],
        index_codecs=index_codecs or [BytesCodec(), Crc32cCodec()],
        index_location=index_location,
    )
    return zarr.create_array(
        store,
        shape=shape,
        chunks=shards,
        dtype=dtype,
        serializer=serializer,
        compressors=None,
        fill_value=-1,
        **kwargs,
    )


def _data(shape: tuple[int, ...] = (16, 12)) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype="<i4").reshape(shape)


def test_sharded_arrays_use_the_native_reader(fused: None) -> None:
    arr = _sharded({})
    assert isinstance(arr._async_array.codec_pipeline.plan.reader, ShardReader)
    assert arr._async_array.codec_pipeline.plan.read_fallback == ""


# -- crafted bad shards -----------------------------------------------------------------


def _get(store: Any, key: str) -> bytes:
    return zarr.core.sync.sync(store.get(key, prototype=PROTO)).to_bytes()


def _put(store: Any, key: str, data: bytes) -> None:
    zarr.core.sync.sync(store.set(key, PROTO.buffer.from_bytes(data)))


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("corruption", CORRUPTIONS)
@pytest.mark.parametrize(
    "selection",
    [
        pytest.param(Ellipsis, id="whole"),
        pytest.param((slice(0, 4), slice(0, 3)), id="one-inner"),
        pytest.param(([1, 5], [2]), id="orthogonal"),
    ],
)
def test_bad_shard_raises_naming_the_key(
    tmp_path: Path, store_kind: str, location: str, corruption: str, selection: Any
) -> None:
    """memory: zarr's store and the Python fetch; local: zarr_fused's native
    file reads (whole shards and index-then-ranges)."""
    store = make_store(store_kind, tmp_path)
    with with_pipeline(FUSED):
        arr = _sharded(store, index_location=location)
        arr[...] = _data()
        shard = _get(store, "c/0/0")
        bad = corrupt(shard, 4, corruption, location)
        _put(store, "c/0/0", bad)
        target = (
            arr.oindex if isinstance(selection, tuple) and isinstance(selection[0], list) else arr
        )
        # a partial read only checks what it fetches: a bad entry of an
        # untouched chunk may go unnoticed, never unchecked bytes
        try:
            got = target[selection]
        except CorruptChunkError as exc:
            assert "c/0/0" in str(exc)
            if corruption in ("truncated", "index-crc"):
                assert isinstance(exc, CorruptShardError)
        else:
            assert corruption not in ALWAYS_DETECTED, "a corrupt index was not detected"
            assert np.array_equal(
                got,
                _data()[selection]
                if not isinstance(selection[0], list)
                else _data()[np.ix_(*selection)],
            )
        # other shards stay readable
        assert_same_values(arr[8:, 6:], _data()[8:, 6:])


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize(
    "selection",
    [
        pytest.param(Ellipsis, id="whole"),
        pytest.param((slice(12, 16), slice(6, 9)), id="one-inner"),
        pytest.param((slice(8, 16), slice(6, 8)), id="column"),
    ],
)
def test_bad_chunk_inside_shard_names_shard_and_inner_chunk(
    tmp_path: Path, store_kind: str, selection: Any
) -> None:
    store = make_store(store_kind, tmp_path)
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 1}):
        arr = _sharded(store, inner_codecs=[BytesCodec(), Crc32cCodec()])
        arr[...] = _data()
        shard = bytearray(_get(store, "c/1/1"))
        e = index_entries(bytes(shard), 4)
        shard[e[2][0] + 3] ^= 0xFF  # inner chunk (1, 0)
        _put(store, "c/1/1", bytes(shard))
        with pytest.raises(CorruptChunkError, match=r"inner chunk \(1, 0\) of shard 'c/1/1'"):
            arr[selection]
        assert_same_values(arr[8:12, 6:12], _data()[8:12, 6:12])  # the rest reads


def _relayout(
    shard: bytes, n: int, location: str, order: list[int], gaps: list[int]
) -> tuple[bytes, list[tuple[int, int]]]:
    """``shard`` with its inner chunks stored in ``order`` (chunk
    ``order[0]`` first), ``gaps[k]`` unused bytes before the k-th of them: a
    valid layout, since the index may list chunks in any order and need not
    cover every byte. Returns the shard and its new entries."""
    e = index_entries(shard, n, location)
    index_size = 16 * n + 4
    first = index_size if location == "start" else 0
    body = bytearray()
    moved: list[tuple[int, int]] = list(e)
    for gap, i in zip(gaps, order):
        body += b"\xa5" * gap
        off, size = e[i]
        moved[i] = (first + len(body), size)
        body += shard[off : off + size]
    raw = (
        bytes(index_size) + bytes(body) if location == "start" else bytes(body) + bytes(index_size)
    )
    return with_index(raw, moved, location=location), moved


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_chunks_stored_out_of_order(tmp_path: Path, location: str, store_kind: str) -> None:
    """An index need not list chunks in storage order: a shard stored in
    reverse reads back whole and in part, and an overlap between chunks that
    are not neighbours in the index is still found."""
    store = make_store(store_kind, tmp_path)
    with with_pipeline(FUSED):
        arr = _sharded(store, index_location=location)
        arr[...] = _data()
        good, moved = _relayout(_get(store, "c/0/0"), 4, location, [3, 2, 1, 0], [0] * 4)
        _put(store, "c/0/0", good)
        assert_same_values(arr[...], _data())
        assert_same_values(arr[0:4, 3:6], _data()[0:4, 3:6])
        assert_same_values(arr[1:7, 4], _data()[1:7, 4])
        # chunk 0 moved into the middle of chunk 2, its index neighbours untouched
        bad = with_index(good, [(moved[2][0] + 4, moved[0][1])] + moved[1:], location=location)
        _put(store, "c/0/0", bad)
        with pytest.raises(CorruptChunkError, match="c/0/0"):
            arr[0:8, 0:6]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    order=st.permutations(range(4)),
    gaps=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    location=st.sampled_from(["end", "start"]),
    selection=st.sampled_from(
        [
            (slice(None), slice(None)),
            (slice(0, 8), slice(0, 6)),
            (slice(1, 7), 4),
            (slice(4, 8), slice(0, 3)),
        ]
    ),
)
def test_any_storage_order_reads_the_same(
    tmp_path: Path, order: list[int], gaps: list[int], location: str, selection: Any
) -> None:
    """Every storage order of a shard's chunks, with unused bytes between
    them, reads back the same, on memory and local stores."""
    for kind in ("memory", "local"):
        store = make_store(kind, Path(tempfile.mkdtemp(dir=tmp_path)))
        with with_pipeline(FUSED):
            arr = _sharded(store, index_location=location)
            arr[...] = _data()
            shard, _ = _relayout(_get(store, "c/0/0"), 4, location, list(order), gaps)
            _put(store, "c/0/0", shard)
            assert_same_values(arr[selection], _data()[selection])


@pytest.mark.parametrize("hint", [0, 1 << 20], ids=["hint-too-small", "hint-fits"])
def test_local_partial_fetch_with_any_size_hint(tmp_path: Path, hint: int) -> None:
    """The native partial fetch sizes its buffer from a hint; when the
    touched chunks outgrow it, the small buffer is handed back and the chunks
    are read into a bigger one, with the same result."""
    from zarr_fused import _shard_index, _shard_local

    with with_pipeline(FUSED):
        arr = _sharded(LocalStore(tmp_path / "a"), shape=(64, 64), shards=(64, 64), inner=(16, 16))
        arr[...] = np.arange(64 * 64, dtype="<i4").reshape(64, 64)
    path = str(tmp_path / "a" / "c" / "0" / "0").encode()
    taken: list[int] = []
    given: list[int] = []

    def take(n: int) -> np.ndarray:
        taken.append(n)
        return np.empty(n, np.uint8)

    touched = np.array([0, 5, 15], dtype=np.intp)
    entries, payload, _ = _shard_local.fetch_partial_local(
        path,
        16,
        touched,
        take,
        checksum=True,
        big_endian=False,
        at_start=False,
        size_hint=hint,
        give=lambda b: given.append(len(b)),
    )
    whole = (tmp_path / "a" / "c" / "0" / "0").read_bytes()
    reference = _shard_index.parse_index(
        whole[-(16 * 16 + 4) :], 16, checksum=True, big_endian=False
    )
    for i in touched:
        off, size = (int(v) for v in entries[i])
        ref_off, ref_size = (int(v) for v in reference[i])
        assert size == ref_size == 16 * 16 * 4
        assert bytes(payload[off : off + size]) == whole[ref_off : ref_off + ref_size]
    assert len(payload) == 3 * 16 * 16 * 4
    if hint:
        assert taken == [hint] and given == []
    else:
        assert taken == [1, 3 * 16 * 16 * 4] and given == [1]


def _evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (once clean), so a read
    goes to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")
@pytest.mark.parametrize("cold", [False, True], ids=["hot", "evicted"])
@pytest.mark.parametrize(
    "touched",
    [
        pytest.param([0, 1, 2, 3], id="adjacent"),
        pytest.param([0, 5, 15], id="apart"),
        pytest.param([7], id="one"),
        pytest.param([2, 9, 10, 11, 14], id="mixed"),
    ],
)
def test_local_partial_fetch_with_prefetch_reads_the_same(
    tmp_path: Path, touched: list[int], cold: bool
) -> None:
    """Asking the kernel for the ranges up front (``prefetch``, the
    pipelined path) changes nothing in what a partial fetch returns, on
    cached and on evicted pages, with a missing inner chunk among them."""
    from zarr_fused import _shard_local

    with with_pipeline(FUSED):
        arr = _sharded(LocalStore(tmp_path / "a"), shape=(64, 64), shards=(64, 64), inner=(16, 16))
        data = np.random.default_rng(23).integers(0, 1 << 30, (64, 64), dtype="<i4")
        data[16:32, 16:32] = -1  # inner chunk 5 is the fill value: missing
        arr[...] = data
    path = tmp_path / "a" / "c" / "0" / "0"
    wanted = np.array(touched, dtype=np.intp)
    settings: dict[str, Any] = {"checksum": True, "big_endian": False, "at_start": False}

    def take(n: int) -> np.ndarray:
        return np.empty(n, np.uint8)

    plain = _shard_local.fetch_partial_local(bytes(path), 16, wanted, take, **settings)
    if cold:
        _evict(path)
    got = _shard_local.fetch_partial_local(
        bytes(path), 16, wanted, take, prefetch=True, max_gap=1 << 10, **settings
    )
    assert plain is not None and got is not None
    for i in wanted:
        off, size = (int(v) for v in got[0][i])
        ref_off, ref_size = (int(v) for v in plain[0][i])
        assert size == ref_size
        assert bytes(got[1][off : off + size]) == bytes(plain[1][ref_off : ref_off + ref_size])


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize(
    "index_codecs",
    [
        pytest.param(("big", True), id="big-crc"),
        pytest.param(("big", False), id="big"),
        pytest.param(("little", False), id="little"),
    ],
)
def test_index_codecs_read_and_write_like_zarr(
    tmp_path: Path, store_kind: str, location: str, index_codecs: tuple[str, bool]
) -> None:
    """Shard indexes in either byte order, with or without crc32c: zarr's
    shards read back right, and ours are byte-identical to zarr's."""
    endian, crc = index_codecs
    codecs = [BytesCodec(endian=endian)] + ([Crc32cCodec()] if crc else [])
    data = _data()
    stores = {}
    for pipeline in (BATCHED, FUSED):
        stores[pipeline] = make_store(store_kind, tmp_path, pipeline.rsplit(".", 1)[-1])
        with with_pipeline(pipeline):
            arr = _sharded(stores[pipeline], index_location=location, index_codecs=codecs)
            arr[...] = data
    with with_pipeline(FUSED):
        theirs = zarr.open_array(stores[BATCHED], mode="r")
        for selection in (Ellipsis, (slice(0, 4), slice(0, 3)), (slice(1, 7), 4)):
            assert_same_values(theirs[selection], data[selection])
        assert_same_values(theirs.oindex[[1, 9], [2, 7]], data[np.ix_([1, 9], [2, 7])])
    for key in ("c/0/0", "c/1/1"):
        assert _get(stores[FUSED], key) == _get(stores[BATCHED], key)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("max_workers", [1, 2])
@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(0, 4), slice(0, 3)), id="one-inner"),
        pytest.param((slice(0, 8, 5), slice(0, 3)), id="strided-half"),
        pytest.param((slice(0, 3), slice(1, 11)), id="across-shards"),
        pytest.param((slice(5, 7), slice(0, 2)), id="missing-inner"),
        pytest.param((slice(9, 11), slice(7, 9)), id="missing-shard"),
    ],
)
def test_local_partial_reads_fetch_and_decode_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str, selection: Any, max_workers: int
) -> None:
    """A planned partial read of a local shard, shard by shard, goes through
    `read_shard_local` (fetch and decode in one nogil call), with zarr's
    values, missing inner chunks and missing shards included; in waves
    (several workers, few shards) it does not. (That is the direct path of
    the compute threads: ``io_concurrency`` 1 here, since with IO threads
    a fresh reader's first read goes through them, `zarr_fused.shard.pipelined`.)"""
    from zarr_fused.io import local as _local_io

    calls: list[bytes] = []
    real = _local_io.shard_local_kernels.read_shard_local

    def spy(batch: Any, first: int, path: bytes, *args: Any, **kwargs: Any) -> Any:
        calls.append(path)
        return real(batch, first, path, *args, **kwargs)

    monkeypatch.setattr(_local_io.shard_local_kernels, "read_shard_local", spy)
    data = _data()
    data[4:8, 0:3] = -1  # one inner chunk of shard (0, 0) is all fill: not stored
    data[8:16, 6:12] = -1  # shard (1, 1) is all fill: no file
    config = {"codec_pipeline.max_workers": max_workers, "codec_pipeline.io_concurrency": 1}
    with with_pipeline(FUSED), zarr.config.set(config):
        arr = _sharded(LocalStore(tmp_path / "a"), index_location=location)
        arr[...] = data
        assert not (tmp_path / "a" / "c" / "1" / "1").exists()
        assert_same_values(arr[selection], data[selection])
    one_chunk = selection in [
        (slice(0, 4), slice(0, 3)),
        (slice(5, 7), slice(0, 2)),
        (slice(9, 11), slice(7, 9)),
    ]
    assert bool(calls) == (max_workers == 1 or one_chunk)


# -- IO pattern ---------------------------------------------------------------------------


class Counting(WrapperStore[Any]):
    """Records the pipeline's sync reads: ("get", byte range) and
    ("ranges", number of ranges) (the reads a coalesced request makes
    internally are not the pipeline's and are not recorded)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.calls: list[tuple[str, Any]] = []
        self.reads = 0  # reads made inside get_ranges_sync (after coalescing)
        self._inside = False

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        if self._inside:
            self.reads += 1
        elif not key.endswith("zarr.json"):
            self.calls.append(("get", byte_range))
        return self._store.get_sync(key, prototype=prototype, byte_range=byte_range)

    def get_ranges_sync(self, key: str, byte_ranges: Any, **kwargs: Any) -> Any:
        self.calls.append(("ranges", len(byte_ranges)))
        self._inside = True
        try:
            return super().get_ranges_sync(key, byte_ranges, **kwargs)
        finally:
            self._inside = False


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        pytest.param((slice(0, 8), slice(0, 6)), [("get", None)], id="whole-shard"),
        pytest.param((slice(0, 4), slice(0, 3)), ["index", ("ranges", 1)], id="one-inner"),
        pytest.param((slice(1, 7), 4), ["index", ("ranges", 2)], id="column"),
        pytest.param((slice(0, 8, 5), slice(0, 6)), [("get", None)], id="strided-touches-all"),
        pytest.param((slice(0, 8, 5), slice(0, 3)), ["index", ("ranges", 2)], id="strided-half"),
    ],
)
def test_partial_reads_fetch_only_needed_ranges(selection: Any, expected: list[Any]) -> None:
    store = Counting(MemoryStore())
    with with_pipeline(FUSED):
        arr = _sharded(store)
        arr[...] = _data()
        store.calls.clear()
        got = arr[selection]
    assert_same_values(got, _data()[selection])
    calls = ["index" if kind == "get" and r is not None else (kind, r) for kind, r in store.calls]
    assert calls == expected


@pytest.mark.parametrize(("gap", "reads"), [(1 << 20, 1), (0, 2)], ids=["coalesced", "apart"])
def test_coalescing_follows_zarr_settings(gap: int, reads: int) -> None:
    store = Counting(MemoryStore())
    with with_pipeline(FUSED):
        arr = _sharded(store, shape=(32,), shards=(32,), inner=(2,))
        arr[...] = np.arange(32, dtype="<i4")
        with zarr.config.set({"array.sharding_coalesce_max_gap_bytes": gap}):
            reopened = zarr.open_array(store, mode="r")
        counting = reopened._async_array.store_path.store  # opening wraps it anew
        assert_same_values(reopened[[0, 1, 30, 31]], np.array([0, 1, 30, 31], "<i4"))
    assert counting.calls[0][0] == "get" and counting.calls[1] == ("ranges", 2)
    assert counting.reads == reads


@pytest.mark.parametrize("gap", [1 << 20, 4096], ids=["default-gap", "small-gap"])
def test_local_reads_never_read_wide_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: int
) -> None:
    """On LocalStore the native reader coalesces with zarr's settings, but a
    gap wider than LOCAL_MAX_GAP is skipped with a second pread rather than
    read and thrown away."""
    from zarr_fused.io import local as _local_io
    from zarr_fused.shard import read as _read_sharded

    seen: list[int] = []
    real = _local_io.shard_local_kernels.fetch_partial_local

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["max_gap"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_local_io.shard_local_kernels, "fetch_partial_local", spy)
    data = np.arange(4096, dtype="<i4")
    with with_pipeline(FUSED), zarr.config.set({"array.sharding_coalesce_max_gap_bytes": gap}):
        arr = _sharded(LocalStore(tmp_path / "a"), shape=(4096,), shards=(4096,), inner=(16,))
        arr[...] = data
        picks = [0, 1, 2000, 4095]
        assert_same_values(arr[picks], data[picks])
    assert seen == [min(gap, _read_sharded.LOCAL_MAX_GAP)]


def test_idle_shard_buffers_are_bounded() -> None:
    """The pool of reused shard buffers keeps at most ``keep`` buffers and
    ``max_bytes`` bytes while idle, dropping the smallest or the largest."""
    from zarr_fused._buffers import BufferPool as _Buffers

    pool = _Buffers(keep=2, max_bytes=1 << 20)
    small, medium, large = (np.empty(n, np.uint8) for n in (1 << 16, 1 << 18, 1 << 19))
    for buf in (small, medium, large):
        pool.give(buf)
    assert [b.nbytes for b in pool._free] == [1 << 18, 1 << 19]  # the smallest went
    assert pool.take(1 << 17) is medium  # the smallest that fits
    pool.give(np.empty(3 << 18, np.uint8))  # 1.25 MiB held: the largest goes
    assert [b.nbytes for b in pool._free] == [1 << 19]
    assert pool.take(1 << 20).nbytes == 1 << 20  # nothing fits: a new one


def test_missing_shards_and_inner_chunks(fused: None) -> None:
    store = MemoryStore()
    arr = _sharded(store, config={"read_missing_chunks": False})
    arr[0:4, 0:3] = 5  # one inner chunk of one shard
    expected = np.full((8, 6), -1, "<i4")
    expected[0:4, 0:3] = 5
    assert_same_values(arr[0:8, 0:6], expected)  # missing inner chunks fill
    with pytest.raises(zarr.errors.ChunkNotFoundError):
        arr[...]  # missing shards raise


# -- selections against zarr -------------------------------------------------------------


@st.composite
def sharded_cases(draw: st.DrawFn) -> dict[str, Any]:
    ndim = draw(st.integers(1, 3))
    inner = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    shards = tuple(i * draw(st.integers(1, 3)) for i in inner)
    shape = tuple(draw(st.integers(1, 2 * s + 1)) for s in shards)
    return {
        "shape": shape,
        "inner": inner,
        "shards": shards,
        "location": draw(st.sampled_from(["start", "end"])),
        "crc": draw(st.booleans()),
        "zstd": draw(st.booleans()),
        "big": draw(st.booleans()),
        "kind": draw(st.sampled_from(["basic", "orthogonal", "vindex"])),
        "data": draw(st.data()),
        "max_workers": draw(st.sampled_from([1, 2, 3])),
        "partial_fill": draw(st.booleans()),
    }


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=sharded_cases())
def test_property_sharded_selections_match_zarr(case: dict[str, Any]) -> None:
    inner_codecs = [BytesCodec(endian="big" if case["big"] else "little")]
    if case["crc"]:
        inner_codecs.append(Crc32cCodec())
    if case["zstd"]:
        inner_codecs.insert(1, ZstdCodec(level=1))
    shape = case["shape"]
    data = np.random.default_rng(len(shape)).integers(-100, 100, shape).astype("<i2")
    store = MemoryStore()
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            store,
            shape=shape,
            chunks=case["shards"],
            dtype=data.dtype,
            fill_value=-1,
            compressors=None,
            serializer=ShardingCodec(
                chunk_shape=case["inner"], codecs=inner_codecs, index_location=case["location"]
            ),
        )
        if case["partial_fill"]:
            arr[tuple(slice(0, max(1, s // 2)) for s in shape)] = data[
                tuple(slice(0, max(1, s // 2)) for s in shape)
            ]
        else:
            arr[...] = data
        expected_arr = zarr.open_array(store, mode="r")
    draw = case["data"].draw
    if case["kind"] == "basic":
        selection = draw(basic_indices(shape=shape))
        get = lambda a: a[selection]
    elif case["kind"] == "orthogonal":
        selection, _ = draw(orthogonal_indices(shape=shape))
        get = lambda a: a.oindex[selection]
    else:
        n = draw(st.integers(1, 6))
        selection = tuple(
            np.array(draw(st.lists(st.integers(0, s - 1), min_size=n, max_size=n))) for s in shape
        )
        get = lambda a: a.vindex[selection]
    with with_pipeline(BATCHED):
        expected = np.asarray(get(expected_arr))
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": case["max_workers"]}):
        got = np.asarray(get(zarr.open_array(store, mode="r")))
    assert_same_values(got, expected)


@pytest.mark.parametrize("max_workers", [1, 2, 4])
@pytest.mark.parametrize(
    "shards", [pytest.param((32, 32), id="one-shard"), pytest.param((8, 8), id="many-shards")]
)
def test_waves_and_per_shard_modes(max_workers: int, shards: tuple[int, int]) -> None:
    data = np.random.default_rng(5).random((32, 32)).astype("<f4")
    store = MemoryStore()
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        arr = zarr.create_array(
            store,
            shape=(32, 32),
            chunks=(4, 4),
            shards=shards,
            dtype="<f4",
            compressors=ZstdCodec(level=1),
        )
        arr[...] = data
        assert_same_values(arr[...], data)
        assert_same_values(arr[3:29:3, 1:31:4], data[3:29:3, 1:31:4])
        assert_same_values(arr[5], data[5])


# -- inner chunks decoded side by side ----------------------------------------------------
#
# Neighbouring inner chunks along the last axis are decoded together and
# scattered row by row (rows shorter than 512 bytes, no checksum before the
# compressor). These geometries put 5 inner chunks across a shard whose rows
# land far apart in the output, so most reads below take that path.


def _side_array(
    store: Any, dtype: str, codecs: str, shape: tuple[int, ...]
) -> tuple[zarr.Array, np.ndarray]:
    endian = "big" if dtype.startswith(">") else "little"
    data = np.random.default_rng(3).integers(0, 100, shape).astype(dtype)
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            store,
            shape=shape,
            chunks=(6, 10, 20),
            dtype=dtype,
            fill_value=7,
            compressors=None,
            serializer=ShardingCodec(
                chunk_shape=(3, 5, 4),
                codecs=[BytesCodec(endian=endian), *SIDE_BY_SIDE_CODECS[codecs]],
            ),
        )
        arr[...] = data
        arr[0:3, 5:10, 8:12] = 7  # one inner chunk in the middle of a row: not stored
    data[0:3, 5:10, 8:12] = 7
    return arr, data


SIDE_SELECTIONS = [
    pytest.param(Ellipsis, id="all"),
    pytest.param((slice(None), slice(None), slice(3, 37)), id="cut-rows"),
    pytest.param((slice(1, 5), slice(2, 9), slice(0, 20)), id="one-shard-wide"),
    pytest.param((slice(None), slice(None), slice(0, 40, 2)), id="stepped"),
    pytest.param((2, slice(None), slice(None)), id="dropped-axis"),
]


@pytest.mark.parametrize("selection", SIDE_SELECTIONS)
@pytest.mark.parametrize("codecs", list(SIDE_BY_SIDE_CODECS))
@pytest.mark.parametrize("dtype", ["<u2", ">u2", "|b1", ">f8"])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_side_by_side_decode_matches_zarr(
    tmp_path: Path, store_kind: str, dtype: str, codecs: str, selection: Any
) -> None:
    store = make_store(store_kind, tmp_path)
    _arr, data = _side_array(store, dtype, codecs, (12, 20, 38))  # partial edge chunks in x
    with with_pipeline(BATCHED):
        expected = zarr.open_array(store, mode="r")[selection]
    assert_same_values(expected, data[selection], byte_order=False)
    for workers in (1, 2):
        with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": workers}):
            assert_same_values(zarr.open_array(store, mode="r")[selection], expected)


@pytest.mark.parametrize("codecs", ["zstd", "raw", "zstd-crc"])
def test_side_by_side_error_names_the_bad_inner_chunk(codecs: str) -> None:
    store = MemoryStore()
    _side_array(store, "<u2", codecs, (6, 10, 20))
    shard = bytearray(_get(store, "c/0/0/0"))
    e = index_entries(bytes(shard), 2 * 2 * 5)
    offset, size = e[2]  # inner chunk (0, 0, 2): the middle of a row of 5
    if codecs == "raw":  # two bytes short of an inner chunk
        shard = bytearray(with_index(bytes(shard), e[:2] + [(offset, size - 2)] + e[3:]))
    else:
        shard[offset + size // 2] ^= 0xFF
    _put(store, "c/0/0/0", bytes(shard))
    with (
        with_pipeline(FUSED),
        pytest.raises(CorruptChunkError, match=r"inner chunk \(0, 0, 2\) of shard 'c/0/0/0'"),
    ):
        zarr.open_array(store, mode="r")[...]


# -- memory -----------------------------------------------------------------------------


def test_read_memory_is_output_plus_a_few_shards(tmp_path: Path) -> None:
    """Reading N bytes peaks at about N plus a shard or so per worker, not
    N plus everything stored, on the compute threads' own path. (Through the
    IO threads, which a slow host or a sanitizer build picks, the bytes in
    flight have their own documented bound, tested in test_io_engine.)"""
    shape, shard = (8 * 256, 256), (256, 256)
    data = np.random.default_rng(0).integers(0, 2**31, shape, dtype="<i4")
    shard_bytes = 256 * 256 * 4
    store = LocalStore(tmp_path / "a")
    settings = {"codec_pipeline.max_workers": 2, "codec_pipeline.io_concurrency": 1}
    with with_pipeline(FUSED), zarr.config.set(settings):
        arr = zarr.create_array(
            store, shape=shape, chunks=(64, 64), shards=shard, dtype="<i4", compressors=None
        )
        arr[...] = data
        arr[...]  # warm up (pool, caches)
        tracemalloc.start()
        try:
            got = arr[...]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert_same_values(got, data)
    extra = peak - data.nbytes
    assert extra < 4 * shard_bytes, f"read used {extra / shard_bytes:.1f} shards beyond its output"


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("operation", ["whole", "partial", "write"])
def test_truncated_shard_in_zarrs_words(
    tmp_path: Path, store_kind: str, location: str, operation: str
) -> None:
    """zarr's own tests match its message for a shard shorter than its index."""
    store = make_store(store_kind, tmp_path)
    with with_pipeline(FUSED):
        arr = _sharded(store, index_location=location)
        arr[...] = _data()
        _put(store, "c/0/0", b"abc")
        with pytest.raises(CorruptShardError, match="too short to hold its index") as info:
            if operation == "whole":
                arr[0:8, 0:6]
            elif operation == "partial":
                arr[0:2, 0:2]
            else:
                arr[0:2, 0:2] = 7
        assert "c/0/0" in str(info.value)


# -- the shard index against its reference twin (helpers.reference) --------------
#
# `_shard.parse_index` against `reference.parse_index` / `shard_index`:
# the same entries for every valid index (index at the start or end, either
# byte order, with or without crc32c, missing chunks), and the same error,
# naming the same inner chunk, for every invalid one. The twin is itself
# checked against the index zarr decodes from shards it wrote.

INDEX_GRIDS = [pytest.param(g, id="x".join(map(str, g))) for g in [(1,), (5,), (2, 3), (3, 2, 2)]]
INDEX_LOCATIONS = [pytest.param(True, id="start"), pytest.param(False, id="end")]
INDEX_CODECS = [
    pytest.param(c, e, id=f"{'be' if e else 'le'}{'-crc' if c else ''}")
    for c in (False, True)
    for e in (False, True)
]
INDEX_MISSING = [pytest.param(m, id=m) for m in ("none", "some", "all-but-one")]


def _index_bytes(entries: Any, *, checksum: bool, big_endian: bool) -> bytes:
    """An index of ``entries`` ((offset, nbytes) pairs), encoded independently
    of both parsers: struct for the pairs, google_crc32c for the checksum."""
    import google_crc32c

    index = b"".join(
        struct.pack(">QQ" if big_endian else "<QQ", int(o), int(s)) for o, s in entries
    )
    if checksum:
        index += struct.pack("<I", google_crc32c.value(index))
    return index


def _index_case(grid: tuple[int, ...], missing: str, seed: int) -> tuple[list[Any], np.ndarray]:
    """(payloads per inner chunk, None where missing; a storage order)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(grid))
    absent = {
        "none": np.zeros(n, bool),
        "some": rng.random(n) < 0.4,
        "all-but-one": np.arange(n) != rng.integers(n),
    }[missing]
    payloads = [None if absent[i] else rng.bytes(int(rng.integers(1, 40))) for i in range(n)]
    return payloads, rng.permutation(n).astype(np.intp)


def _native_index(
    shard: bytes, grid: tuple[int, ...], *, at_start: bool, checksum: bool, big_endian: bool
) -> np.ndarray:
    n = int(np.prod(grid))
    size = 16 * n + (4 if checksum else 0)
    start = 0 if at_start else len(shard) - size
    return index_kernels.parse_index(
        shard[start : start + size],
        n,
        checksum=checksum,
        big_endian=big_endian,
        shard_len=len(shard),
        index_start=start,
        grid=grid,
        where="c/0/0",
    )


@pytest.mark.parametrize("missing", INDEX_MISSING)
@pytest.mark.parametrize(("checksum", "big_endian"), INDEX_CODECS)
@pytest.mark.parametrize("at_start", INDEX_LOCATIONS)
@pytest.mark.parametrize("grid", INDEX_GRIDS)
def test_parse_index_matches_reference(
    grid: tuple[int, ...], at_start: bool, checksum: bool, big_endian: bool, missing: str
) -> None:
    payloads, order = _index_case(grid, missing, seed=21)
    shard = reference.assemble_shard(
        order, payloads, at_start=at_start, checksum=checksum, big_endian=big_endian
    )
    assert shard is not None
    expected = reference.shard_index(
        shard, len(payloads), at_start=at_start, checksum=checksum, big_endian=big_endian, grid=grid
    )
    ours = _native_index(shard, grid, at_start=at_start, checksum=checksum, big_endian=big_endian)
    assert ours.dtype == expected.dtype == np.uint64
    np.testing.assert_array_equal(ours, expected, strict=True)
    # and the entries are what was stored: each present payload at its range
    for i, payload in enumerate(payloads):
        off, size = (int(v) for v in expected[i])
        if payload is None:
            assert (off, size) == (reference.MISSING, reference.MISSING)
        else:
            assert shard[off : off + size] == payload


def _bad_entries(
    kind: str, entries: list[tuple[int, int]], shard_len: int, index_start: int, index_size: int
) -> list[tuple[int, int]]:
    """``entries`` (all present) with one made invalid the way ``kind`` says."""
    e = list(entries)
    m = reference.MISSING
    last = len(e) - 1
    if kind == "half-missing":
        e[last] = (m, e[last][1])
    elif kind == "half-missing-size":
        e[0] = (e[0][0], m)
    elif kind == "overflow":
        e[last] = (2**63, 2**63 + 5)
    elif kind == "past-end":
        e[last] = (e[last][0], shard_len)
    elif kind == "into-index":
        e[last] = (index_start + index_size - 1, 1)
    elif kind == "overlap":
        e[last] = (e[0][0] + 1, e[last][1])
    elif kind == "overlap-contained":
        e[0] = (e[last][0], e[last][1] + e[0][1])
    elif kind == "empty-inside-index":  # valid: an empty range overlaps nothing
        e[last] = (index_start + 1, 0)
    return e


BAD_INDEX_CASES = [
    pytest.param(
        kind,
        checksum,
        big_endian,
        id=f"{kind}-{'be' if big_endian else 'le'}{'-crc' if checksum else ''}",
    )
    for kind in (
        "half-missing",
        "half-missing-size",
        "overflow",
        "past-end",
        "into-index",
        "overlap",
        "overlap-contained",
        "empty-inside-index",
        "crc",
        "truncated",
    )
    for checksum in (False, True)
    for big_endian in (False, True)
    if checksum or kind != "crc"
]


def _parse_both(index: bytes, n: int, args: dict[str, Any]) -> list[tuple[str, Any]]:
    """What the native parser and the reference make of ``index``: each
    ``("ok", entries)`` or ``("error", message)``."""
    outcomes: list[tuple[str, Any]] = []
    for parse in (index_kernels.parse_index, reference.parse_index):
        try:
            outcomes.append(("ok", parse(index, n, **args).tolist()))
        except CorruptShardError as exc:
            outcomes.append(("error", str(exc)))
    return outcomes


@pytest.mark.parametrize(("kind", "checksum", "big_endian"), BAD_INDEX_CASES)
@pytest.mark.parametrize("at_start", INDEX_LOCATIONS)
def test_bad_index_fails_like_reference(
    at_start: bool, kind: str, checksum: bool, big_endian: bool
) -> None:
    grid = (2, 3)
    payloads, order = _index_case(grid, "none", seed=22)
    n = len(payloads)
    shard = reference.assemble_shard(
        order, payloads, at_start=at_start, checksum=checksum, big_endian=big_endian
    )
    assert shard is not None
    size = 16 * n + (4 if checksum else 0)
    start = 0 if at_start else len(shard) - size
    entries = [
        tuple(int(v) for v in row)
        for row in reference.shard_index(
            shard, n, at_start=at_start, checksum=checksum, big_endian=big_endian
        )
    ]
    index = _index_bytes(
        _bad_entries(kind, entries, len(shard), start, size),
        checksum=checksum,
        big_endian=big_endian,
    )
    if kind == "crc":
        index = index[:-1] + bytes([index[-1] ^ 0x40])
    elif kind == "truncated":
        index = index[:-3]
    args = {
        "checksum": checksum,
        "big_endian": big_endian,
        "shard_len": len(shard),
        "index_start": start,
        "grid": grid,
        "where": "c/0/0",
    }
    outcomes = _parse_both(index, n, args)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ("ok" if kind == "empty-inside-index" else "error")


@st.composite
def raw_indexes(draw: st.DrawFn) -> dict[str, Any]:
    """Arbitrary entries near a small shard: present, missing, half-missing,
    empty, overlapping, past the end, in the index, overflowing."""
    grid = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    n = int(np.prod(grid))
    checksum, big_endian, at_start = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    size = 16 * n + (4 if checksum else 0)
    shard_len = size + draw(st.integers(0, 64))
    m = reference.MISSING
    field = st.one_of(st.integers(0, shard_len + 8), st.just(m), st.integers(2**63, m))
    entry = st.one_of(
        st.just((m, m)),
        st.tuples(field, st.integers(0, 24)),
        st.tuples(st.integers(0, shard_len), field),
    )
    entries = draw(st.lists(entry, min_size=n, max_size=n))
    return {
        "grid": grid,
        "entries": entries,
        "checksum": checksum,
        "big_endian": big_endian,
        "shard_len": shard_len,
        "index_start": 0 if at_start else shard_len - size,
    }


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(case=raw_indexes())
def test_property_parse_index_matches_reference(case: dict[str, Any]) -> None:
    n = len(case["entries"])
    index = _index_bytes(case["entries"], checksum=case["checksum"], big_endian=case["big_endian"])
    args = {k: case[k] for k in ("checksum", "big_endian", "shard_len", "index_start", "grid")}
    outcomes = _parse_both(index, n, args)
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(
    "missing", [pytest.param(False, id="full"), pytest.param(True, id="with-missing")]
)
@pytest.mark.parametrize(("checksum", "big_endian"), INDEX_CODECS)
@pytest.mark.parametrize("location", ["start", "end"])
def test_reference_index_matches_zarr(
    location: str, checksum: bool, big_endian: bool, missing: bool
) -> None:
    """The twin reads zarr's shards as zarr does: the same entries as zarr's
    own index decoding, and every present range decodes (by the chain's
    twin) to that inner chunk of the array."""
    index_codecs = [BytesCodec(endian="big" if big_endian else "little")]
    index_codecs += [Crc32cCodec()] if checksum else []
    data = _data()
    if missing:
        data[0:4, 3:6] = -1  # inner chunk (0, 1) of shard c/0/0: all fill value, not stored
    store = MemoryStore()
    with with_pipeline(BATCHED):
        arr = _sharded(store, index_location=location, index_codecs=index_codecs)
        arr[...] = data
    codec = arr.metadata.codecs[0]
    grid = (2, 2)  # shards (8, 6) of inner chunks (4, 3)
    shard = _get(store, "c/0/0")
    ours = reference.shard_index(
        shard, 4, at_start=location == "start", checksum=checksum, big_endian=big_endian, grid=grid
    )
    size = 16 * 4 + (4 if checksum else 0)
    raw = shard[:size] if location == "start" else shard[-size:]
    theirs = codec._decode_shard_index_sync(PROTO.buffer.from_bytes(raw), grid)
    np.testing.assert_array_equal(ours, theirs.offsets_and_lengths.reshape(-1, 2), strict=True)
    inner_codecs = [BytesCodec()]
    spec = chunk_spec((4, 3), np.dtype("<i4"))
    for lin, (off, size) in enumerate(ours.tolist()):
        i, j = np.unravel_index(lin, grid)
        expected = data[4 * i : 4 * i + 4, 3 * j : 3 * j + 3]
        if (off, size) == (reference.MISSING, reference.MISSING):
            assert missing and (expected == -1).all()
            continue
        chunk = reference.decode_chunk(shard[off : off + size], inner_codecs, spec)
        np.testing.assert_array_equal(chunk, expected, strict=True)
