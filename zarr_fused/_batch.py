"""What the paths share about one batch as a whole (`zarr_fused._items`
holds what they share about one item of it).

`ReadRequest` and `WriteRequest` are one read or write call as every reader
and writer takes it, sync or async: ``read(batch, request)``,
``write(batch, request)``. `zarr_fused.pipeline` builds one per call, so a
setting that applies to a whole batch (the output, the dropped axes, the
workers, the `zarr_fused.stats` sink) travels as one argument down every
path, and a new one is a field here rather than a parameter added to
every signature of the family.

`ReadTarget` is where a native read batch goes: the output array, the
fill of missing chunks, the dimensions a decode task is given, and one
status per item. The group readers (`zarr_fused.chunks.read`,
`zarr_fused.chunks.pipelined`, `zarr_fused.shard.read` and the async
reader of chunks) work it out from the request once per batch, the same
way.

`BatchReader` and `HeldWriter` are what a path knows of the path it hands
a batch to when its kernels do not serve it (the shard paths hand such
batches to the array->bytes codec's partial decode and encode, in
`zarr_fused.chunks`): typing against these keeps `chunks/` and `shard/`
apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from zarr_fused._dtypes import fill_pattern
from zarr_fused._items import MISSING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np
    from zarr.abc.codec import GetResult
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

    from zarr_fused._batch_chain import BatchChain
    from zarr_fused._items import ReadItem, WriteItem
    from zarr_fused.io.shard_lock import ShardLocks
    from zarr_fused.stats import Stats

__all__ = ["BatchReader", "HeldWriter", "ReadRequest", "ReadTarget", "WriteRequest"]


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One read call: decode the batch into ``out`` (the selection's
    buffer), its ``drop_axes`` (integer-indexed axes the output lacks)
    dropped, on ``max_workers`` threads (1: the calling thread, no pool),
    counted into ``stats`` (the caller's `zarr_fused.stats` sink, if any)."""

    out: NDBuffer
    drop_axes: tuple[int, ...]
    max_workers: int
    stats: Stats | None = None


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """One write call: store ``value`` (the selection's data, or a scalar)
    into the batch's chunks, ``drop_axes`` as in `ReadRequest`, on
    ``max_workers`` threads, counted into ``stats``."""

    value: NDBuffer
    drop_axes: tuple[int, ...]
    max_workers: int
    stats: Stats | None = None

    def with_workers(self, max_workers: int) -> WriteRequest:
        """The same write on ``max_workers`` threads (a retry with fewer
        files in flight, or one item on the calling thread)."""
        return self if max_workers == self.max_workers else replace(self, max_workers=max_workers)


@dataclass(slots=True)
class ReadTarget:
    """The output side of one native read batch.

    ``out`` and ``drop_axes`` are the request's; ``dst`` is ``out``'s NumPy array (the chain writes into it, see
    `ReadTarget.native`); ``pattern`` the fill value as one element of its
    dtype; ``ndim`` the dimensions decode tasks address (the output's or
    the chunks', whichever has more); ``statuses`` one `GetResult` per item,
    each starting as ``status``.
    """

    out: NDBuffer
    dst: np.ndarray
    drop_axes: tuple[int, ...]
    pattern: bytes
    ndim: int
    statuses: list[GetResult]

    @classmethod
    def native(
        cls,
        chain: BatchChain,
        batch: Sequence[ReadItem],
        request: ReadRequest,
        chunk_shape: tuple[int, ...] | None = None,
        status: GetResult = MISSING,
        fill: Callable[[ArraySpec, Any], bytes] = fill_pattern,
    ) -> ReadTarget | None:
        """The target of ``batch`` decoded by ``chain``, or None when the
        kernels cannot write into the request's ``out`` (the caller's
        fallback reads it).

        The items of a batch share their spec's dtype, fill value and
        prototype, so the first item's spec speaks for all; ``chunk_shape``
        is the shape decode tasks cover (default: that spec's, the chunk's;
        a shard reader passes the inner chunks'); ``fill`` makes the fill
        pattern (a reader may cache it).
        """
        dst = request.out.as_ndarray_like()
        _, spec, *_ = batch[0]
        if not chain.writes_into(dst, spec):
            return None
        shape = spec.shape if chunk_shape is None else chunk_shape
        return cls(
            request.out,
            cast("np.ndarray", dst),  # `writes_into` checked it is one
            request.drop_axes,
            fill(spec, dst.dtype),
            max(dst.ndim, len(shape)),
            [status] * len(batch),
        )


class BatchReader(Protocol):
    """A read path (see `zarr_fused._plan.Reader`)."""

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]: ...


class HeldWriter(Protocol):
    """A write path that can run with shard holds taken by its caller."""

    def write_held(
        self, batch: Sequence[WriteItem], request: WriteRequest, locks: ShardLocks | None
    ) -> None: ...
