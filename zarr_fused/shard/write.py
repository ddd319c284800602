"""The sharded write path: inner chunks encoded in parallel nogil calls,
shards assembled natively.

For each shard a write touches, `ShardWriter` follows zarr's sharding codec
step by step (``ShardingCodec._encode_partial_sync``), so stored shards are
byte-identical to zarr's wherever the inner codecs are
(`zarr_fused.cli.identity.byte_identical`):

1. a write that covers every inner chunk whole does not read the shard;
   any other reads the stored shard once (its index checked natively);
2. inner chunks the write covers whole are encoded straight from the value
   being written (a scalar written over whole chunks is merged and encoded
   once for the batch); inner chunks it covers in part are decoded, merged
   with NumPy and encoded; untouched inner chunks keep their stored bytes;
3. chunks left equal to the fill value are dropped
   (``write_empty_chunks=False``), a shard left with none is deleted;
4. the new shard is laid out in the codec's ``subchunk_write_order`` with
   its index, complete in memory, before it replaces the old one (with an
   atomic file write on LocalStore), so a failure leaves the old shard.

Selections other than slices and integers fall back to zarr's sharding
codec for the shards they touch.

On a `zarr.storage.LocalStore` with IO threads (``io_concurrency`` > 1,
`zarr_fused.io.engine`), the file IO leaves the compute threads: stored
shards a partial update must read are read by the IO threads (all of them
in flight, each encoded as soon as it is in; with few shards, the next one
read while this one encodes), and each new shard is written (temporary
file, ``writev``, ``rename``) or deleted by the IO threads while the
compute threads encode the next (`zarr_fused.io.engine.Writes`).

A shard the write updates only in part is held from the read of the stored
shard to its replacement (`zarr_fused.io.shard_lock`, unless
``codec_pipeline.shard_write_lock`` is off), so concurrent writers of one
shard lose nothing. In the pipelined path an IO thread takes the hold
without waiting before it reads the shard, and the IO thread that stores
the new shard lets it go (every error path lets it go too); a shard held
elsewhere is deferred to a pass at the end. Elsewhere (few shards, no IO
threads, another store) the thread that updates a shard holds it and does
its IO itself. No thread waits for a hold while holding one, and none
holds one while waiting for work that may wait for a hold.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeGuard, cast

import numpy as np
from zarr.core.chunk_utils import fill_value_or_default
from zarr.storage import MemoryStore

from zarr_fused._buffers import buffers
from zarr_fused._dtypes import empty, empty_rule_pattern, in_byte_order
from zarr_fused._merge import is_empty_chunk, merge_owned
from zarr_fused._native import index_kernels, shard_kernels
from zarr_fused._pool import partition, run_parallel
from zarr_fused._zarr_compat import inner_chunk_spec
from zarr_fused.io.engine import Batch, Writes, io_threads, resolve_io_concurrency, run_pipelined
from zarr_fused.io.local import local_files, make_parents, write_parts
from zarr_fused.io.shard_lock import shard_locks
from zarr_fused.shard.index import (
    ShardSide,
    inner_describer,
    inner_grid,
    read_whole_shard,
    stored_payloads,
)
from zarr_fused.stats import note_parts, timed_writer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._batch import HeldWriter, WriteRequest
    from zarr_fused._chain import NativeChain
    from zarr_fused._hybrid import FilteredChain
    from zarr_fused._items import WriteItem
    from zarr_fused.io.shard_lock import Hold, ShardLocks

    #: gives ``(payloads, pooled buffer)`` of the stored shard at ``(setter,
    #: spec, grid, prefix)`` (see `stored_payloads`)
    Loader = Callable[
        [Any, ArraySpec, tuple[int, ...], bytes | None], tuple[list[Any], np.ndarray | None]
    ]

__all__ = ["ShardWriter"]


def _keeps_a_copy(setter: Any) -> bool:
    """Whether the store keeps a copy of what it is given, not the buffer
    itself: zarr's `MemoryStore` (that exact class) copies every value it
    stores, so a shard can be assembled in reused memory for it."""
    return type(getattr(setter, "store", None)) is MemoryStore


@dataclass
class _Write:
    """What every shard of one `ShardWriter.write` call shares."""

    #: the write (its drop_axes are empty: `ShardWriter.accepts`)
    request: WriteRequest
    #: the request's value as a NumPy array (0-d for a scalar write)
    data: np.ndarray
    inner_spec: ArraySpec
    #: whether encoding ``data`` swaps its bytes
    swap: bool
    layout: Any
    #: the fill pattern when the encode kernel tests for empty chunks, else
    #: None (zarr's `chunk_is_empty` decides, in Python)
    empty_pattern: bytes | None
    describe: Any
    #: the LocalStore path prefix when the shards are local files
    prefix: bytes | None
    #: a scalar write: the encoded inner chunk (None when it is empty)
    scalar_payload: np.ndarray | None = None
    #: the IO threads' stores of this write, when they do the file IO
    writes: Writes | None = None
    #: shards to update that were held elsewhere when fetched: updated by a
    #: held pass after the pipelined one
    deferred: list[tuple[WriteItem, Any]] = field(default_factory=list)

    @property
    def scalar(self) -> bool:
        return self.request.value.shape == ()


def _value_block(data: np.ndarray, out_selection: SelectorTuple) -> np.ndarray:
    """The part of the written value that lands in one shard, as a view.
    Shards reach the native writer only with basic selections (a kernel
    plan exists), whose ``out_selection`` is a tuple of ints and slices."""
    return data[(*cast("tuple[int | slice, ...]", out_selection), Ellipsis)]


@dataclass
class _Fetched:
    """A stored shard fetched under its hold."""

    hold: Hold
    #: `ShardWriter._fetch`'s result
    loaded: Any


#: a shard to update that was held elsewhere when its fetch came
_DEFER: Final = object()


def _discard(fetched: Any) -> None:
    """A fetch nobody consumes (the batch failed): its buffer back to the
    pool, its hold let go."""
    if isinstance(fetched, _Fetched):
        try:
            if fetched.loaded is not None:
                buffers.give(fetched.loaded[1])
        finally:
            fetched.hold.release()


@dataclass
class _ShardJob:
    """One shard on its way from the stored bytes to the new ones."""

    item: WriteItem
    plan: Any
    grid: tuple[int, ...]
    #: the encoded bytes of every inner chunk by linear index, None for none
    payloads: list[Any]
    #: the pooled buffer the stored shard was read into, if any
    buffer: np.ndarray | None
    #: the pooled buffer the new inner chunks are encoded into (None: none
    #: is encoded)
    arena: np.ndarray | None
    encoding: Any
    #: linear indices of the inner chunks queued in ``encoding``, in order
    queued: list[int] = field(default_factory=list)
    #: the shard's hold, let go with its buffers (after the shard is stored)
    hold: Hold | None = None

    def pinned(self) -> int:
        """The bytes this shard holds until it is written."""
        return sum(b.nbytes for b in (self.arena, self.buffer) if b is not None)

    def release(self) -> None:
        self.payloads = []
        self.encoding = None
        try:
            buffers.give(self.buffer)
            buffers.give(self.arena)
            self.buffer = None
        finally:
            if self.hold is not None:
                self.hold.release()


class ShardWriter(ShardSide):
    """Native writes of whole and partial shards (see the module docstring)."""

    chain: NativeChain | FilteredChain
    fallback: HeldWriter

    def __init__(
        self, codec: ShardingCodec, chain: NativeChain | FilteredChain, fallback: HeldWriter
    ) -> None:
        super().__init__(codec, chain, fallback)

    # -- the batch --------------------------------------------------------------------------

    def accepts(
        self, data: Any, drop_axes: tuple[int, ...], inner_spec: ArraySpec
    ) -> TypeGuard[np.ndarray]:
        """Whether the engine writes the value ``data`` (else zarr's codec does)."""
        chain = self.chain
        return (
            type(data) is np.ndarray
            and not drop_axes
            and chain.handles(inner_spec)
            and chain.encode_swap(data) is not None
        )

    @staticmethod
    def covers(plan: Any, items: list[Any] | None = None) -> bool:
        """Whether a write of ``plan`` covers every inner chunk of its shard
        whole (nothing stored is kept, so the shard is not read)."""
        if not plan.all_touched:
            return False
        return all(whole for *_, whole in (plan.items() if items is None else items))

    def write(self, batch: Sequence[WriteItem], request: WriteRequest) -> None:
        _, spec0, *_ = batch[0]
        inner_spec = inner_chunk_spec(self.codec, spec0)
        data = request.value.as_ndarray_like()
        locks = shard_locks(batch)
        if not self.accepts(data, request.drop_axes, inner_spec):
            self.fallback.write_held(batch, request, locks)
            return
        plan_selection = shard_kernels.plan_selection
        plans = [
            plan_selection(spec.shape, self.inner_shape, chunk_selection)
            for _, spec, chunk_selection, _, _ in batch
        ]
        general = [item for item, plan in zip(batch, plans) if plan is None]
        native = [(item, plan) for item, plan in zip(batch, plans) if plan is not None]
        ctx = self._context(batch, request, data, inner_spec)
        if ctx.scalar and native:
            ctx.scalar_payload = self._encode_scalar(ctx)
        self._write_shards(ctx, native, request.max_workers, locks)
        if general:
            self.fallback.write_held(general, request, locks)

    def _write_shards(
        self,
        ctx: _Write,
        native: list[tuple[WriteItem, Any]],
        max_workers: int,
        locks: ShardLocks | None,
    ) -> None:
        """The native shards: with IO threads, pipelined (a shard to update
        is held from its fetch to its stored replacement, when it can be
        held at once; the others wait for a held pass at the end), else
        each held by the thread that updates it (see `_write_native`)."""
        io_concurrency = resolve_io_concurrency() if ctx.prefix is not None else 1
        spread = len(native) < 2 * max_workers and max_workers > 1
        if io_concurrency > 1 and not spread:
            with Writes(io_concurrency) as ctx.writes:
                self._write_behind(ctx, native, max_workers, io_concurrency, locks)
            ctx.writes = None
            if ctx.deferred:
                self._write_native(ctx, ctx.deferred, max_workers, locks)
            return
        if locks is not None:
            held = [job for job in native if not self.covers(job[1])]
            if held:
                self._write_native(ctx, held, max_workers, locks)
            native = [job for job in native if self.covers(job[1])]
        if not native:
            return
        if io_concurrency <= 1:
            self._write_native(ctx, native, max_workers)
        else:
            with Writes(io_concurrency) as ctx.writes:
                self._write_behind(ctx, native, max_workers, io_concurrency)

    def _one_shard(self, ctx: _Write, job: tuple[WriteItem, Any], loaded: Any = None) -> None:
        """One shard on one compute thread (``loaded``: see `_prepare`)."""
        state = self._prepare(ctx, *job, loaded=loaded)
        if state is not None:
            state.encoding.run_range()
            self._finish(ctx, state)

    def _write_native(
        self,
        ctx: _Write,
        native: list[tuple[WriteItem, Any]],
        max_workers: int,
        locks: ShardLocks | None = None,
    ) -> None:
        """The compute threads do the file IO: a shard per thread, or each
        shard's inner chunks spread over the threads when there are few.

        With ``locks``, each shard is held from the read of its stored bytes
        to its replacement, by the thread that updates it (the one that
        spreads its encodes, when there are few): a hold is taken only
        where the thread holds no other, and while held the thread waits
        only for its own file IO and for encodes that take no hold
        (`zarr_fused.io.shard_lock` has the argument)."""
        assert ctx.writes is None, "a held shard is written by the thread that holds it"
        if len(native) >= 2 * max_workers or max_workers <= 1:
            run_parallel(
                lambda job: self._held(ctx, job, locks, self._one_shard), native, max_workers
            )
        else:
            for job in native:
                self._held(ctx, job, locks, self._encode_spread, max_workers)

    @staticmethod
    def _held(
        ctx: _Write,
        job: tuple[WriteItem, Any],
        locks: ShardLocks | None,
        update: Callable[..., None],
        *args: Any,
    ) -> None:
        """``update(ctx, job, *args)``, holding the job's shard if ``locks``."""
        if locks is None:
            update(ctx, job, *args)
            return
        (setter, *_), _ = job
        with locks.hold(setter):
            update(ctx, job, *args)

    def _write_behind(
        self,
        ctx: _Write,
        native: list[tuple[WriteItem, Any]],
        max_workers: int,
        io_concurrency: int,
        locks: ShardLocks | None = None,
    ) -> None:
        """The IO threads read the shards to update and write the new ones
        (see the module docstring); ``ctx.writes`` is open. With ``locks``
        (only where shards are not spread), each shard to update is held
        by its fetch if it can be at once (else it goes to
        ``ctx.deferred``) and let go once its replacement is stored."""
        if len(native) < 2 * max_workers and max_workers > 1:
            self._spread_behind(ctx, native, max_workers, io_concurrency)
        elif all(self.covers(plan) for _, plan in native):
            run_parallel(lambda job: self._one_shard(ctx, job), native, max_workers)
        else:
            bound = self.chain.encode_bound(ctx.layout.nbytes)

            def fetch(job: tuple[WriteItem, Any], batch: Batch[Any, Any]) -> Any:
                if batch.stopped:
                    return None
                if locks is None or self.covers(job[1]):
                    return self._fetch(ctx, job)
                return self._fetch_held(ctx, job, locks)

            run_pipelined(
                native,
                [self._stored_bound(job, bound) for job in native],
                fetch,
                lambda job, fetched: self._consume(ctx, job, fetched),
                io_concurrency=io_concurrency,
                max_workers=max_workers,
                discard=_discard,
            )

    def _fetch_held(self, ctx: _Write, job: tuple[WriteItem, Any], locks: ShardLocks) -> Any:
        """`_fetch` under the shard's hold, taken without waiting: a
        `_Fetched`, or `_DEFER` when the shard is held elsewhere."""
        (setter, *_), _ = job
        hold = locks.take(setter, blocking=False)
        if hold is None:
            return _DEFER
        try:
            return _Fetched(hold, self._fetch(ctx, job))
        except BaseException:
            hold.release()
            raise

    def _consume(self, ctx: _Write, job: tuple[WriteItem, Any], fetched: Any) -> None:
        """A fetched shard on a compute thread; a held one keeps its hold
        until its replacement is stored (`_ShardJob.release`)."""
        if fetched is _DEFER:
            ctx.deferred.append(job)
            return
        if not isinstance(fetched, _Fetched):
            self._one_shard(ctx, job, fetched)
            return
        try:
            state = self._prepare(ctx, *job, loaded=fetched.loaded)
        except BaseException:
            fetched.hold.release()
            raise
        if state is None:
            fetched.hold.release()
            return
        state.hold = fetched.hold
        try:
            state.encoding.run_range()
        except BaseException:
            state.release()
            raise
        self._finish(ctx, state)

    def _stored_bound(self, job: tuple[WriteItem, Any], bound: int) -> int:
        """The most bytes the stored shard of ``job`` can hold, as a budget
        cost (none when the write does not read it)."""
        (_, spec, *_), plan = job
        if self.covers(plan):
            return 0
        n = math.prod(inner_grid(spec, self.inner_shape))
        return n * bound + self.fmt.size(n)

    def _fetch(self, ctx: _Write, job: tuple[WriteItem, Any]) -> Any:
        """What `_prepare` needs read from the store for ``job`` (None: nothing)."""
        (setter, spec, *_), plan = job
        if self.covers(plan):
            return None
        return self._load(setter, spec, inner_grid(spec, self.inner_shape), ctx.prefix)

    def _spread_behind(
        self,
        ctx: _Write,
        native: list[tuple[WriteItem, Any]],
        max_workers: int,
        io_concurrency: int,
    ) -> None:
        """Few shards, one after another, each spread over the compute
        threads: the IO threads read the next shard meanwhile."""
        pool = io_threads(io_concurrency)
        ahead: dict[int, Future[Any]] = {}

        def read_ahead(k: int) -> None:
            if k >= len(native):
                return
            _, plan = native[k]
            if not self.covers(plan):
                ahead[k] = pool.submit(self._fetch, ctx, native[k])

        read_ahead(0)
        try:
            for k, job in enumerate(native):
                read_ahead(k + 1)
                loaded = ahead.pop(k).result() if k in ahead else None
                self._encode_spread(ctx, job, max_workers, loaded)
        finally:
            wait(ahead.values())  # a read still running when a shard failed
            for future in ahead.values():
                if not future.cancelled() and future.exception() is None:
                    buffers.give(future.result()[1])

    def _context(
        self,
        batch: Sequence[WriteItem],
        request: WriteRequest,
        data: np.ndarray,
        inner_spec: ArraySpec,
    ) -> _Write:
        chain = self.chain
        _, spec0, *_ = batch[0]
        prefix = local_files(batch, write=True, shard_io=True)
        if prefix is not None:
            make_parents(prefix, batch)
        return _Write(
            request=request,
            data=data,
            inner_spec=inner_spec,
            swap=bool(chain.encode_swap(data)),
            layout=chain.layout(self.inner_shape),
            empty_pattern=(
                empty_rule_pattern(inner_spec, chain.dtype) if data.dtype == chain.dtype else None
            ),
            describe=inner_describer(inner_grid(spec0, self.inner_shape)),
            prefix=prefix,
        )

    def _encode_scalar(self, ctx: _Write) -> np.ndarray | None:
        """A scalar over whole inner chunks: one encoded chunk for the batch,
        None when it is empty."""
        inner_spec = ctx.inner_spec
        nd_buffer = inner_spec.prototype.nd_buffer
        merged = merge_owned(None, ctx.request.value, (), inner_spec, (), True, ())
        if is_empty_chunk(nd_buffer.from_ndarray_like(merged), inner_spec):
            return None
        encoded = self.chain.encode(nd_buffer.from_ndarray_like(merged), inner_spec)
        return encoded.as_numpy_array() if encoded is not None else None

    def _encode_spread(
        self, ctx: _Write, job: tuple[WriteItem, Any], max_workers: int, loaded: Any = None
    ) -> None:
        """One shard, its inner chunks' encodes spread over the workers."""
        state = self._prepare(ctx, *job, loaded=loaded)
        if state is None:
            return
        encoding = state.encoding
        n = len(encoding)
        parts = partition(n, max_workers, max_group=max(1, -(-n // (2 * max_workers))))
        run_parallel(lambda r: encoding.run_range(r.start, r.stop), parts, max_workers)
        self._finish(ctx, state)

    # -- one shard ----------------------------------------------------------------------------

    def _load(
        self, setter: Any, spec: ArraySpec, grid: tuple[int, ...], prefix: bytes | None
    ) -> tuple[list[Any], np.ndarray | None]:
        """The stored payload of every inner chunk by linear index (views,
        None for none), and the pooled buffer they live in."""
        return stored_payloads(read_whole_shard(setter, spec, self.fmt, grid, prefix), grid)

    def _prepare(
        self, ctx: _Write, item: WriteItem, plan: Any, loaded: Any = None
    ) -> _ShardJob | None:
        """Load what the shard keeps (unless ``loaded``, `_load`'s result
        read beforehand, has it) and queue the encodes of its new inner
        chunks; None when the write went to zarr's code instead."""
        load = self._load if loaded is None else lambda *_: loaded
        state = self.start(ctx, item, plan, load)
        if state is None:
            # the value does not fit the selection: zarr's path raises the
            # error zarr users expect
            # (without a hold of its own: a shard this write does not cover
            # is held already, one it covers needs none)
            self.fallback.write_held([item], ctx.request.with_workers(1), None)
        return state

    def start(self, ctx: _Write, item: WriteItem, plan: Any, load: Loader) -> _ShardJob | None:
        """Queue the encodes of a shard's new inner chunks, with what it
        keeps from ``load`` (called only when the write does not cover the
        shard); None when the value does not fit the selection (the caller
        hands the item to zarr's code)."""
        setter, spec, _, _, _ = item
        chain = self.chain
        grid = inner_grid(spec, self.inner_shape)
        items = plan.items()
        if self.covers(plan, items):
            payloads: list[Any] = [None] * math.prod(grid)
            buffer = None
        else:
            payloads, buffer = load(setter, spec, grid, ctx.prefix)
        # the encoded inner chunks live in a reused buffer until `_finish`
        # has written the shard (its results are views into it); a scalar's
        # whole inner chunks share one payload and need none
        queued = sum(not whole for *_, whole in items) if ctx.scalar else len(items)
        arena = buffers.take(queued * chain.encode_bound(ctx.layout.nbytes)) if queued else None
        encoding = chain.encode_batch(len(items), len(self.inner_shape), ctx.describe, arena)
        if ctx.empty_pattern is not None:
            encoding.set_fill(ctx.empty_pattern)
        state = _ShardJob(item, plan, grid, payloads, buffer, arena, encoding)
        if not self._queue_whole(ctx, state, items):
            state.release()
            return None
        partial = [(lin, sel, block_sel) for lin, sel, block_sel, whole in items if not whole]
        if partial:
            self._queue_partial(ctx, state, partial)
        return state

    def _queue_whole(self, ctx: _Write, state: _ShardJob, items: list[Any]) -> bool:
        """Queue the inner chunks the write covers whole; False when the
        kernel finds the value does not fit the selection."""
        setter, _, _, out_selection, _ = state.item
        payloads = state.payloads
        if ctx.scalar:
            for lin, _, _, whole in items:
                if whole:
                    payloads[lin] = ctx.scalar_payload
            return True
        if ctx.empty_pattern is not None or not any(whole for *_, whole in items):
            done = shard_kernels.add_shard_encode(
                state.encoding,
                ctx.data,
                out_selection,
                state.plan,
                ctx.layout,
                setter,
                ctx.swap,
                ctx.empty_pattern is not None,
            )
            if done is None:
                return False
            state.queued.extend(int(lin) for lin in done)
            return True
        # zarr's empty rule needs Python (NaN or complex fill values)
        inner_spec = ctx.inner_spec
        data = ctx.data
        block = _value_block(data, out_selection) if out_selection != () else data
        for lin, _, block_selection, whole in items:
            if not whole:
                continue
            region = np.asarray(block[block_selection]).reshape(self.inner_shape)
            if is_empty_chunk(inner_spec.prototype.nd_buffer.from_ndarray_like(region), inner_spec):
                payloads[lin] = None
            else:
                state.encoding.add(region, ctx.layout, ctx.swap, (setter, lin))
                state.queued.append(lin)
        return True

    def _queue_partial(self, ctx: _Write, state: _ShardJob, partial: list[Any]) -> None:
        """Inner chunks covered in part: decode what is stored, merge, queue
        the encode."""
        chain = self.chain
        inner_spec = ctx.inner_spec
        setter, _, _, out_selection, _ = state.item
        payloads = state.payloads
        existing: dict[int, np.ndarray] = {}
        decoding = chain.kernel_batch(len(partial), len(self.inner_shape), ctx.describe)
        for lin, _, _ in partial:
            if payloads[lin] is not None:
                existing[lin] = empty(self.inner_shape, chain.dtype)
                decoding.add(payloads[lin], ctx.layout, (), existing[lin], (), (), (setter, lin))
        decoding.run()
        data = ctx.data
        block = None if ctx.scalar else _value_block(data, out_selection)
        checks_empty = ctx.empty_pattern is not None
        for lin, sel, block_sel in partial:
            chunk = existing.get(lin)
            if chunk is None:
                # a CPU buffer (the chain handles inner_spec): a NumPy array
                chunk = cast(
                    "np.ndarray",
                    inner_spec.prototype.nd_buffer.create(
                        shape=self.inner_shape,
                        dtype=chain.dtype,
                        order=inner_spec.order,
                        fill_value=fill_value_or_default(inner_spec),
                    ).as_ndarray_like(),
                )
            chunk[sel] = in_byte_order(data if block is None else block[block_sel], chunk.dtype)
            if not checks_empty and is_empty_chunk(
                inner_spec.prototype.nd_buffer.from_ndarray_like(chunk), inner_spec
            ):
                payloads[lin] = None
                continue
            state.encoding.add(
                chunk, ctx.layout, bool(chain.encode_swap(chunk)), (setter, lin), None, checks_empty
            )
            state.queued.append(lin)

    def _finish(self, ctx: _Write, state: _ShardJob) -> None:
        """Take the encoded inner chunks and store the new shard (or delete
        it, when no inner chunk is left)."""
        setter, spec, _, _, _ = state.item
        payloads = self._collect(state)
        layout_args = self.fmt.layout_args()
        if ctx.writes is not None:
            self._hand_over(ctx, state, layout_args)
            return
        try:
            if ctx.prefix is not None:
                # straight from the payloads to the file (writev), no copy
                parts = index_kernels.shard_parts(
                    self.write_order(state.grid), payloads, **layout_args
                )
                if parts is None:
                    setter.delete_sync()
                else:
                    start = time.perf_counter()
                    write_parts(ctx.prefix + os.fsencode(setter.path), parts)
                    note_parts(setter, parts, time.perf_counter() - start)
                return
            reuse = _keeps_a_copy(setter)
            blob = self.assemble(state, take=buffers.take if reuse else None)
            try:
                if blob is None:
                    setter.delete_sync()
                else:
                    setter.set_sync(spec.prototype.buffer.from_array_like(blob))
            finally:
                if reuse and blob is not None:
                    buffers.give(blob.base)  # the reused buffer, of which blob is a view
        finally:
            state.release()

    def _collect(self, state: _ShardJob) -> list[Any]:
        """The shard's payloads, its new inner chunks' encodes taken in."""
        payloads = state.payloads
        for lin, result in zip(state.queued, state.encoding.results()):
            payloads[lin] = None if result is False else result  # False: all fill value
        return payloads

    def assemble(self, state: _ShardJob, take: Any = None) -> np.ndarray | None:
        """The new shard laid out with its index (None when no inner chunk
        is left); ``take`` allocates its buffer (default: a new one)."""
        payloads = self._collect(state)
        return index_kernels.assemble_shard(
            self.write_order(state.grid), payloads, **self.fmt.layout_args(), take=take
        )

    def _hand_over(self, ctx: _Write, state: _ShardJob, layout_args: dict[str, bool]) -> None:
        """Give the new shard's store (or delete) to the IO threads; the
        shard's buffers go back to the pool once it is written."""
        assert ctx.writes is not None and ctx.prefix is not None
        setter, *_ = state.item
        try:
            parts = index_kernels.shard_parts(
                self.write_order(state.grid), state.payloads, **layout_args
            )
        except BaseException:
            state.release()
            raise
        with ctx.writes.parcel(state.pinned(), state.release) as parcel:
            if parts is None:
                parcel.store(setter.delete_sync)
            else:
                write = timed_writer(setter, write_parts)
                parcel.store(write, ctx.prefix + os.fsencode(setter.path), parts)
                note_parts(setter, parts)
