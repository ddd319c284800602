"""The async path (stores without synchronous IO): overlap, failure, cleanup."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BytesCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.dtype import Int32
from zarr.errors import ZarrUserWarning
from zarr.registry import register_codec

import zarr_fused
from zarr_fused._async_path import read_async, write_async
from zarr_fused._batch import ReadRequest, WriteRequest
from zarr_fused._pool import partition
from zarr_fused.chunks import async_write
from zarr_fused.chunks.async_read import AsyncChunkReader
from zarr_fused.errors import CorruptChunkError
from zarr_fused.io.requests import ASYNC_CONCURRENCY_CAP, DEFAULT_ASYNC_CONCURRENCY, request_limit

from helpers import (
    BATCHED,
    FUSED,
    NoSyncIOStore,
    assert_same_values,
    chunk_items,
    make_store,
    with_pipeline,
)


def _spec(shape: tuple[int, ...]) -> ArraySpec:
    return ArraySpec(
        shape=shape,
        dtype=Int32(),
        fill_value=np.int32(-1),
        config=ArrayConfig(order="C", write_empty_chunks=True),
        prototype=default_buffer_prototype(),
    )


def _pipeline(shape: tuple[int, ...]) -> zarr_fused.FusedCodecPipeline:
    return zarr_fused.FusedCodecPipeline.from_codecs([BytesCodec()]).evolve_from_array_spec(
        _spec(shape)
    )


class Getter:
    """An async-only byte getter/setter over a dict, with hooks."""

    def __init__(self, data: dict[str, Any], key: str, *, before: Any = None) -> None:
        self.data, self.key, self.before = data, key, before
        self.path = key

    async def get(self, prototype: Any, byte_range: Any = None) -> Any:
        if self.before is not None:
            await self.before()
        return self.data.get(self.key)

    async def set(self, value: Any, byte_range: Any = None) -> None:
        if self.before is not None:
            await self.before()
        self.data[self.key] = value

    async def delete(self) -> None:
        self.data.pop(self.key, None)


def _encoded(values: np.ndarray) -> Any:
    return default_buffer_prototype().buffer.from_bytes(values.astype("<i4").tobytes())


def test_decoding_starts_while_fetches_are_in_flight() -> None:
    """The last chunk's fetch waits until the first chunk's decode has
    started; a path that decodes only after every fetch finished would
    never get there (bounded by a timeout, so it fails instead of hanging)."""
    pipeline = _pipeline((4,))
    plan = pipeline.plan
    assert plan is not None and plan.chain is not None
    first_decode = threading.Event()
    inner = plan.chain

    class SpyChain:
        native = inner.native
        reason = inner.reason

        def decode_into(self, *args: Any) -> None:
            first_decode.set()
            inner.decode_into(*args)

    spy_reader = AsyncChunkReader(SpyChain(), plan.async_transform)  # type: ignore[arg-type]
    spy_plan = dataclasses.replace(plan, async_chunk_reader=spy_reader)
    data = {f"c{i}": _encoded(np.arange(4) + 10 * i) for i in range(3)}

    async def wait_for_a_decode() -> None:
        await asyncio.wait_for(asyncio.to_thread(first_decode.wait), timeout=10)

    spec = _spec((4,))
    batch = [
        (Getter(data, "c0"), spec, (slice(0, 4),), (slice(0, 4),), True),
        (Getter(data, "c1"), spec, (slice(0, 4),), (slice(4, 8),), True),
        (Getter(data, "c2", before=wait_for_a_decode), spec, (slice(0, 4),), (slice(8, 12),), True),
    ]
    out = NDBuffer.from_numpy_array(np.zeros(12, dtype="int32"))
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        statuses = asyncio.run(read_async(spy_plan, batch, ReadRequest(out, (), 2)))
    assert [s["status"] for s in statuses] == ["present"] * 3
    assert_same_values(
        out.as_numpy_array(),
        np.concatenate([np.arange(4) + 10 * i for i in range(3)]).astype("int32"),
    )


class _SlowThenFail:
    """Two getter hooks for a batch that fails: ``slow`` takes half a
    second, ``fail`` raises ``OSError(message)`` once ``slow`` has started;
    ``finished`` says whether ``slow`` ran to its end instead of being
    cancelled."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.started = asyncio.Event()
        self.finished = False

    async def slow(self) -> None:
        self.started.set()
        await asyncio.sleep(0.5)
        self.finished = True

    async def fail(self) -> None:
        await asyncio.wait_for(self.started.wait(), timeout=5)
        raise OSError(self.message)


