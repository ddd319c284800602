"""Unsharded chunk reads on the async path: from zarr's ``ObjectStore``
(obstore) decoded in groups as they arrive, from any other store a task per
chunk.

Over an object store each chunk is one GET, and for small chunks the
client's cost per request, not the decode, is what a read pays for: zarr's
store wrappers, an asyncio task, a semaphore, a zarr ``Buffer`` and a hand-off
to the compute pool per chunk cost more CPU than decoding 16 KiB. So a batch
whose every chunk is a key of one zarr ``ObjectStore`` (that class exactly:
a subclass may change what ``get`` does), decoded by a native chain straight
into a NumPy output, is read here with

- one coroutine per request slot (``request_limit`` of them; any number
  when the user lifts the limit), each taking the next chunk of the batch
  in order and issuing the very calls ``ObjectStore.get`` makes for a whole
  object (``obstore.get_async`` and ``bytes_async``: same keys, one GET
  each, a missing key read as absent), the error named as the async path
  names it;
- the arrived payloads queued and decoded together, a group (`group_target`
  chunks, or `MAX_GROUP_BYTES`) in one nogil `DecodeBatch` call: in the
  compute pool by at most one job per worker, or without a pool
  (``max_workers`` = 1) on the loop; the last, smaller group on the loop
  once every chunk has arrived. Missing chunks are filled in the same call.

Any other batch (`object_store` says which) takes `AsyncChunkReader`: a task
per chunk, fetched through zarr's byte getter (one of `request_limit`
slots held while in flight) and decoded in the pool the moment its bytes
arrive, so decoding overlaps the fetches still in flight.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Final

from zarr.storage import ObjectStore, StorePath

from zarr_fused._batch import ReadTarget
from zarr_fused._items import MISSING, PRESENT
from zarr_fused._scatter_py import decode_group, fill_missing, scatter_chunk

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from zarr.abc.codec import GetResult
    from zarr.core.buffer import Buffer

    from zarr_fused._batch import ReadRequest
    from zarr_fused._chain import Chain, NativeChain
    from zarr_fused._items import ReadItem
    from zarr_fused._zarr_compat import AsyncChunkTransform
    from zarr_fused.io.requests import BatchIO, Requests, Tracker

__all__ = [
    "MAX_GROUP",
    "MAX_GROUP_BYTES",
    "AsyncChunkReader",
    "ObjectChunkReader",
    "group_target",
]

#: most chunks one decode call takes (more arrive while it runs)
MAX_GROUP: Final = 64
#: most stored bytes one decode call takes: large chunks still spread over
#: the workers
MAX_GROUP_BYTES: Final = 1 << 20
#: decode calls a large batch is cut into, at least (`group_target`)
GROUPS_PER_BATCH: Final = 16


def group_target(n: int) -> int:
    """Chunks queued before a decode starts, for a batch of ``n``.

    Arrivals are spread over the whole read, and a decode (16 KiB in tens
    of microseconds) finishes long before the next chunk arrives: started at
    every arrival, nearly every group would hold one chunk and cost a
    hand-off to the pool. Waiting for ``n / GROUPS_PER_BATCH`` (at most
    `MAX_GROUP`) keeps the decoding overlapped with the fetches while
    paying the hand-off a few times per batch; what is left when the last
    chunk arrives is less than a group.
    """
    return max(1, min(MAX_GROUP, -(-n // GROUPS_PER_BATCH)))


class AsyncChunkReader:
    """Any unsharded batch: a task per chunk, each fetched through its byte
    getter and decoded by the chain in the pool (inline without one), or by
    zarr's async codecs when a codec has no synchronous code (``chain``
    None)."""

    def __init__(self, chain: Chain | None, transform: AsyncChunkTransform) -> None:
        self.chain = chain
        self.transform = transform

    async def read(
        self, batch: Sequence[ReadItem], request: ReadRequest, io: BatchIO
    ) -> tuple[GetResult, ...]:
        chain, transform = self.chain, self.transform
        out, drop_axes = request.out, request.drop_axes
        requests, tracker = io.requests, io.tracker

        def decode_sync(item: ReadItem, raw: Buffer, chain: Chain) -> None:
            chain.decode_into(raw, item, out, drop_axes)

        async def read_one(item: ReadItem) -> GetResult:
            getter, spec, chunk_selection, out_selection, _ = item
            raw = await requests.get(getter, spec.prototype)
            if raw is None:
                fill_missing(out, out_selection, spec)
                return MISSING
            if chain is not None:
                await tracker.compute(decode_sync, item, raw, chain)
            else:
                chunk = await transform.decode_chunk(raw, spec)
                scatter_chunk(out, out_selection, chunk[chunk_selection], drop_axes)
            return PRESENT

        return tuple(await asyncio.gather(*(tracker.task(read_one(item)) for item in batch)))


class ObjectChunkReader:
    """Whole-chunk reads of a native chain over one zarr ``ObjectStore``;
    any other batch goes to the reader it wraps (``fallback``). Holds no
    state of its own, so one serves every thread and survives a fork."""

    def __init__(self, chain: NativeChain, fallback: AsyncChunkReader) -> None:
        self.chain = chain
        self.fallback = fallback

    @staticmethod
    def object_store(batch: Sequence[ReadItem]) -> Any | None:
        """The obstore store every chunk of ``batch`` is read from, or None
        when the chunks are not all keys of one zarr ``ObjectStore``."""
        getter, *_ = batch[0]
        store = getattr(getter, "store", None)
        if type(store) is not ObjectStore:
            return None
        for getter, *_ in batch:
            if type(getter) is not StorePath or getter.store is not store:
                return None
        return store.store

    async def read(
        self, batch: Sequence[ReadItem], request: ReadRequest, io: BatchIO
    ) -> tuple[GetResult, ...]:
        store = self.object_store(batch)
        target = (
            None if store is None else ReadTarget.native(self.chain, batch, request, status=PRESENT)
        )
        if store is None or target is None:
            return await self.fallback.read(batch, request, io)
        run = _GroupedRead(self.chain, batch, target, io.tracker)
        order = iter(range(len(batch)))
        limit = io.requests.limit
        lanes = len(batch) if limit is None else min(limit, len(batch))
        await asyncio.gather(
            *(io.tracker.task(run.lane(store, order, io.requests)) for _ in range(lanes))
        )
        await run.finish()
        return tuple(run.statuses)


class _GroupedRead:
    """One batch: the lanes fetch, `arrived` queues, `_decode` empties the
    queue a group at a time."""

    def __init__(
        self, chain: NativeChain, batch: Sequence[ReadItem], target: ReadTarget, tracker: Tracker
    ) -> None:
        self.chain, self.batch = chain, batch
        self.out, self.drop_axes = target.out, target.drop_axes
        self.pattern, self.ndim, self.statuses = target.pattern, target.ndim, target.statuses
        self.tracker = tracker
        self.workers = 0 if tracker.pool is None else tracker.workers
        self.queue: list[tuple[int, Any]] = []
        self.queued_bytes = 0
        #: chunks that make a group worth a decode call (`group_target`)
        self.target = group_target(len(batch))
        self.active = 0  # decode jobs in the pool
        self.lock = threading.Lock()
        self.error: BaseException | None = None  # the first failed decode's

    async def lane(self, store: Any, order: Iterator[int], requests: Requests) -> None:
        """Fetch the next chunk of the batch until none is left."""
        for i in order:
            if self.error is not None:
                raise self.error
            data = await requests.get_object(store, self.batch[i][0])
            self.arrived(i, data)

    def arrived(self, i: int, data: Any) -> None:
        """Queue chunk ``i``'s bytes (None: absent); start a decode when a
        group's worth is queued."""
        if self.workers == 0:
            self._queue(i, data)
            if self._full():
                self._decode(self._take())
            return
        with self.lock:
            self._queue(i, data)
            if self.active >= self.workers or not self._full():
                return
            self.active += 1
        self.tracker.submit(self._job)

    async def finish(self) -> None:
        """Decode what is left (less than a group: on the loop, which has
        nothing else to do), wait for the pool's jobs; raise the first
        error."""
        while True:
            with self.lock:
                group = self._take() if self.error is None else []
            if not group:
                break
            self._decode(group)
        for cf in list(self.tracker.threads):
            if not cf.done():
                await asyncio.wrap_future(cf)
        if self.error is not None:
            raise self.error

    def _queue(self, i: int, data: Any) -> None:
        self.queue.append((i, data))
        self.queued_bytes += 0 if data is None else len(data)

    def _full(self) -> bool:
        return len(self.queue) >= self.target or self.queued_bytes >= MAX_GROUP_BYTES

    def _take(self) -> list[tuple[int, Any]]:
        """The oldest queued chunks, up to `MAX_GROUP` of them or
        `MAX_GROUP_BYTES` (the lock held when there is a pool)."""
        size = taken = 0
        for _, data in self.queue:
            taken += 1
            size += 0 if data is None else len(data)
            if taken >= MAX_GROUP or size >= MAX_GROUP_BYTES:
                break
        group, self.queue[:taken] = self.queue[:taken], []
        self.queued_bytes -= size
        return group

    def _job(self) -> None:
        """A pool worker: decode groups while a group's worth is queued."""
        while True:
            with self.lock:
                group = self._take() if self.error is None and self._full() else []
                if not group:
                    self.active -= 1
                    return
            try:
                self._decode(group)
            except BaseException as exc:
                with self.lock:
                    self.error = self.error or exc
                raise

    def _decode(self, group: list[tuple[int, Any]]) -> None:
        """Decode (or fill) ``group`` into the output in one native call."""
        for i, data in group:
            if data is None:
                self.statuses[i] = MISSING
        decode_group(
            self.chain, self.batch, self.out, self.drop_axes, self.pattern, self.ndim, group
        )
