"""The thread pool: `zarr_fused._pool` (run_parallel, get_pool, fork reset, off_loop).

Fork is checked for real, in child processes.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from zarr_fused import _pool
from zarr_fused._pool import (
    PoolRole,
    get_pool,
    in_worker_thread,
    pool_size,
    run_parallel,
    shared_pool,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

# A generous bound for anything that could hang: a deadlock fails the test.
TIMEOUT = 30.0
# Forking a process that runs threads is exactly what these tests do on purpose.
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"


# -- run_parallel ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "max_workers"),
    [
        pytest.param(0, 4, id="empty"),
        pytest.param(1, 4, id="one-item"),
        pytest.param(50, 1, id="50-items-1-worker"),
        pytest.param(50, 2, id="50-items-2-workers"),
        pytest.param(50, 4, id="50-items-4-workers"),
        pytest.param(3, 16, id="more-workers-than-items"),
    ],
)
def test_run_parallel_keeps_input_order(n: int, max_workers: int) -> None:
    rng = np.random.default_rng(n * 100 + max_workers)
    items = [int(x) for x in rng.integers(0, 1000, size=n)]
    assert run_parallel(lambda x: (x, x * x), items, max_workers) == [(x, x * x) for x in items]


@pytest.mark.parametrize(
    ("n", "max_workers"),
    [
        pytest.param(10, 1, id="max_workers=1"),
        pytest.param(10, 0, id="max_workers=0"),
        pytest.param(1, 8, id="single-item"),
    ],
)
def test_run_parallel_inline_uses_no_pool(
    monkeypatch: pytest.MonkeyPatch, n: int, max_workers: int
) -> None:
    def no_pool(threads: int) -> Any:
        raise AssertionError(f"get_pool({threads}) called for an inline run")

    monkeypatch.setattr(_pool, "get_pool", no_pool)
    threads_before = set(threading.enumerate())
    idents: list[int] = []

    def fn(x: int) -> int:
        idents.append(threading.get_ident())
        return x + 1

    assert run_parallel(fn, list(range(n)), max_workers) == [x + 1 for x in range(n)]
    assert idents == [threading.get_ident()] * n
    assert set(threading.enumerate()) <= threads_before


def test_run_parallel_uses_workers_and_caller() -> None:
    """Three items each block until all three run: only three threads at once
    (the caller and two pool threads) can get past the barrier."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    idents: dict[int, int] = {}

    def fn(i: int) -> int:
        barrier.wait()
        idents[i] = threading.get_ident()
        return i

    assert run_parallel(fn, [0, 1, 2], 3) == [0, 1, 2]
    assert len(set(idents.values())) == 3
    assert threading.get_ident() in idents.values()
    assert pool_size() >= 2


def test_run_parallel_marks_threads_as_workers_only_while_running() -> None:
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def fn(i: int) -> bool:
        barrier.wait()
        return in_worker_thread()

    assert not in_worker_thread()
    assert run_parallel(fn, [0, 1], 2) == [True, True]
    assert not in_worker_thread()


class Recorder:
    """Which items started and ended, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: set[int] = set()
        self.ended: set[int] = set()

    def start(self, i: int) -> None:
        with self.lock:
            self.started.add(i)

    def end(self, i: int) -> None:
        with self.lock:
            self.ended.add(i)


def test_run_parallel_raises_lowest_index_failure() -> None:
    barrier = threading.Barrier(4, timeout=TIMEOUT)
    item3_failed = threading.Event()

    def fn(i: int) -> int:
        barrier.wait()
        if i == 3:
            item3_failed.set()
            raise ValueError("item 3")
        if i == 1:
            # item 3 fails first in time; item 1 still wins by index
            item3_failed.wait(TIMEOUT)
            time.sleep(0.02)
            raise KeyError("item 1")
        return i

    with pytest.raises(KeyError, match="item 1") as info:
        run_parallel(fn, [0, 1, 2, 3], 4)
    notes = getattr(info.value, "__notes__", [])
    assert any("1 other item" in note for note in notes), notes


def test_run_parallel_single_failure_has_no_note() -> None:
    barrier = threading.Barrier(3, timeout=TIMEOUT)

    def fn(i: int) -> int:
        barrier.wait()
        if i == 2:
            raise RuntimeError("only item 2")
        return i

    with pytest.raises(RuntimeError, match="only item 2") as info:
        run_parallel(fn, [0, 1, 2], 3)
    assert not getattr(info.value, "__notes__", [])


def test_run_parallel_inline_failure_propagates() -> None:
    seen: list[int] = []

    def fn(i: int) -> int:
        seen.append(i)
        if i == 2:
            raise ValueError("item 2")
        return i

    with pytest.raises(ValueError, match="item 2"):
        run_parallel(fn, list(range(6)), 1)
    assert seen == [0, 1, 2]


def test_run_parallel_waits_for_workers_before_raising() -> None:
    """Item 0 fails at once while items 1 and 2 are still running: the raise
    must come only after they ended, so nothing runs on after the call."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    rec = Recorder()

    def fn(i: int) -> int:
        rec.start(i)
        try:
            barrier.wait()
            if i == 0:
                raise OSError("item 0")
            time.sleep(0.3)
            return i
        finally:
            rec.end(i)

    with pytest.raises(OSError, match="item 0"):
        run_parallel(fn, [0, 1, 2], 3)
    with rec.lock:
        assert rec.started == {0, 1, 2}
        assert rec.ended == rec.started


