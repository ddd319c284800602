"""The asynchronous path, for stores without synchronous IO (ZipStore,
remote stores) and codecs without synchronous implementations.

Sharded reads and writes whose index and inner chunks are native go to the
shard engine's async reader and writer (`zarr_fused.shard.async_read`,
`zarr_fused.shard.async_write`); unsharded reads from zarr's ``ObjectStore``
go to `zarr_fused.chunks.async_read` (below zarr's store wrapper, decoded in
groups); other reads fetch every chunk concurrently and hand each chunk to
the thread pool the moment its bytes arrive, so decoding overlaps the
fetches still in flight; writes launch each chunk's ``set`` the
moment its encode finishes. When anything fails, every fetch, decode, encode
and write still pending is cancelled and every one already running is
awaited before the error propagates: nothing keeps running unobserved.
Every store request of a batch (GET, PUT, DELETE, sharded or not) holds one
of `request_limit` slots while it is in flight, and only then: decoding and
encoding never hold a slot.
A store error that does not name its key is re-raised as an `OSError` that
does, the original as its ``__cause__``.

With ``codec_pipeline.max_workers`` = 1 there is no pool and decoding runs
inline, as in zarr's own pipeline.
"""

from __future__ import annotations

import asyncio
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal

from zarr.abc.codec import ArrayBytesCodecPartialDecodeMixin
from zarr.codecs.sharding import ShardingCodec
from zarr.core.chunk_utils import chunk_is_empty
from zarr.core.config import config as zarr_config

from zarr_fused._chain import NativeChain
from zarr_fused._cpus import resolve_max_workers
from zarr_fused._items import MISSING, PRESENT, describe_key
from zarr_fused._merge import merge_and_encode
from zarr_fused._pool import ElasticPool, get_pool, partition
from zarr_fused._scatter_py import fill_missing, scatter_chunk
from zarr_fused._zarr_compat import OBJECT_ABSENT, merge_chunk_array
from zarr_fused.chunks.async_read import ObjectChunkReader
from zarr_fused.config import ASYNC_CONCURRENCY_KEY, int_setting, shard_write_lock
from zarr_fused.errors import WriteConflictError, ZarrFusedError
from zarr_fused.io import object_cas
from zarr_fused.io.object_cas import NOTHING, Outcome

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
    from concurrent.futures import Future

    from zarr.abc.codec import GetResult
    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._chain import Chain
    from zarr_fused._items import ReadItem, WriteItem
    from zarr_fused._plan import PipelinePlan

    #: merges a write into the stored object: the new object, None to
    #: delete it, `NOTHING` to leave it alone
    type Merge = Callable[[Buffer | None], Awaitable[Buffer | None | Literal[Outcome.NOTHING]]]

__all__ = ["DEFAULT_ASYNC_CONCURRENCY", "read_async", "request_limit", "write_async"]

#: Store requests in flight per batch unless the user has set a limit.
#:
#: On an object store every request is a round trip (tens of ms to S3) that
#: costs the client almost nothing while it waits: by Little's law a batch
#: of small objects moves ``limit / latency`` objects a second, so zarr's
#: ``async.concurrency`` default of 10 leaves a 20 ms store serving 500
#: objects a second. Against a server that keeps up (S3 serves thousands of
#: GETs a second per prefix; the benchmarks' light static server), reading
#: 1024 objects took 0.64x the time at 64 in flight as at 32 at 20 ms, and
#: 0.54x at 100 ms, while tensorstore (32) took as long as our 32. More
#: would mostly queue at a throttling server (S3 answers 503 SlowDown per
#: prefix) and hold more connections. Hence 64; a single small server (one
#: MinIO or moto process) wants less (docs/tuning.md).
DEFAULT_ASYNC_CONCURRENCY: Final = 64
ASYNC_CONCURRENCY_CAP: Final = 1024

# zarr's key and its environment variable: a limit set there is the user's
_ZARR_KEY: Final = "async.concurrency"
_ZARR_ENV: Final = "ZARR_ASYNC__CONCURRENCY"


