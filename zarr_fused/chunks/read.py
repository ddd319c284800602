"""The synchronous read path: fetch, decode, scatter.

A reader serves one batch of ``(byte_getter, chunk_spec, chunk_selection,
out_selection, is_complete)`` items, spreading the items over the thread
pool; each item runs its whole life (fetch, decode, scatter) in one worker,
so the IO of one chunk overlaps the decoding of another. Chunks have
disjoint output selections, so workers write into ``out`` without locks.

`NativeChunkReader` serves chunks whose codec chain runs natively: each
worker fetches a group of chunks, then decodes the whole group straight
into ``out`` in one ``nogil`` call. `ChunkReader` fetches each chunk whole
and decodes it through the plan's chain (zarr's code for chains without a
kernel). `PartialDecodeReader` lets the array->bytes codec (sharding) fetch
only the byte ranges a selection needs, through its own synchronous
partial decode.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import GetResult
from zarr.core.chunk_utils import fill_value_or_default
from zarr.storage import LocalStore
from zarr.storage._common import StorePath

from zarr_fused._dtypes import element_bytes
from zarr_fused._scatter_py import fill_missing, scatter_chunk
from zarr_fused._pool import partition, run_parallel

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._chain import Chain, NativeChain

    ReadItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]

__all__ = [
    "MISSING",
    "PRESENT",
    "ChunkReader",
    "NativeChunkReader",
    "PartialDecodeReader",
    "describe_key",
    "fill_pattern",
    "local_files",
]

PRESENT = GetResult(status="present")
MISSING = GetResult(status="missing")


def describe_key(getter: Any) -> str:
    """A readable name of the store key behind a byte getter/setter."""
    path = getattr(getter, "path", None)
    if path is not None:
        store = getattr(getter, "store", None)
        return f"{path!r} in {store}" if store is not None else repr(path)
    coords = getattr(getter, "chunk_coords", None)
    if coords is not None:
        return f"inner chunk {coords}"
    return repr(getter)


class ChunkReader:
    """Whole-chunk reads through a chain."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[GetResult, ...]:
        chain = self.chain

        def read_one(item: ReadItem) -> GetResult:
            getter, spec, chunk_selection, out_selection, _ = item
            raw = getter.get_sync(prototype=spec.prototype)
            if raw is None:
                fill_missing(out, out_selection, spec)
                return MISSING
            chain.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes, getter)
            return PRESENT

        return tuple(run_parallel(read_one, batch, max_workers))


def local_files(batch: Sequence[tuple[Any, ...]], *, write: bool = False) -> bytes | None:
    """The path prefix of the batch's keys when they all live in one
    `zarr.storage.LocalStore` (exactly that class, so subclasses keep their
    own IO); zarr_fused then does the file IO itself, inside its nogil
    calls. None otherwise.

    Performs the checks LocalStore's own sync methods start with.
    """
    first = batch[0][0]
    if type(first) is not StorePath or type(first.store) is not LocalStore:
        return None
    store = first.store
    for item in batch:
        getter = item[0]
        if type(getter) is not StorePath or getter.store is not store:
            return None
    store._ensure_open_sync()
    if write:
        store._check_writable()
    return _root_prefix(store.root)


@functools.lru_cache(maxsize=64)
def _root_prefix(root: Any) -> bytes:
    """``root`` (a LocalStore's path) as a bytes prefix for its keys."""
    return os.fsencode(root) + b"/"


def fill_pattern(spec: ArraySpec, dtype: np.dtype[Any]) -> bytes:
    """The fill value of ``spec`` as one element of ``dtype`` (NumPy casting,
    exactly as ``out[...] = fill_value`` would store it)."""
    return element_bytes(fill_value_or_default(spec), dtype)


class NativeChunkReader:
    """Whole-chunk reads through a native chain, one nogil call per group."""

    def __init__(self, chain: NativeChain) -> None:
        self.chain = chain
        self.generic = ChunkReader(chain)

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[GetResult, ...]:
        chain = self.chain
        dst = out.as_ndarray_like()
        if not chain.writes_into(dst, batch[0][1]):
            return self.generic.read(batch, out, drop_axes, max_workers)
        pattern = fill_pattern(batch[0][1], dst.dtype)
        statuses: list[GetResult] = [MISSING] * len(batch)
        ndim = max(dst.ndim, len(batch[0][1].shape))
        prefix = local_files(batch)

        def read_group(indices: range) -> None:
            group = chain.decode_batch(len(indices), ndim)
            group.set_fill(pattern)
            queued_items: list[int] = []
            general = []
            for i in indices:
                getter, spec, chunk_selection, out_selection, _ = batch[i]
                layout = chain.layout(spec.shape)
                if prefix is not None:
                    path = prefix + os.fsencode(getter.path)
                    if group.add_file(path, layout, chunk_selection, dst, out_selection,
                                      drop_axes, getter):
                        statuses[i] = PRESENT
                        queued_items.append(i)
                    else:
                        general.append((i, getter.get_sync(prototype=spec.prototype)))
                    continue
                raw = getter.get_sync(prototype=spec.prototype)
                if raw is None:
                    queued = group.add_missing(dst, out_selection, getter)
                else:
                    queued = group.add(raw.as_numpy_array(), layout, chunk_selection, dst,
                                       out_selection, drop_axes, getter)
                if queued:
                    statuses[i] = PRESENT if raw is not None else MISSING
                    queued_items.append(i)
                else:
                    general.append((i, raw))
            for position in group.run():
                statuses[queued_items[position]] = MISSING
            for i, raw in general:
                getter, spec, chunk_selection, out_selection, _ = batch[i]
                if raw is None:
                    fill_missing(out, out_selection, spec)
                else:
                    statuses[i] = PRESENT
                    chain.decode_into(
                        raw, spec, chunk_selection, out, out_selection, drop_axes, getter
                    )

        run_parallel(read_group, partition(len(batch), max_workers), max_workers)
        return tuple(statuses)


class PartialDecodeReader:
    """Reads through the array->bytes codec's synchronous partial decode,
    which fetches the shard index and then only the needed inner chunks."""

    def __init__(self, codec: ArrayBytesCodec) -> None:
        self.codec = codec

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[GetResult, ...]:
        decode_partial = self.codec._decode_partial_sync  # type: ignore[attr-defined]

        def read_one(item: ReadItem) -> GetResult:
            getter, spec, chunk_selection, out_selection, _ = item
            selected = decode_partial(getter, chunk_selection, spec)
            if selected is None:
                fill_missing(out, out_selection, spec)
                return MISSING
            scatter_chunk(out, out_selection, selected, drop_axes)
            return PRESENT

        return tuple(run_parallel(read_one, batch, max_workers))
