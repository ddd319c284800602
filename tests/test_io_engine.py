"""The IO layer: IO threads apart from compute, pipelined unsharded reads.

Two kinds of tests. The engine (`zarr_fused.io.engine.run_pipelined`) is
driven in-process with Python fetch/consume functions that coordinate
through events, so ordering, bounds and cancellation are checked without
timing anything. The reads go through zarr with the faultfs shim preloaded
in a long-lived child (``tests/shims``): in its delay mode every open/read
of the array's files waits, as on a network filesystem, and in its error
mode one chunk file fails; zarr's own pipeline (run here, without the shim)
is the oracle.
"""

from __future__ import annotations

import errno
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from shims import FaultyChild, build_faultfs
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.errors import ZarrUserWarning
from zarr.storage import LocalStore

from zarr_fused import _pool
from zarr_fused.chunks.pipelined import (
    MAX_GROUP,
    REQUESTS_PER_THREAD,
    REQUESTS_PER_THREAD_SLOW,
    group_size,
)
from zarr_fused.config import SHARD_WRITE_LOCK_KEY
from zarr_fused.io import engine as _io_engine
from zarr_fused.io.engine import (
    DEFAULT_IO_CONCURRENCY,
    IO_CONCURRENCY_CAP,
    IO_CONCURRENCY_KEY,
    Writes,
    resolve_io_concurrency,
    run_pipelined,
    write_window,
)
from zarr_fused.io.probe import FAST_CALL, FAST_FILE, PROBE_FILES
from zarr_fused.io.shard_lock import LOCK_FILE

from helpers import BATCHED, FUSED, with_pipeline

TIMEOUT = 120.0
WAIT = 30.0  # how long an event may take before a test calls it lost (never a timing claim)

# -- the setting ------------------------------------------------------------------------


def test_io_concurrency_default() -> None:
    with zarr.config.set({IO_CONCURRENCY_KEY: None}):
        assert resolve_io_concurrency() == DEFAULT_IO_CONCURRENCY


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(8, 8, id="int"),
        pytest.param(" 64 ", 64, id="env-string"),
        pytest.param(np.int64(3), 3, id="numpy-int"),
        pytest.param(1, 1, id="one"),
    ],
)
def test_io_concurrency_valid(value: Any, expected: int) -> None:
    with zarr.config.set({IO_CONCURRENCY_KEY: value}):
        assert resolve_io_concurrency() == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(0, id="zero"),
        pytest.param("many", id="word"),
        pytest.param(True, id="bool"),
        pytest.param(2.5, id="float"),
    ],
)
def test_io_concurrency_invalid_warns_and_uses_default(value: Any) -> None:
    with zarr.config.set({IO_CONCURRENCY_KEY: value}), pytest.warns(ZarrUserWarning):
        assert resolve_io_concurrency() == DEFAULT_IO_CONCURRENCY


def test_io_concurrency_above_cap_is_clamped() -> None:
    with (
        zarr.config.set({IO_CONCURRENCY_KEY: IO_CONCURRENCY_CAP + 1}),
        pytest.warns(ZarrUserWarning),
    ):
        assert resolve_io_concurrency() == IO_CONCURRENCY_CAP


@pytest.mark.parametrize(
    ("n", "io", "bound", "expected"),
    [
        pytest.param(1024, 32, 16 << 10, 8, id="1024-files"),
        pytest.param(10, 32, 16 << 10, 1, id="few-files"),
        pytest.param(100_000, 32, 16 << 10, MAX_GROUP, id="many-files"),
        pytest.param(1024, 32, 8 << 20, 1, id="large-chunks"),
    ],
)
def test_group_size(n: int, io: int, bound: int, expected: int) -> None:
    assert group_size(n, io, bound) == expected


# -- the engine, in-process ---------------------------------------------------------------


def _snapshot() -> tuple[set[str], set[str]]:
    """Names of the live threads and this process's open descriptors."""
    import os

    return {t.name for t in threading.enumerate()}, set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    "workers", [pytest.param(1, id="1-worker"), pytest.param(2, id="2-workers")]
)
def test_consumes_in_completion_order_without_a_barrier(workers: int) -> None:
    # request 0's fetch cannot finish until request 1 has been consumed: a
    # reader that fetched everything before decoding anything would stall
    consumed_1 = threading.Event()
    order: list[int] = []

    def fetch(i: int, batch: Any) -> int:
        if i == 0:
            assert consumed_1.wait(WAIT), "request 1 was not consumed while 0 was in flight"
        return i * 10

    def consume(i: int, fetched: int) -> None:
        assert fetched == i * 10
        order.append(i)
        if i == 1:
            consumed_1.set()

    run_pipelined([0, 1], [1, 1], fetch, consume, io_concurrency=2, max_workers=workers)
    assert order == [1, 0]


def test_bytes_in_flight_stay_within_the_budget() -> None:
    rng = np.random.default_rng(5)
    costs = [int(c) for c in rng.integers(1, 40, size=200)]
    budget = 100
    lock = threading.Lock()
    held = [0, 0]  # now, most

    def fetch(i: int, batch: Any) -> int:
        with lock:
            held[0] += costs[i]
            held[1] = max(held[1], held[0])
        return i

    def consume(i: int, fetched: int) -> None:
        with lock:
            held[0] -= costs[i]

    run_pipelined(
        list(range(200)), costs, fetch, consume, io_concurrency=8, max_workers=2, budget=budget
    )
    assert held == [0, held[1]]
    assert 0 < held[1] <= budget


def test_one_request_larger_than_the_budget_still_runs() -> None:
    got: list[int] = []
    run_pipelined(
        [0, 1],
        [500, 500],
        lambda i, b: i,
        lambda i, f: got.append(f),
        io_concurrency=4,
        max_workers=1,
        budget=100,
    )
    assert sorted(got) == [0, 1]