def request_limit() -> int | None:
    """Store requests one batch keeps in flight; None for no limit.

    ``codec_pipeline.async_concurrency`` when it is an integer; else zarr's
    ``async.concurrency`` when the user has set it (a value other than
    zarr's default, or ``ZARR_ASYNC__CONCURRENCY`` in the environment; None
    lifts the limit, as in zarr's pipelines); else
    `DEFAULT_ASYNC_CONCURRENCY`. donfig keeps no record of who set a value,
    so a user who sets exactly zarr's default 10 is indistinguishable from
    the default: `zarr_fused.config` documents setting our key instead.
    Never raises: an invalid value warns and follows the default rule.
    """
    ours = int_setting(
        ASYNC_CONCURRENCY_KEY, cap=ASYNC_CONCURRENCY_CAP, default=lambda: None, stacklevel=2
    )
    if ours is not None:
        return ours
    theirs = zarr_config.get(_ZARR_KEY, default=None)
    if theirs != _zarr_default() or _ZARR_ENV in zarr_config.env:
        return None if theirs is None else max(1, int(theirs))
    return DEFAULT_ASYNC_CONCURRENCY


def _zarr_default() -> Any:
    """zarr's default ``async.concurrency`` (10), from the defaults zarr
    registered with its configuration (the last layer that names it)."""
    value = None
    for layer in zarr_config.defaults:
        value = layer.get("async", {}).get("concurrency", value)
    return value


class _Tracker:
    """Everything one batch has started, so it can all be cancelled and
    awaited when the batch fails."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ElasticPool | None = get_pool(workers) if workers > 1 else None
        self.tasks: list[asyncio.Future[Any]] = []
        self.threads: list[Future[Any]] = []

    def task(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        fut = asyncio.ensure_future(coro)
        self.tasks.append(fut)
        return fut

    def compute(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in the pool, or inline without one."""
        if self.pool is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            try:
                fut.set_result(fn(*args))
            except Exception as exc:
                fut.set_exception(exc)
            self.tasks.append(fut)
            return fut
        cf = self.pool.submit(fn, *args)
        self.threads.append(cf)
        fut = asyncio.wrap_future(cf)
        self.tasks.append(fut)
        return fut

    async def drain(self) -> None:
        # Pool work cannot be interrupted once running: cancel what has not
        # started, then wait for the rest so it cannot outlive the batch.
        for cf in self.threads:
            cf.cancel()
        # only work still running needs a wrapper: wrapping a finished one
        # costs a cross-thread wake-up of the loop per chunk, for nothing
        running = [asyncio.wrap_future(cf) for cf in self.threads if not cf.done()]
        pending = [t for t in self.tasks if not t.done()]
        for t in pending:
            t.cancel()
        waiting = [*running, *pending]
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
        # mark every outcome as retrieved (no "exception never retrieved")
        for t in self.tasks:
            if t.done() and not t.cancelled():
                t.exception()


