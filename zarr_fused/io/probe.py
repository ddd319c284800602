"""IO threads or direct? The latency probe behind that choice.

Handing a group of files from an IO thread to a compute thread costs thread
wake-ups, which a file served from the page cache in a few microseconds
does not repay; on a network filesystem or a cold disk, where every call is
a round trip, the IO threads keep many requests in flight and win. Which
one a read or write takes is measured, not guessed, by one `LatencyProbe`
per reader or writer (`zarr_fused.chunks.pipelined`, `zarr_fused.shard.pipelined`,
`zarr_fused.chunks.write`):

- a read or write with no measurement that stands goes the measuring way:
  an unsharded read reads one chunk per compute thread directly first and
  judges their files by how long those waited for them (a hot cache: not
  at all), the rest following directly or on the IO threads; a sharded
  read is pipelined (only the IO threads time the files alone: a direct
  read's time includes decoding); a write stores a few files from the
  compute threads first (`PROBE_FILES`);
- a measurement stands for `PROBE_INTERVAL` seconds, or `PROBE_SPACING`
  times the recent reads' duration (`took`, decaying by `TOOK_DECAY`) if
  longer: a pipelined read of a hot cache costs more CPU than a direct one,
  so reads that take a good part of the interval (a large array, a busy
  host) must not become probes every few reads;
- and, for unsharded chunk reads, for at least `PROBE_READS` direct reads
  after it: reads that come every second or so (a loop over arrays, a
  caller that reads something else in between) would otherwise all be
  probes;
- a reader with no measurement of its own (an array just opened) takes
  the last one of its store's files while it stands (`StoreLatencies`);
- a direct read that finds its files slow drops the measurement at once
  (chunk reads also stay pipelined for `SLOW_HOLD` seconds: a few fast
  groups, blocks a disk or a VM host still caches, must not send every
  other read of a cold array back to the compute threads).

The thresholds each path compares its measurement with are here too, with
the weighing that keeps large files from the page cache from looking slow
for their size (`per_file_latency`, `per_call_latency`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DECODE_BYTES",
    "FAST_CALL",
    "FAST_FILE",
    "FAST_STORE",
    "FILE_BYTES",
    "PROBE_FILES",
    "PROBE_INTERVAL",
    "PROBE_READS",
    "PROBE_SPACING",
    "SLOW_DIRECT",
    "SLOW_HOLD",
    "STORE_LATENCIES",
    "STORE_ROOTS",
    "TOOK_DECAY",
    "Fastest",
    "LatencyProbe",
    "StoreLatencies",
    "per_call_latency",
    "per_file_latency",
    "slow_direct",
]

#: a chunk file (``open`` + ``pread``) that answers faster than this
#: (seconds) is in the page cache or on a fast local disk: the compute
#: threads read it themselves
FAST_FILE: Final = 50e-6
#: a shard's file call (``open``, ``pread``) answered faster than this
#: (seconds) comes from the page cache or a fast local disk
FAST_CALL: Final = 50e-6
#: chunk files the IO threads store faster than this (seconds per file) are
#: on a local disk or tmpfs, not a network filesystem (where a file costs
#: three or four round trips of 0.2-2 ms): there the IO threads' creates
#: and renames cost more CPU than the compute threads' for the same wall
#: time (docs/io-layer.md), so the compute threads write their files
#: themselves (inside the encode call)
FAST_STORE: Final = 500e-6
#: bytes that count as one more file (or file call): a file served from the
#: page cache still costs a copy of its bytes (some 50 us per 256 KiB
#: here), so large chunk files (an uncompressed 64^3 chunk is 512 KiB) and
#: large shard reads must not look slow for their size
FILE_BYTES: Final = 256 << 10
#: a direct chunk read whose fastest group waited longer than this per file
#: for its files (`zarr_fused.chunks.read.group_wait_per_file`) goes back
#: to the IO threads at once
SLOW_DIRECT: Final = 2 * FAST_FILE
#: decoded bytes per chunk that count as one more `SLOW_DIRECT` (a large
#: chunk's file takes longer to come in, even from a fast local disk; the
#: chunk's decoded size, which a direct read knows, stands for its file's)
DECODE_BYTES: Final = 256 << 10
#: seconds a measurement stands, after which a read is pipelined (a write
#: probes) again, to look afresh at how fast the files answer (a cache that
#: went cold, a slower filesystem)
PROBE_INTERVAL: Final = 1.0
#: and at least this many times the duration of recent reads
PROBE_SPACING: Final = 20
#: how much of a read's duration is still counted at the next read
TOOK_DECAY: Final = 0.9
#: direct chunk reads between two probes, at least; a direct read that
#: finds its files slow needs no probe, it goes back to the IO threads itself
PROBE_READS: Final = 4
#: seconds chunk reads stay pipelined after a direct one found its files slow
SLOW_HOLD: Final = 10 * PROBE_INTERVAL
#: store roots whose last measurement `STORE_LATENCIES` keeps
STORE_ROOTS: Final = 64
#: chunk files each compute thread stores itself, timed, before a write
#: with no measurement that stands decides where the rest go (at 1 ms per
#: round trip, four files cost about 16 ms, once per `PROBE_INTERVAL`)
PROBE_FILES: Final = 4


def per_file_latency(seconds: float, files: int, stored: int) -> float:
    """Seconds per file of a group of ``files`` chunk files holding
    ``stored`` bytes, each `FILE_BYTES` of a file counting as one more file
    (what is compared with `FAST_FILE`)."""
    return seconds / files / (1 + stored / files / FILE_BYTES)


def per_call_latency(seconds: float, calls: int, nbytes: int) -> float:
    """Seconds per file call of a shard request that made ``calls`` calls
    reading ``nbytes`` bytes, each whole `FILE_BYTES` counting as one more
    call (what is compared with `FAST_CALL`)."""
    return seconds / (calls + nbytes // FILE_BYTES)


def slow_direct(seconds_per_file: float, decoded: int) -> bool:
    """Whether a direct chunk read whose fastest group waited
    ``seconds_per_file`` (inf: it read no file) for each file of a chunk of
    ``decoded`` bytes found its files slow (`SLOW_DIRECT`, `DECODE_BYTES`)."""
    return seconds_per_file != float("inf") and seconds_per_file > SLOW_DIRECT * (
        1 + decoded / DECODE_BYTES
    )


class Fastest:
    """The fastest of the timings the IO threads of one pipelined read note
    (seconds per file, or per file call), inf before the first.

    The fastest, not the mean: an IO thread may wait for a CPU in the
    middle of a request (many of them share the cores), which a mean would
    count as file latency; a real round trip slows every request.
    """

    __slots__ = ("lock", "seconds")

    def __init__(self) -> None:
        self.seconds = float("inf")
        self.lock = threading.Lock()

    def note(self, seconds: float) -> None:
        with self.lock:
            self.seconds = min(self.seconds, seconds)


class LatencyProbe:
    """How fast one reader's or writer's files answered, and whether that
    measurement still decides (see the module docstring).

    Parameters
    ----------
    fast : float
        Seconds per file (or file call) below which the compute threads do
        the IO themselves (`FAST_FILE`, `FAST_CALL`, `FAST_STORE`).
    reads_between : int
        Direct reads a measurement stands for whatever its age
        (`PROBE_READS` for chunk reads; 0: its age alone decides).
    clock : callable
        Seconds of a monotonic clock (a seam for tests).
    """

    __slots__ = (
        "clock",
        "direct_reads",
        "fast",
        "latency",
        "probed",
        "reads_between",
        "slow_until",
        "took",
    )

    def __init__(
        self,
        fast: float,
        *,
        reads_between: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fast = fast
        self.reads_between = reads_between
        self.clock = clock
        #: seconds per file (per call for shards) at the last measurement;
        #: None before the first, or once a direct read found the files slow
        self.latency: float | None = None
        #: when that measurement was taken (``clock``)
        self.probed = 0.0
        #: how long recent reads took (seconds; decays by `TOOK_DECAY`)
        self.took = 0.0
        #: direct reads since the last pipelined one
        self.direct_reads = 0
        #: until when reads stay pipelined after a direct one found its
        #: files slow (``clock``)
        self.slow_until = float("-inf")

    def verdict(self) -> bool | None:
        """True: the files answered fast, recently enough for the compute
        threads to do the IO themselves; False: slow, recently (the IO
        threads); None: no measurement stands (measure first)."""
        now = self.clock()
        if now < self.slow_until:
            return False
        latency = self.latency
        if latency is None:
            return None
        stands = self.direct_reads < self.reads_between or now - self.probed < max(
            PROBE_INTERVAL, PROBE_SPACING * self.took
        )
        if not stands:
            return None
        return latency < self.fast

    def direct(self) -> bool:
        """Whether the compute threads do this read's IO themselves."""
        return self.verdict() is True

    def seen_fast(self) -> bool:
        """Whether the last measurement, however old, found the files fast."""
        return self.latency is not None and self.latency < self.fast

    def measured(self, latency: float) -> None:
        """The files answered in ``latency`` seconds each, just now (a
        pipelined read's fastest group, a write's fastest store)."""
        self.latency = latency
        self.probed = self.clock()

    def note_pipelined(self, seconds: float, latency: float) -> None:
        """A pipelined read took ``seconds`` and measured ``latency`` (inf:
        it timed no file, so the measurement before it stands)."""
        self._took(seconds)
        self.direct_reads = 0
        if latency != float("inf"):
            self.measured(latency)

    def note_direct(self, seconds: float) -> None:
        """A direct read took ``seconds`` (spaces the probes)."""
        self._took(seconds)
        self.direct_reads += 1

    def found_slow(self, hold: float = 0.0) -> None:
        """A direct read found the files slow: the next read measures them
        afresh, and reads stay pipelined for ``hold`` seconds."""
        self.latency = None
        if hold:
            self.slow_until = self.clock() + hold

    def _took(self, seconds: float) -> None:
        self.took = max(seconds, TOOK_DECAY * self.took)


