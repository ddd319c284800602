"""Many user threads on one array through zarr_fused.

Every user thread's read or write becomes one batch on zarr_fused's shared
pool (with ``max_workers`` 2) or runs in zarr's worker thread (1), so these
tests stress concurrent batches: disjoint writers must all land, and
readers must never see torn or foreign data in regions nobody writes.
Regions are aligned to chunks (and shards): two writers sharing a chunk
race by design in zarr, whatever the pipeline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from helpers import make_store

FUSED = "zarr_fused.FusedCodecPipeline"
TIMEOUT = 60.0

SHAPE = (64, 64)
BLOCK = 16  # a multiple of every chunk and shard edge below
BLOCKS = [
    (slice(r, r + BLOCK), slice(c, c + BLOCK))
    for r in range(0, SHAPE[0], BLOCK)
    for c in range(0, SHAPE[1], BLOCK)
]

LAYOUTS = {
    "chunked-raw": {"chunks": (8, 8), "compressors": None},
    "chunked-zstd": {"chunks": (8, 8), "compressors": ZstdCodec(level=1)},
    "sharded-zstd": {"chunks": (4, 8), "shards": (16, 16), "compressors": ZstdCodec(level=1)},
}

STORES = [pytest.param("memory", id="memory"), pytest.param("local", id="local")]
LAYOUT_PARAMS = [pytest.param(name, id=name) for name in LAYOUTS]
WORKERS = [pytest.param(1, id="workers=1"), pytest.param(2, id="workers=2")]


def create(store_kind: str, tmp_path: Path, layout: str, dtype: str = "int32") -> zarr.Array:
    arr = zarr.create_array(
        make_store(store_kind, tmp_path), shape=SHAPE, dtype=dtype, **LAYOUTS[layout]
    )
    assert type(arr._async_array.codec_pipeline).__qualname__ == "FusedCodecPipeline"
    assert type(arr._async_array.codec_pipeline).__module__ == "zarr_fused"
    return arr


def run_threads(fn: Callable[[int], Any], n: int) -> list[Any]:
    """``fn(0..n-1)`` on ``n`` threads started together; fails instead of hanging."""
    start = threading.Barrier(n, timeout=TIMEOUT)

    def task(i: int) -> Any:
        start.wait()
        return fn(i)

    with ThreadPoolExecutor(max_workers=n) as executor:
        futures = [executor.submit(task, i) for i in range(n)]
        return [f.result(timeout=TIMEOUT) for f in futures]


@pytest.mark.parametrize("max_workers", WORKERS)
@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
@pytest.mark.parametrize("store_kind", STORES)
def test_disjoint_writers_and_readers(
    fused: None, tmp_path: Path, store_kind: str, layout: str, max_workers: int
) -> None:
    """16 threads each write their own block three times, reading it back
    after every write; the final array holds every thread's last write."""
    rng = np.random.default_rng(101)
    rounds = [rng.integers(-(2**30), 2**30, size=SHAPE, dtype="int32") for _ in range(3)]
    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        arr = create(store_kind, tmp_path, layout)

        def worker(i: int) -> None:
            block = BLOCKS[i]
            for values in rounds:
                arr[block] = values[block]
                np.testing.assert_array_equal(arr[block], values[block], strict=True)

        run_threads(worker, len(BLOCKS))
        np.testing.assert_array_equal(arr[...], rounds[-1], strict=True)
    with zarr.config.set({"codec_pipeline.max_workers": 1}):
        reopened = zarr.open_array(arr.store, mode="r")
        np.testing.assert_array_equal(reopened[...], rounds[-1], strict=True)


@pytest.mark.parametrize("max_workers", WORKERS)
@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
@pytest.mark.parametrize("store_kind", STORES)
def test_concurrent_readers_of_unaligned_selections(
    fused: None, tmp_path: Path, store_kind: str, layout: str, max_workers: int
) -> None:
    """Readers of unaligned, overlapping selections (reads only) all see the
    stored values."""
    rng = np.random.default_rng(202)
    data = rng.integers(-(2**30), 2**30, size=SHAPE, dtype="int32")
    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        arr = create(store_kind, tmp_path, layout)
        arr[...] = data

        def reader(i: int) -> None:
            local = np.random.default_rng(1000 + i)
            for _ in range(8):
                r0, c0 = (int(x) for x in local.integers(0, 48, size=2))
                r1, c1 = (int(x) for x in local.integers(1, 17, size=2))
                sel = (slice(r0, r0 + r1), slice(c0, c0 + c1))
                np.testing.assert_array_equal(arr[sel], data[sel], strict=True)

        run_threads(reader, 12)