@pytest.mark.parametrize(
    "where", [pytest.param("fetch", id="fetch-fails"), pytest.param("consume", id="consume-fails")]
)
def test_first_error_cancels_the_rest_and_waits_for_running_fetches(where: str) -> None:
    n = 400
    running = [0]
    fetched: list[int] = []
    consumed: list[int] = []
    lock = threading.Lock()
    failing = 3
    release = threading.Event()

    def fetch(i: int, batch: Any) -> int:
        with lock:
            running[0] += 1
        try:
            if i == failing and where == "fetch":
                raise OSError(errno.EIO, "injected", f"key-{i}")
            if i != failing:
                release.wait(0.01)  # stays in flight a little, like a round trip
            with lock:
                fetched.append(i)
            return i
        finally:
            with lock:
                running[0] -= 1

    def consume(i: int, value: int) -> None:
        if i == failing and where == "consume":
            raise OSError(errno.EIO, "injected", f"key-{i}")
        consumed.append(i)

    before = _snapshot()
    with pytest.raises(OSError, match="key-3") as info:
        run_pipelined(list(range(n)), [1] * n, fetch, consume, io_concurrency=4, max_workers=2)
    assert info.value.errno == errno.EIO
    assert running[0] == 0  # nothing still reading after the error surfaced
    assert len(fetched) < n - 1  # the rest was cancelled, not fetched
    assert failing not in consumed
    threads, fds = _snapshot()
    assert fds == before[1]
    assert threads <= before[0] | {t for t in threads if t.startswith("zarr_fused")}


def test_io_threads_are_shared_and_bounded() -> None:
    def run() -> None:
        run_pipelined(
            list(range(50)),
            [1] * 50,
            lambda i, b: i,
            lambda i, f: None,
            io_concurrency=3,
            max_workers=2,
        )

    run()
    # no thread retires meanwhile: the same threads serve every run
    _io_engine.io_threads(1).set_idle(3600)
    _pool.get_pool(1).set_idle(3600)
    try:
        before = {t.name for t in threading.enumerate()}
        for _ in range(5):
            run()
        after = {t.name for t in threading.enumerate()}
    finally:
        _io_engine.io_threads(1).set_idle(_pool.IDLE_SECONDS)
        _pool.get_pool(1).set_idle(_pool.IDLE_SECONDS)
    assert after == before
    assert len([t for t in after if t.startswith("zarr_fused-fileio")]) <= max(
        3, _io_engine.io_threads(1).size
    )


# -- reads through zarr, with the shim in a child ---------------------------------------

LAYOUTS = {
    "blosc": {"chunks": (8, 8), "compressors": BloscCodec(cname="lz4", clevel=1)},
    "zstd": {"chunks": (8, 8), "compressors": ZstdCodec(level=1)},
    "raw": {"chunks": (8, 8), "compressors": None},
}
SHAPE = (64, 64)  # 8 x 8 chunk files: keys c/i/j with one digit each

# The start of every script run in the child (READ, WRITE): the threads and
# descriptors of the process (`snapshot`), every compute, IO and hop thread
# started before they are taken (`start_threads`), a failure as the parent
# reads it, and zarr_fused selected with the script's thread counts.
CHILD_COMMON = r"""
import os, threading
import numpy as np, zarr
from zarr.storage import LocalStore
from zarr_fused import _pool
from zarr_fused.io import engine as _io_engine

def _kept(fd):
    # lock files of partial shard writes stay open by design, one per
    # directory (zarr_fused.io.shard_lock); the listing's own descriptor
    # (closed by now) takes the lowest free number, which they shift
    try:
        return os.readlink("/proc/self/fd/" + fd).endswith("/.zarr_fused.lock")
    except OSError:
        return True

def snapshot():
    return (sorted([t.ident, t.name] for t in threading.enumerate()),
            sorted(fd for fd in os.listdir("/proc/self/fd") if not _kept(fd)))

def fill(pool, n):
    # every thread of the pool started (executors start them lazily), so
    # that what a read or write adds afterwards shows
    barrier = threading.Barrier(n + 1)
    futures = [pool.submit(barrier.wait, 30) for _ in range(n)]
    barrier.wait(30)
    for f in futures:
        f.result()

def start_threads():
    # none of them retires while the script runs (the snapshots compare threads)
    io_pool = _io_engine.io_threads(args["io"])
    io_pool.set_idle(3600)
    fill(io_pool, io_pool.size)
    if args["workers"] > 1:
        _pool.get_pool(args["workers"] - 1).set_idle(3600)
        fill(_pool.get_pool(args["workers"] - 1), _pool.pool_size())
    hop = _pool._hop_executor()  # the hop off zarr's event loop (its own bounded pool)
    fill(hop, hop._max_workers)

def failure(e):
    return {"type": type(e).__name__, "errno": getattr(e, "errno", None), "message": str(e)}

config = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
          "codec_pipeline.max_workers": args["workers"],
          "codec_pipeline.io_concurrency": args["io"]}
"""

# Runs in the child after CHILD_COMMON: reads through zarr_fused, returns the
# result's path, and the threads and descriptors before (after a warm-up
# read) and after.
READ = r"""
def force_io(reader):
    # each read through the IO threads, however fast the files answer
    # (the readers otherwise read fast files directly)
    probe(reader).latency = None

def probe(reader):
    return reader.probe if hasattr(reader, "probe") else reader.io.probe

def seen(reader):
    return probe(reader).latency

with zarr.config.set(config):
    arr = zarr.open_array(LocalStore(args["root"]), mode="r")
    plan_reader = arr._async_array.codec_pipeline.plan.reader
    reader = type(plan_reader).__name__
    arr[0:1, 0:1]
    start_threads()
    before = snapshot()
    outcome = None
    measured = []
    try:
        for k in range(args["repeat"]):
            for i, sel in enumerate(args["selections"]):  # expressions over arr
                force_io(plan_reader)
                np.save(args["result"] + f"-{i}.npy", eval(sel, {"arr": arr, "np": np}))
                measured.append(seen(plan_reader))
        arr[...]  # once more, as the reader chooses
    except Exception as e:
        outcome = failure(e)
    result = {"reader": reader, "seconds_per_file": seen(plan_reader), "measured": measured,
              "before": before, "after": snapshot(), "error": outcome,
              "io_threads": sum(t.name.startswith("zarr_fused-fileio")
                                for t in threading.enumerate())}
"""


@pytest.fixture(scope="module")
def shim_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyChild]:
    with FaultyChild(build_faultfs(tmp_path_factory.mktemp("faultfs")), timeout=TIMEOUT) as child:
        yield child