@pytest.mark.parametrize("max_workers", [1, 2])
def test_failed_read_cancels_and_drains(max_workers: int) -> None:
    """A failing fetch cancels the others; nothing is left running or unobserved."""
    pipeline = _pipeline((4,))
    assert pipeline.plan is not None
    hooks = _SlowThenFail("simulated fetch failure")

    async def scenario() -> None:
        spec = _spec((4,))
        data = {"a": _encoded(np.arange(4)), "b": _encoded(np.arange(4))}
        batch = [
            (Getter(data, "a", before=hooks.slow), spec, (slice(0, 4),), (slice(0, 4),), True),
            (Getter(data, "b", before=hooks.fail), spec, (slice(0, 4),), (slice(4, 8),), True),
        ]
        out = NDBuffer.from_numpy_array(np.zeros(8, dtype="int32"))
        with pytest.raises(OSError, match="simulated fetch failure"):
            await read_async(pipeline.plan, batch, ReadRequest(out, (), max_workers))
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []
        await asyncio.sleep(0.7)
        assert not hooks.finished, "the slow fetch kept running after the batch failed"

    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        asyncio.run(scenario())


@pytest.mark.parametrize("max_workers", [1, 2])
def test_failed_write_cancels_and_drains(max_workers: int) -> None:
    pipeline = _pipeline((4,))
    assert pipeline.plan is not None
    hooks = _SlowThenFail("simulated write failure")

    async def scenario() -> None:
        spec = _spec((4,))
        stored: dict[str, Any] = {}
        batch = [
            (Getter(stored, "a", before=hooks.slow), spec, (slice(0, 4),), (slice(0, 4),), True),
            (Getter(stored, "b", before=hooks.fail), spec, (slice(0, 4),), (slice(4, 8),), True),
        ]
        value = NDBuffer.from_numpy_array(np.arange(8, dtype="int32"))
        with pytest.raises(OSError, match="simulated write failure"):
            await write_async(pipeline.plan, batch, WriteRequest(value, (), max_workers))
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []
        await asyncio.sleep(0.7)
        assert not hooks.finished, "the slow write kept running after the batch failed"
        assert stored == {}

    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        asyncio.run(scenario())


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")
@pytest.mark.parametrize("kind", ["nosync", "zip"])
def test_corrupt_chunk_on_async_path_names_the_key(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path)
    with with_pipeline(FUSED):
        arr = zarr.create_array(store, shape=(8,), chunks=(4,), dtype="<i4", compressors=None)
        arr[:] = np.arange(8)
        zarr.core.sync.sync(
            store.set("c/1", default_buffer_prototype().buffer.from_bytes(b"\x00" * 7))
        )
        with pytest.raises(CorruptChunkError, match=r"c/1.*7 bytes"):
            arr[:]


class AsyncOnlyNoop(BytesBytesCodec):  # type: ignore[misc]
    """A bytes->bytes codec with only the async interface."""

    is_fixed_size = True

    def to_dict(self) -> dict[str, Any]:
        return {"name": "zarr-fused-test-async-only"}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AsyncOnlyNoop:
        return cls()

    def compute_encoded_size(self, input_byte_length: int, _spec: Any) -> int:
        return input_byte_length

    async def _encode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        return chunk_bytes

    async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
        return chunk_bytes


register_codec("zarr-fused-test-async-only", AsyncOnlyNoop)


