"""Thread pool of zarr_fused: the pool itself, the hop off the event loop,
fork safety.

Every parallel loop runs through `run_parallel`; how many threads it gets
is decided by `zarr_fused._cpus.resolve_max_workers`. The pool is
module-global and an `ElasticPool`: its size (the most threads it runs at
once) grows in place when a loop asks for more, and its threads start on
demand; threads beyond the CPUs the process may run on retire once idle for
`IDLE_SECONDS`, so one write with ``max_workers=256`` does not leave 255
threads parked for the life of the process. Every process-wide pool comes
from `shared_pool`, one per `PoolRole`: the compute threads (`get_pool`)
and the IO threads (`zarr_fused.io.engine.io_threads`).

Fork: executor threads do not survive ``fork()``; a child inheriting the
parent's pool objects would queue work that no thread ever runs, and it may
inherit the pools' lock in a locked state. ``os.register_at_fork`` drops
them all in the child; a pid check in `shared_pool` is the backstop for
forks that bypass the hook (``os.fork`` from C code). No OpenMP is used
anywhere for the same reason: its runtime is not fork-safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "IDLE_SECONDS",
    "ElasticPool",
    "PoolRole",
    "get_pool",
    "in_worker_thread",
    "off_loop",
    "partition",
    "pool_size",
    "run_parallel",
    "shared_pool",
]

#: the process-wide pools, one per role (`shared_pool`), and the process
#: they belong to
_pools: dict[PoolRole, ElasticPool] = {}
_pool_pid = os.getpid()
_pool_lock = threading.Lock()
# Set in pool worker threads, so a parallel loop started from inside another
# one runs inline instead of waiting on the pool it occupies (deadlock).
_local = threading.local()


# -- a pool whose idle threads retire -----------------------------------------------

#: Seconds a thread beyond its pool's ``keep`` waits for work before it
#: exits. Long enough that the threads of a loop that runs batch after
#: batch (a read per time step) survive the gaps between them, short enough
#: that a single burst of a high setting does not leave its threads behind
#: for the life of the process. `ElasticPool.set_idle` changes it per pool.
IDLE_SECONDS: Final = 5.0


class ElasticPool:
    """Threads that run submitted calls: at most ``size`` at once, started
    on demand; those beyond ``keep`` exit after ``idle`` seconds without
    work.

    The `concurrent.futures.Executor` subset zarr_fused uses: `submit`
    returns a `concurrent.futures.Future` (``cancel`` works until a thread
    takes the call). `ThreadPoolExecutor` never ends an idle thread, hence
    this class.

    Why no work is lost when a thread retires: a thread decides to exit
    only under the pool's lock, with the queue empty, and stops counting as
    a thread before it releases the lock; a `submit` under the same lock
    either finds a waiting thread for its call (then one is woken, and a
    woken thread always looks at the queue before it may retire) or starts
    a new thread while fewer than ``size`` run. At interpreter exit the
    waiting threads are woken and leave once the queue is drained, so the
    exit neither waits for the idle period nor drops queued work.
    """

    def __init__(
        self,
        size: int,
        *,
        keep: int,
        name: str,
        initializer: Callable[[], None] | None = None,
    ) -> None:
        self.size = size
        self.keep = keep
        self.idle = IDLE_SECONDS
        self._name = name
        self._initializer = initializer
        self._work: collections.deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._cond = threading.Condition(threading.Lock())
        self._threads = 0  # started and not yet exited
        self._waiting = 0  # of those, waiting for work
        self._closed = False
        self._count = itertools.count()
        _live_pools.add(self)

    @property
    def threads(self) -> int:
        """Threads running now (busy or waiting for work)."""
        with self._cond:
            return self._threads

    def grow(self, size: int) -> None:
        """Let up to ``size`` threads run at once (never lowers the size)."""
        with self._cond:
            self.size = max(self.size, size)

    def set_idle(self, seconds: float) -> None:
        """Retire threads beyond ``keep`` after ``seconds`` idle (waiting
        threads apply it at once; a seam for tests, too)."""
        with self._cond:
            self.idle = seconds
            self._cond.notify_all()

    def submit[R](self, fn: Callable[..., R], /, *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on a thread of the pool."""
        future: Future[R] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot submit to a pool after interpreter shutdown")
            self._work.append((future, fn, args))
            start = self._waiting < len(self._work) and self._threads < self.size
            if start:
                self._threads += 1
            else:
                self._cond.notify()
        if start:
            self._start()
        return future

    def _start(self) -> None:
        try:
            name = f"{self._name}_{next(self._count)}"
            # not a daemon: the interpreter's exit waits for a call in progress
            threading.Thread(target=self._run, name=name).start()
        except BaseException:
            with self._cond:
                self._threads -= 1
            raise

    def _next(self) -> tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None:
        """The next call to run; None when this thread is to exit."""
        with self._cond:
            since = time.monotonic()
            while not self._work:
                left = since + self.idle - time.monotonic()
                if self._closed or (left <= 0 and self._threads > self.keep):
                    self._threads -= 1
                    return None
                self._waiting += 1
                try:
                    self._cond.wait(left if self._threads > self.keep else None)
                finally:
                    self._waiting -= 1
            return self._work.popleft()

    def _run(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while (job := self._next()) is not None:
            future, fn, args = job
            del job  # nothing of a finished call stays referenced while waiting
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
            del future, fn, args

    def close(self) -> None:
        """Let the threads exit once the queue is drained (at interpreter exit)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


_live_pools: Final[weakref.WeakSet[ElasticPool]] = weakref.WeakSet()


def _close_pools() -> None:
    for pool in list(_live_pools):
        pool.close()


def _forget_pools() -> None:
    # a forked child has none of the parent's threads, and a pool's lock
    # may have been held by one of them at the fork: never touch it again
    _live_pools.clear()


# run before the interpreter joins its threads at exit, as concurrent.futures
# does (an `atexit` hook would run only after that join, which waits for
# threads parked on their condition forever)
threading._register_atexit(_close_pools)  # type: ignore[attr-defined]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


# -- the process-wide pools ----------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PoolRole:
    """What a process-wide pool is for (the key of `shared_pool`)."""

    #: its threads' name prefix
    name: str
    #: threads kept when idle (asked when the pool is created)
    keep: Callable[[], int]
    #: run first in each of its threads
    initializer: Callable[[], None] | None = None


def shared_pool(role: PoolRole, threads: int) -> ElasticPool:
    """The process's pool for ``role``, created on first use (anew in a
    forked child) and grown to at least ``threads`` threads; those beyond
    ``role.keep()`` retire when idle (`ElasticPool`)."""
    if _pool_pid != os.getpid():
        _reset_after_fork()
    pool = _pools.get(role)
    if pool is None or pool.size < threads:
        with _pool_lock:
            pool = _pools.get(role)
            if pool is None:
                pool = ElasticPool(
                    threads, keep=role.keep(), name=role.name, initializer=role.initializer
                )
                _pools[role] = pool
            pool.grow(threads)
    return pool


def _mark_worker() -> None:
    _local.in_worker = True


def _cpus_here() -> int:
    """The CPUs this process may run on (its affinity mask): the compute
    threads kept when idle, at least as many as the default ``max_workers``
    asks for (`zarr_fused._cpus` caps it further by a cgroup quota)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


