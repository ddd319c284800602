"""The synchronous write path: fetch existing, merge, encode, store.

Like the read path, each item of a batch runs its whole life in one pool
worker. The merge and empty-chunk rules are zarr's own
(`zarr.core.chunk_utils`), so ``write_empty_chunks`` behaves exactly as
with zarr's pipelines.

`NativeChunkWriter` serves native chains group by group: fetch the stored
bytes of the chunks the write covers only partly, decode them in one nogil
call, merge with NumPy, encode the group in one nogil call, store. A scalar
written over whole chunks (``a[...] = 5``) is merged and encoded once per
chunk shape, not once per chunk.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.chunk_utils import _merge_chunk_array, chunk_is_empty, fill_value_or_default
from zarr.core.indexing import is_scalar

from zarr_fused._dtypes import empty, in_byte_order
from zarr_fused._pool import partition, run_parallel
from zarr_fused.chunks.read import fill_pattern, local_files

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._chain import Chain, NativeChain

    WriteItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]

__all__ = ["ChunkWriter", "NativeChunkWriter", "PartialEncodeWriter", "merge_and_encode"]


def merge_and_encode(
    chain: Chain,
    existing: Buffer | None,
    value: NDBuffer,
    item: WriteItem,
    drop_axes: tuple[int, ...],
) -> Buffer | None:
    """Bytes to store for one chunk, or None when it must not be stored."""
    setter, spec, chunk_selection, out_selection, is_complete = item
    existing_array = None if existing is None else chain.decode(existing, spec, setter)
    merged = _merge_chunk_array(
        existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
    )
    if chunk_is_empty(merged, spec):
        return None
    return chain.encode(merged, spec, setter)


class ChunkWriter:
    """Whole-chunk writes through a chain."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def write(
        self,
        batch: Sequence[WriteItem],
        value: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> None:
        chain = self.chain

        def write_one(item: WriteItem) -> None:
            setter, spec, _, _, is_complete = item
            existing = None if is_complete else setter.get_sync(prototype=spec.prototype)
            encoded = merge_and_encode(chain, existing, value, item, drop_axes)
            if encoded is None:
                setter.delete_sync()
            else:
                setter.set_sync(encoded)

        run_parallel(write_one, batch, max_workers)


