"""The synchronous read path: fetch, decode, scatter.

A reader serves one batch of ``(byte_getter, chunk_spec, chunk_selection,
out_selection, is_complete)`` items, spreading the items over the thread
pool; each item runs its whole life (fetch, decode, scatter) in one worker,
so the IO of one chunk overlaps the decoding of another. Chunks have
disjoint output selections, so workers write into ``out`` without locks.

`NativeChunkReader` serves chunks whose codec chain runs in the batch
kernels (a native chain, or filters that all have a kernel over one): each
worker fetches a group of chunks, then decodes the whole group straight
into ``out`` in one ``nogil`` call. `ChunkReader` fetches each chunk whole
and decodes it through the plan's chain (zarr's code for chains without a
kernel).
`PartialDecodeReader` lets the array->bytes codec (sharding) fetch
only the byte ranges a selection needs, through its own synchronous
partial decode.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

try:
    import resource
except ImportError:  # not Unix
    resource = None  # type: ignore[assignment]

from zarr.storage import StorePath

from zarr_fused._batch import ReadRequest, ReadTarget
from zarr_fused._items import MISSING, PRESENT
from zarr_fused._pool import partition, run_parallel
from zarr_fused._scatter_py import fill_missing, scatter_chunk
from zarr_fused._zarr_compat import decode_partial_sync
from zarr_fused.io.local import local_files
from zarr_fused.stats import counted, counted_key, note_files

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.abc.codec import ArrayBytesCodec, GetResult
    from zarr.core.buffer import Buffer, BufferPrototype

    from zarr_fused._batch_chain import BatchChain
    from zarr_fused._chain import Chain
    from zarr_fused._items import ReadItem
    from zarr_fused.stats import Stats

__all__ = ["ChunkReader", "NativeChunkReader", "PartialDecodeReader"]


def _read_each(
    batch: Sequence[ReadItem], request: ReadRequest, read_into: Callable[[ReadItem], bool]
) -> tuple[GetResult, ...]:
    """``read_into`` each item on the pool threads (it says whether the
    chunk was stored); a chunk that was not gets its fill value here."""

    def read_one(item: ReadItem) -> GetResult:
        if read_into(item):
            return PRESENT
        _, spec, _, out_selection, _ = item
        fill_missing(request.out, out_selection, spec)
        return MISSING

    return tuple(run_parallel(read_one, batch, request.max_workers))


class _EachChunk(ABC):
    """A read path that reads each chunk on its own, on the pool threads:
    `read_into` reads one into the request's ``out`` and says whether it
    was stored."""

    @abstractmethod
    def read_into(self, item: ReadItem, request: ReadRequest) -> bool: ...

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        return _read_each(batch, request, lambda item: self.read_into(item, request))


class ChunkReader(_EachChunk):
    """Whole-chunk reads through a chain.

    The files of a plain `zarr.storage.LocalStore` (`local_files`) are read
    here, as ``LocalStore.get_sync`` reads them: its path arithmetic costs
    more per call than reading a small chunk file. Counted keys (a stats
    block) keep their own ``get_sync``, which counts the request.
    """

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        prefix = _plain_local_prefix(batch)
        if prefix is None:
            return super().read(batch, request)

        def read_into(item: ReadItem) -> bool:
            getter, spec, _, _, _ = item
            raw = _read_file(prefix + os.fsencode(getter.path), spec.prototype)
            return self._decode_into(raw, item, request)

        return _read_each(batch, request, read_into)

    def read_into(self, item: ReadItem, request: ReadRequest) -> bool:
        getter, spec, _, _, _ = item
        return self._decode_into(getter.get_sync(prototype=spec.prototype), item, request)

    def _decode_into(self, raw: Buffer | None, item: ReadItem, request: ReadRequest) -> bool:
        if raw is None:
            return False
        self.chain.decode_into(raw, item, request.out, request.drop_axes)
        return True


def _plain_local_prefix(batch: Sequence[ReadItem]) -> bytes | None:
    """`local_files` of a batch whose keys are all plain `StorePath`s."""
    for getter, *_ in batch:
        if type(getter) is not StorePath:
            return None
    return local_files(batch)


def _read_file(path: bytes, prototype: BufferPrototype) -> Buffer | None:
    """A whole chunk file, or None when there is none (``LocalStore.get_sync``)."""
    data = _read_bytes(path)
    return None if data is None else prototype.buffer.from_bytes(data)


def _read_bytes(path: bytes) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as file:
            return file.readall()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


class NativeChunkReader:
    """Whole-chunk reads through the batch kernels, one nogil call per group;
    what they cannot write into (another data type, advanced selections)
    through ``generic`` (a `ChunkReader` of the same chain; for filters over
    a native chain, one of the plan's hybrid chain).

    Inside a `zarr_fused.stats` block it takes a batch of `LocalStore` keys
    as they are (`zarr_fused.stats.counted`'s ``local_native``): the files
    its kernels read are counted from the request's sink, and the keys it
    makes requests through are wrapped one by one."""

    #: see `zarr_fused.stats.counted`
    local_native = True

    def __init__(self, chain: BatchChain, generic: ChunkReader) -> None:
        self.chain = chain
        self.generic = generic
        #: the last read's fastest group, in seconds it waited per chunk file
        #: (inf when it read no file): how fast the files answer, for
        #: `zarr_fused.chunks.pipelined`; see `group_wait_per_file`
        self.fastest_file = float("inf")

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        target = ReadTarget.native(self.chain, batch, request)
        if target is None:
            self.fastest_file = float("inf")
            return self.generic.read(counted(list(batch), request.stats), request)
        job = _ChunkRead(self.chain, batch, target, request.stats)
        max_workers = request.max_workers
        run_parallel(job.read_group, partition(len(batch), max_workers), max_workers)
        self.fastest_file = job.fastest
        return tuple(target.statuses)


class _ChunkRead:
    """One `NativeChunkReader.read` call, group by group: fetch (or name the
    files of) a group's chunks, decode them into ``out`` in one nogil call;
    chunks the kernels do not take go through the chain one by one."""

    def __init__(
        self,
        chain: BatchChain,
        batch: Sequence[ReadItem],
        target: ReadTarget,
        sink: Stats | None = None,
    ) -> None:
        self.chain = chain
        self.batch = batch
        self.target = target
        self.sink = sink
        self.prefix = local_files(batch)
        self.fastest = float("inf")

    def read_group(self, indices: range) -> None:
        if self.prefix is None:
            self._read_group(indices)
            return
        before = _group_clock()
        files = self._read_group(indices)
        # a race between two groups can only keep the slower figure
        self.fastest = min(self.fastest, group_wait_per_file(before, _group_clock(), indices))
        note_files(self.sink, self.batch, files, self.prefix)  # after the clock: it stats the files

    def _read_group(self, indices: range) -> list[int]:
        """Read the group; the items whose files the kernels read."""
        chain, target, sink = self.chain, self.target, self.sink
        dst, drop_axes, statuses = target.dst, target.drop_axes, target.statuses
        group = chain.kernel_batch(len(indices), target.ndim)
        group.set_fill(target.pattern)
        queued_items: list[int] = []
        general: list[tuple[int, Buffer | None]] = []
        for i in indices:
            getter, spec, chunk_selection, out_selection, _ = self.batch[i]
            layout = chain.layout(spec.shape)
            # the group's first key tells its native run the sink to time into
            key = getter if queued_items else counted_key(getter, sink)
            if self.prefix is not None:
                path = self.prefix + os.fsencode(getter.path)
                if group.add_file(
                    path, layout, chunk_selection, dst, out_selection, drop_axes, key
                ):
                    statuses[i] = PRESENT
                    queued_items.append(i)
                else:
                    raw = counted_key(getter, sink).get_sync(prototype=spec.prototype)
                    general.append((i, raw))
                continue
            raw = counted_key(getter, sink).get_sync(prototype=spec.prototype)
            if raw is None:
                queued = group.add_missing(dst, out_selection, key)
            else:
                queued = group.add(
                    raw.as_numpy_array(),
                    layout,
                    chunk_selection,
                    dst,
                    out_selection,
                    drop_axes,
                    key,
                )
            if queued:
                statuses[i] = PRESENT if raw is not None else MISSING
                queued_items.append(i)
            else:
                general.append((i, raw))
        for position in group.run():  # the files that were missing
            statuses[queued_items[position]] = MISSING
        self._read_general(general)
        return queued_items

    def _read_general(self, general: list[tuple[int, Buffer | None]]) -> None:
        """The chunks the kernels did not take, through the chain."""
        out, drop_axes, statuses = self.target.out, self.target.drop_axes, self.target.statuses
        for i, raw in general:
            _, spec, _, out_selection, _ = self.batch[i]
            if raw is None:
                fill_missing(out, out_selection, spec)
            else:
                statuses[i] = PRESENT
                self.chain.decode_into(raw, self.batch[i], out, drop_axes)


#: a group that blocked fewer times than this per file did not wait for its
#: files (a hot page cache blocks never; a cold disk or a network
#: filesystem at least once per file; the GIL a few times per group)
BLOCKS_PER_FILE = 0.25


#: Linux counts one thread's blocking waits; elsewhere (None) every group
#: is judged by its wall time
THREAD_USAGE: int | None = getattr(resource, "RUSAGE_THREAD", None)


def _group_clock() -> tuple[float, float, int]:
    """Wall time, this thread's CPU time and its blocking waits so far (-1
    where they are not counted)."""
    blocks = resource.getrusage(THREAD_USAGE).ru_nvcsw if THREAD_USAGE is not None else -1
    return time.perf_counter(), time.thread_time(), blocks


def group_wait_per_file(
    before: tuple[float, float, int], after: tuple[float, float, int], indices: range
) -> float:
    """How long a group of chunk files waited for its files, per file.

    A group's own CPU time (reading from the page cache, decoding) is not
    waiting: a hot cache of slow-to-decode chunks (gzip, a few hundred
    microseconds per chunk) must not look like a slow filesystem. A group
    that hardly blocked did not wait for its files at all: the rest of its
    wall time was spent runnable, waiting for a CPU on a busy host. One that
    blocked (a cold disk, a network filesystem) waited for the wall time its
    CPU time does not cover. Where blocking waits are not counted (not
    Linux), the whole wall time counts.
    """
    wall = after[0] - before[0]
    if before[2] < 0:
        return wall / len(indices)
    if after[2] - before[2] < BLOCKS_PER_FILE * len(indices):
        return 0.0
    return max(0.0, wall - (after[1] - before[1])) / len(indices)


class PartialDecodeReader(_EachChunk):
    """Reads through the array->bytes codec's synchronous partial decode,
    which fetches the shard index and then only the needed inner chunks."""

    def __init__(self, codec: ArrayBytesCodec) -> None:
        self.codec = codec

    def read_into(self, item: ReadItem, request: ReadRequest) -> bool:
        getter, spec, chunk_selection, out_selection, _ = item
        selected = decode_partial_sync(self.codec)(getter, chunk_selection, spec)
        if selected is None:
            return False
        scatter_chunk(request.out, out_selection, selected, request.drop_axes)
        return True