@pytest.mark.parametrize("max_workers", WORKERS)
@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
@pytest.mark.parametrize("store_kind", STORES)
def test_readers_never_see_torn_chunks_beside_a_writer(
    fused: None, tmp_path: Path, store_kind: str, layout: str, max_workers: int
) -> None:
    """One thread rewrites the top row of blocks over and over while eight
    threads read the rest (and the whole array): the region nobody writes
    always reads back exactly, and each written chunk is one whole version."""
    rng = np.random.default_rng(303)
    data = rng.integers(-(2**30), 2**30, size=SHAPE, dtype="int32")
    written = (slice(0, BLOCK), slice(None))
    untouched = (slice(BLOCK, None), slice(None))
    versions = [np.full((BLOCK, SHAPE[1]), -(k + 1), dtype="int32") for k in range(4)]
    chunk_rows, chunk_cols = LAYOUTS[layout]["chunks"]
    n_readers = 8
    stop = threading.Event()
    reads = [0] * n_readers
    writes: list[int] = []
    completed = [0]  # writes that finished
    writer_errors: list[BaseException] = []

    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        arr = create(store_kind, tmp_path, layout)
        arr[...] = data
        arr[written] = versions[0]

        def writer() -> None:
            k = 0
            try:
                while not stop.is_set():
                    k += 1
                    arr[written] = versions[k % len(versions)]
                    completed[0] += 1
            except BaseException as exc:  # re-raised in the test thread
                writer_errors.append(exc)
            writes.append(k)

        def reader(i: int) -> None:
            local = np.random.default_rng(2000 + i)
            deadline = time.monotonic() + TIMEOUT
            j = -1
            # at least 12 reads, and on until the writer has replaced the
            # chunks twice: on a loaded host it may not have run at all yet
            while j < 11 or (completed[0] < 2 and time.monotonic() < deadline):
                j += 1
                if j % 3 == 0:
                    whole = arr[...]
                    np.testing.assert_array_equal(whole[untouched], data[untouched], strict=True)
                    top = whole[written]
                    allowed = {-(k + 1) for k in range(len(versions))}
                    for r in range(0, BLOCK, chunk_rows):
                        for c in range(0, SHAPE[1], chunk_cols):
                            chunk = top[r : r + chunk_rows, c : c + chunk_cols]
                            values = set(np.unique(chunk).tolist())
                            assert len(values) == 1 and values <= allowed, (r, c, values)
                else:
                    r0 = int(local.integers(BLOCK, SHAPE[0] - 8))
                    c0 = int(local.integers(0, SHAPE[1] - 8))
                    sel = (slice(r0, r0 + 8), slice(c0, c0 + 8))
                    np.testing.assert_array_equal(arr[sel], data[sel], strict=True)
                reads[i] += 1

        writer_thread = threading.Thread(target=writer, daemon=True)
        writer_thread.start()
        try:
            run_threads(reader, n_readers)
        finally:
            stop.set()
            writer_thread.join(TIMEOUT)
        assert not writer_thread.is_alive(), "the writer did not stop"
        if writer_errors:
            raise writer_errors[0]
        assert writes and completed[0] >= 2, "the writer did not finish two writes"
        assert min(reads) >= 12, reads
        np.testing.assert_array_equal(arr[untouched], data[untouched], strict=True)


@pytest.mark.parametrize("max_workers", WORKERS)
@pytest.mark.parametrize("store_kind", STORES)
def test_many_arrays_one_per_thread(
    fused: None, tmp_path: Path, store_kind: str, max_workers: int
) -> None:
    """Different arrays (different dtypes, so different plans) used at once."""
    dtypes = ["int8", "uint16", "int32", "float32", "float64", ">i4", "<u8", "bool"]
    rng = np.random.default_rng(404)
    datas = [
        rng.integers(0, 2, size=SHAPE).astype(np.dtype(dt))
        if dt == "bool"
        else (rng.random(SHAPE) * 100).astype(np.dtype(dt))
        for dt in dtypes
    ]
    with zarr.config.set({"codec_pipeline.max_workers": max_workers}):
        arrays = [
            zarr.create_array(
                make_store(store_kind, tmp_path, name=f"a{i}"),
                shape=SHAPE,
                dtype=datas[i].dtype,
                chunks=(8, 16),
                compressors=None,
            )
            for i in range(len(dtypes))
        ]

        def worker(i: int) -> None:
            arrays[i][...] = datas[i]
            for block in BLOCKS[:4]:
                np.testing.assert_array_equal(arrays[i][block], datas[i][block], strict=True)

        run_threads(worker, len(dtypes))
        for arr, data in zip(arrays, datas, strict=True):
            got = arr[...]
            assert (got.dtype.kind, got.dtype.itemsize) == (data.dtype.kind, data.dtype.itemsize)
            np.testing.assert_array_equal(got, data)
