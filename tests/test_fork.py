"""zarr_fused across real processes: fork and spawn children, pickling.

The parent reads with pool threads alive before the child starts, so a
forked child inherits a process whose pool threads are gone; a spawned
child receives the array by pickling and must rebuild the pipeline's plan.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
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
    arr, data = make_array(MemoryStore(), layout, seed=21)
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
