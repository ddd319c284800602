"""`zarr_fused.stats`: the counters of a block against what the store saw.

A counting `WrapperStore` (over a `MemoryStore` or a `LocalStore`) records
every request the pipeline makes; the block's counters must equal it,
request for request and byte for byte, for sharded and unsharded arrays,
whole and partial reads and writes. A `LocalStore` read natively is
checked against the files on disk, and moto's S3 (obstore) against the
requests its proxy saw. Threads and asyncio tasks with their own blocks
see only their own counts; without a block nothing is allocated.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr.storage import LocalStore, MemoryStore, WrapperStore

import zarr_fused
from zarr_fused.stats import CountedPath, Stats, active, store_kind

from helpers import BATCHED, FUSED, NoSyncIOStore, with_pipeline

SHAPE = (24, 20)
CHUNKS = (6, 5)  # 4 x 4 chunks
SHARDS = (12, 10)  # 2 x 2 shards of 2 x 2 inner chunks


class Counting(WrapperStore[Any]):
    """Counts every request by op ("get", "get_range", "set", "delete")
    and the bytes each moved, as the store sees them."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.requests: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _note(self, op: str, buf: Any) -> None:
        with self.lock:
            self.requests[op] += 1
            self.bytes[op] += 0 if buf is None else len(buf)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes.clear()

    def get_sync(self, key: str, *, prototype: Any = None, byte_range: Any = None) -> Any:
        buf = self._store.get_sync(key, prototype=prototype, byte_range=byte_range)
        self._note("get" if byte_range is None else "get_range", buf)
        return buf

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        buf = await self._store.get(key, prototype, byte_range)
        self._note("get" if byte_range is None else "get_range", buf)
        return buf

    def set_sync(self, key: str, value: Any) -> None:
        self._store.set_sync(key, value)
        self._note("set", value)

    async def set(self, key: str, value: Any) -> None:
        await self._store.set(key, value)
        self._note("set", value)

    def delete_sync(self, key: str) -> None:
        self._store.delete_sync(key)
        self._note("delete", None)

    async def delete(self, key: str) -> None:
        await self._store.delete(key)
        self._note("delete", None)

    # zarr's coalescing plan, its requests made through `get_sync` above
    get_ranges_sync = Store.get_ranges_sync


def _data(seed: int = 7) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 1000, SHAPE).astype("<u2")
    data[:6, :5] = 0  # one chunk all fill value: not stored
    return data


def _create(store: Any, sharded: bool) -> zarr.Array:
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            store,
            shape=SHAPE,
            chunks=CHUNKS,
            shards=SHARDS if sharded else None,
            dtype="<u2",
            compressors=zarr.codecs.ZstdCodec(level=1),
            fill_value=0,
        )
        arr[...] = _data()
    return arr


def _open(store: Any) -> zarr.Array:
    with with_pipeline(FUSED):
        return zarr.open_array(store, mode="r+")


def _by_op(counter: Counter[tuple[str, str]], kind: str) -> dict[str, int]:
    return {op: n for (k, op), n in counter.items() if k == kind and n}


OPS = {
    "read-all": lambda arr: arr[...],
    "read-part": lambda arr: arr[3:17, 2:9],
    "read-point": lambda arr: arr[13, 11],
    "write-all": lambda arr: arr.__setitem__(Ellipsis, _data(8)),
    "write-part": lambda arr: arr.__setitem__((slice(3, 17), slice(2, 9)), 5),
    "write-fill": lambda arr: arr.__setitem__((slice(0, 12), slice(0, 10)), 0),
}


def _base(kind: str, tmp_path: Path) -> Any:
    if kind == "nosync":  # the async path, as on a remote store
        return NoSyncIOStore(MemoryStore())
    return MemoryStore() if kind == "memory" else LocalStore(tmp_path / "a")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
def test_counters_equal_a_counting_store(tmp_path: Path, kind: str, sharded: bool, op: str) -> None:
    store = Counting(_base(kind, tmp_path))
    _create(store, sharded)
    arr = _open(store)
    store.reset()
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        OPS[op](arr)
    seen = dict(+store.requests)
    assert seen  # the operation did make requests
    assert _by_op(s.requests, store_kind(store)) == seen
    assert _by_op(s.bytes, store_kind(store)) == dict(+store.bytes)
    assert s.total_requests() == sum(seen.values())
    what = op.split("-")[0]
    assert s.calls[what] >= 1
    assert sum(s.items.values()) >= 1


