"""zarr_fused across real processes: fork and spawn children, pickling.

The parent reads with pool threads alive before the child starts, so a
forked child inherits a process whose pool threads are gone; a spawned
child receives the array by pickling and must rebuild the pipeline's plan.
Also the pattern of a DataLoader (a Pool of forked or spawned workers
reading random slices) and a fork while another thread is inside a read.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore, MemoryStore

import zarr_fused
from zarr_fused._pool import pool_size

FUSED = "zarr_fused.FusedCodecPipeline"
TIMEOUT = 60.0
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"

SHAPE = (40, 30)
# A region that cuts through chunks (and shards) on both axes.
REGION = (slice(3, 17), slice(5, 22))

LAYOUTS = {
    "chunked-zstd": {"chunks": (10, 10), "compressors": ZstdCodec(level=1)},
    "sharded-zstd": {"chunks": (5, 5), "shards": (10, 10), "compressors": ZstdCodec(level=1)},
    "chunked-raw": {"chunks": (10, 10), "compressors": None},
}


def make_array(store: Any, layout: str, seed: int) -> tuple[zarr.Array, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        arr = zarr.create_array(store, shape=SHAPE, dtype=data.dtype, **LAYOUTS[layout])
        arr[:] = data
    assert type(arr._async_array.codec_pipeline) is zarr_fused.FusedCodecPipeline
    return arr, data


def _child_read_write(
    arr: zarr.Array, expected: np.ndarray, new_values: np.ndarray, conn: Any
) -> None:
    """Runs in the child: read all, write REGION, report."""
    try:
        size_at_start = pool_size()
        with zarr.config.set({"codec_pipeline.path": FUSED, "codec_pipeline.max_workers": 2}):
            pipeline = arr._async_array.codec_pipeline
            values = arr[...]
            arr[REGION] = new_values
            after = arr[...]
        conn.send(
            {
                "pipeline": f"{type(pipeline).__module__}.{type(pipeline).__qualname__}",
                "has_plan": pipeline.plan is not None,
                "size_at_start": size_at_start,
                "read_ok": bool(np.array_equal(values, expected)),
                "region_ok": bool(np.array_equal(after[REGION], new_values)),
            }
        )
    except BaseException:
        conn.send({"error": traceback.format_exc()})
    finally:
        conn.close()


def run_child(method: str, arr: zarr.Array, data: np.ndarray, new: np.ndarray) -> dict[str, Any]:
    ctx = multiprocessing.get_context(method)
    read_end, write_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_read_write, args=(arr, data, new, write_end))
    proc.start()
    write_end.close()
    try:
        assert read_end.poll(TIMEOUT), f"the {method} child did not answer"
        result = read_end.recv()
        proc.join(TIMEOUT)
        assert not proc.is_alive(), f"the {method} child did not exit"
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert "error" not in result, result["error"]
    assert proc.exitcode == 0
    return result


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.parametrize(
    "method",
    [
        pytest.param(
            "fork",
            id="fork",
            marks=pytest.mark.skipif(
                "fork" not in multiprocessing.get_all_start_methods(), reason="no fork"
            ),
        ),
        pytest.param("spawn", id="spawn"),
    ],
)
@pytest.mark.parametrize(
    "layout",
    [pytest.param("chunked-zstd", id="chunked-zstd"), pytest.param("sharded-zstd", id="sharded")],
)
def test_child_process_reads_and_writes(tmp_path: Path, method: str, layout: str) -> None:
    arr, data = make_array(LocalStore(tmp_path / "data"), layout, seed=7)
    # Read with pool threads so the child starts from a parent with live workers.
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        np.testing.assert_array_equal(arr[...], data, strict=True)
    assert pool_size() >= 1
    assert any(t.name.startswith("zarr_fused") for t in threading.enumerate())

    rng = np.random.default_rng(8)
    shape = tuple(s.stop - s.start for s in REGION)
    new = rng.integers(-(2**20), 2**20, size=shape, dtype="int32")

    result = run_child(method, arr, data, new)

    assert result["pipeline"] == FUSED
    assert result["has_plan"]
    assert result["read_ok"]
    assert result["region_ok"]
    if method == "fork":
        assert result["size_at_start"] == 0
    expected = data.copy()
    expected[REGION] = new
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        reopened = zarr.open_array(LocalStore(tmp_path / "data"), mode="r")
        np.testing.assert_array_equal(reopened[...], expected, strict=True)
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        np.testing.assert_array_equal(arr[...], expected, strict=True)


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("chunked-zstd", id="chunked-zstd"),
        pytest.param("sharded-zstd", id="sharded-zstd"),
        pytest.param("chunked-raw", id="chunked-raw"),
    ],
)
def test_pipeline_pickles_and_rebuilds_plan(layout: str) -> None:
    arr, _data = make_array(MemoryStore(), layout, seed=21)
    pipeline = arr._async_array.codec_pipeline
    assert pipeline.plan is not None

    clone = pickle.loads(pickle.dumps(pipeline))

    assert type(clone) is zarr_fused.FusedCodecPipeline
    assert clone.plan is not None
    assert clone.plan is not pipeline.plan
    assert clone.codecs == pipeline.codecs
    assert clone.array_spec == pipeline.array_spec
    assert clone.batch_size == pipeline.batch_size
    assert clone == pipeline
    assert type(clone.plan.reader) is type(pipeline.plan.reader)
    assert type(clone.plan.writer) is type(pipeline.plan.writer)
    assert type(clone.plan.chain) is type(pipeline.plan.chain)
    assert clone.plan.fallback == pipeline.plan.fallback


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("chunked-zstd", id="chunked-zstd"),
        pytest.param("sharded-zstd", id="sharded-zstd"),
        pytest.param("chunked-raw", id="chunked-raw"),
    ],
)
def test_unpickled_array_reads_and_writes_the_same(tmp_path: Path, layout: str) -> None:
    arr, data = make_array(LocalStore(tmp_path / "data"), layout, seed=22)
    clone = pickle.loads(pickle.dumps(arr))
    pipeline = clone._async_array.codec_pipeline
    assert type(pipeline) is zarr_fused.FusedCodecPipeline
    assert pipeline.plan is not None
    # No zarr_fused config here: the unpickled array keeps its own pipeline.
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        np.testing.assert_array_equal(clone[...], data, strict=True)
        np.testing.assert_array_equal(clone[REGION], arr[REGION], strict=True)
        clone[REGION] = -1
        expected = data.copy()
        expected[REGION] = -1
        np.testing.assert_array_equal(arr[...], expected, strict=True)


def test_unevolved_pipeline_pickles() -> None:
    arr, _ = make_array(MemoryStore(), "chunked-zstd", seed=23)
    codecs = arr._async_array.metadata.codecs
    pipeline = zarr_fused.FusedCodecPipeline.from_codecs(codecs)
    clone = pickle.loads(pickle.dumps(pipeline))
    assert type(clone) is zarr_fused.FusedCodecPipeline
    assert clone.plan is not None
    assert clone.array_spec is None
    assert clone.codecs == pipeline.codecs
    assert clone == pipeline


# -- a DataLoader's worker pool, a fork in the middle of a read --------------------------
#
# The pattern of PyTorch's DataLoader: the parent reads (its pool threads
# start), then hands the array to a multiprocessing Pool whose workers read
# random slices, many per worker. And a fork while another thread of the
# parent is inside a read: the child inherits whatever locks that read held
# at that moment, with none of the threads that would release them.

BIG_SHAPE = (512, 512)
BIG_LAYOUTS = {
    "chunked-zstd": {"chunks": (32, 32), "compressors": ZstdCodec(level=1)},
    "sharded-zstd": {"chunks": (32, 32), "shards": (128, 128), "compressors": ZstdCodec(level=1)},
}
SLICES = 24

_dataset: zarr.Array | None = None


def make_big_array(root: Path, layout: str, seed: int) -> tuple[zarr.Array, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.integers(-(2**20), 2**20, size=BIG_SHAPE, dtype="int32")
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        arr = zarr.create_array(
            LocalStore(root), shape=BIG_SHAPE, dtype=data.dtype, **BIG_LAYOUTS[layout]
        )
        arr[:] = data
    assert type(arr._async_array.codec_pipeline) is zarr_fused.FusedCodecPipeline
    return arr, data


def random_slices(seed: int, n: int) -> list[tuple[tuple[int, int], ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        bounds = []
        for size in BIG_SHAPE:
            start = int(rng.integers(0, size - 1))
            bounds.append((start, int(rng.integers(start + 1, min(size, start + 200) + 1))))
        out.append(tuple(bounds))
    return out


def _init_worker(arr: zarr.Array) -> None:
    global _dataset
    _dataset = arr


def _read_slice(bounds: tuple[tuple[int, int], ...]) -> tuple[int, str, np.ndarray]:
    """A Pool task: read one slice of the worker's array with pool threads."""
    assert _dataset is not None
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        pipeline = type(_dataset._async_array.codec_pipeline)
        values = _dataset[tuple(slice(a, b) for a, b in bounds)]
    return os.getpid(), f"{pipeline.__module__}.{pipeline.__qualname__}", values


