"""Unsharded chunk writes on the async path (stores without synchronous IO,
codecs without synchronous code).

Each chunk is merged with its stored bytes (fetched only when the write
does not cover it) and encoded in the compute pool as soon as those bytes
arrive; its ``set`` (or ``delete``, for a chunk left empty) starts as soon
as its encode finishes. Chunks the write covers whole need nothing from the
store and are encoded a group per pool job (`AsyncChunkWriter._write_whole`).
A chunk of zarr's sharding codec (a shard the native shard writer handed
back) written in part is a conditional read-modify-write
(`zarr_fused.io.requests.Requests.update`); a plain chunk written in part
is read, merged and stored, as on local files.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING, Any

from zarr_fused._merge import is_empty_chunk, merge_and_encode
from zarr_fused._pool import partition
from zarr_fused._zarr_compat import merge_chunk_array

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._batch import WriteRequest
    from zarr_fused._chain import Chain
    from zarr_fused._items import WriteItem
    from zarr_fused._zarr_compat import AsyncChunkTransform
    from zarr_fused.io.requests import BatchIO, Requests, Tracker

    #: a chunk's part of the value merged into its stored bytes and encoded
    type Encode = Callable[[WriteItem, Buffer | None], Awaitable[Buffer | None]]

__all__ = ["AsyncChunkWriter"]


class AsyncChunkWriter:
    """Unsharded writes of one array on the async path (see the module
    docstring); holds no state across batches."""

    def __init__(self, chain: Chain | None, transform: AsyncChunkTransform, sharded: bool) -> None:
        self.chain = chain
        self.transform = transform
        #: whether the chunks are shards of zarr's sharding codec
        self.sharded = sharded

    async def write(self, batch: Sequence[WriteItem], request: WriteRequest, io: BatchIO) -> None:
        """Each chunk merged and encoded in the pool (those the write covers
        whole, in groups: `_write_whole`), stored the moment its encode
        finishes."""
        chain, value, drop_axes = self.chain, request.value, request.drop_axes
        whole = [item for item in batch if item[4]] if chain is not None else []
        rest = [item for item in batch if not item[4]] if whole else batch
        requests, tracker = io.requests, io.tracker
        writes = []
        if chain is not None and whole:
            job = _write_whole(chain, whole, value, drop_axes, requests, tracker)
            writes.append(tracker.task(job))
        encode = partial(self._encode, value, drop_axes, tracker)
        writes += [tracker.task(self._write_one(item, encode, requests)) for item in rest]
        await asyncio.gather(*writes)

    async def _write_one(self, item: WriteItem, encode: Encode, requests: Requests) -> None:
        """Store one chunk: encoded alone, merged with the stored chunk when
        the write covers part of it."""
        setter, spec, _, _, is_complete = item
        if is_complete:
            await requests.set(setter, await encode(item, None))
        elif self.sharded:
            await requests.update(setter, spec.prototype, partial(encode, item))
        else:
            await requests.set(
                setter, await encode(item, await requests.get(setter, spec.prototype))
            )

    async def _encode(
        self,
        value: NDBuffer,
        drop_axes: tuple[int, ...],
        tracker: Tracker,
        item: WriteItem,
        existing: Buffer | None,
    ) -> Buffer | None:
        """``item``'s part of ``value`` merged into ``existing`` and encoded:
        by the chain in the pool, else by zarr's async codecs; None for a
        chunk left empty."""
        if self.chain is not None:
            encoded: Buffer | None = await tracker.compute(
                merge_and_encode, self.chain, existing, value, item, drop_axes
            )
            return encoded
        _, spec, chunk_selection, out_selection, is_complete = item
        transform = self.transform
        existing_array = None if existing is None else await transform.decode_chunk(existing, spec)
        merged = merge_chunk_array(
            existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
        )
        if is_empty_chunk(merged, spec):
            return None
        return await transform.encode_chunk(merged, spec)


async def _write_whole(
    chain: Chain,
    items: Sequence[WriteItem],
    value: NDBuffer,
    drop_axes: tuple[int, ...],
    requests: Requests,
    tracker: Tracker,
) -> None:
    """Chunks the write covers whole: they need nothing from the store, so
    they are encoded a group per pool job, and the loop (which on a client
    such as s3fs spends about a millisecond of its own CPU per request) is
    woken once per group rather than once per chunk. Without a pool the
    loop encodes a group at a time, each after the previous group's
    requests have started, not every group before the first request."""
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