def make_array(
    root: Path,
    layout: str,
    seed: int,
    shape: tuple[int, ...] = SHAPE,
    missing: tuple[str, ...] = (),
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(-(2**20), 2**20, size=shape, dtype="int32")
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(root), shape=shape, dtype=data.dtype, fill_value=7, **LAYOUTS[layout]
        )
        arr[...] = data
    for key in missing:
        (root / key).unlink()
    return data


def oracle(root: Path, selection: tuple[slice, ...]) -> np.ndarray:
    with with_pipeline(BATCHED):
        return zarr.open_array(LocalStore(root), mode="r")[selection]


def delayed(root: Path, delay_us: int, ops: str = "open,read") -> dict[str, object]:
    """The shim's faults for a slow file system: every call of ``ops`` on a
    file under ``root`` waits ``delay_us`` microseconds, then succeeds."""
    return {"marker": root, "ops": ops, "mode": "delay", "delay_us": delay_us}


def run_reads(
    child: FaultyChild,
    tmp_path: Path,
    root: Path,
    selections: list[tuple[slice, ...]] | list[str],
    *,
    workers: int = 2,
    io: int = 8,
    repeat: int = 1,
    reader: str = "PipelinedChunkReader",
    **faults: object,
) -> dict[str, Any]:
    args = {
        "root": str(root),
        "workers": workers,
        "io": io,
        "repeat": repeat,
        # expressions over the array ``arr``, evaluated in the child
        "selections": [sel if isinstance(sel, str) else f"arr[{sel!r}]" for sel in selections],
        "result": str(tmp_path / "result"),
    }
    answer = child.run(CHILD_COMMON + READ, args, **faults)
    assert answer["ok"], answer.get("traceback")
    result: dict[str, Any] = answer["result"]
    assert result["reader"] == reader, result
    return result


def assert_fault_named(
    result: dict[str, Any], number: int, target: str, root: Path, data: np.ndarray
) -> None:
    """The injected fault surfaced with its errno, naming ``target``; nothing
    was left behind, and the data is still there and readable."""
    assert result["error"] is not None, "the fault did not surface"
    assert result["error"]["errno"] == number, result["error"]
    assert target in result["error"]["message"], result["error"]
    assert_nothing_left(result)
    with with_pipeline(FUSED):
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], data)


def assert_nothing_left(result: dict[str, Any]) -> None:
    threads_before, fds_before = result["before"]
    threads_after, fds_after = result["after"]
    assert fds_after == fds_before, "descriptors left behind"
    new = [t for t in threads_after if t not in threads_before]
    assert new == [], f"threads left behind: {new}"


WHOLE = (slice(None), slice(None))
SELECTIONS = [
    pytest.param(WHOLE, id="whole"),
    pytest.param((slice(3, 61), slice(5, 40)), id="partial-chunks"),
    pytest.param((slice(1, 60, 3), slice(None, None, 5)), id="strided"),
    pytest.param((slice(8, 16), slice(56, 64)), id="one-chunk"),
]


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_values_under_latency_equal_zarrs(
    tmp_path: Path, shim_child: FaultyChild, layout: str, selection: tuple[slice, ...]
) -> None:
    root = tmp_path / "arr"
    make_array(root, layout, seed=21, missing=("c/2/3", "c/7/7"))
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [selection],
        **delayed(root, 300),
    )
    assert result["error"] is None, result["error"]
    np.testing.assert_array_equal(np.load(tmp_path / "result-0.npy"), oracle(root, selection))
    assert_nothing_left(result)


def test_slow_files_keep_the_reads_on_the_io_threads(
    tmp_path: Path, shim_child: FaultyChild
) -> None:
    root = tmp_path / "arr"
    make_array(root, "blosc", seed=25)
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [WHOLE],
        **delayed(root, 200),
    )
    assert result["error"] is None, result["error"]
    # every file waited 2 x 200 us (open, pread): far above FAST_FILE
    assert result["seconds_per_file"] >= FAST_FILE


@pytest.mark.parametrize(
    "workers", [pytest.param(1, id="1-worker"), pytest.param(2, id="2-workers")]
)
def test_values_with_one_io_thread_in_flight_per_read(
    tmp_path: Path, shim_child: FaultyChild, workers: int
) -> None:
    root = tmp_path / "arr"
    make_array(root, "zstd", seed=22)
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [WHOLE],
        workers=workers,
        io=2,
        **delayed(root, 100),
    )
    assert result["error"] is None, result["error"]
    np.testing.assert_array_equal(np.load(tmp_path / "result-0.npy"), oracle(root, WHOLE))
    assert_nothing_left(result)


TARGET = "c/5/2"
READ_FAULTS = [
    pytest.param("open", "EACCES", id="open-EACCES"),
    pytest.param("open", "EIO", id="open-EIO"),
    pytest.param("read", "EIO", id="read-EIO"),
    # what NFS answers for a file removed while a client reads it
    pytest.param("read", "ESTALE", id="vanished-ESTALE"),
]


@pytest.mark.parametrize(("ops", "code"), READ_FAULTS)
def test_fault_in_flight_names_the_key_and_leaves_nothing(
    tmp_path: Path, shim_child: FaultyChild, ops: str, code: str
) -> None:
    root = tmp_path / "arr"
    data = make_array(root, "zstd", seed=23)
    number = getattr(errno, code)
    result = run_reads(
        shim_child, tmp_path, root, [WHOLE], marker=root / TARGET, ops=ops, errno=number
    )
    assert_fault_named(result, number, TARGET, root, data)


def test_stress_thousands_of_reads_under_latency_leave_nothing(
    tmp_path: Path, shim_child: FaultyChild
) -> None:
    root = tmp_path / "arr"
    shape = (256, 256)  # 4096 chunk files of 4 x 4
    rng = np.random.default_rng(24)
    data = rng.integers(0, 2**30, size=shape, dtype="int32")
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(root),
            shape=shape,
            dtype="int32",
            chunks=(4, 4),
            compressors=ZstdCodec(level=1),
            fill_value=0,
        )
        arr[...] = data
    starts = rng.integers(0, 200, size=(6, 2))
    selections = [WHOLE] + [
        (slice(int(a), int(a) + 50), slice(int(b), int(b) + 50)) for a, b in starts
    ]
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        selections,
        io=64,
        repeat=2,
        **delayed(root, 50),
    )
    assert result["error"] is None, result["error"]
    for i, sel in enumerate(selections):
        np.testing.assert_array_equal(np.load(tmp_path / f"result-{i}.npy"), data[sel])
    assert_nothing_left(result)


