"""The native shard engine over stores without synchronous IO (object
stores through obstore or s3fs): writes.

Each shard of a batch runs on its own, all shards at once:

1. a write that covers every inner chunk of the shard whole does not read
   it; any other fetches the stored shard in one GET, as zarr's sharding
   codec does (``_load_full_shard_maybe``): the new shard keeps the stored
   bytes of every inner chunk the write leaves alone, so nothing less than
   the whole object will do;
2. in the compute pool, the index is checked natively and the inner chunks
   merged and encoded by the local writer's own steps
   (`zarr_fused.shard.write.ShardWriter.start`), spread over the workers
   when there are fewer shards than can keep the pool busy, and the shard
   is assembled with its index (`ShardWriter.assemble`);
3. its upload starts the moment it is assembled: one PUT of the complete
   shard (atomic on S3, so a failure leaves the old object), or one DELETE
   when no inner chunk is left, as zarr does.

A shard that was read (step 1) is stored by a conditional PUT where the
store takes one (``codec_pipeline.shard_write_lock``, on by default): if
another writer replaced the shard in between, steps 1-3 run again on what
it stored, after a pause (`zarr_fused.io.object_cas`); the batch's
``update`` request runs that loop.

Stored bytes are the local writer's, byte-identical to zarr's sharding
codec. Every request shares the batch's limiter (``async.concurrency``) and
names its key in errors (`zarr_fused.io.requests`). Selections the shard
planner does not cover, and a value that does not fit its selection, are
handed back to the async path's generic write (zarr's sharding codec).
"""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

from zarr_fused._native import shard_kernels
from zarr_fused._pool import partition
from zarr_fused._zarr_compat import inner_chunk_spec
from zarr_fused.io.object_cas import NOTHING
from zarr_fused.shard.index import stored_payloads, whole_shard

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer

    from zarr_fused._batch import WriteRequest
    from zarr_fused._items import WriteItem
    from zarr_fused.io.object_cas import Outcome
    from zarr_fused.io.requests import BatchIO
    from zarr_fused.shard.write import ShardWriter, _ShardJob, _Write

__all__ = ["AsyncShardWriter"]


class AsyncShardWriter:
    """Native shard writes over an async store (see the module docstring)."""

    def __init__(self, writer: ShardWriter) -> None:
        self.writer = writer

    def applies(self, batch: Sequence[WriteItem], request: WriteRequest) -> list[Any] | None:
        """The shard plan of each item of ``batch`` (None for an item the
        planner does not cover), or None when the engine writes none of
        them (the batch then goes to zarr's sharding codec)."""
        if shard_kernels is None:
            return None
        writer = self.writer
        inner_spec = inner_chunk_spec(writer.codec, batch[0][1])
        if not writer.accepts(request.value.as_ndarray_like(), request.drop_axes, inner_spec):
            return None
        plans = [
            shard_kernels.plan_selection(spec.shape, writer.inner_shape, chunk_selection)
            for _, spec, chunk_selection, _, _ in batch
        ]
        return plans if any(plan is not None for plan in plans) else None

    async def write(
        self, batch: Sequence[WriteItem], plans: list[Any], request: WriteRequest, io: BatchIO
    ) -> list[WriteItem]:
        """Write the items of ``batch`` that have a plan (from `applies`);
        return those left for zarr's sharding codec."""
        native = [(item, plan) for item, plan in zip(batch, plans, strict=True) if plan is not None]
        rest = [item for item, plan in zip(batch, plans, strict=True) if plan is None]
        run = _AsyncWrite(self.writer, batch, request, io)
        run.spread = run.workers if len(native) < 2 * run.workers else 1
        if run.ctx.scalar:
            run.ctx.scalar_payload = await io.tracker.compute(self.writer._encode_scalar, run.ctx)
        await asyncio.gather(*(io.tracker.task(run.shard(item, plan)) for item, plan in native))
        return rest + run.misfits


