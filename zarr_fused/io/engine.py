"""The IO layer: file requests in flight apart from the compute threads.

On a parallel or network filesystem (Lustre, GPFS, NFS) every ``open`` and
``pread`` is a round trip of 0.2-2 ms, and a cold page cache makes a local
disk behave alike. Compute threads that do their own IO keep at most
``max_workers`` requests in flight (one, for a batch job pinned to one
core). This module keeps ``codec_pipeline.io_concurrency`` requests in
flight however many CPUs the process has, and hands each request's bytes to
the compute threads as soon as they arrive.

`run_pipelined` is the one entry point: a read (or any batch of IO
requests) passes a list of requests, a ``fetch`` function that IO threads
run (its file IO must release the GIL: zarr_fused's ``_localio`` calls do)
and a ``consume`` function that compute threads run on each fetched
request, in completion order. There is no barrier between fetching and
decoding: the first request decodes while the others are still in flight.

Bounds
------
Requests in flight (admitted and not yet consumed) are limited two ways:

- by count, to ``2 * io_concurrency + workers``, so the IO threads always
  have the next request queued while the compute threads drain the
  previous ones, and a batch never queues more than that ahead of other
  batches sharing the IO threads;
- by bytes: each request states the most bytes it can hold (``cost``: for
  chunk files, the encoded size bound of its chunks); a request is admitted
  only while the admitted costs stay within `BYTES_IN_FLIGHT` (64 MiB), or
  when nothing else is admitted (a single request larger than the budget
  still runs, alone). A request's buffers are released once consumed.

So a read never holds more than ``max(BYTES_IN_FLIGHT, largest request)``
of stored bytes on top of its output, however large the array.

Failure: the first error of a fetch or a consume stops the batch: requests
not yet started are cancelled, running fetches stop at their next file
(they check `Batch.stopped`), and `run_pipelined` returns only after every
admitted request has finished or been cancelled, so no thread still reads a
file or writes into the output; then it raises that first error (later ones
are noted on it). Descriptors are opened and closed inside one native call,
so none outlives its request.

Writes (`Writes`) run the other way round: compute threads encode a group
of chunks or a shard, hand its stores (temporary file, ``writev``,
``rename``; or the delete of a key left empty) to the IO threads as one
`Parcel`, and go on encoding the next while those run. A parcel states the
bytes it pins (the encode arena, a shard's old and new bytes) and is
admitted only while the parcels not yet stored stay within
`BYTES_IN_FLIGHT`, or when none is pending (so one larger than the budget
still goes, alone); until then the compute thread that made it waits. A
batch also keeps at most `write_window` store requests in flight. So a
write holds at most ``BYTES_IN_FLIGHT`` of encoded bytes waiting for the
IO threads, plus what each compute thread is encoding (one group or one
shard), plus, on a partial update, the stored shards read ahead (the
``run_pipelined`` bound above). The first failed store stops the batch:
stores not yet started are skipped (their parcels still release their
memory), compute threads stop at their next hand-off, and the batch ends
only once every store has run or been skipped, raising that first error.
Each key is touched by one store per batch, and a batch returns only after
all its stores ran, so writes and deletes of one key stay in order.

Threads: the IO threads are one process-wide pool (all reads of a process
share ``io_concurrency`` requests in flight), created on first use, grown
when the setting grows, and reset in a forked child (pool threads do not
survive ``fork``), by the same factory as the compute pool
(`zarr_fused._pool.shared_pool`). Threads start on demand, and those
beyond `DEFAULT_IO_CONCURRENCY` exit after `zarr_fused._pool.IDLE_SECONDS`
without work.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import queue
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Self

from zarr_fused._pool import ElasticPool, PoolRole, get_pool, in_worker_thread, shared_pool
from zarr_fused.config import IO_CONCURRENCY_KEY, int_setting

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "BYTES_IN_FLIGHT",
    "DEFAULT_IO_CONCURRENCY",
    "IO_CONCURRENCY_CAP",
    "IO_CONCURRENCY_KEY",
    "WRITE_WINDOW",
    "Batch",
    "Parcel",
    "Writes",
    "io_concurrency_at_most",
    "io_threads",
    "resolve_io_concurrency",
    "run_pipelined",
    "write_window",
]

#: Default IO requests in flight per process.
#:
#: tensorstore sizes its ``file_io_concurrency`` as ``max(4, hardware
#: threads)`` (``tensorstore/internal/file_io_concurrency_resource.cc``, with
#: a TODO to pick it better): a local-disk figure that ties IO to the CPU
#: count, so a job pinned to one core of a 2-core node gets 4. What a
#: request waits for on a network filesystem is the round trip, not a CPU:
#: by Little's law the requests needed in flight are the rate wanted times
#: the latency. A 16 KiB chunk file costs two round trips (open, pread); at
#: 1 ms each, 32 in flight deliver 16,000 files (250 MiB) a second, more than
#: one core decodes of such small chunks, and 0.2 ms needs fewer. Beyond 32
#: the gain is small while each thread costs a stack and servers start to
#: throttle one client (Lustre's ``max_rpcs_in_flight`` defaults to 8 per
#: OST, so 32 spreads over several OSTs; NFS' RPC slot table grows to 65536
#: on demand). Hence 32, independent of the CPU count; raise it for higher
#: latencies, lower it on a filesystem that punishes many open files.
DEFAULT_IO_CONCURRENCY: Final = 32
IO_CONCURRENCY_CAP: Final = 1024

#: Stored bytes a batch may hold in admitted requests (see the module docstring).
BYTES_IN_FLIGHT: Final = 64 << 20


#: a cap on `resolve_io_concurrency` in the current context (`io_concurrency_at_most`)
_io_cap: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "zarr_fused_io_cap", default=None
)


@contextlib.contextmanager
def io_concurrency_at_most(cap: int) -> Iterator[None]:
    """Within the block, `resolve_io_concurrency` in this context returns at
    most ``cap`` (a write retried with fewer files in flight after the disk
    filled up: ``1`` leaves the compute threads to write their own files).
    A context variable, not the configuration: other threads' reads and
    writes keep their setting."""
    token = _io_cap.set(cap)
    try:
        yield
    finally:
        _io_cap.reset(token)


def resolve_io_concurrency() -> int:
    """IO requests in flight, from ``codec_pipeline.io_concurrency``.

    ``None`` (default) is `DEFAULT_IO_CONCURRENCY`. ``1`` means no IO
    threads: the compute threads read their own files, as before the IO
    layer existed. Like ``max_workers``, never raises: an invalid value (not
    an integer, or < 1) warns with `zarr.errors.ZarrUserWarning` and uses
    the default; values above `IO_CONCURRENCY_CAP` warn and are clamped.
    Inside `io_concurrency_at_most`, at most its cap.
    """
    cap = _io_cap.get()
    resolved = int_setting(
        IO_CONCURRENCY_KEY,
        cap=IO_CONCURRENCY_CAP,
        default=lambda: DEFAULT_IO_CONCURRENCY,
        stacklevel=2,
    )
    return resolved if cap is None else max(1, min(cap, resolved))


# -- the IO threads -------------------------------------------------------------------

#: the IO threads: one pool per process, shared by every read and write
_IO_THREADS: Final = PoolRole("zarr_fused-fileio", keep=lambda: DEFAULT_IO_CONCURRENCY)


def io_threads(threads: int) -> ElasticPool:
    """The process's IO pool, grown to at least ``threads`` threads.

    The pool grows in place and starts its threads on demand; threads
    beyond `DEFAULT_IO_CONCURRENCY` exit after `zarr_fused._pool.IDLE_SECONDS`
    without work (`zarr_fused._pool.ElasticPool`), so a burst at
    ``io_concurrency=1024`` does not leave a thousand threads behind.
    """
    return shared_pool(_IO_THREADS, threads)


# -- one pipelined batch ----------------------------------------------------------------


class _Stop:
    """Tells a compute thread that the batch is over."""


_STOP: Final = _Stop()


@dataclass(eq=False)
class Batch[R, F]:
    """The state of one `run_pipelined` call, shared by its IO and compute
    threads (every field after construction is guarded by ``lock``)."""

    requests: Sequence[R]
    costs: Sequence[int]
    fetch: Callable[[R, Batch[R, F]], F]
    consume: Callable[[R, F], None]
    pool: ElasticPool
    max_admitted: int
    budget: int
    workers: int
    #: called with each fetched result that is not consumed (the batch stopped)
    discard: Callable[[F], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: queue.SimpleQueue[tuple[int, Future[F]] | _Stop] = field(
        default_factory=queue.SimpleQueue
    )
    futures: dict[int, Future[F]] = field(default_factory=dict)
    next_index: int = 0
    admitted: int = 0
    admitted_cost: int = 0
    delivered: int = 0
    errors: list[tuple[int, BaseException]] = field(default_factory=list)
    #: set at the first failure; fetches check it between files
    stopped: bool = False
    #: the same as one byte (1 once stopped), for native fetch loops that
    #: run without the GIL
    stop_flag: bytearray = field(default_factory=lambda: bytearray(1))

    def admit(self) -> None:
        """Submit requests while the count and byte bounds allow (lock held)."""
        n = len(self.requests)
        while not self.stopped and self.next_index < n and self.admitted < self.max_admitted:
            cost = self.costs[self.next_index]
            if self.admitted and self.admitted_cost + cost > self.budget:
                return
            index = self.next_index
            self.next_index += 1
            self.admitted += 1
            self.admitted_cost += cost
            future = self.pool.submit(self.fetch, self.requests[index], self)
            self.futures[index] = future
            future.add_done_callback(functools.partial(self.deliver, index))

    def deliver(self, index: int, future: Future[F]) -> None:
        """Queue a finished (or cancelled) request for the compute threads."""
        self.done.put((index, future))

    def fail(self, index: int, exc: BaseException) -> None:
        """Record a failure and cancel what has not started (lock held)."""
        self.errors.append((index, exc))
        if not self.stopped:
            self.stopped = True
            self.stop_flag[0] = 1
            for future in self.futures.values():
                future.cancel()  # only those still queued; their callbacks deliver them

    def finish(self, index: int) -> None:
        """Release request ``index`` and admit more; ends the batch when
        nothing is left to deliver (lock held)."""
        del self.futures[index]
        self.admitted -= 1
        self.admitted_cost -= self.costs[index]
        self.delivered += 1
        self.admit()
        if self.admitted == 0 and (self.stopped or self.next_index == len(self.requests)):
            for _ in range(self.workers):
                self.done.put(_STOP)

    def work(self) -> None:
        """A compute thread's loop: consume fetched requests as they arrive."""
        while True:
            item = self.done.get()
            if isinstance(item, _Stop):
                return
            index, future = item
            try:
                if not future.cancelled() and not self.stopped:
                    self.consume(self.requests[index], future.result())
                else:
                    self.drop(future)
            except BaseException as exc:
                with self.lock:
                    self.fail(index, exc)
            finally:
                with self.lock:
                    self.finish(index)

    def drop(self, future: Future[F]) -> None:
        """Hand a fetched result nobody consumes to ``discard``."""
        if self.discard is not None and not future.cancelled() and future.exception() is None:
            self.discard(future.result())

    def drain(self) -> None:
        """Drop what was delivered and not taken (after an interrupt)."""
        while True:
            try:
                item = self.done.get_nowait()
            except queue.Empty:
                return
            if not isinstance(item, _Stop):
                self.drop(item[1])

    def raise_first(self) -> None:
        if not self.errors:
            return
        self.errors.sort(key=lambda pair: pair[0])
        exc = self.errors[0][1]
        if len(self.errors) > 1:
            exc.add_note(f"({len(self.errors) - 1} other request(s) of this batch failed too)")
        raise exc