def test_forked_child_gets_fresh_io_threads() -> None:
    import os
    import signal
    import time
    import warnings

    run_pipelined(
        list(range(20)),
        [1] * 20,
        lambda i, b: i,
        lambda i, f: None,
        io_concurrency=4,
        max_workers=1,
    )  # the parent's IO pool exists
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: the inherited pool has no threads
        code = 2
        try:
            got: list[int] = []
            run_pipelined(
                list(range(20)),
                [1] * 20,
                lambda i, b: i,
                lambda i, f: got.append(f),
                io_concurrency=4,
                max_workers=1,
            )
            code = 0 if sorted(got) == list(range(20)) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + WAIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the inherited IO pool")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


# -- sharded reads through the IO threads ------------------------------------------------

SHARDED = "ShardReader"
INNER = (4, 4)
SHARD = (16, 16)  # 4 x 4 shard files of 4 x 4 inner chunks: keys c/i/j, one digit each
#: one shard not stored, and one inner chunk of another (all fill value)
GONE_SHARD = "c/1/2"
FILL_BOX = (slice(0, 4), slice(4, 8))  # inner chunk (0, 1) of shard c/0/0


def make_sharded(
    root: Path, seed: int, *, checksum: bool = True, shape: tuple[int, ...] = SHAPE
) -> np.ndarray:
    """A sharded int32 array (zstd inner chunks; the index with or without
    its crc32c), one shard and one inner chunk missing; its values."""
    rng = np.random.default_rng(seed)
    data = rng.integers(-(2**20), 2**20, size=shape, dtype="int32")
    data[FILL_BOX] = 7
    index_codecs = [BytesCodec(), Crc32cCodec()] if checksum else [BytesCodec()]
    serializer = ShardingCodec(
        chunk_shape=INNER, codecs=[BytesCodec(), ZstdCodec(level=1)], index_codecs=index_codecs
    )
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(root),
            shape=shape,
            dtype=data.dtype,
            chunks=SHARD,
            serializer=serializer,
            compressors=None,
            fill_value=7,
        )
        arr[...] = data
    (root / GONE_SHARD).unlink()
    data[16:32, 32:48] = 7
    return data


def sharded_oracle(root: Path, expression: str) -> np.ndarray:
    with with_pipeline(BATCHED):
        arr = zarr.open_array(LocalStore(root), mode="r")
        return np.asarray(eval(expression, {"arr": arr, "np": np}))


MASK = "np.random.default_rng(3).random((64, 64)) < 0.3"
SHARDED_SELECTIONS = [
    # (expression over arr, whether it touches enough shards to be pipelined)
    pytest.param("arr[...]", True, id="whole-shards"),
    pytest.param("arr[5:6]", True, id="thin-slab"),
    pytest.param("arr[3:61, 5:40]", True, id="partial-shards"),
    pytest.param("arr[1:60:3, ::5]", True, id="strided"),
    pytest.param("arr[17:19, 33:35]", False, id="one-inner-chunk"),
    pytest.param("arr[16:32, 32:48]", False, id="missing-shard"),
    pytest.param("arr.oindex[[1, 20, 40, 63], [0, 17, 33, 62]]", True, id="oindex"),
    pytest.param("arr.vindex[[1, 20, 40, 63], [0, 17, 33, 62]]", True, id="vindex"),
    pytest.param(f"arr.vindex[{MASK}]", True, id="mask"),
    pytest.param("arr[0, :]", True, id="drop-axis"),
]


@pytest.mark.parametrize(("expression", "pipelined"), SHARDED_SELECTIONS)
def test_sharded_values_under_latency_equal_zarrs(
    tmp_path: Path, shim_child: FaultyChild, expression: str, pipelined: bool
) -> None:
    root = tmp_path / "arr"
    make_sharded(root, seed=31)
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [expression],
        reader=SHARDED,
        **delayed(root, 300),
    )
    assert result["error"] is None, result["error"]
    expected = sharded_oracle(root, expression)
    np.testing.assert_array_equal(np.load(tmp_path / "result-0.npy"), expected)
    # the shards went through the IO threads (a measured read), or, with
    # fewer shards than the workers can take shard by shard, did not
    assert (result["measured"][0] is not None) == pipelined, result["measured"]
    assert_nothing_left(result)


@pytest.mark.parametrize(
    ("workers", "io"),
    [pytest.param(1, 2, id="1-worker-2-io"), pytest.param(2, 32, id="2-workers-32-io")],
)
def test_sharded_slow_files_keep_the_reads_on_the_io_threads(
    tmp_path: Path, shim_child: FaultyChild, workers: int, io: int
) -> None:
    root = tmp_path / "arr"
    data = make_sharded(root, seed=32)
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        ["arr[5:6]"],
        workers=workers,
        io=io,
        reader=SHARDED,
        **delayed(root, 200),
    )
    assert result["error"] is None, result["error"]
    np.testing.assert_array_equal(np.load(tmp_path / "result-0.npy"), data[5:6])
    # every shard waited 3 x 200 us (open, index, ranges): far above FAST_CALL
    assert result["seconds_per_file"] >= FAST_CALL
    assert_nothing_left(result)