class _Requests:
    """The store requests of one batch: at most `request_limit` in flight
    (any number when it is None), and a store error that does not name the
    key wrapped in one that does (the original as its ``__cause__``)."""

    def __init__(self) -> None:
        limit = request_limit()
        self.limit = None if limit is None else max(1, int(limit))
        self.limiter: AbstractAsyncContextManager[Any] = (
            nullcontext() if self.limit is None else asyncio.Semaphore(self.limit)
        )
        #: partial updates are conditional writes (``codec_pipeline.shard_write_lock``)
        self.protect = shard_write_lock()

    async def get(
        self, getter: Any, prototype: Any, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        async with self.limiter:
            with _naming(getter, "reading"):
                buf: Buffer | None = await getter.get(prototype=prototype, byte_range=byte_range)
                return buf

    async def get_object(self, store: Any, getter: Any) -> Any:
        """What ``ObjectStore.get`` fetches for a whole object, below its
        wrapper: the same two obstore calls on the same key, obstore's
        ``Bytes`` (None when absent, as zarr reads a missing key) instead of a
        zarr ``Buffer``. Holds no slot: the caller keeps at most `limit` of
        these in flight (`zarr_fused.chunks.async_read`)."""
        import obstore

        with _naming(getter, "reading"):
            try:
                response = await obstore.get_async(store, getter.path)
                return await response.bytes_async()
            except OBJECT_ABSENT:
                return None

    async def set(self, setter: Any, value: Buffer | None) -> None:
        """Store ``value`` at ``setter`` (delete it when None)."""
        async with self.limiter:
            # Let the loop read what has arrived before this request is
            # prepared: a client that builds each request on the loop (s3fs
            # hashes and signs the body there) otherwise answers the earlier
            # requests' responses late; through s3fs at 20 ms, 1024 PUTs took
            # 3.9 s without this and 2.9 s with it.
            await asyncio.sleep(0)
            with _naming(setter, "writing"):
                if value is None:
                    await setter.delete()
                else:
                    await setter.set(value)

    async def update(self, setter: Any, prototype: Any, merge: Merge) -> None:
        """Read ``setter``'s object, ``merge`` it with this write's part and
        store the result (delete the object when it is None; nothing when
        `NOTHING`). With protection on and a store that takes conditional
        writes, the store is conditional on the object being the one read,
        and a conflict starts over from the read after a pause
        (`zarr_fused.io.object_cas`); other stores get
        `object_cas.unprotected` (strict mode's error, or one warning). A
        slot is held for each request, none while merging."""
        store = object_cas.conditional_store(setter)
        what = f"a partial write of {describe_key(setter)}"
        if store is None or not self.protect:
            if self.protect:
                object_cas.unprotected(setter, what)
            merged = await merge(await self.get(setter, prototype))
            if merged is not NOTHING:
                await self.set(setter, merged)
            return
        backoff = object_cas.Backoff(describe_key(setter))
        while True:
            async with self.limiter:
                with _naming(setter, "reading"):
                    seen = await object_cas.get_versioned(store, setter.path)
            existing = None if seen.data is None else prototype.buffer.from_bytes(seen.data)
            if not seen.conditional:  # the server gave the object no ETag
                object_cas.unprotected(setter, what + " (the object has no ETag)")
            merged = await merge(existing)
            if merged is NOTHING:
                return
            if not seen.conditional:
                await self.set(setter, merged)
                return
            try:
                await self._put_if_unchanged(store, setter, merged, seen)
                return
            except WriteConflictError as conflict:
                await backoff.after(conflict)

    async def _put_if_unchanged(
        self, store: Any, setter: Any, value: Buffer | None, seen: object_cas.Versioned
    ) -> None:
        """`object_cas.put_if_unchanged` in a slot, the key named in errors;
        a DELETE (``value`` None) is unconditional: obstore has none other."""
        async with self.limiter:
            await asyncio.sleep(0)  # as in `set`
            with _naming(setter, "writing"):
                if value is None:
                    await setter.delete()
                else:
                    await object_cas.put_if_unchanged(
                        store, setter.path, value.as_buffer_like(), seen
                    )


@asynccontextmanager
async def _batch() -> AsyncIterator[tuple[_Requests, _Tracker]]:
    """The requests and the tracker of one batch; on the way out, whether
    the batch succeeded or failed, everything it started is finished."""
    tracker = _Tracker(resolve_max_workers())
    try:
        yield _Requests(), tracker
    finally:
        await tracker.drain()


@contextmanager
def _naming(key: Any, doing: str) -> Iterator[None]:
    """Re-raise a store error that does not name ``key`` as an `OSError`
    that does."""
    try:
        yield
    except Exception as exc:
        path = getattr(key, "path", None)
        # NotImplementedError is a store's answer about its API (ZipStore
        # cannot delete), not an IO failure: zarr's callers expect it as is
        if (
            path is None
            or path in str(exc)
            or isinstance(exc, (ZarrFusedError, NotImplementedError))
        ):
            raise
        raise OSError(f"{doing} {describe_key(key)}: {type(exc).__name__}: {exc}") from exc


async def read_async(
    plan: PipelinePlan,
    batch: list[ReadItem],
    out: NDBuffer,
    drop_axes: tuple[int, ...],
) -> tuple[GetResult, ...]:
    """Read a batch without synchronous store IO."""
    shard_reader = plan.async_shard_reader
    plans = None if shard_reader is None else shard_reader.applies(batch, out, drop_axes)
    if plans is not None:
        assert shard_reader is not None
        async with _batch() as (requests, tracker):
            return await shard_reader.read(batch, plans, out, requests, tracker)
    codec = plan.array_bytes_codec
    if plan.partial_decode and isinstance(codec, ArrayBytesCodecPartialDecodeMixin):
        # The codec fetches only the byte ranges it needs (coalesced), as in
        # zarr's pipelines; its inner chunks come back through this pipeline.
        arrays = await codec.decode_partial(
            [(getter, chunk_selection, spec) for getter, spec, chunk_selection, *_ in batch]
        )
        results: list[GetResult] = []
        for array, (_, spec, _, out_selection, _) in zip(arrays, batch, strict=True):
            if array is None:
                fill_missing(out, out_selection, spec)
                results.append(MISSING)
            else:
                scatter_chunk(out, out_selection, array, drop_axes)
                results.append(PRESENT)
        return tuple(results)

    chain = plan.chain
    if isinstance(chain, NativeChain):
        objects = ObjectChunkReader(chain)
        store = objects.applies(batch, out)
        if store is not None:
            async with _batch() as (requests, tracker):
                return await objects.read(store, batch, out, drop_axes, requests, tracker)
    async with _batch() as (requests, tracker):
        return await _read_chunks(plan, batch, out, drop_axes, requests, tracker)


async def _read_chunks(
    plan: PipelinePlan,
    batch: list[ReadItem],
    out: NDBuffer,
    drop_axes: tuple[int, ...],
    requests: _Requests,
    tracker: _Tracker,
) -> tuple[GetResult, ...]:
    """Any other unsharded batch: a task per chunk, each fetched through
    its byte getter and decoded in the pool (inline without one)."""
    chain = plan.chain

    def decode_sync(item: ReadItem, raw: Buffer, chain: Chain) -> None:
        getter, spec, chunk_selection, out_selection, _ = item
        chain.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes, getter)

    async def read_one(item: ReadItem) -> GetResult:
        getter, spec, chunk_selection, out_selection, _ = item
        raw = await requests.get(getter, spec.prototype)
        if raw is None:
            fill_missing(out, out_selection, spec)
            return MISSING
        if chain is not None:
            await tracker.compute(decode_sync, item, raw, chain)
        else:
            chunk = await plan.async_transform.decode_chunk(raw, spec)
            scatter_chunk(out, out_selection, chunk[chunk_selection], drop_axes)
        return PRESENT

    return tuple(await asyncio.gather(*(tracker.task(read_one(item)) for item in batch)))


