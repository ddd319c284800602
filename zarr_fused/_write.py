"""The synchronous write path: fetch existing, merge, encode, store.

Like the read path, each item of a batch runs its whole life in one pool
worker. The merge and empty-chunk rules are zarr's own
(`zarr.core.chunk_utils`), so ``write_empty_chunks`` behaves exactly as
with zarr's pipelines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zarr.core.chunk_utils import _merge_chunk_array, chunk_is_empty

from zarr_fused._pool import run_parallel
from zarr_fused._read import corrupt
from zarr_fused.errors import CorruptChunkError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._chain import Chain

    WriteItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]

__all__ = ["ChunkWriter", "PartialEncodeWriter", "merge_and_encode"]


def merge_and_encode(
    chain: Chain,
    existing: Buffer | None,
    value: NDBuffer,
    item: WriteItem,
    drop_axes: tuple[int, ...],
) -> Buffer | None:
    """Bytes to store for one chunk, or None when it must not be stored."""
    setter, spec, chunk_selection, out_selection, is_complete = item
    existing_array = None
    if existing is not None:
        try:
            existing_array = chain.decode(existing, spec)
        except CorruptChunkError as exc:
            raise corrupt(setter, exc) from None
    merged = _merge_chunk_array(
        existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
    )
    if chunk_is_empty(merged, spec):
        return None
    return chain.encode(merged, spec)


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