class _AsyncWrite:
    """One `AsyncShardWriter.write` call: the steps each shard goes through."""

    def __init__(
        self, writer: ShardWriter, batch: Sequence[WriteItem], request: WriteRequest, io: BatchIO
    ) -> None:
        self.writer = writer
        self.requests = io.requests
        self.tracker = io.tracker
        # a NumPy array: `AsyncShardWriter.applies` checked it
        data = cast("np.ndarray", request.value.as_ndarray_like())
        inner_spec = inner_chunk_spec(writer.codec, batch[0][1])
        self.ctx: _Write = writer._context(batch, request, data, inner_spec)
        self.workers = request.max_workers
        #: workers one shard's encodes spread over (1 when shards go round)
        self.spread = 1
        #: items whose value does not fit the selection (zarr's code raises)
        self.misfits: list[WriteItem] = []
        self._lock = threading.Lock()

    async def shard(self, item: WriteItem, plan: Any) -> None:
        """Encode and assemble the shard, then upload it (or delete it when
        nothing is left): straight away when the write covers it whole,
        else merged with the stored shard in the batch's ``update``."""
        setter, spec, _, _, _ = item
        if not self.writer.covers(plan):
            await self.requests.update(setter, spec.prototype, partial(self.merge, item, plan))
            return
        blob = await self.merge(item, plan, None)
        if blob is not NOTHING:
            await self.requests.set(setter, blob)

    async def merge(
        self, item: WriteItem, plan: Any, raw: Buffer | None
    ) -> Buffer | None | Literal[Outcome.NOTHING]:
        """The new shard from the stored one (``raw``): None when no inner
        chunk is left, `NOTHING` when the value does not fit (the item then
        goes to zarr's code)."""
        prototype = item[1].prototype
        if self.spread > 1:
            state = await self.tracker.compute(self.start, item, plan, raw)
            if state is None:
                return NOTHING
            blob = await self.encode_spread(state)
        else:
            outcome = await self.tracker.compute(self.encode, item, plan, raw)
            if outcome is False:
                return NOTHING
            blob = outcome
        return None if blob is None else prototype.buffer.from_array_like(blob)

    def start(self, item: WriteItem, plan: Any, raw: Buffer | None) -> _ShardJob | None:
        """Check the stored shard's index and queue the new inner chunks'
        encodes (in the pool); None when the value does not fit."""

        def load(
            setter: Any, spec: ArraySpec, grid: tuple[int, ...], prefix: bytes | None
        ) -> tuple[list[Any], np.ndarray | None]:
            if raw is None:
                return stored_payloads(None, grid)
            return stored_payloads(
                whole_shard(raw.as_numpy_array(), setter, self.writer.fmt, grid), grid
            )

        state = self.writer.start(self.ctx, item, plan, load)
        if state is None:
            with self._lock:
                self.misfits.append(item)
        return state

    def encode(self, item: WriteItem, plan: Any, raw: Buffer | None) -> np.ndarray | None | bool:
        """`start`, every encode and the assembly in one pool call: the new
        shard (None: delete it), False when the value does not fit."""
        state = self.start(item, plan, raw)
        if state is None:
            return False
        state.encoding.run_range()
        return self.assemble(state)

    async def encode_spread(self, state: _ShardJob) -> np.ndarray | None:
        """One shard's encodes spread over the workers, then its assembly."""
        encoding = state.encoding
        n = len(encoding)
        parts = partition(n, self.spread, max_group=max(1, -(-n // (2 * self.spread))))
        compute = self.tracker.compute
        await asyncio.gather(*(compute(encoding.run_range, r.start, r.stop) for r in parts))
        result: np.ndarray | None = await compute(self.assemble, state)
        return result

    def assemble(self, state: _ShardJob) -> np.ndarray | None:
        """The new shard in a buffer of its own (the encode arena goes back
        to the pool before the upload starts)."""
        try:
            return self.writer.assemble(state)
        finally:
            state.release()
