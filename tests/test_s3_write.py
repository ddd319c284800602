"""Sharded writes over async stores: the native engine
(`zarr_fused.shard.async_write`) against moto's S3 server, through zarr's
`ObjectStore` (obstore) and `FsspecStore` (s3fs), and over a `MemoryStore`
without synchronous IO.

Stored bytes and values are checked against zarr's `BatchedCodecPipeline`,
requests against zarr's own pipelines (never more GET/PUT/HEAD, the same
PUTs and DELETEs), faults injected by the proxy against the rules of
`test_s3` (an error naming the key or a successful retry, nothing
half-written, no task left). The servers are conftest's, one set for this
module; the stores are `helpers.s3_stores`', as in `test_s3`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import zarr
from test_s3 import FILL, SHAPE
from zarr.abc.store import Store
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.storage import MemoryStore
from zarr_fused_testing.s3 import Fault, LatencyProxy, MotoServer, Stats

from zarr_fused.errors import CorruptShardError
from zarr_fused.shard.async_write import AsyncShardWriter
from zarr_fused.shard.write import ShardWriter

from helpers import (
    BATCHED,
    FUSED,
    ZARR_FUSED,
    NoSyncIOStore,
    assert_same_values,
    chunk_items,
    with_pipeline,
)
from helpers.s3_stores import (
    assert_same_objects_and_values,
    new_prefix,
    open_store,
    stored,
    under_fault,
)

# -- arrays: 3 x 2 shards of 2 x 3 inner chunks -----------------------------------------


@dataclass(frozen=True)
class Layout:
    location: str
    crc: bool

    def create(self, store: Store, write_empty_chunks: bool) -> zarr.Array:
        codecs = [BytesCodec(), ZstdCodec(level=1)] + ([Crc32cCodec()] if self.crc else [])
        return zarr.create_array(
            store,
            shape=SHAPE,
            chunks=(8, 15),
            dtype="<u2",
            serializer=ShardingCodec(
                chunk_shape=(4, 5), codecs=codecs, index_location=self.location
            ),
            compressors=None,
            fill_value=FILL,
            config={"write_empty_chunks": write_empty_chunks},
        )


LAYOUTS = {
    "end-crc": Layout("end", True),
    "start": Layout("start", False),
    "start-crc": Layout("start", True),
    "end": Layout("end", False),
}


def first_data() -> np.ndarray:
    """What is stored before a partial write: a whole shard (1, 1) at the
    fill value (missing), and inner chunk (0, 1) of shard (0, 0) too."""
    data = np.random.default_rng(1501).integers(0, 1000, SHAPE).astype("<u2")
    data[8:16, 15:30] = FILL
    data[0:4, 5:10] = FILL
    return data


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, shape).astype("<u2")


@dataclass(frozen=True)
class Write:
    #: what is stored first (by zarr's pipeline): "data", or "none"
    first: str
    op: Callable[[zarr.Array], None]


WRITES = {
    "all": Write("none", lambda a: a.__setitem__(Ellipsis, first_data())),
    "partial": Write(
        "data", lambda a: a.__setitem__((slice(5, 19), slice(3, 22)), _values((14, 19), 2))
    ),
    "partial-unwritten": Write(
        "none", lambda a: a.__setitem__((slice(5, 19), slice(3, 22)), _values((14, 19), 3))
    ),
    # the missing shard (1, 1), in part
    "into-missing-shard": Write(
        "data", lambda a: a.__setitem__((9, slice(16, 24)), _values((8,), 4))
    ),
    "scalar-partial": Write("data", lambda a: a.__setitem__((slice(2, 20), slice(1, 29)), 5)),
    "fill-a-shard": Write("data", lambda a: a.__setitem__((slice(0, 8), slice(0, 15)), FILL)),
    "fill-an-inner-chunk": Write(
        "data", lambda a: a.__setitem__((slice(8, 12), slice(0, 5)), FILL)
    ),
    # the whole shard (0, 0), not a scalar
    "one-shard": Write(
        "data", lambda a: a.__setitem__((slice(0, 8), slice(0, 15)), _values((8, 15), 5))
    ),
}


def run_write(
    pipeline: str, store: Store, layout: str, write: str, write_empty_chunks: bool = False
) -> None:
    """Store the write's first data with zarr's pipeline, then run the
    write with ``pipeline``."""
    spec = WRITES[write]
    with with_pipeline(BATCHED):
        arr = LAYOUTS[layout].create(store, write_empty_chunks)
        if spec.first == "data":
            arr[...] = first_data()
    with with_pipeline(pipeline):
        spec.op(zarr.open_array(store, config={"write_empty_chunks": write_empty_chunks}))


def read_all(store: Store) -> np.ndarray:
    with with_pipeline(BATCHED):
        return np.asarray(zarr.open_array(store, mode="r")[...])


def _s3_cases() -> list[Any]:
    out = []
    for kind in ("obstore", "s3fs"):
        for layout in LAYOUTS:
            for write in WRITES:
                for empty in ("drop-empty", "keep-empty"):
                    # s3fs requests cost botocore's CPU: a representative part
                    if kind == "s3fs" and (
                        layout != "end-crc"
                        or empty == "keep-empty"
                        or write not in ("partial", "fill-a-shard", "into-missing-shard")
                    ):
                        continue
                    out.append(
                        pytest.param(
                            kind, layout, write, empty, id=f"{kind}-{layout}-{write}-{empty}"
                        )
                    )
    return out


@pytest.mark.parametrize(("kind", "layout", "write", "empty"), _s3_cases())
def test_sharded_write_matches_zarr(
    moto: MotoServer, proxy: LatencyProxy, kind: str, layout: str, write: str, empty: str
) -> None:
    results = {}
    for pipeline in (BATCHED, FUSED):
        prefix = new_prefix()
        store = open_store(kind, proxy, prefix)
        run_write(pipeline, store, layout, write, empty == "keep-empty")
        results[pipeline] = (stored(moto, prefix), read_all(store))
    assert_same_objects_and_values(results[FUSED], results[BATCHED])


# -- the native path ran ----------------------------------------------------------------


@pytest.mark.parametrize("write", ["all", "partial", "scalar-partial", "fill-a-shard"])
def test_sharded_write_skips_zarrs_codec(
    monkeypatch: pytest.MonkeyPatch, moto: MotoServer, proxy: LatencyProxy, write: str
) -> None:
    """Basic writes of natively writable shards never reach zarr's sharding
    codec's encode; the async writer writes every shard."""
    expected_prefix = new_prefix()
    run_write(BATCHED, open_store("obstore", proxy, expected_prefix), "end-crc", write)
    prefix = new_prefix()
    store = open_store("obstore", proxy, prefix)
    with with_pipeline(BATCHED):
        LAYOUTS["end-crc"].create(store, False)[...] = first_data()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("zarr's sharding codec encoded a shard")

    for name in (
        "_encode_single",
        "_encode_partial_single",
        "_encode_sync",
        "_encode_partial_sync",
    ):
        monkeypatch.setattr(ShardingCodec, name, refuse)
    shards: list[int] = []
    native_write = AsyncShardWriter.write

    async def spy(self: AsyncShardWriter, batch: Any, *args: Any) -> Any:
        shards.append(len(batch))
        return await native_write(self, batch, *args)

    monkeypatch.setattr(AsyncShardWriter, "write", spy)
    spec = WRITES[write]
    with with_pipeline(FUSED):
        spec.op(zarr.open_array(store))
    assert sum(shards) > 0
    if spec.first == "data":
        assert stored(moto, prefix) == stored(moto, expected_prefix)


