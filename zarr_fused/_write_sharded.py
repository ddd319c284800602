"""The sharded write path: inner chunks encoded in parallel nogil calls,
shards assembled natively.

For each shard a write touches, `ShardWriter` follows zarr's sharding codec
step by step (``ShardingCodec._encode_partial_sync``), so stored shards are
byte-identical to zarr's wherever the inner codecs are
(`zarr_fused._chain.byte_identical`):

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
"""

from __future__ import annotations

import math
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.chunk_utils import chunk_is_empty, fill_value_or_default
from zarr.storage import MemoryStore

from zarr_fused._dtypes import empty, in_byte_order
from zarr_fused._native import index_kernels, io_kernels, shard_kernels
from zarr_fused._pool import partition, run_parallel
from zarr_fused._read import describe_key, fill_pattern, local_files
from zarr_fused._read_sharded import _buffers, _index_format, _inner_describer
from zarr_fused._write import merge_owned
from zarr_fused.errors import CorruptShardError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

    from zarr_fused._chain import NativeChain
    from zarr_fused._write import PartialEncodeWriter, WriteItem

__all__ = ["ShardWriter"]

_UNSET = object()


def _keeps_a_copy(setter: Any) -> bool:
    """Whether the store keeps a copy of what it is given, not the buffer
    itself: zarr's `MemoryStore` (that exact class) copies every value it
    stores, so a shard can be assembled in reused memory for it."""
    return type(getattr(setter, "store", None)) is MemoryStore


