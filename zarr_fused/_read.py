"""The synchronous read path: fetch, decode, scatter.

A reader serves one batch of ``(byte_getter, chunk_spec, chunk_selection,
out_selection, is_complete)`` items, spreading the items over the thread
pool; each item runs its whole life (fetch, decode, scatter) in one worker,
so the IO of one chunk overlaps the decoding of another. Chunks have
disjoint output selections, so workers write into ``out`` without locks.

`ChunkReader` fetches each chunk whole and decodes it through the plan's
chain. `PartialDecodeReader` lets the array->bytes codec (sharding) fetch
only the byte ranges a selection needs, through its own synchronous partial
decode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zarr.abc.codec import GetResult

from zarr_fused._output import fill_missing, scatter_chunk
from zarr_fused._pool import run_parallel
from zarr_fused.errors import CorruptChunkError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._chain import Chain

    ReadItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]

__all__ = ["MISSING", "PRESENT", "ChunkReader", "PartialDecodeReader", "describe_key"]

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


def corrupt(getter: Any, exc: CorruptChunkError) -> CorruptChunkError:
    """``exc`` restated with the key it concerns."""
    err = CorruptChunkError(f"chunk {describe_key(getter)}: {exc}")
    err.__cause__ = exc
    return err


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
            try:
                chain.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes)
            except CorruptChunkError as exc:
                raise corrupt(getter, exc) from None
            return PRESENT

        return tuple(run_parallel(read_one, batch, max_workers))


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