#: the compute threads of every parallel loop (`run_parallel`)
_COMPUTE: Final = PoolRole("zarr_fused", keep=_cpus_here, initializer=_mark_worker)


def get_pool(threads: int) -> ElasticPool:
    """The compute pool, grown to at least ``threads`` threads (>= 1)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return shared_pool(_COMPUTE, threads)


def pool_size() -> int:
    """Threads in the compute pool (0 when none was created in this process)."""
    pool = _pools.get(_COMPUTE) if _pool_pid == os.getpid() else None
    return 0 if pool is None else pool.size


def _reset_after_fork() -> None:
    global _pool_lock, _pool_pid, _hop
    _pools.clear()
    _pool_lock = threading.Lock()
    _pool_pid = os.getpid()
    _hop = None


# -- the hop off the event loop -----------------------------------------------------
#
# Every sync-API call of zarr runs on zarr's one event loop thread, so a batch
# is handed to another thread (compute on that loop would serialize all
# readers). `asyncio.to_thread` does that through `run_in_executor` and
# `wrap_future`, whose chained callbacks cost more than the read of one
# small chunk is worth (~15 us of ~60 us per hop on this project's benchmark
# machine). `off_loop` does the same hop with one executor submit and one
# `call_soon_threadsafe`. Its threads are not pool workers, so a batch they
# run still spreads over the pool.

_hop: ThreadPoolExecutor | None = None
_hop_pid = -1


def _hop_executor() -> ThreadPoolExecutor:
    global _hop, _hop_pid
    hop = _hop
    if hop is None or _hop_pid != os.getpid():
        with _pool_lock:
            if _hop is None or _hop_pid != os.getpid():
                # sized like asyncio's default executor, which it stands in for
                _hop = ThreadPoolExecutor(
                    max_workers=min(32, (os.cpu_count() or 1) + 4),
                    thread_name_prefix="zarr_fused-io",
                )
                _hop_pid = os.getpid()
            hop = _hop
    return hop


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():  # the awaiting task was cancelled: drop the outcome
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def off_loop[R](fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``await asyncio.to_thread(fn, *args, **kwargs)``, more cheaply.

    ``fn`` runs in another thread, in a copy of the caller's context; its
    result or exception comes back to the awaiting coroutine. As with
    `asyncio.to_thread`, cancelling the awaiting task does not stop ``fn``.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    context = contextvars.copy_context()

    def job() -> None:
        value: object
        try:
            value, ok = context.run(fn, *args, **kwargs), True
        except BaseException as exc:  # handed to the awaiting coroutine
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(_settle, future, ok, value)
        except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
            pass

    _hop_executor().submit(job)
    return await future


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def in_worker_thread() -> bool:
    """Whether the calling thread is one of zarr_fused's pool threads."""
    return getattr(_local, "in_worker", False)