def run_pipelined[R, F](
    requests: Sequence[R],
    costs: Sequence[int],
    fetch: Callable[[R, Batch[R, F]], F],
    consume: Callable[[R, F], None],
    *,
    io_concurrency: int,
    max_workers: int,
    budget: int = BYTES_IN_FLIGHT,
    discard: Callable[[F], None] | None = None,
) -> None:
    """Fetch every request on the IO threads and consume each on a compute
    thread as soon as it is fetched.

    Parameters
    ----------
    requests : sequence
        The work, in the order it is submitted (completion order may differ).
    costs : sequence of int
        The most bytes each request's fetched result can hold.
    fetch : callable
        ``fetch(request, batch) -> fetched``, run on an IO thread; should
        return early (raise or return) once ``batch.stopped`` is set.
    consume : callable
        ``consume(request, fetched)``, run on a compute thread (the caller
        is one of them); distinct requests must touch disjoint state.
    io_concurrency : int
        IO threads (`resolve_io_concurrency`).
    max_workers : int
        Compute threads, the caller included.
    budget : int
        Bytes the admitted requests may hold together (see the module docstring).
    discard : callable, optional
        ``discard(fetched)``: a fetched result not consumed (the batch stopped).

    Raises
    ------
    BaseException
        The first failure (lowest request index among those that failed),
        after every admitted request finished or was cancelled.
    """
    n = len(requests)
    if n == 0:
        return
    workers = 1 if in_worker_thread() else max(1, min(max_workers, n))
    batch: Batch[R, F] = Batch(
        requests,
        costs,
        fetch,
        consume,
        io_threads(io_concurrency),
        max_admitted=2 * io_concurrency + workers,
        budget=budget,
        workers=workers,
        discard=discard,
    )
    with batch.lock:
        batch.admit()
    _work_with_helpers(batch, workers)
    batch.raise_first()