def _corrupt_entry(path: Path, entry: int, offset: int, length: int) -> None:
    """Overwrite one ``(offset, nbytes)`` entry of the index at the end of
    a shard without a checksum."""
    raw = bytearray(path.read_bytes())
    start = len(raw) - 16 * (SHARD[0] // INNER[0]) * (SHARD[1] // INNER[1]) + 16 * entry
    raw[start : start + 16] = np.array([offset, length], dtype="<u8").tobytes()
    path.write_bytes(bytes(raw))


BAD_SHARDS = [
    # (how the shard at c/2/1 is broken, the selection, the index's checksum)
    pytest.param("length-past-end", "arr[...]", False, id="length-past-end-whole"),
    pytest.param("length-past-end", "arr[32:33]", False, id="length-past-end-partial"),
    pytest.param("offset-overflow", "arr[32:33]", False, id="offset-overflow-partial"),
    pytest.param("truncated", "arr[32:33]", True, id="truncated-partial"),
    pytest.param("truncated", "arr[...]", True, id="truncated-whole"),
    pytest.param("bad-checksum", "arr[32:33]", True, id="bad-checksum-partial"),
]


@pytest.mark.parametrize(("damage", "expression", "checksum"), BAD_SHARDS)
def test_sharded_crafted_bad_index_under_latency_names_the_key(
    tmp_path: Path, shim_child: FaultyChild, damage: str, expression: str, checksum: bool
) -> None:
    root = tmp_path / "arr"
    make_sharded(root, seed=33, checksum=checksum)
    path = root / "c" / "2" / "1"
    if damage == "length-past-end":
        _corrupt_entry(path, 0, 0, path.stat().st_size + 100)
    elif damage == "offset-overflow":
        _corrupt_entry(path, 0, 2**64 - 10, 20)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [expression],
        reader=SHARDED,
        **delayed(root, 200),
    )
    assert result["error"] is not None, "the bad index did not surface"
    assert result["error"]["type"] == "CorruptShardError", result["error"]
    assert "c/2/1" in result["error"]["message"], result["error"]
    assert_nothing_left(result)


SHARD_TARGET = "c/2/1"


@pytest.mark.parametrize("expression", ["arr[...]", "arr[32:33]"], ids=["whole", "partial"])
@pytest.mark.parametrize(("ops", "code"), READ_FAULTS)
def test_sharded_fault_in_flight_names_the_key_and_leaves_nothing(
    tmp_path: Path, shim_child: FaultyChild, ops: str, code: str, expression: str
) -> None:
    root = tmp_path / "arr"
    data = make_sharded(root, seed=34)
    number = getattr(errno, code)
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        [expression],
        reader=SHARDED,
        marker=root / SHARD_TARGET,
        ops=ops,
        errno=number,
    )
    assert_fault_named(result, number, SHARD_TARGET, root, data)


def test_sharded_stress_many_reads_under_latency_leave_nothing(
    tmp_path: Path, shim_child: FaultyChild
) -> None:
    root = tmp_path / "arr"
    shape = (256, 256)  # 256 shard files of 16 inner chunks
    data = make_sharded(root, seed=35, shape=shape)
    rng = np.random.default_rng(35)
    starts = rng.integers(0, 200, size=(6, 2))
    selections = ["arr[...]"] + [f"arr[{a}:{a + 50}, {b}:{b + 50}]" for a, b in starts.tolist()]
    result = run_reads(
        shim_child,
        tmp_path,
        root,
        selections,
        io=64,
        repeat=2,
        reader=SHARDED,
        **delayed(root, 50),
    )
    assert result["error"] is None, result["error"]
    for i, expression in enumerate(selections):
        expected = eval(expression, {"arr": data, "np": np})
        np.testing.assert_array_equal(np.load(tmp_path / f"result-{i}.npy"), expected)
    assert_nothing_left(result)


# -- writes behind the compute threads: the engine, in-process ---------------------------


def test_write_parcels_hold_at_most_the_budget() -> None:
    rng = np.random.default_rng(40)
    costs = [int(c) for c in rng.integers(1, 40, size=200)]
    budget = 100
    lock = threading.Lock()
    held = [0, 0]  # now, most
    released: list[int] = []

    def release(i: int) -> None:
        with lock:
            held[0] -= costs[i]
            released.append(i)

    def store(i: int) -> None:
        threading.Event().wait(0.001)  # in flight a little, like a rename

    with Writes(8, budget=budget) as writes:
        for i, cost in enumerate(costs):
            parcel = writes.parcel(cost, functools.partial(release, i))
            with lock:
                held[0] += cost
                held[1] = max(held[1], held[0])
            with parcel:
                parcel.store(store, i)
    assert sorted(released) == list(range(200))
    assert held == [0, held[1]]
    assert 0 < held[1] <= budget
    assert writes.parcels == 0 and writes.held == 0


def test_one_parcel_larger_than_the_budget_still_goes() -> None:
    stored: list[int] = []
    with Writes(4, budget=100) as writes:
        for i in range(2):
            with writes.parcel(500) as parcel:
                parcel.store(stored.append, i)
    assert sorted(stored) == [0, 1]


def test_stores_run_while_the_next_parcel_is_made() -> None:
    # parcel 0's store cannot finish until parcel 1 exists: a writer that
    # waited for each store before encoding the next would stall
    made_1 = threading.Event()
    order: list[str] = []

    def store(i: int) -> None:
        if i == 0:
            assert made_1.wait(WAIT), "parcel 1 was not made while parcel 0 was stored"
        order.append(f"stored {i}")

    with Writes(2) as writes:
        for i in range(2):
            with writes.parcel(1) as parcel:
                parcel.store(store, i)
                if i == 1:
                    made_1.set()
    assert sorted(order) == ["stored 0", "stored 1"]


def test_first_failed_store_stops_the_batch_and_releases_every_parcel() -> None:
    n = 400
    failing = 3
    lock = threading.Lock()
    stored: list[int] = []
    released: list[int] = []
    made: list[int] = []

    def store(i: int) -> None:
        if i == failing:
            raise OSError(errno.EIO, "injected", f"key-{i}")
        threading.Event().wait(0.001)
        with lock:
            stored.append(i)

    before = _snapshot()
    with pytest.raises(OSError, match="key-3") as info, Writes(4, budget=8) as writes:
        for i in range(n):
            with writes.parcel(1, functools.partial(released.append, i)) as parcel:
                made.append(i)
                parcel.store(store, i)
    assert info.value.errno == errno.EIO
    assert failing not in stored
    assert len(made) < n  # the producer stopped at its next hand-off
    assert sorted(released) == made + [len(made)]  # and the refused parcel released too
    assert writes.parcels == 0 and writes.held == 0
    threads, fds = _snapshot()
    assert fds == before[1]
    assert threads <= before[0] | {t for t in threads if t.startswith("zarr_fused")}


