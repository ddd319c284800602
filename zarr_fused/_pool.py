"""Thread pool of zarr_fused: the pool itself, the hop off the event loop,
fork safety.

Every parallel loop runs through `run_parallel`; how many threads it gets
is decided by `zarr_fused._cpus.resolve_max_workers`. The pool is
module-global, grows on demand and never shrinks: a pool is never shut down
while another thread may still submit to it (``shutdown`` would make that
submit raise); a replaced pool finishes its work and is collected once
unreferenced.

Fork: executor threads do not survive ``fork()``; a child inheriting the
parent's pool object would queue work that no thread ever runs, and it may
inherit the pool lock in a locked state. ``os.register_at_fork`` drops both
in the child; a pid check in `get_pool` is the backstop for forks that
bypass the hook (``os.fork`` from C code). No OpenMP is used anywhere for
the same reason: its runtime is not fork-safe.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "get_pool",
    "in_worker_thread",
    "off_loop",
    "partition",
    "pool_size",
    "run_parallel",
]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = os.getpid()
_pool_lock = threading.Lock()
# Set in pool worker threads, so a parallel loop started from inside another
# one runs inline instead of waiting on the pool it occupies (deadlock).
_local = threading.local()


# -- the pool ---------------------------------------------------------------------


def _mark_worker() -> None:
    _local.in_worker = True


def get_pool(threads: int) -> ThreadPoolExecutor:
    """The shared pool, grown to at least ``threads`` threads (>= 1)."""
    global _pool, _pool_size
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if _pool_pid != os.getpid():
        _reset_after_fork()
    pool = _pool
    if pool is None or _pool_size < threads:
        with _pool_lock:
            if _pool is None or _pool_size < threads:
                _pool = ThreadPoolExecutor(
                    max_workers=threads,
                    thread_name_prefix="zarr_fused",
                    initializer=_mark_worker,
                )
                _pool_size = threads
            pool = _pool
    return pool


def pool_size() -> int:
    """Threads in the current pool (0 when none was created in this process)."""
    return _pool_size if _pool_pid == os.getpid() else 0


def _reset_after_fork() -> None:
    global _pool, _pool_size, _pool_lock, _pool_pid, _hop
    _pool = None
    _pool_size = 0
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