class ShardWriter:
    """Native writes of whole and partial shards (see the module docstring)."""

    def __init__(self, codec: ShardingCodec, chain: NativeChain, fallback: PartialEncodeWriter) -> None:
        self.codec = codec
        self.chain = chain
        self.fallback = fallback
        self.inner_shape = tuple(codec.chunk_shape)
        self.checksum, self.big_endian = _index_format(codec)  # type: ignore[misc]
        self._orders: dict[tuple[int, ...], np.ndarray] = {}
        self._lock = threading.Lock()

    def _order(self, grid: tuple[int, ...]) -> np.ndarray:
        """Linear indices of the inner chunks in the codec's write order."""
        order = self._orders.get(grid)
        if order is None:
            coords = list(self.codec._subchunk_order_iter(grid, self.codec.subchunk_write_order))
            order = np.array([np.ravel_multi_index(tuple(c), grid) for c in coords], dtype=np.intp)
            with self._lock:
                self._orders[grid] = order
        return order

    # -- the stored shard ----------------------------------------------------------------

    def _load(self, setter: Any, spec: ArraySpec, grid: tuple[int, ...],
              prefix: bytes | None) -> tuple[Any, Any, Any]:
        """(payload views by linear index, or None when there is no shard;
        the buffer to give back)."""
        n = math.prod(grid)
        size = 16 * n + (4 if self.checksum else 0)
        buffer = None
        if prefix is not None:
            path = prefix + os.fsencode(setter.path)
            buffer = _buffers.take(4 * size)
            length = io_kernels.read_into(path, buffer)  # type: ignore[union-attr]
            while length is not None and length > len(buffer):  # the buffer is too small
                _buffers.give(buffer)
                buffer = _buffers.take(length)
                length = io_kernels.read_into(path, buffer)  # type: ignore[union-attr]
            if length is None:
                return None, buffer, None
            data = buffer[:length]
        else:
            raw = setter.get_sync(prototype=spec.prototype)
            if raw is None:
                return None, None, None
            data = raw.as_numpy_array()
        at_start = self.codec.index_location == "start"
        if len(data) < size:
            raise CorruptShardError.truncated(describe_key(setter), len(data), size)
        index = data[:size] if at_start else data[len(data) - size:]
        entries = index_kernels.parse_index(  # type: ignore[union-attr]
            index, n, checksum=self.checksum, big_endian=self.big_endian, shard_len=len(data),
            index_start=0 if at_start else len(data) - size, grid=grid,
            where=lambda: describe_key(setter))
        payloads: list[Any] = [None] * n
        for lin in np.flatnonzero(entries[:, 0] != np.uint64(2**64 - 1)):
            off, length_ = int(entries[lin, 0]), int(entries[lin, 1])
            payloads[lin] = data[off:off + length_]
        return payloads, buffer, data

    # -- the batch --------------------------------------------------------------------------

    def write(
        self,
        batch: Sequence[WriteItem],
        value: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> None:
        chain = self.chain
        spec0 = batch[0][1]
        inner_spec = self.codec._get_chunk_spec(spec0)
        data = value.as_ndarray_like()
        if (type(data) is not np.ndarray or drop_axes or not chain.handles(inner_spec)
                or chain.encode_swap(data) is None):
            self.fallback.write(batch, value, drop_axes, max_workers)
            return
        scalar = value.shape == ()
        swap = bool(chain.encode_swap(data))
        layout = chain.layout(self.inner_shape)
        ndim = len(self.inner_shape)
        plan_selection = shard_kernels.plan_selection  # type: ignore[union-attr]
        plans = [plan_selection(spec.shape, self.inner_shape, chunk_selection)
                 for _, spec, chunk_selection, _, _ in batch]
        general = [item for item, plan in zip(batch, plans) if plan is None]
        native = [(item, plan) for item, plan in zip(batch, plans) if plan is not None]

        fill = fill_value_or_default(inner_spec)
        native_empty = (
            not inner_spec.config.write_empty_chunks
            and fill is not None
            and data.dtype == chain.dtype
            and (chain.dtype.kind in "biumM"
                 or (chain.dtype.kind == "f" and not np.isnan(fill)))
        )
        pattern = fill_pattern(inner_spec, chain.dtype) if native_empty else None
        describe = _inner_describer(tuple(s // c for s, c in zip(spec0.shape, self.inner_shape)))
        prefix = local_files(batch, write=True) if io_kernels is not None else None
        if prefix is not None:
            for parent in {os.path.dirname(prefix + os.fsencode(item[0].path)) for item in batch}:
                os.makedirs(parent, exist_ok=True)

        # a scalar over whole inner chunks: one outcome for the whole batch
        scalar_outcome: Any = _UNSET
        if scalar and native:
            merged = merge_owned(None, value, (), inner_spec, (), True, ())
            if chunk_is_empty(inner_spec.prototype.nd_buffer.from_ndarray_like(merged), inner_spec):
                scalar_outcome = None
            else:
                scalar_outcome = chain.encode(
                    inner_spec.prototype.nd_buffer.from_ndarray_like(merged), inner_spec)
                scalar_outcome = scalar_outcome.as_numpy_array() if scalar_outcome is not None else None

        def prepare(job: tuple[WriteItem, Any]) -> dict[str, Any] | None:
            (setter, spec, chunk_selection, out_selection, _), plan = job
            grid = tuple(s // c for s, c in zip(spec.shape, self.inner_shape))
            items = plan.items()
            whole_shard = plan.all_touched and all(whole for *_, whole in items)
            payloads: list[Any] = [None] * math.prod(grid)
            buffer = None
            if not whole_shard:
                stored, buffer, _ = self._load(setter, spec, grid, prefix)
                if stored is not None:
                    payloads = stored
            # the encoded inner chunks live in a reused buffer until `finish`
            # has written the shard (its results are views into it)
            arena = _buffers.take(len(items) * chain.encode_bound(layout.nbytes))
            encoding = chain.encode_batch(len(items), ndim, describe, arena)
            if pattern is not None:
                encoding.set_fill(pattern)
            queued: list[int] = []
            if scalar:
                for lin, _, _, whole in items:
                    if whole:
                        payloads[lin] = scalar_outcome
            elif native_empty or not any(whole for *_, whole in items):
                done = shard_kernels.add_shard_encode(  # type: ignore[union-attr]
                    encoding, data, out_selection, plan, layout, setter, swap, native_empty)
                if done is None:
                    # the value does not fit the selection: zarr's path raises
                    # the error zarr users expect
                    del encoding
                    _buffers.give(buffer)
                    _buffers.give(arena)
                    self.fallback.write([job[0]], value, drop_axes, 1)
                    return None
                queued.extend(int(lin) for lin in done)
            else:  # zarr's empty rule needs Python (NaN or complex fill values)
                block = data[(*out_selection, Ellipsis)] if out_selection != () else data
                for lin, _, block_selection, whole in items:
                    if not whole:
                        continue
                    region = np.asarray(block[block_selection]).reshape(self.inner_shape)
                    if chunk_is_empty(inner_spec.prototype.nd_buffer.from_ndarray_like(region), inner_spec):
                        payloads[lin] = None
                    else:
                        encoding.add(region, layout, swap, (setter, lin))
                        queued.append(lin)
            # inner chunks covered in part: decode what is stored, merge, encode
            partial = [(lin, sel, block_sel) for lin, sel, block_sel, whole in items if not whole]
            if partial:
                existing: dict[int, np.ndarray] = {}
                decoding = chain.kernel_batch(len(partial), ndim, describe)
                for lin, _, _ in partial:
                    if payloads[lin] is not None:
                        existing[lin] = empty(self.inner_shape, chain.dtype)
                        decoding.add(payloads[lin], layout, (), existing[lin], (), (), (setter, lin))
                decoding.run()
                block = None if scalar else data[(*out_selection, Ellipsis)]
                for lin, sel, block_sel in partial:
                    chunk = existing.get(lin)
                    if chunk is None:
                        chunk = inner_spec.prototype.nd_buffer.create(
                            shape=self.inner_shape, dtype=chain.dtype, order=inner_spec.order,
                            fill_value=fill_value_or_default(inner_spec),
                        ).as_ndarray_like()
                    chunk[sel] = in_byte_order(data if scalar else block[block_sel], chunk.dtype)
                    if pattern is None and chunk_is_empty(
                        inner_spec.prototype.nd_buffer.from_ndarray_like(chunk), inner_spec
                    ):
                        payloads[lin] = None
                        continue
                    encoding.add(chunk, layout, bool(chain.encode_swap(chunk)), (setter, lin), None,
                                 pattern is not None)
                    queued.append(lin)
            return {"job": job, "grid": grid, "payloads": payloads, "buffer": buffer,
                    "arena": arena, "encoding": encoding, "queued": queued}

        def finish(state: dict[str, Any]) -> None:
            (setter, spec, _, _, _), _ = state["job"]
            payloads = state["payloads"]
            for lin, result in zip(state["queued"], state["encoding"].results()):
                payloads[lin] = None if result is False else result
            layout_args = dict(at_start=self.codec.index_location == "start",
                               checksum=self.checksum, big_endian=self.big_endian)
            if prefix is not None:
                # straight from the payloads to the file (writev), no copy
                parts = index_kernels.shard_parts(  # type: ignore[union-attr]
                    self._order(state["grid"]), payloads, **layout_args)
                if parts is None:
                    setter.delete_sync()
                else:
                    io_kernels.write_parts(prefix + os.fsencode(setter.path), parts)  # type: ignore[union-attr]
            else:
                reuse = _keeps_a_copy(setter)
                blob = index_kernels.assemble_shard(  # type: ignore[union-attr]
                    self._order(state["grid"]), payloads, **layout_args,
                    take=_buffers.take if reuse else None)
                try:
                    if blob is None:
                        setter.delete_sync()
                    else:
                        setter.set_sync(spec.prototype.buffer.from_array_like(blob))
                finally:
                    if reuse and blob is not None:
                        _buffers.give(blob.base)  # the reused buffer, of which blob is a view
            state["payloads"] = None
            state["encoding"] = None
            _buffers.give(state.pop("buffer"))
            _buffers.give(state.pop("arena"))

        def one_shard(job: tuple[WriteItem, Any]) -> None:
            state = prepare(job)
            if state is None:
                return
            state["encoding"].run_range()
            finish(state)

        if len(native) >= 2 * max_workers or max_workers <= 1:
            run_parallel(one_shard, native, max_workers)
        else:
            for job in native:
                state = prepare(job)
                if state is None:
                    continue
                encoding = state["encoding"]
                n = len(encoding)
                parts = partition(n, max_workers, max_group=max(1, -(-n // (2 * max_workers))))
                run_parallel(lambda r: encoding.run_range(r.start, r.stop), parts, max_workers)
                finish(state)
        if general:
            self.fallback.write(general, value, drop_axes, max_workers)