def test_an_encode_error_skips_the_queued_stores() -> None:
    # every IO thread busy (another batch's work) until this batch stopped,
    # so its five stores are still queued when its encoding fails
    writes = Writes(32)
    busy = writes.pool.size
    started = threading.Semaphore(0)
    stored: list[int] = []
    released: list[int] = []

    def other_work() -> None:
        started.release()
        pause = threading.Event()
        for _ in range(int(WAIT / 0.001)):
            if writes.stopped:
                return
            pause.wait(0.001)

    blockers = [writes.pool.submit(other_work) for _ in range(busy)]
    for _ in range(busy):
        assert started.acquire(timeout=WAIT)
    with pytest.raises(ValueError, match="encode failed"), writes:
        for i in range(5):
            with writes.parcel(1, functools.partial(released.append, i)) as parcel:
                parcel.store(stored.append, i)
        raise ValueError("encode failed")
    for blocker in blockers:
        blocker.result(timeout=WAIT)
    assert stored == []  # all five were skipped
    assert sorted(released) == list(range(5))


# -- writes through zarr: who does the file IO, and what lands on disk --------------------

WRITE_LAYOUTS = {
    "chunked": {"chunks": (8, 8), "compressors": BloscCodec(cname="lz4", clevel=1)},
    "sharded": {"chunks": SHARD, "shards_inner": INNER},
}
# A write: ((rows, columns), fill): the box gets ``new``'s values there, or
# the scalar ``fill`` when not None.
ALL = ((0, 64), (0, 64))
PARTIAL = ((3, 61), (5, 40))
FEW = ((18, 30), (2, 30))
# (layout, write): whole files, a part of each file (the stored chunk or
# shard is read first), a region spanning two shards only (few shards: each
# spread over the compute threads), and fill values that leave keys empty
# (deleted)
WRITES = [
    pytest.param("chunked", (ALL, None), id="chunked-whole"),
    pytest.param("chunked", (PARTIAL, None), id="chunked-partial"),
    pytest.param("chunked", (((8, 40), (0, 64)), 7), id="chunked-emptied"),
    pytest.param("sharded", (ALL, None), id="sharded-whole"),
    pytest.param("sharded", (PARTIAL, None), id="sharded-partial"),
    pytest.param("sharded", (FEW, None), id="sharded-few"),
    pytest.param("sharded", (((16, 48), (0, 64)), 7), id="sharded-emptied"),
]


def apply_write(arr: Any, write: Any, new: np.ndarray) -> None:
    """Do ``write`` (see WRITES) on ``arr`` (a zarr or a NumPy array)."""
    box, fill = write
    selection = tuple(slice(a, b) for a, b in box)
    arr[selection] = new[selection] if fill is None else fill


def _create_for_write(root: Path, layout: str, data: np.ndarray) -> Any:
    options = dict(WRITE_LAYOUTS[layout])
    if "shards_inner" in options:
        inner = options.pop("shards_inner")
        options = {
            "chunks": inner,
            "shards": options["chunks"],
            "compressors": ZstdCodec(level=1),
        }
    arr = zarr.create_array(
        LocalStore(root), shape=SHAPE, dtype=data.dtype, fill_value=7, **options
    )
    arr[...] = data
    return arr


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("zarr.json", LOCK_FILE)
    }