def _work_with_helpers(batch: Batch[Any, Any], workers: int) -> None:
    """Run ``batch.work`` in the caller and ``workers - 1`` compute-pool
    helpers until every request is consumed; a helper's own failure (outside
    any consume) is raised."""
    helpers = [get_pool(workers - 1).submit(batch.work) for _ in range(workers - 1)]
    try:
        batch.work()
    except BaseException as exc:  # outside any consume: an interrupt while waiting
        with batch.lock:
            batch.fail(-1, exc)
            running = list(batch.futures.values())
        wait(running)
        batch.drain()
        raise
    finally:
        # Helpers still queued behind other work are not needed any more
        # (the caller's loop ended, so every request was delivered).
        for helper in helpers:
            helper.cancel()
        wait(helpers)
    for helper in helpers:
        if not helper.cancelled() and helper.exception() is not None:
            raise helper.exception()  # type: ignore[misc]


# -- writes behind the compute threads ------------------------------------------------


#: IO requests one write batch keeps in flight, at least (see `write_window`)
WRITE_WINDOW: Final = 8


def write_window(io_concurrency: int) -> int:
    """IO requests one write batch keeps in flight: a quarter of
    ``io_concurrency``, at least `WRITE_WINDOW` (never more than
    ``io_concurrency``). Fewer than reads: on a local ext4 disk, 32 threads
    creating and renaming files in one directory at once cost about 35%
    more CPU than the compute threads doing it themselves, 8 about 15%
    (1024 blosc chunk files, docs/io-layer.md); a network filesystem
    that wants more writes in flight gets them with a higher
    ``io_concurrency``."""
    return max(1, min(io_concurrency, max(WRITE_WINDOW, io_concurrency // 4)))


class WritesStopped(Exception):
    """Raised in a compute thread that hands over a parcel after a store of
    its batch failed; `Writes` replaces it with that failure."""


class Parcel:
    """Stores that pin ``cost`` bytes until the last of them has run (see
    `Writes.parcel`)."""

    __slots__ = ("_pending", "cost", "release", "writes")

    def __init__(self, writes: Writes, cost: int, release: Callable[[], None] | None) -> None:
        self.writes = writes
        self.cost = cost
        self.release = release
        self._pending = 1  # the producer's hold, until `close`

    def store(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on an IO thread (skipped once the batch failed);
        its errors should name the key (an OSError from ``write_parts``
        names the file)."""
        writes = self.writes
        with writes.cond:
            while writes.requests >= writes.window and not writes.stopped:
                writes.cond.wait()
            writes.requests += 1
            self._pending += 1
            index = writes.submitted
            writes.submitted += 1
        try:
            writes.pool.submit(self._run, index, fn, args)
        except BaseException:
            writes.request_done()
            self._done()
            raise

    def close(self) -> None:
        """No more stores: the parcel is released once those given have run."""
        self._done()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, index: int, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            if not self.writes.stopped:  # skipped once the batch failed
                fn(*args)
        except BaseException as exc:
            self.writes.fail(index, exc)
        finally:
            self.writes.request_done()
            self._done()

    def _done(self) -> None:
        writes = self.writes
        with writes.cond:
            self._pending -= 1
            if self._pending:
                return
        try:
            if self.release is not None:
                self.release()
        finally:
            writes.settle(self.cost)


class Writes:
    """One write batch's stores, run on the IO threads behind the compute
    threads that encode them (see the module docstring).

    Use as a context manager around the encoding: on exit it waits for
    every store and raises the first failure (by submission order).
    """

    def __init__(self, io_concurrency: int, budget: int = BYTES_IN_FLIGHT) -> None:
        self.pool = io_threads(io_concurrency)
        self.budget = budget
        self.window = write_window(io_concurrency)
        #: IO requests submitted and not yet run
        self.requests = 0
        self.cond = threading.Condition()
        self.parcels = 0
        self.held = 0
        self.submitted = 0
        self.errors: list[tuple[int, BaseException]] = []
        self.stopped = False

    def parcel(self, cost: int, release: Callable[[], None] | None = None) -> Parcel:
        """A parcel of ``cost`` bytes, once they fit the budget (waits
        meanwhile); use it as a context manager (its exit closes it).
        ``release()`` runs once its stores have run, failed or been skipped.
        Raises `WritesStopped` once the batch failed (then ``release`` has
        run already)."""
        with self.cond:
            while not self.stopped and self.parcels and self.held + cost > self.budget:
                self.cond.wait()
            if not self.stopped:
                self.parcels += 1
                self.held += cost
                return Parcel(self, cost, release)
        if release is not None:
            release()
        raise WritesStopped

    def request_done(self) -> None:
        with self.cond:
            self.requests -= 1
            self.cond.notify_all()

    def settle(self, cost: int) -> None:
        with self.cond:
            self.parcels -= 1
            self.held -= cost
            self.cond.notify_all()

    def fail(self, index: int, exc: BaseException) -> None:
        with self.cond:
            self.errors.append((index, exc))
            self.stopped = True
            self.cond.notify_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and not isinstance(exc, WritesStopped):
            with self.cond:
                self.stopped = True  # the encoding failed: skip what is queued
        with self.cond:
            while self.parcels:
                self.cond.wait()
        if self.errors and (exc is None or isinstance(exc, WritesStopped)):
            self.errors.sort(key=lambda pair: pair[0])
            first = self.errors[0][1]
            if len(self.errors) > 1:
                first.add_note(f"({len(self.errors) - 1} other store(s) of this batch failed too)")
            raise first from None