def _files(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and p.name != "zarr.json"
    }


@pytest.mark.parametrize("file_sizes", [True, False], ids=["file-sizes", "no-file-sizes"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_native_local_read_counts_the_files(
    tmp_path: Path, sharded: bool, file_sizes: bool
) -> None:
    """A `LocalStore` read natively (no wrapper hides it): one request per
    chunk (or shard) key of the read, missing ones included, and the bytes
    of the files that exist; without ``file_sizes``, whole chunk files
    decoded in the read's native call are counted unsized instead."""
    root = tmp_path / "a"
    _create(LocalStore(root), sharded)
    arr = _open(LocalStore(root))
    files = _files(root)
    with with_pipeline(FUSED), zarr_fused.stats(file_sizes=file_sizes) as s:
        np.testing.assert_array_equal(arr[...], _data())
    keys = 4 if sharded else 16
    assert s.requests == Counter({("local", "get"): keys})
    # the IO threads' path reports the lengths: sized whatever file_sizes says
    unsized = s.unsized[("local", "get")]
    assert unsized in ((0, keys) if not file_sizes and not sharded else (0,))
    assert s.bytes[("local", "get")] == (0 if unsized else sum(files.values()))
    assert s.items == Counter({("read", "shards" if sharded else "chunks"): keys})
    assert s.bytes_decoded == 2 * (
        (len(files)) * (SHARDS[0] * SHARDS[1] if sharded else CHUNKS[0] * CHUNKS[1])
    )


@pytest.mark.parametrize("io_concurrency", [1, 4], ids=["direct", "pipelined"])
def test_native_local_read_wraps_a_key_per_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io_concurrency: int
) -> None:
    """An unsharded `LocalStore` read natively keeps zarr's keys: only the
    first key of each group of files is wrapped (its native run finds the
    sink from it), and the files and the time split are counted all the
    same."""
    root = tmp_path / "a"
    _create(LocalStore(root), sharded=False)
    arr = _open(LocalStore(root))
    wrapped: list[str] = []
    init = CountedPath.__init__

    def counting_init(self: CountedPath, key: Any, sink: Stats, kind: str) -> None:
        wrapped.append(key.path)
        init(self, key, sink, kind)

    monkeypatch.setattr(CountedPath, "__init__", counting_init)
    config = {"codec_pipeline.max_workers": 2, "codec_pipeline.io_concurrency": io_concurrency}
    with with_pipeline(FUSED), zarr.config.set(config), zarr_fused.stats() as s:
        np.testing.assert_array_equal(arr[...], _data())
    assert 1 <= len(wrapped) < 16
    assert s.requests == Counter({("local", "get"): 16})
    assert s.native == Counter({("read", "chunks"): len(_files(root))})
    assert s.thread_seconds["decode"] > 0
    assert s.thread_seconds["read_io"] > 0


def test_native_local_read_counts_what_the_kernels_decline(tmp_path: Path) -> None:
    """Chunks whose selection the kernels do not take (an integer array)
    are fetched through their keys inside a native local read: each of
    those requests is counted, with its bytes."""
    root = tmp_path / "a"
    _create(LocalStore(root), sharded=False)
    arr = _open(LocalStore(root))
    files = _files(root)
    rows = [1, 13]  # chunk rows 0 and 2: 8 chunks, chunk (0, 0) not stored
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        np.testing.assert_array_equal(arr.oindex[rows, :], _data()[rows, :])
    touched = [f"c/{r}/{c}" for r in (0, 2) for c in range(4)]
    assert s.requests == Counter({("local", "get"): 8})
    assert s.bytes[("local", "get")] == sum(files.get(k, 0) for k in touched)
    assert not s.unsized


def test_native_local_partial_shard_read_counts_each_shard(tmp_path: Path) -> None:
    root = tmp_path / "a"
    _create(LocalStore(root), sharded=True)
    arr = _open(LocalStore(root))
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        arr[3:17, 2:4]  # 2 x 1 shards, half or a quarter of each
    assert s.requests == Counter({("local", "get_shard_part"): 2})
    assert s.unsized == s.requests
    assert not s.bytes


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_native_local_write_counts_the_files(tmp_path: Path, sharded: bool) -> None:
    root = tmp_path / "a"
    _create(LocalStore(root), sharded)
    arr = _open(LocalStore(root))
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        arr[...] = _data(9)  # all fill value where nothing was stored: deleted again
    files = _files(root)
    deletes = 0 if sharded else 1
    assert s.requests == Counter({("local", "set"): len(files), ("local", "delete"): deletes})
    assert s.bytes[("local", "set")] == sum(files.values())
    assert s.items == Counter({("write", "shards" if sharded else "chunks"): len(files) + deletes})


def test_nothing_allocated_without_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("allocated outside a stats() block")

    monkeypatch.setattr(Stats, "__init__", refuse)
    monkeypatch.setattr(CountedPath, "__init__", refuse)
    store = MemoryStore()
    _create(store, sharded=False)
    arr = _open(store)
    with with_pipeline(FUSED):
        arr[...] = _data(3)
        np.testing.assert_array_equal(arr[...], _data(3))
    assert active() is None


def test_nested_blocks_count_into_the_outer() -> None:
    store = Counting(MemoryStore())
    _create(store, sharded=False)
    arr = _open(store)
    store.reset()
    with with_pipeline(FUSED), zarr_fused.stats() as outer:
        arr[:6, :]
        with zarr_fused.stats() as inner:
            arr[6:, :]
    assert inner.total_requests() == 12
    assert outer.total_requests() == sum(store.requests.values()) == 16
    assert active() is None


def test_threads_count_only_their_own() -> None:
    store = Counting(MemoryStore())
    _create(store, sharded=False)
    arr = _open(store)
    totals: dict[int, int] = {}
    barrier = threading.Barrier(2)

    def read(rows: int) -> None:
        with zarr_fused.stats() as s:
            barrier.wait()
            for _ in range(5):
                arr[:rows, :]
        totals[rows] = s.total_requests()

    with with_pipeline(FUSED):
        threads = [threading.Thread(target=read, args=(rows,)) for rows in (6, 18)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert totals == {6: 5 * 4, 18: 5 * 12}


def test_tasks_count_only_their_own() -> None:
    store = Counting(MemoryStore())
    _create(store, sharded=False)
    with with_pipeline(FUSED):

        async def main() -> dict[int, int]:
            arr = await zarr.api.asynchronous.open_array(store=store, mode="r")

            async def read(rows: int) -> tuple[int, int]:
                with zarr_fused.stats() as s:
                    for _ in range(3):
                        await arr.getitem((slice(0, rows), slice(None)))
                        await asyncio.sleep(0)
                return rows, s.total_requests()

            return dict(await asyncio.gather(read(6), read(24)))

        totals = asyncio.run(main())
    assert totals == {6: 3 * 4, 24: 3 * 16}


def test_bench_style_summary_names_every_counter() -> None:
    store = MemoryStore()
    _create(store, sharded=True)
    arr = _open(store)
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        arr[...]
    summary = s.as_dict()
    assert set(summary) == set(Stats._FIELDS)
    assert summary["requests"] == {"memory:get": 4}
    assert summary["items"] == {"read:shards": 4}


# -- S3 (moto through the counting proxy, obstore) ---------------------------------------


@pytest.mark.parametrize("op", ["read-all", "read-part", "write-all", "write-part"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_s3_counters_equal_the_proxy(proxy: Any, sharded: bool, op: str) -> None:
    from helpers.s3_stores import new_prefix, open_store

    store = open_store("obstore", proxy, new_prefix())
    _create(store, sharded)
    arr = _open(store)
    proxy.reset()
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        OPS[op](arr)
    seen = proxy.reset()
    gets = s.requests[("object", "get")] + s.requests[("object", "get_range")]
    assert gets == seen.count("GET")
    assert s.requests[("object", "set")] == seen.count("PUT")
    # obstore deletes with a DeleteObjects POST
    assert s.requests[("object", "delete")] == seen.count("DELETE", "POST")
    assert s.total_requests() == sum(seen.requests.values())
    got = s.bytes[("object", "get")] + s.bytes[("object", "get_range")]
    # the bodies of found objects (a missing key's answer is an XML error body)
    assert got == sum(r.received for r in seen.log if r.kind == "GET" and r.status < 300)
    assert s.bytes[("object", "set")] == seen.bytes_sent["PUT"]
    # the async path's compute threads see the block: the kernels' time counts
    phase = "decode" if op.startswith("read") else "encode"
    assert s.thread_seconds[phase] > 0


def test_fallbacks_name_the_plans_reason() -> None:
    """A format-2 array with a BZ2 compressor (no native kernel) runs zarr's
    code: each batch is a fallback with the plan's reason, and its requests
    are still counted."""
    from numcodecs import BZ2

    store = Counting(MemoryStore())
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            store, shape=(8,), chunks=(2,), dtype="int32", zarr_format=2, compressors=BZ2()
        )
        arr[...] = np.arange(8, dtype="int32")
    arr = _open(store)
    reason = arr._async_array.codec_pipeline.plan.read_fallback
    assert reason
    store.reset()
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        arr[...]
    assert s.fallbacks == Counter({("read", reason): s.calls["read"]})
    assert _by_op(s.requests, "wrapper") == dict(+store.requests) == {"get": 4}


def test_bench_breakdown_reads_the_counters() -> None:
    """`zarr-fused bench`'s breakdown of a partial read of a sharded array
    from a store without native IO: the range requests, coalescing, keys."""
    from zarr_fused.cli.bench import breakdown

    store = Counting(MemoryStore())
    _create(store, sharded=True)
    arr = _open(store)
    store.reset()
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        arr[3:17, 2:4]  # part of 2 shards: each an index and its chunks' ranges
    ranges = s.ranges
    assert ranges["requests"] == store.requests["get_range"] - 2
    assert 0 < ranges["requests"] <= ranges["asked"]
    lines = breakdown(s)
    requests = s.requests[("wrapper", "get_range")]
    assert any(f"wrapper get_range: {requests} request(s)" in line for line in lines)
    shards = s.items[("read", "shards")]
    assert any(f"read: {shards} shards in " in line for line in lines)
    coalesced = f"byte ranges: {ranges['asked']} asked, coalesced into {ranges['requests']}"
    assert any(coalesced in line for line in lines)
    inner = s.native[("read", "inner_chunks")]
    assert any(f"inner chunks decoded natively: {inner}" in line for line in lines)
    per_shard = f"inner chunks decoded per shard read: {inner / shards:.1f}"
    assert any(per_shard in line for line in lines)
    (split,) = (line for line in lines if "native time, summed over threads" in line)
    assert "decode" in split


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_read_regions_is_counted(sharded: bool) -> None:
    """`zarr_fused.read_regions` reads its planned waves through the
    pipeline: the block counts them as the store sees them."""
    store = Counting(MemoryStore())
    _create(store, sharded)
    arr = _open(store)
    store.reset()
    regions = [(slice(1, 7), slice(2, 9)), (slice(10, 20), slice(0, 5))]
    with with_pipeline(FUSED), zarr_fused.stats() as s:
        got = zarr_fused.read_regions(arr, regions)
    np.testing.assert_array_equal(got[1], _data()[10:20, 0:5])
    seen = dict(+store.requests)
    assert seen
    assert _by_op(s.requests, "wrapper") == seen
    assert _by_op(s.bytes, "wrapper") == dict(+store.bytes)


# -- the time split of the native kernels ----------------------------------------------

#: compute threads of the timed tests (the phase sums are bounded by the
#: calls' wall time times the threads that can run at once)
WORKERS = 2


def _threads() -> int:
    from zarr_fused.io.engine import resolve_io_concurrency

    return 1 + WORKERS + resolve_io_concurrency()


def _timed(arr: zarr.Array, op: str) -> Stats:
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": WORKERS}),
        zarr_fused.stats() as s,
    ):
        OPS[op](arr)
    return s


def _check_bounds(s: Stats, what: str) -> None:
    spent = s.thread_seconds
    assert set(spent) <= set(Stats.PHASES)
    assert all(seconds >= 0 for seconds in spent.values())
    assert sum(spent.values()) <= s.seconds[what] * _threads()


@pytest.mark.parametrize("op", ["read-all", "read-part", "read-point"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
def test_read_time_split(tmp_path: Path, kind: str, sharded: bool, op: str) -> None:
    """Decode time exactly when the kernels decoded chunks; scatter time
    when they copied into the output or filled it; file read time exactly
    on native local reads (a memory store's requests are "store" time)."""
    store = _base(kind, tmp_path)
    _create(store, sharded)
    s = _timed(_open(store), op)
    _check_bounds(s, "read")
    spent = s.thread_seconds
    decoded = s.native["read", "inner_chunks" if sharded else "chunks"]
    assert decoded == sum(s.native.values()) > 0
    assert spent["decode"] > 0
    if op != "read-all":  # a part of a chunk: copied out of the decoded chunk
        assert spent["scatter"] > 0
    assert (spent["read_io"] > 0) == (kind == "local")
    assert (spent["encode"], spent["write_io"]) == (0, 0)


#: reads of the array of `_data` (chunk (0, 0) all fill value, not stored)
#: -> the chunks, and inner chunks and shards, the kernels decode
DECODED = {
    "read-all": ({("read", "chunks"): 15}, {("read", "inner_chunks"): 15}, 4),
    # rows 3:17 of inner chunks 0-2, columns 2:9 of inner chunks 0-1
    "read-part": ({("read", "chunks"): 5}, {("read", "inner_chunks"): 5}, 2),
    "read-point": ({("read", "chunks"): 1}, {("read", "inner_chunks"): 1}, 1),
}


@pytest.mark.parametrize("op", list(DECODED))
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
def test_chunks_decoded_and_inner_chunks_per_shard(
    tmp_path: Path, kind: str, sharded: bool, op: str
) -> None:
    store = _base(kind, tmp_path)
    _create(store, sharded)
    s = _timed(_open(store), op)
    chunks, inner, shards = DECODED[op]
    assert s.native == Counter(inner if sharded else chunks)
    if sharded:
        assert s.items["read", "shards"] == shards
        assert s.inner_chunks_per_shard() == sum(inner.values()) / shards
    else:
        assert s.inner_chunks_per_shard() is None


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
def test_a_read_of_nothing_stored_decodes_nothing(tmp_path: Path, kind: str, sharded: bool) -> None:
    """Every chunk missing: filled (scatter time), nothing decoded."""
    store = _base(kind, tmp_path)
    with with_pipeline(BATCHED):
        zarr.create_array(
            store, shape=SHAPE, chunks=CHUNKS, shards=SHARDS if sharded else None, dtype="<u2"
        )
    s = _timed(_open(store), "read-all")
    _check_bounds(s, "read")
    assert not s.native
    assert s.thread_seconds["decode"] == 0


def test_no_time_when_nothing_ran() -> None:
    with zarr_fused.stats() as s:
        pass
    assert not s.thread_seconds
    assert not s.native
    assert s.inner_chunks_per_shard() is None


def test_a_fallback_decodes_nothing_natively() -> None:
    from numcodecs import BZ2

    store = MemoryStore()
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            store, shape=(8,), chunks=(2,), dtype="int32", zarr_format=2, compressors=BZ2()
        )
        arr[...] = np.arange(8, dtype="int32")
    s = _timed(_open(store), "read-all")
    assert s.fallbacks
    assert not s.native
    assert not s.thread_seconds


@pytest.mark.parametrize("op", ["write-all", "write-part"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local", "nosync"])
def test_write_time_split(tmp_path: Path, kind: str, sharded: bool, op: str) -> None:
    """Encode time and chunks encoded on every write; file write time
    exactly on native local writes."""
    store = _base(kind, tmp_path)
    _create(store, sharded)
    s = _timed(_open(store), op)
    _check_bounds(s, "write")
    spent = s.thread_seconds
    assert spent["encode"] > 0
    assert s.native["write", "inner_chunks" if sharded else "chunks"] > 0
    assert (spent["write_io"] > 0) == (kind == "local")
    assert spent["decode"] == 0 or op == "write-part"  # a part merges into stored chunks


# The timed runs take the same steps as the untimed kernels, a clock read
# between them: the same values and the same stored bytes, for every way a
# chunk is decoded (side by side, one by one, straight into the output,
# byte-swapped) or gathered and encoded.
@pytest.mark.parametrize("dtype", ["<u2", ">u2"], ids=["native-order", "swapped"])
@pytest.mark.parametrize("codecs", ["raw", "zstd", "zstd-crc", "crc"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local"])
def test_timed_runs_read_and_write_what_untimed_ones_do(
    tmp_path: Path, kind: str, sharded: bool, codecs: str, dtype: str
) -> None:
    from helpers import SIDE_BY_SIDE_CODECS

    data = _data(11).astype(dtype)
    stored = {}
    for timed in (False, True):
        store = MemoryStore() if kind == "memory" else LocalStore(tmp_path / str(timed))
        with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": WORKERS}):
            arr = zarr.create_array(
                store,
                shape=SHAPE,
                chunks=CHUNKS,
                shards=SHARDS if sharded else None,
                dtype=dtype,
                compressors=SIDE_BY_SIDE_CODECS[codecs],
                fill_value=0,
            )
            with zarr_fused.stats() if timed else _no_block() as s:
                arr[...] = data
                arr[3:17, 2:9] = 7
                whole, part = arr[...], arr[3:17, 2:9]
            if timed:
                assert s.thread_seconds["decode"] > 0
        expected = data.copy()
        expected[3:17, 2:9] = 7
        np.testing.assert_array_equal(whole, expected)
        np.testing.assert_array_equal(part, expected[3:17, 2:9])
        stored[timed] = _stored_bytes(store)
    assert stored[True] == stored[False]


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_timed_runs_of_a_filter_chain_read_and_write_what_untimed_ones_do(
    sharded: bool,
) -> None:
    """With array->array filters (delta here) the kernels time each chunk
    whole: decode and encode time, the same values and bytes."""
    from zarr.codecs import numcodecs as znc

    data = _data(12)
    stored = {}
    for timed in (False, True):
        store = MemoryStore()
        with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": WORKERS}):
            arr = zarr.create_array(
                store,
                shape=SHAPE,
                chunks=CHUNKS,
                shards=SHARDS if sharded else None,
                dtype="<u2",
                filters=[znc.Delta(dtype="<u2")],
                compressors=zarr.codecs.ZstdCodec(level=1),
                fill_value=0,
            )
            with zarr_fused.stats() if timed else _no_block() as s:
                arr[...] = data
                whole = arr[...]
            if timed:
                unit = "inner_chunks" if sharded else "chunks"
                assert s.native["read", unit] > 0
                assert s.thread_seconds["decode"] > 0
                assert s.thread_seconds["encode"] > 0
        np.testing.assert_array_equal(whole, data)
        stored[timed] = _stored_bytes(store)
    assert stored[True] == stored[False]


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("kind", ["memory", "local"])
def test_timed_runs_raise_what_untimed_ones_do(tmp_path: Path, kind: str, sharded: bool) -> None:
    """A corrupt chunk (or inner chunk) fails the timed run with the same
    error, naming the same key, as the untimed one."""
    store = _base(kind, tmp_path)
    _create(store, sharded)
    key = "c/1/1"
    raw = asyncio.run(_get(store, key))
    # the zstd frame's magic number: the chunk's, or the first inner chunk's
    # of a shard (its index is at the end)
    asyncio.run(_set(store, key, bytes(8) + raw[8:]))
    arr = _open(store)
    errors = []
    for timed in (False, True):
        with (
            with_pipeline(FUSED),
            zarr_fused.stats() if timed else _no_block(),
            pytest.raises(Exception) as info,
        ):
            arr[...]
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    assert key in errors[0][1]


async def _get(store: Any, key: str) -> bytes:
    from zarr.core.buffer import default_buffer_prototype

    buf = await store.get(key, prototype=default_buffer_prototype())
    return buf.to_bytes()


async def _set(store: Any, key: str, value: bytes) -> None:
    from zarr.core.buffer import default_buffer_prototype

    await store.set(key, default_buffer_prototype().buffer.from_bytes(value))


def _no_block() -> Any:
    import contextlib

    return contextlib.nullcontext()


def _stored_bytes(store: Any) -> dict[str, bytes]:
    from zarr.core.buffer import default_buffer_prototype

    async def collect() -> dict[str, bytes]:
        out = {}
        async for key in store.list():
            if not key.endswith("zarr.json"):
                buf = await store.get(key, prototype=default_buffer_prototype())
                out[key] = buf.to_bytes()
        return out

    return asyncio.run(collect())