@pytest.mark.parametrize(("layout", "write"), WRITES)
def test_writes_go_through_the_io_threads_and_match_zarr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, write: Any
) -> None:
    import zarr_fused.chunks.write as chunk_write
    import zarr_fused.shard.write as shard_write

    rng = np.random.default_rng(41)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    new = old + rng.integers(1, 1000, size=SHAPE, dtype="int32")
    with with_pipeline(BATCHED):
        _create_for_write(tmp_path / "zarr", layout, old)
        apply_write(zarr.open_array(LocalStore(tmp_path / "zarr")), write, new)
    threads: list[str] = []

    def spy(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return wrapped

    # (few shards to update, each spread over the compute threads, are held
    # by the thread that spreads them, which stores them itself: the IO
    # threads store them only without that protection)
    config = {"codec_pipeline.max_workers": 2, SHARD_WRITE_LOCK_KEY: write[0] != FEW}
    with with_pipeline(FUSED), zarr.config.set(config):
        arr = _create_for_write(tmp_path / "fused", layout, old)
        monkeypatch.setattr(chunk_write, "write_parts", spy(chunk_write.write_parts))
        monkeypatch.setattr(shard_write, "write_parts", spy(shard_write.write_parts))
        monkeypatch.setattr(shard_write.ShardWriter, "_load", spy(shard_write.ShardWriter._load))
        monkeypatch.setattr(LocalStore, "delete_sync", spy(LocalStore.delete_sync))
        writer = arr._async_array.codec_pipeline.plan.writer
        if hasattr(writer, "probe"):
            # through the IO threads, however fast the files were stored
            # (the writer otherwise stores fast files from the compute
            # threads, and probes with them when it has no measurement):
            # as if the IO threads had just found them slow
            writer.probe.latency = float("inf")
            writer.probe.probed = time.monotonic()
        apply_write(arr, write, new)
    assert _files(tmp_path / "fused") == _files(tmp_path / "zarr")
    assert threads, "no file was written, read or deleted"
    assert all(name.startswith("zarr_fused-fileio") for name in threads), threads


def test_io_concurrency_1_writes_on_the_compute_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zarr_fused.shard.write as shard_write

    rng = np.random.default_rng(42)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    threads: list[str] = []
    write_parts = shard_write.write_parts

    def spy(*args: Any) -> None:
        threads.append(threading.current_thread().name)
        write_parts(*args)

    config = {"codec_pipeline.max_workers": 2, IO_CONCURRENCY_KEY: 1}
    with with_pipeline(FUSED), zarr.config.set(config):
        arr = _create_for_write(tmp_path / "fused", "sharded", old)
        monkeypatch.setattr(shard_write, "write_parts", spy)
        arr[3:61, 5:40] = old[3:61, 5:40] + 1
    assert threads
    assert not any(name.startswith("zarr_fused-fileio") for name in threads), threads


# -- write faults in flight, with the shim in a child ------------------------------------

# Runs in the child after CHILD_COMMON: one write through zarr_fused (IO
# threads on), with the threads and descriptors before (after a warm-up
# write) and after.
WRITE = r"""
with zarr.config.set(config):
    arr = zarr.open_array(LocalStore(args["root"]), mode="r+")
    new = np.load(args["value"])
    arr[0:1, 0:1] = arr[0:1, 0:1]
    start_threads()
    before = snapshot()
    outcome = None
    try:
        for box, fill in args["writes"]:
            sel = tuple(slice(a, b) for a, b in box)
            arr[sel] = new[sel] if fill is None else fill
    except Exception as e:
        outcome = failure(e)
    result = {"before": before, "after": snapshot(), "error": outcome}
"""

WRITE_TARGET = "c/1/2"  # a chunk file (rows 8:16, columns 16:24) or a shard (16:32, 32:48)
WRITE_FAULTS = [
    pytest.param("create", "EACCES", id="create-EACCES"),
    pytest.param("write", "ENOSPC", id="writev-ENOSPC"),
    pytest.param("rename", "EIO", id="rename-EIO"),
]
FAULTED_WRITES = [
    pytest.param("chunked", (ALL, None), id="chunked-whole"),
    pytest.param("sharded", (ALL, None), id="sharded-whole"),
    pytest.param("sharded", (PARTIAL, None), id="sharded-partial"),
]


def run_write(
    child: FaultyChild,
    tmp_path: Path,
    root: Path,
    writes: list[Any],
    new: np.ndarray,
    *,
    io: int = 8,
    **faults: object,
) -> dict[str, Any]:
    np.save(tmp_path / "new.npy", new)
    args = {
        "root": str(root),
        "workers": 2,
        "io": io,
        "writes": writes,
        "value": str(tmp_path / "new.npy"),
    }
    answer = child.run(CHILD_COMMON + WRITE, args, **faults)
    assert answer["ok"], answer.get("traceback")
    result: dict[str, Any] = answer["result"]
    return result


def assert_write_fault_left_old_or_new(
    result: dict[str, Any], number: int, root: Path, old: np.ndarray, new: np.ndarray
) -> None:
    """The fault surfaced naming the target; no thread, descriptor or
    temporary file was left; the target still holds the old data and every
    file is whole (old or new), as zarr reads it and as zarr_fused does."""
    assert result["error"] is not None, "the fault did not surface"
    assert result["error"]["errno"] == number, result["error"]
    assert WRITE_TARGET in result["error"]["message"], result["error"]
    assert_nothing_left(result)
    assert sorted(p.name for p in root.rglob("*.partial")) == []
    with with_pipeline(BATCHED):
        stored = zarr.open_array(LocalStore(root), mode="r")
        chunks = stored.shards or stored.chunks
        stored = stored[...]
    i, j = (int(p) for p in WRITE_TARGET.split("/")[1:])
    target = (slice(i * chunks[0], (i + 1) * chunks[0]), slice(j * chunks[1], (j + 1) * chunks[1]))
    np.testing.assert_array_equal(stored[target], old[target])
    for a in range(0, SHAPE[0], chunks[0]):
        for b in range(0, SHAPE[1], chunks[1]):
            box = (slice(a, a + chunks[0]), slice(b, b + chunks[1]))
            assert np.array_equal(stored[box], old[box]) or np.array_equal(stored[box], new[box])
    with with_pipeline(FUSED):
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], stored)


@pytest.mark.parametrize(("layout", "write"), FAULTED_WRITES)
@pytest.mark.parametrize(("ops", "code"), WRITE_FAULTS)
def test_write_fault_in_flight_names_the_key_and_leaves_nothing(
    tmp_path: Path, shim_child: FaultyChild, layout: str, write: Any, ops: str, code: str
) -> None:
    root = tmp_path / "arr"
    rng = np.random.default_rng(43)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    new = old + rng.integers(1, 1000, size=SHAPE, dtype="int32")
    with with_pipeline(BATCHED):
        _create_for_write(root, layout, old)
    number = getattr(errno, code)
    result = run_write(
        shim_child,
        tmp_path,
        root,
        [write],
        new,
        marker=root / WRITE_TARGET,
        ops=ops,
        errno=number,
    )
    expected = old.copy()
    apply_write(expected, write, new)
    assert_write_fault_left_old_or_new(result, number, root, old, expected)


def test_partial_shard_update_read_fault_names_the_key_and_leaves_nothing(
    tmp_path: Path, shim_child: FaultyChild
) -> None:
    root = tmp_path / "arr"
    rng = np.random.default_rng(44)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    new = old + rng.integers(1, 1000, size=SHAPE, dtype="int32")
    with with_pipeline(BATCHED):
        _create_for_write(root, "sharded", old)
    result = run_write(
        shim_child,
        tmp_path,
        root,
        [(PARTIAL, None)],
        new,
        marker=root / WRITE_TARGET,
        ops="read",
        errno=errno.EIO,
    )
    expected = old.copy()
    apply_write(expected, (PARTIAL, None), new)
    assert_write_fault_left_old_or_new(result, errno.EIO, root, old, expected)


@pytest.mark.parametrize("layout", list(WRITE_LAYOUTS))
def test_stress_thousands_of_writes_under_latency_leave_nothing(
    tmp_path: Path, shim_child: FaultyChild, layout: str
) -> None:
    root = tmp_path / "arr"
    shape = (256, 256)
    rng = np.random.default_rng(45)
    data = rng.integers(0, 2**30, size=shape, dtype="int32")
    new = data ^ 0x5A5A
    options: dict[str, Any] = (
        {"chunks": (4, 4), "compressors": ZstdCodec(level=1)}  # 4096 chunk files
        if layout == "chunked"
        else {"chunks": (4, 4), "shards": (16, 16), "compressors": ZstdCodec(level=1)}  # 256 shards
    )
    with with_pipeline(BATCHED):
        zarr.create_array(LocalStore(root), shape=shape, dtype="int32", fill_value=0, **options)[
            ...
        ] = data
    # whole files, then emptied ones (deleted), then a part of each file,
    # emptied ones included (read, found missing)
    writes = [(((0, 256), (0, 256)), None), (((64, 128), (0, 256)), 0)]
    writes.append((((5, 250), (7, 200)), None))
    result = run_write(
        shim_child,
        tmp_path,
        root,
        writes,
        new,
        io=64,
        **delayed(root, 50, ops="create,write,rename,open,read"),
    )
    assert result["error"] is None, result["error"]
    expected = data.copy()
    for write in writes:
        apply_write(expected, write, new)
    with with_pipeline(BATCHED):
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], expected)
    assert sorted(p.name for p in root.rglob("*.partial")) == []
    assert_nothing_left(result)