# -- requests: never more than zarr's pipelines -----------------------------------------


def _count(proxy: LatencyProxy, kind: str, pipeline: str, write: str) -> Stats:
    store = open_store(kind, proxy, new_prefix())
    spec = WRITES[write]
    with with_pipeline(BATCHED):
        arr = LAYOUTS["end-crc"].create(store, False)
        if spec.first == "data":
            arr[...] = first_data()
    with with_pipeline(pipeline):
        arr = zarr.open_array(store)  # a pipeline of the configured class
        proxy.reset()
        spec.op(arr)
    return proxy.reset()


def _request_cases() -> list[Any]:
    out = []
    for kind in ("obstore", "s3fs"):
        for theirs in (ZARR_FUSED, BATCHED):
            for write in WRITES:
                if kind == "s3fs" and (theirs != ZARR_FUSED or write not in ("all", "partial")):
                    continue
                name = theirs.rsplit(".", 1)[-1]
                out.append(pytest.param(kind, theirs, write, id=f"{kind}-{name}-{write}"))
    return out


@pytest.mark.parametrize(("kind", "theirs", "write"), _request_cases())
def test_write_requests_no_more_than_zarr(
    proxy: LatencyProxy, kind: str, theirs: str, write: str
) -> None:
    """No more GET/PUT/HEAD than zarr's pipeline for the same write, and the
    same PUTs and DELETEs (one per shard stored or removed)."""
    expected = _count(proxy, kind, theirs, write)
    ours = _count(proxy, kind, FUSED, write)
    # obstore deletes with a bulk-delete POST, s3fs with a DELETE
    assert ours.count("PUT", "DELETE", "POST") > 0
    for method in ("GET", "PUT", "HEAD"):
        assert ours.requests[method] <= expected.requests[method], (
            method,
            ours.summary(),
            expected.summary(),
        )
    assert ours.requests["PUT"] == expected.requests["PUT"]
    assert ours.count("DELETE", "POST") == expected.count("DELETE", "POST")