NO_FORK = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork"
)


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.parametrize(
    ("layout", "method"),
    [
        pytest.param("chunked-zstd", "fork", id="chunked-zstd-fork", marks=NO_FORK),
        pytest.param("sharded-zstd", "fork", id="sharded-zstd-fork", marks=NO_FORK),
        # spawned workers unpickle the array (one layout: each worker
        # starts a fresh interpreter, seconds on a busy machine)
        pytest.param("sharded-zstd", "spawn", id="sharded-zstd-spawn"),
    ],
)
def test_worker_pool_reads_random_slices_after_the_parent_read(
    tmp_path: Path, method: str, layout: str
) -> None:
    arr, data = make_big_array(tmp_path / "data", layout, seed=31)
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        np.testing.assert_array_equal(arr[...], data, strict=True)
    assert pool_size() >= 1
    tasks = random_slices(seed=32, n=SLICES)

    ctx = multiprocessing.get_context(method)
    pool = ctx.Pool(2, initializer=_init_worker, initargs=(arr,))
    try:
        results = pool.map_async(_read_slice, tasks, chunksize=1).get(TIMEOUT)
    finally:
        pool.terminate()
        pool.join()

    assert {pid for pid, _, _ in results}.isdisjoint({os.getpid()})
    for bounds, (_, pipeline, values) in zip(tasks, results, strict=True):
        assert pipeline == FUSED
        np.testing.assert_array_equal(
            values, data[tuple(slice(a, b) for a, b in bounds)], strict=True
        )
    # the parent's own pool still serves it
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        np.testing.assert_array_equal(arr[...], data, strict=True)


