"""The asynchronous path, for stores without synchronous IO (ZipStore,
remote stores) and codecs without synchronous implementations: which reader
or writer of the plan takes a batch.

Sharded reads and writes whose index and inner chunks are native go to the
shard engine's async reader and writer (`zarr_fused.shard.async_read`,
`zarr_fused.shard.async_write`); other sharded reads to zarr's sharding
codec, which fetches only the byte ranges it needs; unsharded reads and
writes (and the shards the native writer hands back) to the chunk reader
and writer (`zarr_fused.chunks.async_read`, `zarr_fused.chunks.async_write`).
Each batch runs inside `zarr_fused.io.requests.open_batch`: its store
requests share one limit, and when anything fails everything it started is
cancelled or awaited before the error propagates. This module opens it and
hands the readers and writers its `BatchIO`, so they import the IO layer's
classes only as types (and the plan, which holds them, stays within the
import-depth limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zarr.abc.codec import ArrayBytesCodecPartialDecodeMixin

from zarr_fused._items import MISSING, PRESENT
from zarr_fused._scatter_py import fill_missing, scatter_chunk
from zarr_fused.io.requests import open_batch

if TYPE_CHECKING:
    from zarr.abc.codec import GetResult

    from zarr_fused._batch import ReadRequest, WriteRequest
    from zarr_fused._items import ReadItem, WriteItem
    from zarr_fused._plan import PipelinePlan

__all__ = ["read_async", "write_async"]


async def read_async(
    plan: PipelinePlan, batch: list[ReadItem], request: ReadRequest
) -> tuple[GetResult, ...]:
    """Read a batch without synchronous store IO."""
    shard_reader = plan.async_shard_reader
    plans = None if shard_reader is None else shard_reader.applies(batch, request)
    if plans is not None:
        assert shard_reader is not None
        async with open_batch(request.max_workers) as io:
            return await shard_reader.read(batch, plans, request, io)
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
                fill_missing(request.out, out_selection, spec)
                results.append(MISSING)
            else:
                scatter_chunk(request.out, out_selection, array, request.drop_axes)
                results.append(PRESENT)
        return tuple(results)
    async with open_batch(request.max_workers) as io:
        return await plan.async_chunk_reader.read(batch, request, io)


async def write_async(plan: PipelinePlan, batch: list[WriteItem], request: WriteRequest) -> None:
    """Write a batch without synchronous store IO: the native shard writer
    first where it applies, the chunk writer for the rest."""
    shard_writer = plan.async_shard_writer
    plans = None if shard_writer is None else shard_writer.applies(batch, request)
    if plans is not None:
        assert shard_writer is not None
        async with open_batch(request.max_workers) as io:
            batch = await shard_writer.write(batch, plans, request, io)
        if not batch:
            return
    async with open_batch(request.max_workers) as io:
        await plan.async_chunk_writer.write(batch, request, io)