def test_run_parallel_stops_taking_items_after_failure() -> None:
    rec = Recorder()
    n = 60

    def fn(i: int) -> int:
        rec.start(i)
        try:
            if i == 0:
                raise ValueError("item 0")
            time.sleep(0.02)
            return i
        finally:
            rec.end(i)

    with pytest.raises(ValueError, match="item 0"):
        run_parallel(fn, list(range(n)), 2)
    with rec.lock:
        assert rec.ended == rec.started
        assert len(rec.started) < n


def run_with_timeout(target: Any) -> Any:
    """Run ``target()`` in a daemon thread; fail (not hang) if it deadlocks."""
    result: dict[str, Any] = {}

    def runner() -> None:
        try:
            result["value"] = target()
        except BaseException as exc:  # reported in the test thread
            result["error"] = exc

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "deadlock: run_parallel did not return"
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.mark.parametrize(
    ("outer_workers", "inner_workers", "n"),
    [
        pytest.param(2, 2, 64, id="2x2"),
        pytest.param(4, 4, 32, id="4x4"),
        pytest.param(2, 8, 16, id="2x8"),
    ],
)
def test_run_parallel_nested_runs_inline(outer_workers: int, inner_workers: int, n: int) -> None:
    def inner(x: int) -> int:
        return threading.get_ident()

    def outer(i: int) -> tuple[int, list[int]]:
        return threading.get_ident(), run_parallel(inner, list(range(10)), inner_workers)

    results = run_with_timeout(lambda: run_parallel(outer, list(range(n)), outer_workers))
    assert len(results) == n
    for ident, inner_idents in results:
        assert inner_idents == [ident] * 10


def test_run_parallel_concurrent_callers_share_the_pool() -> None:
    """Several threads that each start a parallel loop: none deadlocks, each
    gets its own results."""

    def caller(k: int) -> list[int]:
        return run_parallel(lambda x: x * k, list(range(40)), 3)

    def all_callers() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(8)]

        def one(k: int) -> None:
            out[k] = caller(k)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        return out

    results = run_with_timeout(all_callers)
    assert results == [[x * k for x in range(40)] for k in range(8)]


# -- get_pool / pool_size ------------------------------------------------------------


def test_pool_only_grows_in_place() -> None:
    big = get_pool(4)
    assert pool_size() >= 4
    assert get_pool(2) is big
    assert pool_size() >= 4
    assert get_pool(1) is big
    size = pool_size()
    grown = get_pool(size + 1)
    assert pool_size() == size + 1
    assert grown is big  # grown in place
    assert get_pool(size) is grown


@pytest.mark.parametrize("threads", [pytest.param(0, id="0"), pytest.param(-2, id="-2")])
def test_get_pool_rejects_nonpositive(threads: int) -> None:
    with pytest.raises(ValueError, match="threads"):
        get_pool(threads)