def run_parallel[T, R](fn: Callable[[T], R], items: Sequence[T], max_workers: int) -> list[R]:
    """``[fn(x) for x in items]``, spread over up to ``max_workers`` threads.

    The calling thread works too, so ``max_workers`` threads run in all.
    Workers pull items from a shared counter (uneven chunk costs balance
    out). When an item fails, the others stop taking new items; every
    worker is waited for before the failure of the lowest-index item is
    raised, so nothing keeps running after this returns.
    """
    n = len(items)
    if max_workers <= 1 or n <= 1 or in_worker_thread():
        return [fn(item) for item in items]

    results: list[Any] = [None] * n
    errors: dict[int, BaseException] = {}
    counter = itertools.count()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            i = next(counter)
            if i >= n:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:
                errors[i] = exc
                stop.set()
                return

    helpers = min(max_workers, n) - 1
    pool = get_pool(helpers)
    futures = [pool.submit(work) for _ in range(helpers)]
    # The caller works as well; while it does, loops it starts run inline,
    # like those started in pool threads.
    was_worker = in_worker_thread()
    _local.in_worker = True
    try:
        work()
    finally:
        _local.in_worker = was_worker
        stop.set()
        # Helpers still queued behind other callers' work are not needed any
        # more: every item has been taken (or the batch failed).
        for fut in futures:
            fut.cancel()
        wait(futures)
    _raise_failure(futures, errors)
    return results


def _raise_failure(futures: list[Future[None]], errors: dict[int, BaseException]) -> None:
    """Raise what broke a helper, else the failure of the lowest-index item
    (noting how many others failed), else nothing."""
    for fut in futures:
        if fut.cancelled():
            continue
        broken = fut.exception()
        if broken is not None:  # work() itself failed, not fn
            raise broken
    if errors:
        first = min(errors)
        exc = errors[first]
        if len(errors) > 1:
            exc.add_note(f"({len(errors) - 1} other item(s) of this batch failed too)")
        raise exc


def partition(n: int, max_workers: int, *, max_group: int = 64) -> list[range]:
    """Split ``range(n)`` into consecutive groups for the pool.

    About four groups per worker, so uneven chunk costs still balance, and
    at most ``max_group`` items per group, so fetching a group's payloads
    overlaps other groups' decoding.
    """
    if n <= 0:
        return []
    size = max(1, min(max_group, -(-n // (4 * max(1, max_workers)))))
    return [range(start, min(n, start + size)) for start in range(0, n, size)]