async def write_async(
    plan: PipelinePlan,
    batch: list[WriteItem],
    value: NDBuffer,
    drop_axes: tuple[int, ...],
) -> None:
    """Write a batch without synchronous store IO.

    Each chunk is merged with its stored bytes (fetched only when the write
    does not cover it) and encoded as soon as those bytes arrive; its
    ``set`` (or ``delete``, for a chunk left empty) starts as soon as its
    encode finishes.
    """
    shard_writer = plan.async_shard_writer
    plans = None if shard_writer is None else shard_writer.applies(batch, value, drop_axes)
    if plans is not None:
        assert shard_writer is not None
        async with _batch() as (requests, tracker):
            batch = await shard_writer.write(batch, plans, value, drop_axes, requests, tracker)
        if not batch:
            return
    async with _batch() as (requests, tracker):
        await _write_chunks(plan, batch, value, drop_axes, requests, tracker)


async def _write_chunks(
    plan: PipelinePlan,
    batch: list[WriteItem],
    value: NDBuffer,
    drop_axes: tuple[int, ...],
    requests: _Requests,
    tracker: _Tracker,
) -> None:
    """Unsharded chunks: each merged and encoded in the pool (those the
    write covers whole, in groups: `_write_whole`), stored the moment its
    encode finishes."""
    chain = plan.chain

    async def encode_async(item: WriteItem, existing: Buffer | None) -> Buffer | None:
        _, spec, chunk_selection, out_selection, is_complete = item
        transform = plan.async_transform
        existing_array = None if existing is None else await transform.decode_chunk(existing, spec)
        merged = merge_chunk_array(
            existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
        )
        if chunk_is_empty(merged, spec):
            return None
        return await transform.encode_chunk(merged, spec)

    async def encode(item: WriteItem, existing: Buffer | None) -> Buffer | None:
        if chain is not None:
            encoded: Buffer | None = await tracker.compute(
                merge_and_encode, chain, existing, value, item, drop_axes
            )
            return encoded
        return await encode_async(item, existing)

    # a shard written in part (zarr's sharding codec, which the native
    # shard writer handed back) is protected against concurrent writers;
    # a chunk written in part is not, as on local files
    sharded = isinstance(plan.array_bytes_codec, ShardingCodec)

    async def write_one(item: WriteItem) -> None:
        setter, spec, _, _, is_complete = item
        if is_complete:
            await requests.set(setter, await encode(item, None))
        elif sharded:
            await requests.update(setter, spec.prototype, partial(encode, item))
        else:
            await requests.set(
                setter, await encode(item, await requests.get(setter, spec.prototype))
            )

    whole = [item for item in batch if item[4]] if chain is not None else []
    rest = [item for item in batch if not item[4]] if whole else batch
    writes = []
    if chain is not None and whole:
        writes.append(tracker.task(_write_whole(chain, whole, value, drop_axes, requests, tracker)))
    writes += [tracker.task(write_one(item)) for item in rest]
    await asyncio.gather(*writes)