@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
@pytest.mark.parametrize("kind", ["memory", "nosync"])
def test_async_only_codec_matches_zarr(tmp_path: Path, kind: str) -> None:
    data = np.arange(60, dtype="<i4").reshape(6, 10)
    results = {}
    for path in (FUSED, BATCHED):
        store = make_store(kind, tmp_path)
        with with_pipeline(path):
            arr = zarr.create_array(
                store,
                shape=data.shape,
                chunks=(4, 4),
                dtype=data.dtype,
                compressors=[AsyncOnlyNoop()],
                fill_value=-1,
            )
            if path == FUSED:
                assert arr._async_array.codec_pipeline.plan.chain is None
            arr[...] = data
            arr[1:3, 2:9] = 5
            results[path] = (np.asarray(arr[...]), np.asarray(arr[2:5, ::3]), chunk_items(store))
    for ours, theirs in zip(results[FUSED], results[BATCHED]):
        if isinstance(ours, dict):
            assert ours == theirs
        else:
            assert_same_values(ours, theirs)


@pytest.mark.parametrize("concurrency", [None, 1, 3])
@pytest.mark.parametrize("sharded", [False, True], ids=["chunks", "shards"])
def test_async_concurrency_settings_like_zarr(
    tmp_path: Path, concurrency: Any, sharded: bool
) -> None:
    """``async.concurrency = None`` means no limit in zarr's pipelines (zarr's
    benchmark scripts set it); the async path once raised TypeError for it."""
    data = np.arange(12 * 10, dtype="<i4").reshape(12, 10)
    stores = {}
    for name, path in (("ours", FUSED), ("zarr", BATCHED)):
        store = make_store("nosync", tmp_path, name)
        with with_pipeline(path), zarr.config.set({"async.concurrency": concurrency}):
            arr = zarr.create_array(
                store,
                shape=data.shape,
                chunks=(4, 5),
                dtype=data.dtype,
                shards=(8, 10) if sharded else None,
                fill_value=-1,
            )
            arr[...] = data
            arr[1:6, 2:7] = -data[1:6, 2:7]  # partial: fetches what is stored
            assert_same_values(
                arr[...], np.where(np.pad(np.ones((5, 5), bool), ((1, 6), (2, 3))), -data, data)
            )
            assert_same_values(arr.oindex[[0, 11], [1, 9]], arr[...][np.ix_([0, 11], [1, 9])])
        stores[name] = store
    assert chunk_items(stores["ours"]) == chunk_items(stores["zarr"])


def test_inner_chunks_use_the_arrays_pipeline_whatever_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """zarr's sharding codec builds its inner pipeline from the running
    process's configuration; an array pickled to a process configured
    otherwise (a Dask worker) must still read its inner chunks with
    zarr_fused. (Writes on this path encode whole shards through zarr's
    ChunkTransform, which no configuration changes.)"""
    import pickle

    from zarr_fused import FusedCodecPipeline
    from zarr_fused.shard.async_read import AsyncShardReader

    calls: list[str] = []
    original = FusedCodecPipeline.read

    async def spy(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("read")
        return await original(self, batch, *args, **kwargs)

    monkeypatch.setattr(FusedCodecPipeline, "read", spy)
    # batches the native shard engine does not take (e.g. coordinate
    # selections) go to zarr's sharding codec: make this one such a batch
    monkeypatch.setattr(AsyncShardReader, "applies", lambda *args: None)
    store = make_store("nosync", Path("."))
    data = np.arange(16 * 16, dtype="<i4").reshape(16, 16)
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store, shape=data.shape, chunks=(4, 4), shards=(8, 8), dtype=data.dtype
        )
    with with_pipeline(BATCHED):
        moved = pickle.loads(pickle.dumps(arr))
        calls.clear()
        moved[1:6, 2:7] = data[1:6, 2:7]
        calls.clear()
        assert_same_values(moved[1:6, 2:7], data[1:6, 2:7])
        assert calls.count("read") >= 2, calls  # the shards, then their inner chunks


