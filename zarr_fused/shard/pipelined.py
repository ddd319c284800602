"""Sharded reads from a LocalStore, IO pipelined with decoding.

`ShardIO` runs the shards of one `zarr_fused.shard.read.ShardReader` batch
through the IO threads of `zarr_fused.io.engine`: each touched shard is one
IO request, so up to ``io_concurrency`` shards have their index read at
once (a thin slab across many shards no longer waits for one index after
another), and each request goes on to its shard's coalesced inner-chunk
ranges as soon as the index is parsed, in the same native call
(`zarr_fused.io.local.read_shard_part`: ``open``, index ``pread``, range
``preadv``; the GIL released throughout). A shard read whole is one
request too. Each request first asks the kernel for all its ranges
(``POSIX_FADV_WILLNEED``): from a block device they are then read at once.
Where that does not apply (the last read came from the page cache or a
filesystem the advice does not reach) and calls are slow, while there are
few shards a partial shard's touched inner chunks are split over several
requests, whose ranges are then read in parallel (`_Requests`). A compute thread decodes each shard into the
output as soon as its request (its last part) is in, while the other
shards are still in flight.

The index bytes are untrusted either way: the native fetch checks every
entry against the file's length and the codec's limits before sizing or
reading anything, and raises `zarr_fused.errors.CorruptShardError` naming
the key; a failed ``open``/``pread`` raises ``OSError`` with the file's path.
The first failure cancels the shards not yet started (`run_pipelined`).

Which threads read the files follows how fast they answer, as for
unsharded chunks (`zarr_fused.io.probe`): the hand-off between threads
costs wake-ups that a shard served from the page cache does not repay, so
while file calls answer within `FAST_CALL`, the compute threads read their
shards themselves (the direct path of ``ShardReader``). The first read of
a reader is pipelined unless its store's files were measured within
`zarr_fused.io.probe.PROBE_INTERVAL` by another reader (`SHARD_CALLS`
lends that measurement: zarr builds a new reader with every array it
opens), and so is a read once the last measurement no longer stands (only
a pipelined read measures the files: a direct read's
time includes decoding), and the read after a direct one that made the
process read from a block device (a page cache that went cold:
`storage_read_bytes`): otherwise reads of a cache that went cold after a
hot read stay direct for as long as they come more often than the probes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np

from zarr_fused._native import io_kernels, shard_local_kernels
from zarr_fused.io.engine import Batch, resolve_io_concurrency, run_pipelined
from zarr_fused.io.probe import (
    FAST_CALL,
    Fastest,
    LatencyProbe,
    StoreLatencies,
    per_call_latency,
)
from zarr_fused.shard.index import MISSING_OFFSET

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["SHARD_CALLS", "ShardIO", "storage_read_bytes"]

#: a shard split over several requests pays, per extra part, an ``open``,
#: an index read and a hand-off between threads (about 0.1 ms of CPU);
#: reads split shards only while file calls took at least this long
#: (seconds) at the last pipelined read, or before the first, and that
#: read did not come from a block device: there the kernel reads a request's
#: ranges at once (``POSIX_FADV_WILLNEED``, see `_shard_local`), so a part
#: adds only its open, index read and hand-off; where the advice does
#: nothing (a FUSE or some parallel filesystems, the latency harness' shim)
#: the parts still read their ranges in parallel
SPLIT_CALL = 0.5e-3

#: the last measurement of each store root's shard file calls, lent to the
#: probe of a reader that has none (see `StoreLatencies`: an array opened
#: for each read would otherwise pipeline every read, a hand-off per shard);
#: apart from the chunk files' `STORE_LATENCIES`, which count per file (its
#: lock is reset at a fork with theirs)
SHARD_CALLS: Final = StoreLatencies()


#: the kernel's IO counters of this process (Linux); ``read_bytes`` counts
#: what was read from block devices, not what the page cache served
_PROC_IO = Path("/proc/self/io")


def storage_read_bytes() -> int | None:
    """Bytes this process has had read from block devices so far, None
    where the kernel does not say (not Linux, or no task IO accounting).

    A network filesystem's reads are not counted: its latency shows in the
    pipelined reads' timing instead.
    """
    try:
        text = _PROC_IO.read_bytes()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(b"read_bytes:"):
            return int(line.split()[1])
    return None


class ShardBatch(Protocol):
    """What `ShardIO` needs of one batch of `ShardReader` (its `_ReadBatch`)."""

    @property
    def shards(self) -> Sequence[Any]: ...

    prefetch: bool

    def fetch(self, shard: Any) -> Any: ...
    def fetch_part(self, shard: Any, touched: Any) -> Any: ...
    def decode_fetched(self, shard: Any) -> None: ...
    def cost(self, shard: Any) -> int: ...
    def fetched_io(self, shard: Any) -> tuple[int, int]: ...
    def deferred_group(self, shard: Any) -> Any: ...
    def mark_missing(self, shard: Any) -> None: ...


class ShardIO:
    """The choice between the IO threads and the direct path for the
    batches of one `ShardReader`, and the pipelined read itself."""

    def __init__(self) -> None:
        #: how fast the file calls answered (seconds per call), and whether
        #: that still decides
        self.probe = LatencyProbe(FAST_CALL)
        #: `storage_read_bytes` when a direct read was chosen because the
        #: files answered fast; None otherwise
        self.direct_from: int | None = None
        #: whether the last pipelined read read from a block device
        self.from_device = False
        #: the local store root of the reader's files (`applies` sets it:
        #: one store per array, so every batch of a reader names the same)
        self.root: bytes | None = None

    def applies(self, n_shards: int, max_workers: int, root: bytes | None) -> int:
        """The IO requests in flight to pipeline a batch of ``n_shards``
        shards under the local store ``root`` (None: not a local store)
        with, 0 when the direct path serves it.

        Only where the direct path goes shard by shard (enough shards for
        every worker, or one worker): with few shards and several workers
        it spreads each shard's inner chunks over all of them, which one
        compute thread per request would not.
        """
        self.direct_from = None
        self.root = root
        if root is None or n_shards < 2 or io_kernels is None or shard_local_kernels is None:
            return 0
        if n_shards < 2 * max_workers and max_workers > 1:
            return 0
        io_concurrency = resolve_io_concurrency()
        if io_concurrency <= 1:
            return 0
        SHARD_CALLS.lend(root, self.probe)
        if self.probe.direct():
            self.direct_from = storage_read_bytes()
            return 0
        return io_concurrency

    def note_direct(self, seconds: float) -> None:
        """Note how long a direct read took (spaces the probes), and
        whether it read from a block device: then the next read (of any
        reader of the store) is pipelined and measures the files afresh."""
        self.probe.note_direct(seconds)
        start, self.direct_from = self.direct_from, None
        if start is None:
            return
        now = storage_read_bytes()
        if now is not None and now > start:
            self.probe.found_slow()
            if self.root is not None:
                SHARD_CALLS.forget(self.root)

    def run(self, read: ShardBatch, io_concurrency: int, max_workers: int) -> None:
        """Fetch every shard of ``read`` on the IO threads and decode each
        on a compute thread as soon as it is in."""
        timing = Fastest()
        began = time.perf_counter()
        seen = self.probe.latency
        split = (seen is None or seen >= SPLIT_CALL) and not self.from_device
        requests = _Requests(read, io_concurrency, split)
        device_before = storage_read_bytes()
        # the kernel reads each request's ranges at once (a cold disk's
        # queue filled, no thread per range); what the direct path skips
        read.prefetch = True

        def fetch(request: Any, state: Batch[Any, Any]) -> Any:
            start = time.perf_counter()
            fetched = requests.fetch(request)
            calls, nbytes = read.fetched_io(fetched)
            if calls:
                timing.note(per_call_latency(time.perf_counter() - start, calls, nbytes))
            return fetched

        try:
            run_pipelined(
                requests.items,
                requests.costs,
                fetch,
                requests.consume,
                io_concurrency=io_concurrency,
                max_workers=max_workers,
            )
        finally:
            # shards fetched but not decoded (the batch failed) give their
            # buffers back; run_pipelined returned, so no fetch still runs
            requests.release()
        # a read that timed no file call (every shard missing) leaves the
        # probe as it was, the recent reads' duration included
        if timing.seconds != float("inf"):
            self.probe.note_pipelined(time.perf_counter() - began, timing.seconds)
        device_after = storage_read_bytes()
        self.from_device = device_after is not None and device_after != device_before
        if self.root is not None:
            SHARD_CALLS.note(self.root, self.probe)


class _Part:
    """One IO request of a shard split over several (see `_Requests`): its
    touched inner chunks are tasks ``first:stop`` of the shard's deferred
    decode batch."""

    __slots__ = ("fetched", "first", "shard", "split", "stop", "touched")

    def __init__(self, shard: Any, split: _Split, touched: Any, first: int) -> None:
        self.shard = shard
        self.split = split
        self.touched = touched
        self.first = first
        self.stop = first + len(touched)
        self.fetched: Any = None


class _Split:
    """A shard split over several requests: its decode batch, with every
    touched inner chunk queued for a fetch to come (`add_shard` with
    ``defer``), and how many of its parts are still out, and missing."""

    __slots__ = ("group", "left", "missing", "parts")

    def __init__(self, group: Any, parts: int) -> None:
        self.group = group
        self.parts = parts
        self.left = parts
        self.missing = 0


class _Requests:
    """The IO requests of one pipelined read: a shard each, or, while there
    are fewer shards than IO threads, a planned partial shard's touched
    inner chunks split over several requests. Each part reads the index
    (again) and its chunks' ranges: the ranges of one request are read one
    after another, and zarr stores inner chunks in Morton order, so a slab's
    chunks lie apart in the file. Each part is decoded as soon as it is in,
    into the output, by its share of the shard's decode tasks (no packing
    of the parts into one buffer first)."""

    def __init__(self, read: ShardBatch, io_concurrency: int, split_shards: bool) -> None:
        self.read = read
        self.items: list[Any] = []
        self.costs: list[int] = []
        self.lock = threading.Lock()
        split = -(-2 * io_concurrency // max(1, len(read.shards))) if split_shards else 1
        for shard in read.shards:
            plan = shard.plan
            n = 1 if plan is None or plan.all_touched else min(split, plan.n_touched)
            cost = read.cost(shard)
            group = read.deferred_group(shard) if n > 1 else None
            if group is None:
                self.items.append(shard)
                self.costs.append(cost)
                continue
            state = _Split(group, n)
            first = 0
            for touched in np.array_split(np.asarray(plan.touched(), dtype=np.intp), n):
                self.items.append(_Part(shard, state, touched, first))
                first += len(touched)
            self.costs += [-(-cost // n)] * n

    def fetch(self, request: Any) -> Any:
        if isinstance(request, _Part):
            request.fetched = self.read.fetch_part(request.shard, request.touched)
            return request.fetched
        return self.read.fetch(request)

    def consume(self, request: Any, fetched: Any) -> None:
        if not isinstance(request, _Part):
            self.read.decode_fetched(request)
            return
        split = request.split
        entries, payload = fetched.entries, fetched.payload
        if fetched.missing:  # the part's chunks decode as missing: the fill value
            entries = np.full((request.shard.plan.n_total, 2), MISSING_OFFSET, dtype=np.uint64)
            payload = np.empty(0, dtype=np.uint8)
        try:
            shard_local_kernels.decode_part(
                split.group, request.first, request.stop, entries, payload
            )
        finally:
            fetched.release()
        with self.lock:
            split.left -= 1
            split.missing += bool(fetched.missing)
            if split.left or split.missing < split.parts:
                return
        # no part found the file: a missing shard (a shard that vanished
        # between its parts reads as fill where its file was gone)
        self.read.mark_missing(request.shard)

    def release(self) -> None:
        for request in self.items:
            if isinstance(request, _Part) and request.fetched is not None:
                request.fetched.release()
        for shard in self.read.shards:
            shard.release()