def test_sharded_writes_upload_concurrently(proxy: LatencyProxy) -> None:
    """With a latency on every request, the shards' PUTs overlap."""
    store = open_store("obstore", proxy, new_prefix())
    with with_pipeline(BATCHED):
        LAYOUTS["end-crc"].create(store, False)
    with with_pipeline(FUSED):
        arr = zarr.open_array(store)
        proxy.reset(latency=0.05)
        arr[...] = first_data()
    stats = proxy.reset()
    assert stats.requests["PUT"] == 5  # 6 shards, one all fill
    assert stats.max_in_flight > 1, stats.summary()


def test_sharded_writes_respect_async_concurrency(proxy: LatencyProxy) -> None:
    """Every request of a sharded write (the stored shards' GETs, the PUTs)
    counts against ``async.concurrency``."""
    store = open_store("obstore", proxy, new_prefix())
    with with_pipeline(BATCHED):
        LAYOUTS["end-crc"].create(store, False)[...] = first_data()
    with with_pipeline(FUSED), zarr.config.set({"async.concurrency": 2}):
        arr = zarr.open_array(store)
        proxy.reset(latency=0.05)
        arr[1:23, 1:29] = 3
    stats = proxy.reset()
    assert stats.requests["GET"] >= 5 and stats.requests["PUT"] == 6
    assert stats.max_in_flight <= 2, stats.summary()


# -- faults ------------------------------------------------------------------------------

KEY = "c/0/1"


@dataclass(frozen=True)
class WriteFault:
    fault: Fault
    write: str  # a key of WRITES
    outcome: str  # "retried": must succeed; "error": must fail naming the key; "either"


WRITE_FAULTS = {
    "put-500": WriteFault(Fault("500", KEY + "$", "PUT"), "partial", "error"),
    "put-503-once": WriteFault(Fault("503", KEY + "$", "PUT", times=1), "partial", "retried"),
    "put-reset-once": WriteFault(Fault("reset", KEY + "$", "PUT", times=1), "partial", "either"),
    "get-500": WriteFault(Fault("500", KEY + "$", "GET"), "partial", "error"),
    "get-503-once": WriteFault(Fault("503", KEY + "$", "GET", times=1), "partial", "retried"),
    "get-reset-once": WriteFault(Fault("reset", KEY + "$", "GET", times=1), "partial", "either"),
    "get-truncate-always": WriteFault(Fault("truncate", KEY + "$", "GET"), "partial", "error"),
    # obstore deletes with a bulk-delete POST to the bucket (key "")
    "delete-500": WriteFault(Fault("500", "^$", "POST"), "fill-a-shard", "error"),
}


def _fault_cases() -> list[Any]:
    out = []
    for kind in ("obstore", "s3fs"):
        for case in WRITE_FAULTS:
            if kind == "s3fs" and case not in ("put-500", "get-500", "get-503-once"):
                continue
            out.append(pytest.param(kind, case, id=f"{kind}-{case}"))
    return out


@pytest.mark.parametrize(("kind", "case"), _fault_cases())
def test_write_fault(moto: MotoServer, proxy: LatencyProxy, kind: str, case: str) -> None:
    spec = WRITE_FAULTS[case]
    faulted_key = KEY if spec.write == "partial" else "c/0/0"
    reference = new_prefix()  # what the write stores without a fault
    run_write(BATCHED, open_store(kind, proxy, reference), "end-crc", spec.write)
    prefix = new_prefix()
    store = open_store(kind, proxy, prefix)
    with with_pipeline(BATCHED):
        LAYOUTS["end-crc"].create(store, False)[...] = first_data()
    before = stored(moto, prefix)
    after = stored(moto, reference)
    with with_pipeline(FUSED):
        _, error = under_fault(
            proxy, spec.fault, spec.outcome, lambda: WRITES[spec.write].op(zarr.open_array(store))
        )
    proxy.reset()
    objects = stored(moto, prefix)
    # nothing half-written: every shard is the old one or the whole new one
    for key in set(before) | set(after):
        assert objects.get(key) in (before.get(key), after.get(key)), key
    if error is None:
        assert objects == after
    else:
        assert faulted_key in str(error), f"the error does not name {faulted_key!r}: {error!r}"