@pytest.mark.parametrize("shape", [(40,), (12, 8)], ids=["1d", "2d"])
def test_scalar_reads_of_sharded_arrays(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """Single-element reads of a sharded array on a store without sync IO
    (a 0-d output region) give zarr's values."""
    data = np.arange(int(np.prod(shape)), dtype="<i4").reshape(shape)
    store = make_store("nosync", tmp_path)
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store,
            shape=shape,
            dtype=data.dtype,
            chunks=tuple(max(1, s // 4) for s in shape),
            shards=tuple(max(1, s // 2) for s in shape),
            compressors=None,
        )
        arr[...] = data
        for point in [(0,) * len(shape), tuple(s - 1 for s in shape), tuple(s // 3 for s in shape)]:
            assert arr[point] == data[point]
            assert arr.get_basic_selection(point) == data[point]


# -- requests in flight: ``codec_pipeline.async_concurrency`` and zarr's ``async.concurrency``

# name -> (zarr configuration, environment, the limit request_limit gives)
LIMIT_RULES: dict[str, tuple[dict[str, Any], dict[str, str], int | None]] = {
    "default": ({}, {}, DEFAULT_ASYNC_CONCURRENCY),
    "zarr-set": ({"async.concurrency": 4}, {}, 4),
    "zarr-unlimited": ({"async.concurrency": None}, {}, None),
    "zarr-default-from-env": ({}, {"ZARR_ASYNC__CONCURRENCY": "10"}, 10),
    "ours": ({"codec_pipeline.async_concurrency": 64}, {}, 64),
    "ours-over-zarr": ({"codec_pipeline.async_concurrency": 16, "async.concurrency": 4}, {}, 16),
    "ours-from-env-string": ({"codec_pipeline.async_concurrency": " 12 "}, {}, 12),
}


@pytest.mark.parametrize("rule", list(LIMIT_RULES))
def test_request_limit_rule(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    settings, env, expected = LIMIT_RULES[rule]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with zarr.config.set(settings):
        assert request_limit() == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(0, DEFAULT_ASYNC_CONCURRENCY, id="zero"),
        pytest.param("many", DEFAULT_ASYNC_CONCURRENCY, id="not-an-integer"),
        pytest.param(True, DEFAULT_ASYNC_CONCURRENCY, id="bool"),
        pytest.param(5000, ASYNC_CONCURRENCY_CAP, id="above-cap"),
    ],
)
def test_request_limit_invalid_values_warn(value: Any, expected: int) -> None:
    with (
        zarr.config.set({"codec_pipeline.async_concurrency": value}),
        pytest.warns(ZarrUserWarning, match="async_concurrency"),
    ):
        assert request_limit() == expected


class InFlightStore(NoSyncIOStore):
    """A memory store without synchronous IO whose every request takes a
    50 ms and counts the requests in flight at once."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.now = self.peak = 0

    async def _timed(self, call: Any) -> Any:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(0.05)
            return await call
        finally:
            self.now -= 1

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        return await self._timed(self._store.get(key, prototype, byte_range))

    async def set(self, key: str, value: Any) -> None:
        await self._timed(self._store.set(key, value))


# name -> (zarr configuration, requests in flight expected at the peak)
IN_FLIGHT: dict[str, tuple[dict[str, Any], int]] = {
    "default": ({}, DEFAULT_ASYNC_CONCURRENCY),
    "zarr-set": ({"async.concurrency": 4}, 4),
    "ours": ({"codec_pipeline.async_concurrency": 48}, 48),
    "zarr-unlimited": ({"async.concurrency": None}, 100),  # every chunk at once
}


@pytest.mark.parametrize("operation", ["read", "write"])
@pytest.mark.parametrize("setting", list(IN_FLIGHT))
def test_unsharded_requests_in_flight(setting: str, operation: str) -> None:
    """A batch of 100 chunks keeps exactly the configured number of
    requests in flight (reads: GETs; writes: PUTs)."""
    settings, expected = IN_FLIGHT[setting]
    data = np.random.default_rng(151).integers(0, 99, (40, 40)).astype("<i4")
    store = InFlightStore(zarr.storage.MemoryStore())
    with with_pipeline(FUSED), zarr.config.set(settings):
        arr = zarr.create_array(store, shape=data.shape, chunks=(4, 4), dtype=data.dtype)
        arr[...] = data
        if operation == "read":
            store.peak = 0
            assert_same_values(arr[...], data)
    assert store.peak == expected


@pytest.mark.parametrize("max_workers", [1, 2], ids=["workers=1", "workers=2"])
def test_whole_chunk_writes_encode_a_group_per_pool_job(
    monkeypatch: pytest.MonkeyPatch, max_workers: int
) -> None:
    """Chunks a write covers whole are encoded in `partition` groups, one
    pool job each, and store the same bytes as zarr's pipeline; a chunk
    left empty is deleted, not stored."""
    calls: list[int] = []
    encode_group = async_write._encode_group

    def counting(chain: Any, value: Any, items: Any, drop_axes: Any) -> Any:
        calls.append(len(items))
        return encode_group(chain, value, items, drop_axes)

    monkeypatch.setattr(async_write, "_encode_group", counting)
    data = np.random.default_rng(152).integers(1, 99, (40, 40)).astype("<i4")
    data[:4] = 0  # a row of chunks holding only the fill value
    stored = {}
    for path in (FUSED, BATCHED):
        memory = zarr.storage.MemoryStore()
        with with_pipeline(path), zarr.config.set({"codec_pipeline.max_workers": max_workers}):
            arr = zarr.create_array(
                NoSyncIOStore(memory), shape=data.shape, chunks=(4, 4), dtype=data.dtype
            )
            arr[...] = data
        stored[path] = {k: v.to_bytes() for k, v in memory._store_dict.items()}
    assert stored[FUSED] == stored[BATCHED]
    assert "c/0/0" not in stored[FUSED]
    groups = async_write._ramp(partition(100, max_workers))
    assert sorted(calls) == sorted(len(g) for g in groups)  # pool jobs finish in any order
    assert len(groups[0]) <= 4  # the first requests wait for a few encodes only


@pytest.mark.parametrize("workers", [1, 2, 8])
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 17, 64, 100, 1024, 1031])
def test_ramp_covers_every_item_in_order(n: int, workers: int) -> None:
    """`_ramp` keeps every index once and in order, starts with at most 4,
    doubles, and never makes a group larger than `partition`'s."""
    full = partition(n, workers)
    groups = async_write._ramp(full)
    assert [i for g in groups for i in g] == list(range(n))
    if not groups:
        return
    sizes = [len(g) for g in groups]
    assert sizes[0] <= 4
    assert max(sizes) == len(full[0])
    growing = sizes[: sizes.index(max(sizes))]
    assert all(b == 2 * a for a, b in itertools.pairwise(growing))


class StartOrderStore(NoSyncIOStore):
    """A memory store without synchronous IO that records when each set
    starts (with what else the test records, in order)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.events: list[tuple[str, str]] = []

    async def set(self, key: str, value: Any) -> None:
        self.events.append(("start", key))
        await asyncio.sleep(0.01)
        await self._store.set(key, value)


def test_without_a_pool_requests_start_before_the_last_encode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a pool the loop encodes a group at a time: the first request
    starts before the last group is encoded, not after every group."""
    store = StartOrderStore(zarr.storage.MemoryStore())
    encode_group = async_write._encode_group

    def recording(chain: Any, value: Any, items: Any, drop_axes: Any) -> Any:
        store.events.append(("encode", ""))
        return encode_group(chain, value, items, drop_axes)

    monkeypatch.setattr(async_write, "_encode_group", recording)
    data = np.random.default_rng(154).integers(1, 99, (40, 40)).astype("<i4")
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 1}):
        arr = zarr.create_array(store, shape=data.shape, chunks=(4, 4), dtype=data.dtype)
        store.events.clear()
        arr[...] = data
        assert_same_values(arr[...], data)
    kinds = [what for what, _ in store.events]
    assert kinds.count("encode") > 2
    last_encode = len(kinds) - 1 - kinds[::-1].index("encode")
    assert kinds.index("start") < last_encode
