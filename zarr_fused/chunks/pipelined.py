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
from zarr_fused.io.engine import Batch, resolve_io_concurrency, run_pipelined
from zarr_fused.io.local import local_files

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.codec import GetResult
    from zarr.core.buffer import NDBuffer

    from zarr_fused._chain import NativeChain
    from zarr_fused._items import ReadItem
    from zarr_fused.chunks.read import NativeChunkReader

__all__ = ["PipelinedChunkReader", "group_size", "per_file_latency"]

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


#: a chunk file that answers faster than this (seconds) is in the page cache
#: or on a fast local disk: the compute threads read it themselves
FAST_FILE = 50e-6
#: stored bytes per file that count as one more `FAST_FILE` in a pipelined
#: read's time per file: a file served from the page cache still costs a
#: copy of its bytes (some 50 us per 256 KiB here), so large chunk files
#: (an uncompressed 64^3 chunk is 512 KiB) must not look slow for their size
FILE_BYTES = 256 << 10
#: a direct read whose fastest group took longer than this per file
#: (decoding included) goes back to the IO threads at once
SLOW_DIRECT = 2 * FAST_FILE
#: decoded bytes per chunk that count as one more `SLOW_DIRECT` (a direct
#: read's time per file includes decoding, which grows with the chunk)
DECODE_BYTES = 256 << 10
#: seconds after which a direct read is pipelined again, to look afresh at
#: how fast the files answer (a cache that went cold, a slower filesystem)
PROBE_INTERVAL = 1.0
#: and at least this many times the duration of recent reads: a pipelined
#: read of a hot cache costs more CPU than a direct one (a hand-off per
#: group of files), so reads that take a good part of `PROBE_INTERVAL` (a
#: large array, a busy host) must not become probes every few reads
PROBE_SPACING = 20
#: how much of a read's duration is still counted at the next read
TOOK_DECAY = 0.9
#: and at least this many direct reads between two probes: reads that come
#: every second or so (a loop over arrays, a caller that reads something
#: else in between) would otherwise all be probes, each at the CPU cost of
#: a pipelined read; a direct read that finds its files slow needs no
#: probe, it goes back to the IO threads itself
PROBE_READS = 4


def per_file_latency(seconds: float, files: int, stored: int) -> float:
    """Seconds per file of a group of ``files`` files holding ``stored``
    bytes, each `FILE_BYTES` of a file counting as one more file (what is
    compared with `FAST_FILE`)."""
    return seconds / files / (1 + stored / files / FILE_BYTES)