class PartialEncodeWriter:
    """Writes through the array->bytes codec's synchronous partial encode,
    which reads the existing shard, merges and rewrites it."""

    def __init__(self, codec: ArrayBytesCodec) -> None:
        self.codec = codec

    def write(
        self,
        batch: Sequence[WriteItem],
        value: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> None:
        encode_partial = self.codec._encode_partial_sync  # type: ignore[attr-defined]
        scalar = len(value.shape) == 0

        def write_one(item: WriteItem) -> None:
            setter, spec, chunk_selection, out_selection, _ = item
            chunk_value = value if scalar else value[out_selection]
            encode_partial(setter, chunk_value, chunk_selection, spec)

        run_parallel(write_one, batch, max_workers)


def merge_owned(
    existing: np.ndarray | None,
    value: NDBuffer,
    out_selection: SelectorTuple,
    spec: ArraySpec,
    chunk_selection: SelectorTuple,
    is_complete: bool,
    drop_axes: tuple[int, ...],
) -> np.ndarray:
    """zarr's `_merge_chunk_array`, for an ``existing`` array the caller owns
    (freshly decoded), which is merged in place instead of copied first."""
    if is_complete and value.shape != ():
        selected = value[out_selection]
        if selected.shape == spec.shape:
            return selected.as_ndarray_like()  # type: ignore[return-value]
    if existing is None:
        chunk = spec.prototype.nd_buffer.create(
            shape=spec.shape,
            dtype=spec.dtype.to_native_dtype(),
            order=spec.order,
            fill_value=fill_value_or_default(spec),
        ).as_ndarray_like()
    else:
        chunk = existing
    if chunk_selection == () or is_scalar(value.as_ndarray_like(), spec.dtype.to_native_dtype()):
        chunk_value = value
    else:
        chunk_value = value[out_selection]
        if drop_axes:
            item = tuple(None if i in drop_axes else slice(None) for i in range(spec.ndim))
            chunk_value = chunk_value[item]
    chunk[chunk_selection] = in_byte_order(chunk_value.as_ndarray_like(), chunk.dtype)
    return chunk  # type: ignore[return-value]


_UNSET = object()


class NativeChunkWriter:
    """Whole-chunk writes through a native chain, one nogil call per group
    for decoding the existing chunks and one for encoding."""

    def __init__(self, chain: NativeChain) -> None:
        self.chain = chain
        self.generic = ChunkWriter(chain)

    def write(
        self,
        batch: Sequence[WriteItem],
        value: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> None:
        chain = self.chain
        if not chain.handles(batch[0][1]) or type(value.as_ndarray_like()) is not np.ndarray:
            self.generic.write(batch, value, drop_axes, max_workers)
            return
        scalar = value.shape == ()
        ndim = max(len(batch[0][1].shape), 1)
        spec0 = batch[0][1]
        # The empty-chunk test runs in the encode kernel, as a bitwise scan,
        # where that is exactly zarr's rule: not for NaN fill values (any NaN
        # counts as equal there) nor complex ones (there 0j == -0j).
        fill = fill_value_or_default(spec0)
        native_empty_check = (
            not spec0.config.write_empty_chunks
            and fill is not None
            and (
                chain.dtype.kind in "biumM"
                or (chain.dtype.kind == "f" and not np.isnan(fill))
            )
        )
        fill_bytes = fill_pattern(spec0, chain.dtype) if native_empty_check else None
        # complete chunks of a scalar write: one outcome per chunk shape and selection
        shared: dict[Any, Any] = {}
        shared_lock = threading.Lock()

        def outcome(merged: np.ndarray, spec: ArraySpec, key: Any, *, queued: bool = False) -> Any:
            """None (store nothing), a Buffer, or an ndarray to queue (whose
            empty-chunk test the kernel runs when ``queued`` allows it)."""
            if not (queued and native_empty_check and merged.dtype == chain.dtype) and chunk_is_empty(
                spec.prototype.nd_buffer.from_ndarray_like(merged), spec
            ):
                return None
            if chain.encode_swap(merged) is None:
                return chain.fallback.encode(spec.prototype.nd_buffer.from_ndarray_like(merged), spec)
            return merged

        def scalar_outcome(spec: ArraySpec, item: WriteItem) -> Any:
            # "complete" edge chunks cover only their in-bounds part, so the
            # outcome depends on the chunk selection as well as the shape
            _, _, chunk_selection, out_selection, _ = item
            try:
                memo_key = hash((spec.shape, chunk_selection)) and (spec.shape, chunk_selection)
            except TypeError:  # an array in the selection
                memo_key = None
            with shared_lock:
                result = shared.get(memo_key, _UNSET) if memo_key is not None else _UNSET
                if result is _UNSET:
                    merged = merge_owned(
                        None, value, out_selection, spec, chunk_selection, True, drop_axes
                    )
                    result = outcome(merged, spec, item[0])
                    if isinstance(result, np.ndarray):
                        result = chain.encode(
                            spec.prototype.nd_buffer.from_ndarray_like(result), spec, item[0]
                        )
                    if memo_key is not None:
                        shared[memo_key] = result
            return result

        prefix = local_files(batch, write=True)
        if prefix is not None:
            # LocalStore creates a chunk's parent directories on every write;
            # once per directory per batch does the same
            for parent in {os.path.dirname(prefix + os.fsencode(item[0].path)) for item in batch}:
                os.makedirs(parent, exist_ok=True)

        def write_group(indices: range) -> None:
            existing: dict[int, np.ndarray] = {}
            partial = [i for i in indices if not batch[i][4]]
            if partial:
                decoding = chain.decode_batch(len(partial), ndim)
                decoding.set_fill(b"\0" * chain.dtype.itemsize)
                decoded_items = []
                for i in partial:
                    setter, spec, _, _, _ = batch[i]
                    array = empty(spec.shape, chain.dtype)
                    layout = chain.layout(spec.shape)
                    if prefix is not None:
                        decoding.add_file(prefix + os.fsencode(setter.path), layout, (), array,
                                          (), (), setter)
                    else:
                        raw = setter.get_sync(prototype=spec.prototype)
                        if raw is None:
                            continue
                        decoding.add(raw.as_numpy_array(), layout, (), array, (), (), setter)
                    decoded_items.append(i)
                    existing[i] = array
                for position in decoding.run():
                    del existing[decoded_items[position]]
            encoding = chain.encode_batch(len(indices), ndim)
            if fill_bytes is not None:
                encoding.set_fill(fill_bytes)
            results: list[tuple[int, Any]] = []
            for i in indices:
                setter, spec, chunk_selection, out_selection, is_complete = batch[i]
                if scalar and is_complete:
                    results.append((i, scalar_outcome(spec, batch[i])))
                    continue
                merged = merge_owned(
                    existing.get(i), value, out_selection, spec, chunk_selection, is_complete,
                    drop_axes,
                )
                result = outcome(merged, spec, setter, queued=True)
                if isinstance(result, np.ndarray):
                    swap = chain.encode_swap(result)
                    path = None if prefix is None else prefix + os.fsencode(setter.path)
                    result = encoding.add(
                        result, chain.layout(spec.shape), swap, setter, path,
                        native_empty_check and result.dtype == chain.dtype,
                    )
                results.append((i, result))
            encoded = encoding.run() if len(encoding) else []
            for i, result in results:
                setter, spec, _, _, _ = batch[i]
                if isinstance(result, int):
                    result = encoded[result]
                    if result is None:  # written to its file
                        continue
                    if result is False:  # all fill value
                        result = None
                    else:
                        result = spec.prototype.buffer.from_array_like(result)
                if result is None:
                    setter.delete_sync()
                else:
                    setter.set_sync(result)

        run_parallel(write_group, partition(len(batch), max_workers), max_workers)