async def _write_whole(
    chain: Chain,
    items: Sequence[WriteItem],
    value: NDBuffer,
    drop_axes: tuple[int, ...],
    requests: _Requests,
    tracker: _Tracker,
) -> None:
    """Chunks the write covers whole: they need nothing from the store, so
    they are encoded a group per pool job, and the loop (which on a client
    such as s3fs spends about a millisecond of its own CPU per request) is
    woken once per group rather than once per chunk. Without a pool the
    loop encodes: a group at a time, each after the previous group's
    requests have started, not every group before the first request (on
    one core through s3fs, the first of 1024 PUTs went out 60-130 ms after
    the write began; now 8-18 ms)."""
    groups = [items[g.start : g.stop] for g in _ramp(partition(len(items), tracker.workers))]

    def store(group: Sequence[WriteItem], encoded: list[Buffer | None]) -> list[Any]:
        return [
            tracker.task(requests.set(it[0], enc)) for it, enc in zip(group, encoded, strict=True)
        ]

    async def write_group(group: Sequence[WriteItem]) -> None:
        encoded = await tracker.compute(_encode_group, chain, value, group, drop_axes)
        await asyncio.gather(*store(group, encoded))

    if tracker.pool is not None:
        await asyncio.gather(*(tracker.task(write_group(group)) for group in groups))
        return
    started: list[Any] = []
    for group in groups:
        started += store(group, _encode_group(chain, value, group, drop_axes))
        await asyncio.sleep(0)
    await asyncio.gather(*started)


def _ramp(groups: list[range], first: int = 4) -> list[range]:
    """``groups`` with the first ones cut to ``first``, then twice that and
    so on up to their size: the first requests wait for a few chunks'
    encodes rather than a whole group's (64 chunks of a 1024-chunk write on
    two workers)."""
    if not groups:
        return groups
    stop, size, ramped = groups[-1].stop, len(groups[0]), []
    start, step = 0, min(first, size)
    while start < stop and step < size:
        ramped.append(range(start, min(stop, start + step)))
        start, step = start + step, 2 * step
    ramped.extend(range(i, min(stop, i + size)) for i in range(start, stop, size))
    return ramped


def _encode_group(
    chain: Chain, value: NDBuffer, items: Sequence[WriteItem], drop_axes: tuple[int, ...]
) -> list[Buffer | None]:
    """`merge_and_encode` for chunks the write covers whole, in one pool job."""
    return [merge_and_encode(chain, None, value, item, drop_axes) for item in items]