def test_corrupt_stored_shard_fails_naming_the_key(moto: MotoServer, proxy: LatencyProxy) -> None:
    """A partial write over a shard whose index is damaged fails naming the
    shard, and leaves it as it was."""
    prefix = new_prefix()
    store = open_store("obstore", proxy, prefix)
    with with_pipeline(BATCHED):
        LAYOUTS["end-crc"].create(store, False)[...] = first_data()
    shard = stored(moto, prefix)[KEY]
    damaged = shard[:-6] + bytes(b ^ 0xFF for b in shard[-6:-4]) + shard[-4:]  # the crc fails
    proto = default_buffer_prototype()
    zarr.core.sync.sync(store.set(KEY, proto.buffer.from_bytes(damaged)))
    with with_pipeline(FUSED), pytest.raises(CorruptShardError, match=KEY):
        zarr.open_array(store)[0:8, 16:18] = 1
    assert stored(moto, prefix)[KEY] == damaged


# -- MemoryStore without synchronous IO ------------------------------------------------


def _memory_cases() -> list[Any]:
    return [
        pytest.param(layout, write, empty, id=f"{layout}-{write}-{empty}")
        for layout in ("end-crc", "start")
        for write in WRITES
        for empty in ("drop-empty", "keep-empty")
    ]


@pytest.mark.parametrize(("layout", "write", "empty"), _memory_cases())
def test_nosync_memory_write_matches_zarr(
    monkeypatch: pytest.MonkeyPatch, layout: str, write: str, empty: str
) -> None:
    """The async path's native writer on a MemoryStore that advertises no
    synchronous IO stores zarr's bytes."""
    results = {}
    ran: list[int] = []
    native_write = AsyncShardWriter.write

    async def spy(self: AsyncShardWriter, batch: Any, *args: Any) -> Any:
        ran.append(len(batch))
        return await native_write(self, batch, *args)

    monkeypatch.setattr(AsyncShardWriter, "write", spy)
    for pipeline in (BATCHED, FUSED):
        memory = MemoryStore()
        run_write(pipeline, NoSyncIOStore(memory), layout, write, empty == "keep-empty")
        results[pipeline] = chunk_items(memory)
    assert ran, "the native async writer did not run"
    assert results[FUSED] == results[BATCHED]


def test_uploads_start_as_each_shard_is_assembled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last shard's assembly waits until some shard's upload has
    started: a writer that uploads only after every shard is assembled
    never gets there (bounded by a timeout, so it fails instead of hanging)."""
    uploading = threading.Event()
    assembled = 0
    lock = threading.Lock()
    assemble = ShardWriter.assemble

    def slow_assemble(self: ShardWriter, state: Any, take: Any = None) -> Any:
        nonlocal assembled
        with lock:
            assembled += 1
            last = assembled == 6
        if last and not uploading.wait(timeout=10):
            raise AssertionError("no upload started before the last shard was assembled")
        return assemble(self, state, take)

    class Watched(NoSyncIOStore):
        async def set(self, key: str, value: Buffer) -> None:
            if key.startswith("c/"):
                uploading.set()
                await asyncio.sleep(0)
            await super().set(key, value)

    monkeypatch.setattr(ShardWriter, "assemble", slow_assemble)
    store = Watched(MemoryStore())
    data = _values(SHAPE, 6)
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 2}):
        LAYOUTS["end-crc"].create(store, False)[...] = data
        assert_same_values(zarr.open_array(store)[...], data)
    assert assembled == 6


@pytest.mark.parametrize(
    "value_shape", [(63,), (2, 64), (64, 1), (1, 64)], ids=["short", "extra-row", "column", "row"]
)
def test_nosync_mismatched_value_behaves_like_zarr(value_shape: tuple[int, ...]) -> None:
    """A value that does not fit the selection goes to zarr's code on the
    async path too: it raises what zarr raises, or stores what zarr stores."""
    outcomes: dict[str, Any] = {}
    for path in (FUSED, BATCHED):
        memory = MemoryStore()
        with with_pipeline(path):
            arr = zarr.create_array(
                NoSyncIOStore(memory), shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="<i4"
            )
            try:
                arr[3:4] = np.arange(int(np.prod(value_shape)), dtype="<i4").reshape(value_shape)
            except Exception as exc:
                outcomes[path] = type(exc)
            else:
                outcomes[path] = chunk_items(memory)
    assert outcomes[FUSED] == outcomes[BATCHED]