class StoreLatencies:
    """The last measurement of each store root's files, lent to probes
    that have none of their own.

    A probe belongs to one reader, and zarr builds a new reader with every
    array it opens: a caller that opens an array for each read
    (``zarr.open_array(...)[:]``, a loop over the arrays of a group) would
    make every read a pipelined one, whose hand-off per file costs more CPU
    than decoding a cheap chunk (lz4). A probe with no measurement takes
    its store's last one while that is younger than `PROBE_INTERVAL`, and
    only its age decides from then on (not `LatencyProbe`'s
    ``reads_between``, which counts the direct reads of its own reader).

    Readers of many threads note and lend at once: a lock keeps the
    eviction's look at the oldest root from racing another's insert.
    """

    __slots__ = ("__weakref__", "capacity", "lock", "seen")

    def __init__(self, capacity: int = STORE_ROOTS) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        #: root -> (seconds per file, when measured on the probes' clock)
        self.seen: dict[bytes, tuple[float, float]] = {}
        _LIVE.add(self)

    def note(self, root: bytes, probe: LatencyProbe) -> None:
        """``probe`` measured the files under ``root`` (or kept its last
        measurement): remember it for the store's other readers."""
        if probe.latency is None:
            return
        with self.lock:
            self.seen.pop(root, None)
            self.seen[root] = (probe.latency, probe.probed)
            if len(self.seen) > self.capacity:
                del self.seen[next(iter(self.seen))]

    def forget(self, root: bytes) -> None:
        """A direct read found the files under ``root`` slow."""
        with self.lock:
            self.seen.pop(root, None)

    def lend(self, root: bytes, probe: LatencyProbe) -> None:
        """Give ``probe``, if it has no measurement and is not holding
        reads on the IO threads, the store's last one while it stands."""
        if probe.latency is not None:
            return
        with self.lock:
            seen = self.seen.get(root)
        if seen is None:
            return
        now = probe.clock()
        latency, probed = seen
        if now < probe.slow_until or now - probed >= PROBE_INTERVAL:
            return
        probe.latency = latency
        probe.probed = probed
        probe.direct_reads = probe.reads_between


#: every `StoreLatencies` of the process, for their locks' reset at a fork
_LIVE: weakref.WeakSet[StoreLatencies] = weakref.WeakSet()

#: one per process: the roots' files answer the same to every reader
STORE_LATENCIES: Final = StoreLatencies()


def _new_locks_after_fork() -> None:
    # a thread of the parent may have held one at the fork
    for latencies in _LIVE:
        latencies.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)