def _child_read(arr: zarr.Array, expected: np.ndarray, conn: Any) -> None:
    """Runs in a child forked while the parent reads: read all, with threads."""
    try:
        with zarr.config.set({"codec_pipeline.max_workers": 2}):
            values = arr[...]
            region = arr[REGION]
        conn.send(
            {
                "read_ok": bool(np.array_equal(values, expected)),
                "region_ok": bool(np.array_equal(region, expected[REGION])),
                "pool": pool_size(),
            }
        )
    except BaseException:
        conn.send({"error": traceback.format_exc()})
    finally:
        conn.close()


FORKS = 4


@pytest.mark.filterwarnings(FORK_WARNING)
@NO_FORK
@pytest.mark.parametrize("layout", [pytest.param(k, id=k) for k in BIG_LAYOUTS])
def test_fork_while_another_thread_reads(tmp_path: Path, layout: str) -> None:
    arr, data = make_big_array(tmp_path / "data", layout, seed=41)
    stop = threading.Event()
    reads: list[bool] = []

    def reader() -> None:
        deadline = time.monotonic() + TIMEOUT
        while not stop.is_set() and time.monotonic() < deadline:
            reads.append(bool(np.array_equal(arr[...], data)))

    delays = np.random.default_rng(42).uniform(0.0, 0.03, size=FORKS)
    ctx = multiprocessing.get_context("fork")
    results = []
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        thread = threading.Thread(target=reader, name="reader")
        thread.start()
        try:
            deadline = time.monotonic() + TIMEOUT
            while not reads and time.monotonic() < deadline:
                time.sleep(0.001)
            for delay in delays:
                time.sleep(float(delay))
                read_end, write_end = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child_read, args=(arr, data, write_end))
                proc.start()
                write_end.close()
                try:
                    assert read_end.poll(TIMEOUT), "a child forked during a read hung"
                    results.append(read_end.recv())
                    proc.join(TIMEOUT)
                    assert not proc.is_alive(), "a child forked during a read did not exit"
                finally:
                    if proc.is_alive():
                        proc.kill()
                    proc.join()
                    read_end.close()
                assert proc.exitcode == 0
        finally:
            stop.set()
            thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert reads and all(reads)
    assert len(results) == FORKS
    for result in results:
        assert "error" not in result, result["error"]
        assert result["read_ok"] and result["region_ok"]
        assert result["pool"] >= 1
