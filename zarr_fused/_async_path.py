"""The asynchronous path, for stores without synchronous IO (ZipStore,
remote stores) and codecs without synchronous implementations.

Reads fetch every chunk concurrently (bounded by ``async.concurrency``) and
hand each chunk to the thread pool the moment its bytes arrive, so decoding
overlaps the fetches still in flight; writes launch each chunk's ``set`` the
moment its encode finishes. When anything fails, every fetch, decode, encode
and write still pending is cancelled and every one already running is
awaited before the error propagates: nothing keeps running unobserved.

With ``codec_pipeline.max_workers`` = 1 there is no pool and decoding runs
inline, as in zarr's own pipeline.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from zarr.abc.codec import ArrayBytesCodecPartialDecodeMixin
from zarr.core.chunk_utils import _merge_chunk_array, chunk_is_empty
from zarr.core.config import config as zarr_config

from zarr_fused._cpus import resolve_max_workers
from zarr_fused._items import MISSING, PRESENT
from zarr_fused._pool import get_pool
from zarr_fused._scatter_py import fill_missing, scatter_chunk
from zarr_fused.chunks.merge import merge_and_encode

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from concurrent.futures import Future, ThreadPoolExecutor

    from zarr.abc.codec import GetResult
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._chain import Chain
    from zarr_fused._items import ReadItem, WriteItem
    from zarr_fused._plan import PipelinePlan

__all__ = ["read_async", "write_async"]


class _Tracker:
    """Everything one batch has started, so it can all be cancelled and
    awaited when the batch fails."""

    def __init__(self, workers: int) -> None:
        self.pool: ThreadPoolExecutor | None = get_pool(workers) if workers > 1 else None
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
        running = [asyncio.wrap_future(cf) for cf in self.threads if not cf.cancelled()]
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


def _request_limiter() -> AbstractAsyncContextManager[Any]:
    """What each store request of a batch runs under: ``async.concurrency``
    requests in flight at most, or any number when it is ``None`` (as in
    zarr's pipelines)."""
    limit = zarr_config.get("async.concurrency")
    if limit is None:
        return nullcontext()
    return asyncio.Semaphore(max(1, int(limit)))


async def read_async(
    plan: PipelinePlan,
    batch: list[ReadItem],
    out: NDBuffer,
    drop_axes: tuple[int, ...],
) -> tuple[GetResult, ...]:
    """Read a batch without synchronous store IO."""
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
    semaphore = _request_limiter()
    tracker = _Tracker(resolve_max_workers())

    def decode_sync(item: ReadItem, raw: Buffer, chain: Chain) -> None:
        getter, spec, chunk_selection, out_selection, _ = item
        chain.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes, getter)

    async def read_one(item: ReadItem) -> GetResult:
        getter, spec, chunk_selection, out_selection, _ = item
        async with semaphore:
            raw = await getter.get(prototype=spec.prototype)
        if raw is None:
            fill_missing(out, out_selection, spec)
            return MISSING
        if chain is not None:
            await tracker.compute(decode_sync, item, raw, chain)
        else:
            chunk = await plan.async_transform.decode_chunk(raw, spec)
            scatter_chunk(out, out_selection, chunk[chunk_selection], drop_axes)
        return PRESENT

    try:
        return tuple(await asyncio.gather(*(tracker.task(read_one(item)) for item in batch)))
    finally:
        await tracker.drain()


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
    chain = plan.chain
    semaphore = _request_limiter()
    tracker = _Tracker(resolve_max_workers())

    async def encode_async(item: WriteItem, existing: Buffer | None) -> Buffer | None:
        _, spec, chunk_selection, out_selection, is_complete = item
        transform = plan.async_transform
        existing_array = None if existing is None else await transform.decode_chunk(existing, spec)
        merged = _merge_chunk_array(
            existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
        )
        if chunk_is_empty(merged, spec):
            return None
        return await transform.encode_chunk(merged, spec)

    async def write_one(item: WriteItem) -> None:
        setter, spec, _, _, is_complete = item
        existing = None
        if not is_complete:
            async with semaphore:
                existing = await setter.get(prototype=spec.prototype)
        if chain is not None:
            encoded = await tracker.compute(
                merge_and_encode, chain, existing, value, item, drop_axes
            )
        else:
            encoded = await encode_async(item, existing)
        async with semaphore:
            if encoded is None:
                await setter.delete()
            else:
                await setter.set(encoded)

    try:
        await asyncio.gather(*(tracker.task(write_one(item)) for item in batch))
    finally:
        await tracker.drain()