class PipelinedChunkReader:
    """Whole-chunk reads of LocalStore chunk files, IO apart from decoding.

    Which threads read the files follows how fast they answer. Handing
    each group of files from an IO thread to a compute thread costs thread
    wake-ups, which a file served from the page cache in a few microseconds
    does not repay: while files answer within `FAST_FILE` (and as much
    again per `FILE_BYTES` they hold), the compute
    threads read them inside their decode calls (`NativeChunkReader`).
    Slower files (a network filesystem, a cold cache) go to the IO threads.
    The first read of a plan is pipelined, and so are the reads of the next
    ``10 * PROBE_INTERVAL`` seconds after a direct one whose fastest group
    took more than `SLOW_DIRECT` per file (waits for a CPU left out: see
    `zarr_fused.chunks.read.group_seconds_per_file`), and a read
    `PROBE_INTERVAL` after the last pipelined one, or `PROBE_SPACING` times
    the recent reads' duration if longer, once `PROBE_READS` direct reads
    came in between (a direct read's time includes decoding, so only a
    pipelined read measures the files).
    """

    def __init__(self, chain: NativeChain, direct: NativeChunkReader) -> None:
        self.chain = chain
        #: the reader for everything the IO threads do not serve (the plan
        #: passes it in, so this module sits beside the chunk reader)
        self.direct = direct
        #: seconds per chunk file seen by the last pipelined read; None
        #: before the first, or when a direct read was slow
        self.seconds_per_file: float | None = None
        #: when the last pipelined read ended (time.monotonic)
        self.probed = 0.0
        #: until when reads stay pipelined after a slow direct one: a few
        #: fast groups (blocks a disk or a VM host still caches) must not
        #: send every other read of a cold array back to the compute threads
        self.slow_until = 0.0
        #: how long recent reads took (seconds; decays by `TOOK_DECAY`)
        self.took = 0.0
        #: direct reads since the last pipelined one
        self.direct_reads = 0

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[GetResult, ...]:
        if len(batch) <= max_workers:
            # the compute threads already keep every file of the batch in
            # flight: IO threads could only add a hand-off per chunk
            return self.direct.read(batch, out, drop_axes, max_workers)
        io_concurrency = resolve_io_concurrency()
        prefix = None
        if io_concurrency > 1 and fileio_kernels is not None and io_kernels is not None:
            prefix = local_files(batch)
        target = None if prefix is None else ReadTarget.native(self.chain, batch, out, drop_axes)
        if prefix is None or target is None:
            return self.direct.read(batch, out, drop_axes, max_workers)
        if self._direct_is_faster():
            return self._read_direct_timed(batch, out, drop_axes, max_workers)
        seen = self.seconds_per_file
        fast = seen is not None and seen < FAST_FILE
        per_thread = REQUESTS_PER_THREAD if fast else REQUESTS_PER_THREAD_SLOW
        read = _PipelinedRead(self.chain, batch, target, prefix, io_concurrency, per_thread)
        start = time.perf_counter()
        run_pipelined(
            read.groups,
            read.costs,
            read.fetch,
            read.consume,
            io_concurrency=io_concurrency,
            max_workers=max_workers,
        )
        self._note(time.perf_counter() - start)
        self.direct_reads = 0
        if read.fastest != float("inf"):
            self.seconds_per_file = read.fastest
            self.probed = time.monotonic()
        return tuple(read.statuses)

    def _note(self, seconds: float) -> None:
        self.took = max(seconds, TOOK_DECAY * self.took)

    def _direct_is_faster(self) -> bool:
        """Whether the files answered fast enough, recently enough, for the
        compute threads to read them themselves (see the class docstring)."""
        seen = self.seconds_per_file
        now = time.monotonic()
        return (
            seen is not None
            and seen < FAST_FILE
            and now >= self.slow_until
            and (
                self.direct_reads < PROBE_READS
                or now - self.probed < max(PROBE_INTERVAL, PROBE_SPACING * self.took)
            )
        )

    def _read_direct_timed(
        self, batch: Sequence[ReadItem], out: NDBuffer, drop_axes: tuple[int, ...], max_workers: int
    ) -> tuple[GetResult, ...]:
        start = time.perf_counter()
        result = self.direct.read(batch, out, drop_axes, max_workers)
        self._note(time.perf_counter() - start)
        self.direct_reads += 1
        # The fastest group, not the whole read: on a busy host a read's
        # threads wait for a CPU, which its mean time per file would count
        # as file latency and send a hot cache to the IO threads.
        took = self.direct.fastest_file
        _, spec0, *_ = batch[0]
        nbytes = self.chain.layout(spec0.shape).nbytes
        if took != float("inf") and took > SLOW_DIRECT * (1 + nbytes / DECODE_BYTES):
            self.seconds_per_file = None
            self.slow_until = time.monotonic() + 10 * PROBE_INTERVAL
        return result


class _PipelinedRead:
    """One pipelined read: groups of chunk files fetched on the IO threads
    (`fetch`) and decoded into the output on the compute threads (`consume`)."""

    def __init__(
        self,
        chain: NativeChain,
        batch: Sequence[ReadItem],
        target: ReadTarget,
        prefix: bytes,
        io_concurrency: int,
        per_thread: int,
    ) -> None:
        self.chain = chain
        self.batch = batch
        self.target = target
        self.statuses = target.statuses
        self.paths = [prefix + os.fsencode(getter.path) for getter, *_ in batch]
        self.bounds = [chain.encode_bound(chain.layout(spec.shape).nbytes) for _, spec, *_ in batch]
        self.size = group_size(len(batch), io_concurrency, max(self.bounds), per_thread)
        self.groups = [
            range(s, min(len(batch), s + self.size)) for s in range(0, len(batch), self.size)
        ]
        self.costs = [sum(self.bounds[i] for i in g) for g in self.groups]
        # Buffers of consumed requests are handed to the next ones: fresh
        # memory costs a page fault per page (large allocations are mmapped),
        # and a reused buffer is still in the CPU's cache.
        self.spare: list[np.ndarray] = []
        self.lock = threading.Lock()
        # the fastest group's seconds per file: an IO thread may wait for a
        # CPU in the middle of a group (32 of them share the cores), which a
        # mean would count as file latency; a real round trip slows every group
        self.fastest = float("inf")

    def _arena(self, need: int) -> np.ndarray:
        with self.lock:
            if self.spare and self.spare[-1].shape[0] >= need:
                return self.spare.pop()
        return np.empty(need, dtype=np.uint8)

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
        if done:
            stored = int(lengths[:done].clip(min=0).sum())
            per_file = per_file_latency(time.perf_counter() - start, done, stored)
            with self.lock:
                self.fastest = min(self.fastest, per_file)
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
        self.chain.decode_group(
            self.batch, target.out, target.drop_axes, target.pattern, target.ndim, payloads
        )
        with self.lock:
            self.spare.append(fetched.arena)
