"""Sharded reads from a LocalStore, IO pipelined with decoding.

`ShardIO` runs the shards of one `zarr_fused.shard.read.ShardReader` batch
through the IO threads of `zarr_fused.io.engine`: each touched shard is one
IO request, so up to ``io_concurrency`` shards have their index read at
once (a thin slab across many shards no longer waits for one index after
another), and each request goes on to its shard's coalesced inner-chunk
ranges as soon as the index is parsed, in the same native call
(`zarr_fused.io.local.read_shard_part`: ``open``, index ``pread``, range
``preadv``; the GIL released throughout). A shard read whole is one
request too. A compute thread decodes each shard into the output as soon
as its request is in, while the other shards are still in flight.

The index bytes are untrusted either way: the native fetch checks every
entry against the file's length and the codec's limits before sizing or
reading anything, and raises `zarr_fused.errors.CorruptShardError` naming
the key; a failed ``open``/``pread`` raises ``OSError`` with the file's path.
The first failure cancels the shards not yet started (`run_pipelined`).

Which threads read the files follows how fast they answer, as for
unsharded chunks (`zarr_fused.chunks.pipelined`): the hand-off between
threads costs wake-ups that a shard served from the page cache does not
repay, so while file calls answer within `FAST_CALL`, the compute threads
read their shards themselves (the direct path of ``ShardReader``). The
first read of a reader is pipelined, and so is a read `PROBE_INTERVAL`
(or `PROBE_SPACING` times its duration) after the last pipelined one (only
a pipelined read measures the files: a direct read's time includes
decoding).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from zarr_fused._native import io_kernels, shard_local_kernels
from zarr_fused.io.engine import Batch, resolve_io_concurrency, run_pipelined

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["CALL_BYTES", "FAST_CALL", "PROBE_INTERVAL", "ShardIO"]

#: a file call (open, pread) answered faster than this (seconds) comes from
#: the page cache or a fast local disk: the compute threads read themselves
FAST_CALL = 50e-6
#: bytes a page-cache copy moves in about `FAST_CALL`: a large read counts
#: as that many calls, so that copying is not taken for latency
CALL_BYTES = 256 << 10
#: seconds after which a direct read is pipelined again, to look afresh at
#: how fast the files answer (a cache that went cold, a slower filesystem)
PROBE_INTERVAL = 1.0
#: and at least this many times the duration of recent reads: a pipelined
#: read of a hot cache costs more than a direct one (more buffers in
#: flight, each faulted in afresh), so reads that take a good part of
#: `PROBE_INTERVAL` must not become probes every other time
PROBE_SPACING = 20
#: how much of a read's duration is still counted at the next read
TOOK_DECAY = 0.9


class ShardBatch(Protocol):
    """What `ShardIO` needs of one batch of `ShardReader` (its `_ReadBatch`)."""

    shards: Sequence[Any]

    def fetch(self, shard: Any) -> Any: ...
    def decode_fetched(self, shard: Any) -> None: ...
    def cost(self, shard: Any) -> int: ...
    def fetched_io(self, shard: Any) -> tuple[int, int]: ...


class ShardIO:
    """The choice between the IO threads and the direct path for the
    batches of one `ShardReader`, and the pipelined read itself."""

    def __init__(self) -> None:
        #: seconds per file call seen by the last pipelined read; None
        #: before the first
        self.seconds_per_call: float | None = None
        #: when the last pipelined read ended (time.monotonic)
        self.probed = 0.0
        #: how long recent reads took (seconds; decays by `TOOK_DECAY`)
        self.took = 0.0

    def applies(self, n_shards: int, max_workers: int, local: bool) -> int:
        """The IO requests in flight to pipeline a batch of ``n_shards``
        shards with, 0 when the direct path serves it.

        Only where the direct path goes shard by shard (enough shards for
        every worker, or one worker): with few shards and several workers
        it spreads each shard's inner chunks over all of them, which one
        compute thread per request would not.
        """
        if not local or n_shards < 2 or io_kernels is None or shard_local_kernels is None:
            return 0
        if n_shards < 2 * max_workers and max_workers > 1:
            return 0
        io_concurrency = resolve_io_concurrency()
        if io_concurrency <= 1 or self._direct_is_faster():
            return 0
        return io_concurrency

    def note_direct(self, seconds: float) -> None:
        """Note how long a direct read took (spaces the probes)."""
        self.took = max(seconds, TOOK_DECAY * self.took)

    def _direct_is_faster(self) -> bool:
        seen = self.seconds_per_call
        return (
            seen is not None
            and seen < FAST_CALL
            and time.monotonic() - self.probed < max(PROBE_INTERVAL, PROBE_SPACING * self.took)
        )

    def run(self, read: ShardBatch, io_concurrency: int, max_workers: int) -> None:
        """Fetch every shard of ``read`` on the IO threads and decode each
        on a compute thread as soon as it is in."""
        timing = _Timing()
        began = time.monotonic()

        def fetch(shard: Any, state: Batch[Any, Any]) -> Any:
            start = time.perf_counter()
            read.fetch(shard)
            calls, nbytes = read.fetched_io(shard)
            if calls:
                calls += nbytes // CALL_BYTES
                timing.note((time.perf_counter() - start) / calls)
            return shard

        try:
            run_pipelined(
                read.shards,
                [read.cost(s) for s in read.shards],
                fetch,
                lambda shard, _: read.decode_fetched(shard),
                io_concurrency=io_concurrency,
                max_workers=max_workers,
            )
        finally:
            # shards fetched but not decoded (the batch failed) give their
            # buffers back; run_pipelined returned, so no fetch still runs
            for shard in read.shards:
                shard.release()
        if timing.fastest != float("inf"):
            self.seconds_per_call = timing.fastest
            self.probed = time.monotonic()
            self.took = max(self.probed - began, TOOK_DECAY * self.took)


class _Timing:
    """The fastest request's seconds per file call: an IO thread may wait
    for a CPU in the middle of a request (many share the cores), which a
    mean would count as file latency; a real round trip slows them all."""

    __slots__ = ("fastest", "lock")

    def __init__(self) -> None:
        self.fastest = float("inf")
        self.lock = threading.Lock()

    def note(self, seconds: float) -> None:
        with self.lock:
            self.fastest = min(self.fastest, seconds)