def test_fast_chunk_files_are_written_by_the_compute_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import zarr_fused.chunks.write as chunk_write

    rng = np.random.default_rng(46)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    stored: list[str] = []

    def spy(*args: Any) -> None:
        stored.append(threading.current_thread().name)

    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 2}):
        arr = _create_for_write(tmp_path / "fused", "chunked", old)
        writer = arr._async_array.codec_pipeline.plan.writer
        writer.probe.latency = chunk_write.FAST_STORE / 2  # measured fast just now
        writer.probe.probed = time.monotonic()
        monkeypatch.setattr(chunk_write, "write_parts", spy)
        arr[...] = old + 1
        np.testing.assert_array_equal(arr[...], old + 1)
    assert stored == []  # the encode kernel wrote the files itself


def _stores_of_a_fresh_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_store: float, seed: int
) -> tuple[list[str], Any]:
    """Write all of a new handle's 64 chunk files through zarr_fused with
    ``FAST_STORE`` set to ``fast_store``: the threads that called
    ``write_parts`` (the IO threads' stores), and the writer."""
    import zarr_fused.chunks.write as chunk_write

    rng = np.random.default_rng(seed)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    with with_pipeline(BATCHED):
        _create_for_write(tmp_path / "fused", "chunked", old)
    stored: list[str] = []
    write_parts = chunk_write.write_parts

    def spy(*args: Any) -> None:
        stored.append(threading.current_thread().name)
        write_parts(*args)

    monkeypatch.setattr(chunk_write, "FAST_STORE", fast_store)
    monkeypatch.setattr(chunk_write, "write_parts", spy)
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 2}):
        arr = zarr.open_array(LocalStore(tmp_path / "fused"), mode="r+")
        writer = arr._async_array.codec_pipeline.plan.writer
        assert writer.probe.latency is None  # nothing measured yet
        arr[...] = old + 1
        np.testing.assert_array_equal(arr[...], old + 1)
    return stored, writer


def test_first_write_of_a_fresh_handle_stores_fast_files_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every store counts as fast: the probe keeps the whole write on the
    # compute threads (no hand-off to the IO threads for a first write)
    stored, writer = _stores_of_a_fresh_handle(tmp_path, monkeypatch, 10.0, 47)
    assert stored == []  # the encode kernel wrote every file itself
    assert writer.probe.latency is not None


def test_first_write_of_a_fresh_handle_hands_slow_files_to_the_io_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no store counts as fast: after the probe's files (stored by the
    # compute threads), the rest goes to the IO threads
    stored, _ = _stores_of_a_fresh_handle(tmp_path, monkeypatch, 0.0, 48)
    assert len(stored) == 64 - 2 * PROBE_FILES
    assert all(name.startswith("zarr_fused-fileio") for name in stored), stored


@pytest.mark.parametrize(
    ("io", "expected"),
    [
        pytest.param(1, 1, id="io-1"),
        pytest.param(4, 4, id="io-4"),
        pytest.param(32, 8, id="io-32"),
        pytest.param(128, 32, id="io-128"),
    ],
)
def test_write_window(io: int, expected: int) -> None:
    assert write_window(io) == expected


def test_store_requests_in_flight_stay_within_the_window() -> None:
    lock = threading.Lock()
    running = [0, 0]  # now, most

    def store(i: int) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        threading.Event().wait(0.002)
        with lock:
            running[0] -= 1

    with Writes(32) as writes:
        assert writes.window == 8
        for start in range(0, 200, 20):
            with writes.parcel(1) as parcel:
                for i in range(start, start + 20):
                    parcel.store(store, i)
    assert running[0] == 0
    assert 1 <= running[1] <= 8
    assert writes.requests == 0


@pytest.mark.parametrize(
    ("per_thread", "expected"),
    [
        pytest.param(REQUESTS_PER_THREAD, 8, id="fast-files"),
        pytest.param(REQUESTS_PER_THREAD_SLOW, 16, id="slow-files"),
    ],
)
def test_group_size_per_thread(per_thread: int, expected: int) -> None:
    """Slow files (a cold cache) get half the requests, twice the files each."""
    assert group_size(1024, 32, 16 << 10, per_thread) == expected


def test_io_threads_return_to_the_default_after_a_high_setting() -> None:
    """A batch at io_concurrency=128 starts about 128 IO threads; idle, all
    but DEFAULT_IO_CONCURRENCY of them exit (the idle period shortened
    through the pool's seam), and a batch run while they retire completes."""

    def fetch(i: int, batch: Any) -> int:
        time.sleep(0.005)  # keeps its thread busy, as a slow file would
        return i

    got: list[int] = []
    run_pipelined(
        list(range(400)), [1] * 400, fetch, lambda i, f: None, io_concurrency=128, max_workers=2
    )
    pool = _io_engine.io_threads(1)
    assert pool.threads > _io_engine.DEFAULT_IO_CONCURRENCY
    try:
        pool.set_idle(0.05)
        run_pipelined(
            list(range(300)),
            [1] * 300,
            lambda i, b: i,
            lambda i, f: got.append(f),
            io_concurrency=_io_engine.DEFAULT_IO_CONCURRENCY,
            max_workers=2,
        )
        deadline = time.monotonic() + WAIT
        while pool.threads > _io_engine.DEFAULT_IO_CONCURRENCY and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        pool.set_idle(_pool.IDLE_SECONDS)
    assert sorted(got) == list(range(300))
    assert pool.threads == _io_engine.DEFAULT_IO_CONCURRENCY
    fileio = [t for t in threading.enumerate() if t.name.startswith("zarr_fused-fileio")]
    assert len(fileio) == _io_engine.DEFAULT_IO_CONCURRENCY
