"""Unsharded chunk reads from a LocalStore, IO pipelined with decoding.

`PipelinedChunkReader` serves the same batches as
`zarr_fused.chunks.read.NativeChunkReader`, for arrays whose chunks are files of
one `zarr.storage.LocalStore`: the IO threads of `zarr_fused.io.engine`
read groups of chunk files (``open`` + ``pread``, with the GIL released)
into a buffer per group, and a compute thread decodes each group straight
into the output as soon as its files are in. With ``io_concurrency``
requests in flight, a filesystem whose every call is a round trip no longer
holds the decoding back to one request per compute thread.

Everything else (other stores, outputs the kernels cannot write into
directly, ``io_concurrency`` of 1) goes to `NativeChunkReader` unchanged.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from zarr_fused._batch import ReadTarget
from zarr_fused._items import PRESENT
from zarr_fused._native import fileio_kernels, io_kernels
from zarr_fused._scatter_py import decode_group
from zarr_fused.io.engine import Batch, resolve_io_concurrency, run_pipelined
from zarr_fused.io.local import local_files
from zarr_fused.io.probe import (
    FAST_FILE,
    PROBE_READS,
    SLOW_HOLD,
    STORE_LATENCIES,
    Fastest,
    LatencyProbe,
    per_file_latency,
    slow_direct,
)
from zarr_fused.stats import counted_key, note_fetched

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import GetResult

    from zarr_fused._batch import ReadRequest
    from zarr_fused._batch_chain import BatchChain
    from zarr_fused._items import ReadItem
    from zarr_fused.chunks.read import NativeChunkReader
    from zarr_fused.stats import Stats

__all__ = ["PipelinedChunkReader", "group_size"]

#: most chunk files one IO request reads (one after another, in one IO thread)
MAX_GROUP = 16
#: most stored bytes (by the encoded size bound) one IO request reads
MAX_GROUP_BYTES = 4 << 20
#: IO requests per IO thread while files answer fast (a hot-cache probe:
#: many small requests balance out uneven waits for a CPU)
REQUESTS_PER_THREAD = 4
#: and once they answer slowly (a cold cache, or before the first read):
#: every request costs a hand-off from an IO thread to a compute thread,
#: and on a cold local disk, where the device and not the number in flight
#: bounds the read, those wake-ups are CPU the decoding lacks, most of all
#: when the process is pinned to one core
REQUESTS_PER_THREAD_SLOW = 2


def group_size(
    n: int, io_concurrency: int, bound: int, per_thread: int = REQUESTS_PER_THREAD
) -> int:
    """Chunk files per IO request for ``n`` chunks of at most ``bound`` bytes.

    About ``per_thread`` requests per IO thread, so
    the requests that finish first are decoded while the last ones are
    still in flight and uneven latencies balance out; several files per
    request where there are many, so that the hand-off between threads is
    not paid for every file.
    """
    size = -(-n // (per_thread * io_concurrency))
    size = min(size, MAX_GROUP, max(1, MAX_GROUP_BYTES // max(1, bound)))
    return max(1, size)


@dataclass(frozen=True, slots=True)
class _Fetched:
    """The files of one request: their bytes in ``arena`` (file i at
    ``offsets[i]``, ``lengths[i]`` long, -1 when missing); files larger than
    their bound in ``oversize``."""

    arena: np.ndarray
    lengths: list[int]
    oversize: dict[int, bytes]


class PipelinedChunkReader:
    """Whole-chunk reads of LocalStore chunk files, IO apart from decoding.

    Which threads read the files follows how fast they answer (`probe`,
    see `zarr_fused.io.probe`): while files answer within `FAST_FILE` (and
    as much again per `zarr_fused.io.probe.FILE_BYTES` they hold), the
    compute threads read them inside their decode calls
    (`NativeChunkReader`); slower files (a network filesystem, a cold
    cache) go to the IO threads. A read with no measurement that stands
    reads one chunk per compute thread first (`_scout_then_read`); a direct
    read whose fastest group waited more than
    `zarr_fused.io.probe.SLOW_DIRECT` per file for its files (its CPU time
    left out: see `zarr_fused.chunks.read.group_wait_per_file`) sends the
    reads of the next `SLOW_HOLD` seconds to the IO threads.

    The chain is any the batch kernels run: a native codec chain, or native
    filters over one (`zarr_fused._hybrid.FilteredChain`).
    """

    #: see `zarr_fused.stats.counted`: the files are counted from the
    #: request's sink (IO threads) and each group's first key (decoding)
    local_native = True

    def __init__(self, chain: BatchChain, direct: NativeChunkReader) -> None:
        self.chain = chain
        #: the reader for everything the IO threads do not serve (the plan
        #: passes it in, so this module sits beside the chunk reader)
        self.direct = direct
        #: how fast the files answered, and whether that still decides
        self.probe = LatencyProbe(FAST_FILE, reads_between=PROBE_READS)

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        if len(batch) <= request.max_workers:
            # the compute threads already keep every file of the batch in
            # flight: IO threads could only add a hand-off per chunk
            return self.direct.read(batch, request)
        io_concurrency = resolve_io_concurrency()
        prefix = None
        if io_concurrency > 1 and fileio_kernels is not None and io_kernels is not None:
            prefix = local_files(batch)
        if prefix is None or not self._writes_into(batch, request):
            return self.direct.read(batch, request)
        probe = self.probe
        STORE_LATENCIES.lend(prefix, probe)
        verdict = probe.verdict()
        if verdict is True:
            return self._read_direct_timed(batch, request, prefix)
        if verdict is None:
            return self._scout_then_read(batch, request, prefix, io_concurrency)
        return self._read_pipelined(batch, request, prefix, io_concurrency)

    def _writes_into(self, batch: Sequence[ReadItem], request: ReadRequest) -> bool:
        """Whether the kernels can decode ``batch`` straight into the
        request's output (what `ReadTarget.native` checks): the pipelined
        read builds its target only once it knows it runs, for the items
        it reads, and a direct read needs none."""
        _, spec, *_ = batch[0]
        return self.chain.writes_into(request.out.as_ndarray_like(), spec)

    def _scout_then_read(
        self, batch: Sequence[ReadItem], request: ReadRequest, prefix: bytes, io_concurrency: int
    ) -> tuple[GetResult, ...]:
        """A read with no measurement that stands: the compute threads read
        one chunk each first, timed; the rest follows them directly if they
        did not wait for their files, on the IO threads otherwise.

        One round trip ahead of the IO threads on a slow filesystem, where
        a read waits for dozens; on a hot cache, no hand-off between threads
        at all (a pipelined first read costs a fresh process's first read of
        cheap chunks half again its CPU time).
        """
        scout = request.max_workers
        first = self.direct.read(batch[:scout], request)
        rest = batch[scout:]
        wait = self.direct.fastest_file  # inf: it read no file
        if wait < FAST_FILE:
            self.probe.measured(wait)
            self.probe.direct_reads = 0
            STORE_LATENCIES.note(prefix, self.probe)
            return first + self._read_direct_timed(rest, request, prefix)
        return first + self._read_pipelined(rest, request, prefix, io_concurrency)

    def _read_pipelined(
        self, batch: Sequence[ReadItem], request: ReadRequest, prefix: bytes, io_concurrency: int
    ) -> tuple[GetResult, ...]:
        target = ReadTarget.native(self.chain, batch, request)
        if target is None:  # as for the whole batch: not after `read` found it writable
            return self.direct.read(batch, request)
        probe = self.probe
        per_thread = REQUESTS_PER_THREAD if probe.seen_fast() else REQUESTS_PER_THREAD_SLOW
        read = _PipelinedRead(
            self.chain, batch, target, prefix, io_concurrency, per_thread, request.stats
        )
        start = time.perf_counter()
        try:
            run_pipelined(
                read.groups,
                read.costs,
                read.fetch,
                read.consume,
                io_concurrency=io_concurrency,
                max_workers=request.max_workers,
            )
        finally:
            read.count_files()
        probe.note_pipelined(time.perf_counter() - start, read.fastest.seconds)
        STORE_LATENCIES.note(prefix, probe)
        return tuple(read.statuses)

    def _read_direct_timed(
        self, batch: Sequence[ReadItem], request: ReadRequest, prefix: bytes
    ) -> tuple[GetResult, ...]:
        start = time.perf_counter()
        result = self.direct.read(batch, request)
        self.probe.note_direct(time.perf_counter() - start)
        # The fastest group, not the whole read: on a busy host a read's
        # threads wait for a CPU, which its mean wait per file would count
        # as file latency and send a hot cache to the IO threads.
        _, spec0, *_ = batch[0]
        nbytes = self.chain.layout(spec0.shape).nbytes
        if slow_direct(self.direct.fastest_file, nbytes):
            self.probe.found_slow(hold=SLOW_HOLD)
            STORE_LATENCIES.forget(prefix)
        return result


class _PipelinedRead:
    """One pipelined read: groups of chunk files fetched on the IO threads
    (`fetch`) and decoded into the output on the compute threads (`consume`)."""

    def __init__(
        self,
        chain: BatchChain,
        batch: Sequence[ReadItem],
        target: ReadTarget,
        prefix: bytes,
        io_concurrency: int,
        per_thread: int,
        sink: Stats | None = None,
    ) -> None:
        self.chain = chain
        self.sink = sink
        self.target = target
        self.statuses = target.statuses
        self.paths = [prefix + os.fsencode(getter.path) for getter, *_ in batch]
        self.bounds = [chain.encode_bound(chain.layout(spec.shape).nbytes) for _, spec, *_ in batch]
        self.size = group_size(len(batch), io_concurrency, max(self.bounds), per_thread)
        self.groups = [
            range(s, min(len(batch), s + self.size)) for s in range(0, len(batch), self.size)
        ]
        if sink is not None:
            # each group's decode run finds the sink to time into from its first key
            batch = list(batch)
            for g in self.groups:
                first = batch[g.start]
                batch[g.start] = (counted_key(first[0], sink), *first[1:])
        self.batch = batch
        self.costs = [sum(self.bounds[i] for i in g) for g in self.groups]
        # Buffers of consumed requests are handed to the next ones: fresh
        # memory costs a page fault per page (large allocations are mmapped),
        # and a reused buffer is still in the CPU's cache.
        self.spare: list[np.ndarray] = []
        self.lock = threading.Lock()
        #: the fastest group's seconds per file
        self.fastest = Fastest()
        #: files fetched, their stored bytes and the seconds it took (for
        #: the sink, handed over once per read: a count per group is a
        #: lock and a few calls more, on every one of dozens of groups)
        self.fetched = [0, 0, 0.0]

    def _arena(self, need: int) -> np.ndarray:
        with self.lock:
            if self.spare and self.spare[-1].shape[0] >= need:
                return self.spare.pop()
        return np.empty(need, dtype=np.uint8)

    def count_files(self) -> None:
        """Hand the files fetched over to the sink, if any."""
        files, stored, seconds = self.fetched
        note_fetched(self.sink, int(files), int(stored), seconds)

    def fetch(self, group: range, state: Batch[range, _Fetched]) -> _Fetched:
        arena = self._arena(self.costs[group.start // self.size])
        caps = np.array(self.bounds[group.start : group.stop], dtype=np.intp)
        offsets = np.zeros(len(group), dtype=np.intp)
        np.cumsum(caps[:-1], out=offsets[1:])
        lengths = np.empty(len(group), dtype=np.intp)
        start = time.perf_counter()
        done = fileio_kernels.read_files_into(
            self.paths[group.start : group.stop], arena, offsets, caps, lengths, state.stop_flag
        )
        seconds = time.perf_counter() - start
        if done:
            stored = int(lengths[:done].clip(min=0).sum())
            self.fastest.note(per_file_latency(seconds, done, stored))
            if self.sink is not None:
                with self.lock:
                    fetched = self.fetched
                    fetched[0] += done
                    fetched[1] += stored
                    fetched[2] += seconds
        oversize: dict[int, bytes] = {}
        for k in np.flatnonzero(lengths[:done] < -1).tolist():
            # larger than any chunk we would write: read it whole
            whole = io_kernels.read_whole(self.paths[group.start + k])
            lengths[k] = -1 if whole is None else len(whole)
            if whole is not None:
                oversize[group.start + k] = whole
        return _Fetched(arena, lengths[:done].tolist(), oversize)

    def consume(self, group: range, fetched: _Fetched) -> None:
        payloads: list[tuple[int, Any]] = []
        offset = 0
        for i, length in zip(group, fetched.lengths, strict=True):
            payload: bytes | np.ndarray | None = None
            if length >= 0:
                self.statuses[i] = PRESENT
                payload = fetched.oversize.get(i)
                if payload is None:
                    payload = fetched.arena[offset : offset + length]
            payloads.append((i, payload))
            offset += self.bounds[i]
        target = self.target
        decode_group(
            self.chain,
            self.batch,
            target.out,
            target.drop_axes,
            target.pattern,
            target.ndim,
            payloads,
        )
        with self.lock:
            self.spare.append(fetched.arena)