def test_pool_resets_when_pid_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop for forks that bypass os.register_at_fork."""
    old = get_pool(2)
    monkeypatch.setattr(_pool, "_pool_pid", -1)
    assert pool_size() == 0
    fresh = get_pool(1)
    assert fresh is not old
    assert pool_size() == 1
    assert run_parallel(lambda x: -x, [1, 2, 3], 2) == [-1, -2, -3]


# -- shared_pool: one pool per role ---------------------------------------------------


#: set in the threads of the test role's pool, by its initializer
_role_marks = threading.local()


def _mark_role_thread() -> None:
    _role_marks.on = True


@pytest.fixture
def role() -> Iterator[PoolRole]:
    """A role of its own (no thread kept idle), its pool dropped afterwards."""
    made = PoolRole("zarr_fused-test-role", keep=lambda: 0, initializer=_mark_role_thread)
    yield made
    pool = _pool._pools.pop(made, None)
    if pool is not None:
        pool.set_idle(0.0)


def test_shared_pool_is_one_pool_per_role(role: PoolRole) -> None:
    pool = shared_pool(role, 2)
    assert shared_pool(role, 1) is pool
    assert pool is not get_pool(1)
    assert pool.keep == 0


def test_shared_pool_grows_in_place(role: PoolRole) -> None:
    pool = shared_pool(role, 1)
    assert shared_pool(role, 3) is pool
    assert pool.size == 3


def test_shared_pool_threads_carry_the_roles_name_and_setup(role: PoolRole) -> None:
    def where() -> tuple[str, bool]:
        return threading.current_thread().name, getattr(_role_marks, "on", False)

    name, marked = shared_pool(role, 1).submit(where).result(TIMEOUT)
    assert name.startswith("zarr_fused-test-role_")
    assert marked


def test_every_role_resets_when_pid_changes(
    role: PoolRole, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_role, old_compute = shared_pool(role, 1), get_pool(1)
    monkeypatch.setattr(_pool, "_pool_pid", -1)
    assert shared_pool(role, 1) is not old_role
    assert get_pool(1) is not old_compute


# -- fork ---------------------------------------------------------------------------


def _child_pool_check(conn: Any) -> None:
    """In a forked child: the pool is gone and a new one works."""
    try:
        size_at_start = pool_size()
        barrier = threading.Barrier(2, timeout=TIMEOUT)

        def fn(x: int) -> tuple[int, int]:
            if x < 2:
                barrier.wait()
            return x * 3, threading.get_ident()

        results = run_parallel(fn, list(range(10)), 2)
        conn.send(
            {
                "size_at_start": size_at_start,
                "values": [v for v, _ in results],
                "threads": len({t for _, t in results}),
                "size_after": pool_size(),
            }
        )
    except BaseException as exc:
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def _warm_pool() -> None:
    """Pool threads alive (and idle) in the parent."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    run_parallel(lambda i: barrier.wait(), [0, 1, 2], 3)
    assert pool_size() >= 2
    assert any(t.name.startswith("zarr_fused") for t in threading.enumerate())


def check_child_result(result: dict[str, Any]) -> None:
    assert "error" not in result, result
    assert result["size_at_start"] == 0
    assert result["values"] == [x * 3 for x in range(10)]
    assert result["threads"] == 2
    assert result["size_after"] >= 1


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available")
def test_os_fork_child_gets_a_fresh_pool() -> None:
    _warm_pool()
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            read_end.close()
            _child_pool_check(write_end)
            code = 0
        finally:
            os._exit(code)
    write_end.close()
    try:
        assert read_end.poll(TIMEOUT), "the forked child did not answer"
        result = read_end.recv()
    finally:
        deadline = time.monotonic() + TIMEOUT
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child did not exit")
            time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    check_child_result(result)
    assert pool_size() >= 2  # the parent's pool is untouched


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
def test_multiprocessing_fork_child_gets_a_fresh_pool() -> None:
    _warm_pool()
    ctx = multiprocessing.get_context("fork")
    read_end, write_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_pool_check, args=(write_end,))
    proc.start()
    write_end.close()
    try:
        assert read_end.poll(TIMEOUT), "the forked child did not answer"
        result = read_end.recv()
        proc.join(TIMEOUT)
        assert not proc.is_alive()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 0
    check_child_result(result)


# -- the hop off the event loop ------------------------------------------------------


