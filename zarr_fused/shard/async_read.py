"""The native shard engine over stores without synchronous IO (object
stores through obstore or s3fs, HTTP): reads.

For a batch, every touched shard is fetched at once, with zarr's own IO
pattern so that no read costs more requests than zarr's pipelines:

- a shard whose every inner chunk the selection touches comes in one GET of
  the whole object; its index is parsed and checked natively and all its
  inner chunks decoded in the compute pool;
- any other shard first has its index fetched (one ranged GET: the suffix
  when the index is at the end, the leading bytes when at the start), then
  the byte ranges of its touched, stored inner chunks are coalesced with
  zarr's planner and the array's ``sharding_coalesce_*`` settings (the same
  merged GETs zarr's sharding codec issues) and all requested at once; each
  merged range is decoded in the pool the moment it arrives, straight into
  the output.

Every request of the batch (index, whole shard, merged range) shares the
batch's limiter: `zarr_fused.io.requests.request_limit` requests in flight,
as the async path uses for unsharded chunks. Missing shards and inner chunks are filled
natively. The engine applies to basic selections that the shard planner
covers, decoded straight into a NumPy output of the chain's own dtype; any
other batch goes to zarr's sharding codec (`applies` says which).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.store import RangeByteRequest, SuffixByteRequest

from zarr_fused._buffers import RawBuffer
from zarr_fused._dtypes import fill_pattern
from zarr_fused._items import MISSING, PRESENT, describe_key
from zarr_fused._native import shard_kernels
from zarr_fused._pool import partition
from zarr_fused._scatter_py import fill_missing
from zarr_fused._zarr_compat import coalesce_ranges, inner_chunk_spec
from zarr_fused.errors import CorruptShardError
from zarr_fused.shard.index import (
    MISSING_OFFSET,
    inner_describer,
    inner_grid,
    whole_shard,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import GetResult
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer

    from zarr_fused._batch import ReadRequest
    from zarr_fused._items import ReadItem
    from zarr_fused.io.requests import BatchIO
    from zarr_fused.shard.read import ShardReader

__all__ = ["AsyncShardReader"]


class AsyncShardReader:
    """Native shard reads over an async store (see the module docstring),
    of the shards the synchronous ``reader`` reads: its codec, inner chain,
    inner chunk shape and index format."""

    def __init__(self, reader: ShardReader) -> None:
        self.codec = reader.codec
        self.chain = reader.chain
        self.inner_shape = reader.inner_shape
        self.fmt = reader.fmt

    def applies(self, batch: Sequence[ReadItem], request: ReadRequest) -> list[Any] | None:
        """The shard plans of ``batch``, or None when the engine does not
        apply (the batch then goes to zarr's sharding codec)."""
        if request.drop_axes or shard_kernels is None:
            return None
        dst = request.out.as_ndarray_like()
        if not self.chain.writes_into(dst, batch[0][1]):
            return None
        plans = []
        for _, spec, chunk_selection, out_selection, _ in batch:
            if not _is_basic(out_selection):
                return None
            plan = shard_kernels.plan_selection(spec.shape, self.inner_shape, chunk_selection)
            if plan is None:
                return None
            plans.append(plan)
        return plans

    async def read(
        self, batch: Sequence[ReadItem], plans: list[Any], request: ReadRequest, io: BatchIO
    ) -> tuple[GetResult, ...]:
        """Read ``batch`` (its ``plans`` from `applies`) into the request's ``out``."""
        run = _AsyncBatch(self, batch, request, io)
        return tuple(
            await asyncio.gather(
                *(io.tracker.task(run.shard(i, plan)) for i, plan in enumerate(plans))
            )
        )


def _is_basic(selection: Any) -> bool:
    """Whether ``out[selection]`` is a view (slices and integers only)."""
    items = selection if isinstance(selection, tuple) else (selection,)
    return all(isinstance(s, (slice, int, np.integer)) for s in items)


class _AsyncBatch:
    """One `AsyncShardReader.read` call: the steps that fetch and decode
    each shard."""

    def __init__(
        self,
        reader: AsyncShardReader,
        batch: Sequence[ReadItem],
        request: ReadRequest,
        io: BatchIO,
    ) -> None:
        self.reader = reader
        self.fmt = reader.fmt
        self.chain = reader.chain
        self.batch = batch
        self.out = request.out
        # a NumPy array: `AsyncShardReader.applies` checked it
        self.dst: np.ndarray = request.out.as_ndarray_like()  # type: ignore[assignment]
        self.requests = io.requests
        self.tracker = io.tracker
        spec0 = batch[0][1]
        self.pattern = fill_pattern(spec0, self.dst.dtype)
        self.layout = self.chain.layout(reader.inner_shape)
        self.ndim = max(self.dst.ndim, len(reader.inner_shape))
        workers = request.max_workers
        #: workers one shard's decodes spread over (1 when shards go round)
        self.spread = workers if len(batch) < 2 * workers else 1

    def _grid(self, i: int) -> tuple[int, ...]:
        """Inner chunks per dimension of the ``i``-th shard."""
        return inner_grid(self.batch[i][1], self.reader.inner_shape)

    def _group(self, i: int, capacity: int) -> Any:
        """A decode batch for the ``i``-th shard, naming its inner chunks."""
        describe = inner_describer(self._grid(i))
        group = self.chain.kernel_batch(capacity, self.ndim, describe)
        group.set_fill(self.pattern)
        return group

    async def shard(self, i: int, plan: Any) -> GetResult:
        _, spec, _, out_selection, _ = self.batch[i]
        if not plan.n_touched:
            return PRESENT
        if plan.all_touched:
            found = await self.whole(i, plan)
        else:
            found = await self.partial(i, plan)
        if not found:
            await self.tracker.compute(fill_missing, self.out, out_selection, spec)
            return MISSING
        return PRESENT

    # -- a shard read whole ---------------------------------------------------------------

    async def whole(self, i: int, plan: Any) -> bool:
        """Fetch a shard in one GET and decode it; False when it is not
        stored. With fewer shards than can keep the pool busy, its inner
        chunks are spread over the workers."""
        getter, spec, *_ = self.batch[i]
        raw = await self.requests.get(getter, spec.prototype)
        if raw is None:
            return False
        group = await self.tracker.compute(self.queue_whole, i, plan, raw)
        n = len(group)
        parts = partition(n, self.spread) if self.spread > 1 else [range(n)]
        await asyncio.gather(
            *(self.tracker.compute(group.run_range, r.start, r.stop) for r in parts)
        )
        return True

    def queue_whole(self, i: int, plan: Any, raw: Buffer) -> Any:
        """Check the index of a whole shard and queue the decodes of its
        inner chunks (in the pool)."""
        getter, _, _, out_selection, _ = self.batch[i]
        shard = whole_shard(raw.as_numpy_array(), getter, self.fmt, self._grid(i))
        group = self._group(i, plan.n_touched)
        queued = shard_kernels.add_shard(
            group, shard.data, shard.entries, plan, self.layout, self.dst, out_selection, getter
        )
        assert queued, "`applies` admits only basic output selections"
        return group

    # -- a shard read in part --------------------------------------------------------------

    async def partial(self, i: int, plan: Any) -> bool:
        """Fetch the index, then the touched chunks' merged ranges, decoding
        each as it arrives; False when the shard is not stored."""
        getter, spec, _, out_selection, _ = self.batch[i]
        grid = self._grid(i)
        n_chunks = math.prod(grid)
        size = self.fmt.size(n_chunks)
        at = RangeByteRequest(0, size) if self.fmt.at_start else SuffixByteRequest(size)
        index = await self.requests.get(getter, spec.prototype, at)
        if index is None:
            return False
        entries = self.fmt.parse(index.as_numpy_array(), n_chunks, grid, getter)
        # a view even when every index is an integer (a 0-d output): numpy
        # returns a scalar for dst[()], which the kernels cannot write into
        sel = out_selection if isinstance(out_selection, tuple) else (out_selection,)
        region = self.dst[(*sel, Ellipsis)]
        stored: list[tuple[Any, ...]] = []
        missing: list[tuple[Any, ...]] = []
        for lin, inner_sel, block_sel, _ in plan.items():
            off, n = (int(v) for v in entries[lin])
            if n == 0:  # no encoded chunk is empty; and an empty range is no request
                raise CorruptShardError(
                    f"{inner_describer(grid)((getter, lin))} has an empty entry ({off:#x}, 0)"
                )
            (missing if off == MISSING_OFFSET else stored).append(
                (lin, off, n, inner_sel, block_sel)
            )
        work = [
            self.tracker.task(self.fetch_range(i, region, g)) for g in self._merged(spec, stored)
        ]
        if missing:
            work.append(self.tracker.compute(self.fill_chunks, i, region, missing))
        # a range gone missing means the shard vanished after its index was read
        return all(r is not False for r in await asyncio.gather(*work))

    def _merged(self, spec: ArraySpec, stored: list[tuple[Any, ...]]) -> list[list[Any]]:
        """``stored`` chunks in the groups zarr's coalescing plan merges."""
        ranges = [RangeByteRequest(off, off + n) for _, off, n, _, _ in stored]
        groups, alone = coalesce_ranges(
            ranges,
            max_gap_bytes=spec.config.sharding_coalesce_max_gap_bytes,
            max_coalesced_bytes=spec.config.sharding_coalesce_max_bytes,
        )
        merged = [[stored[k] for k, _ in group] for group in groups]
        merged.extend([stored[k]] for k, _ in alone)
        return merged

    async def fetch_range(self, i: int, region: np.ndarray, members: list[Any]) -> bool:
        getter, spec, *_ = self.batch[i]
        start = min(off for _, off, _, _, _ in members)
        end = max(off + n for _, off, n, _, _ in members)
        raw = await self.requests.get(getter, spec.prototype, RangeByteRequest(start, end))
        if raw is None:
            return False
        await self.tracker.compute(self.decode_range, i, region, raw, start, members)
        return True

    def decode_range(
        self, i: int, region: np.ndarray, raw: Buffer, start: int, members: list[Any]
    ) -> None:
        """Decode the inner chunks of one merged range into ``region`` (the
        shard's output block), in the pool."""
        getter = self.batch[i][0]
        data = raw.as_numpy_array()
        group = self._group(i, len(members))
        for lin, off, n, inner_sel, block_sel in members:
            chunk = data[off - start : off - start + n]
            # the lengths come from the stored index: check them against
            # the bytes that arrived before decoding anything
            if len(chunk) != n:
                raise CorruptShardError(
                    f"{describe_key(getter)}: inner chunk {lin} should hold {n} bytes from "
                    f"byte {off}, the shard has {len(chunk)} there (truncated shard)"
                )
            if not group.add(chunk, self.layout, inner_sel, region, block_sel, (), (getter, lin)):
                decoded = self.chain.decode_array(
                    RawBuffer(chunk),
                    self._inner_spec(i),
                    (getter, lin),
                )
                region[block_sel] = decoded[inner_sel]
        group.run()

    def fill_chunks(self, i: int, region: np.ndarray, missing: list[Any]) -> None:
        """Fill the touched inner chunks the index marks missing (in the pool)."""
        getter = self.batch[i][0]
        group = self._group(i, len(missing))
        for lin, _, _, _, block_sel in missing:
            if not group.add_missing(region, block_sel, (getter, lin)):
                region[block_sel] = np.frombuffer(self.pattern, self.dst.dtype)[0]
        group.run()

    def _inner_spec(self, i: int) -> ArraySpec:
        return inner_chunk_spec(self.reader.codec, self.batch[i][1])