def test_off_loop_returns_the_result_from_another_thread() -> None:
    import asyncio

    from zarr_fused._pool import in_worker_thread, off_loop

    def work(a: int, *, b: int) -> tuple[int, int, bool]:
        return a + b, threading.get_ident(), in_worker_thread()

    async def main() -> tuple[tuple[int, int, bool], int]:
        return await off_loop(work, 2, b=3), threading.get_ident()

    (value, worker, in_pool), loop_thread = asyncio.run(main())
    assert value == 5
    assert worker != loop_thread
    assert not in_pool  # a batch run there still spreads over the pool


def test_off_loop_raises_the_exception_and_carries_the_context() -> None:
    import asyncio
    import contextvars

    from zarr_fused._pool import off_loop

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def boom() -> None:
        raise KeyError(var.get())

    async def main() -> None:
        var.set("caller's")
        with pytest.raises(KeyError, match="caller's"):
            await off_loop(boom)

    asyncio.run(main())


def test_off_loop_cancelled_waiter_leaves_no_error() -> None:
    import asyncio

    from zarr_fused._pool import off_loop

    release = threading.Event()
    finished = threading.Event()

    def slow() -> int:
        release.wait(5)
        finished.set()
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(off_loop(slow))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        assert await asyncio.to_thread(finished.wait, 5)
        await asyncio.sleep(0.05)  # the late result reaches the loop and is dropped

    loop = asyncio.new_event_loop()
    errors: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert errors == []


# -- idle threads retire ------------------------------------------------------------


def _busy_threads(pool: _pool.ElasticPool, n: int) -> None:
    """``n`` calls that all run at once: ``n`` threads of ``pool`` started."""
    barrier = threading.Barrier(n + 1, timeout=TIMEOUT)
    futures = [pool.submit(barrier.wait) for _ in range(n)]
    barrier.wait()
    for future in futures:
        future.result(timeout=TIMEOUT)


def _threads_drop_to(pool: _pool.ElasticPool, n: int) -> int:
    """Wait (at most TIMEOUT) until ``pool`` runs ``n`` threads; the count then."""
    deadline = time.monotonic() + TIMEOUT
    while pool.threads > n and time.monotonic() < deadline:
        time.sleep(0.01)
    return pool.threads


def test_idle_threads_beyond_keep_retire_and_later_work_runs() -> None:
    pool = _pool.ElasticPool(48, keep=3, name="zarr_fused-test")
    try:
        _busy_threads(pool, 48)
        assert pool.threads == 48
        pool.set_idle(0.05)
        # work submitted while threads retire: none lost, none stuck
        futures = [pool.submit(lambda x: x * 2, i) for i in range(200)]
        assert [f.result(timeout=TIMEOUT) for f in futures] == [2 * i for i in range(200)]
        assert _threads_drop_to(pool, 3) == 3
        assert sum(t.name.startswith("zarr_fused-test_") for t in threading.enumerate()) <= 3
        _busy_threads(pool, 10)  # grows again on demand
        assert pool.threads >= 10
    finally:
        pool.close()


def test_compute_pool_returns_to_the_cpu_count_after_a_high_setting() -> None:
    keep = _pool._cpus_here()
    pool = get_pool(keep + 20)
    try:
        barrier = threading.Barrier(keep + 20, timeout=TIMEOUT)
        run_parallel(lambda _: barrier.wait(), list(range(keep + 20)), keep + 20)
        assert pool.threads >= keep + 19
        pool.set_idle(0.05)
        assert _threads_drop_to(pool, keep) == keep
        assert run_parallel(lambda x: -x, list(range(50)), keep + 20) == [-x for x in range(50)]
    finally:
        pool.set_idle(_pool.IDLE_SECONDS)


def test_interpreter_exits_with_idle_and_queued_pool_work() -> None:
    """Idle threads (kept ones wait without a timeout) do not hold up the
    exit, and calls queued at exit still run."""
    import subprocess
    import sys

    code = (
        "import threading, time\n"
        "from zarr_fused._pool import ElasticPool\n"
        "pool = ElasticPool(4, keep=4, name='zarr_fused-exit')\n"
        "[f.result() for f in [pool.submit(time.sleep, 0.01) for _ in range(8)]]\n"
        "pool.submit(time.sleep, 0.2)\n"
        "pool.submit(lambda: print('ran at exit', flush=True))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran at exit"
