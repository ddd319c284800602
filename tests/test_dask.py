"""zarr_fused under Dask: a real ``distributed.LocalCluster`` with worker
processes, configured once through `zarr_fused.dask.register`.

The arrays are small (CI runs on two cores); what matters is where the work
runs: each test asserts inside the workers that zarr_fused's native shard
engine served the tasks, not only that the values are right.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr_fused_testing.cluster import local_cluster

from helpers import BATCHED, FUSED, chunk_items, with_pipeline

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

import zarr_fused.dask

pytestmark = [
    pytest.mark.slow,
    # distributed's own shutdown chatter is not ours to police
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore:.*[Pp]ort .* is already in use.*:UserWarning"),
]

SHAPE, SHARDS, INNER = (64, 64, 32), (32, 32, 32), (16, 16, 16)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    # distributed's nannies set OMP_NUM_THREADS and friends in this process's
    # environment for the workers they spawn; later tests must not inherit them
    saved = dict(os.environ)
    cluster = local_cluster()
    try:
        with distributed.Client(cluster) as c:
            zarr_fused.dask.register(c)
            yield c
    finally:
        cluster.close(timeout=30)
        zarr.config.set({"codec_pipeline.path": BATCHED})
        os.environ.clear()
        os.environ.update(saved)


def _data() -> np.ndarray:
    return np.random.default_rng(16).integers(0, 4000, SHAPE, dtype="<u2")


def _write_local(path: Path, data: np.ndarray) -> None:
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            zarr.storage.LocalStore(path),
            shape=SHAPE,
            dtype=data.dtype,
            chunks=INNER,
            shards=SHARDS,
        )
        arr[...] = data


# What the workers ran: counts of native shard reads and writes, kept in
# each worker process by wrappers that client.run installs (reset on each
# install).


def _install_counters() -> None:
    from zarr_fused.shard import read as _read_sharded
    from zarr_fused.shard import write as _write_sharded

    counts = {"read": 0, "write": 0}
    for name, cls in (("read", _read_sharded.ShardReader), ("write", _write_sharded.ShardWriter)):
        original = cls.__dict__.get("_zf_original") or getattr(cls, name)

        def counted(
            self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any
        ) -> Any:
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        cls._zf_original = original  # type: ignore[attr-defined]
        setattr(cls, name, counted)
    _read_sharded._zf_counts = counts  # type: ignore[attr-defined]


def _counts() -> dict[str, int]:
    from zarr_fused.shard import read as _read_sharded

    return dict(_read_sharded._zf_counts)  # type: ignore[attr-defined]


def _worker_totals(client: Any) -> dict[str, int]:
    totals = {"read": 0, "write": 0}
    for counts in client.run(_counts).values():
        for key, value in counts.items():
            totals[key] += value
    return totals


def test_register_configures_current_and_restarted_workers(client: Any) -> None:
    paths = client.run(lambda: zarr.config.get("codec_pipeline.path"))
    assert set(paths.values()) == {FUSED}
    client.restart()
    paths = client.run(lambda: zarr.config.get("codec_pipeline.path"))
    assert len(paths) == 2 and set(paths.values()) == {FUSED}
    assert zarr.config.get("codec_pipeline.path") == FUSED


def test_workers_default_to_no_more_threads_than_cores(client: Any) -> None:
    """2 worker processes x 1 task thread: each task runs zarr_fused inline
    (one thread), not one thread per CPU of the affinity mask."""
    sizes = client.run(lambda: zarr_fused.default_max_workers())
    cores = len(os.sched_getaffinity(0))
    total = sum(count for count, _ in sizes.values())
    assert total <= cores, sizes
    assert all(count == 1 for count, _ in sizes.values()), sizes


def test_from_zarr_path_reads_through_the_native_engine(client: Any, tmp_path: Path) -> None:
    data = _data()
    path = tmp_path / "a.zarr"
    _write_local(path, data)
    client.run(_install_counters)
    x = da.from_zarr(str(path))  # dask opens it through FsspecStore
    total = x.sum(dtype="u8").compute()
    assert total == data.sum(dtype="u8")
    np.testing.assert_array_equal(x[5:40, 3, ::3].compute(), data[5:40, 3, ::3])
    assert _worker_totals(client)["read"] >= 4  # every shard, in the workers


def test_from_zarr_of_an_array_and_pickled_arrays(client: Any, tmp_path: Path) -> None:
    data = _data()
    path = tmp_path / "a.zarr"
    _write_local(path, data)
    client.run(_install_counters)
    with with_pipeline(FUSED):
        arr = zarr.open_array(zarr.storage.LocalStore(path), mode="r")
    x = da.from_zarr(arr)
    np.testing.assert_array_equal(x.compute(), data)
    assert _worker_totals(client)["read"] >= 4


def test_to_zarr_path_shard_aligned_is_native_and_byte_identical(
    client: Any, tmp_path: Path
) -> None:
    data = _data()
    client.run(_install_counters)
    ours = tmp_path / "ours.zarr"
    ours.mkdir()
    x = da.from_array(data, chunks=SHARDS)
    da.to_zarr(x, str(ours), chunks=INNER, shards=SHARDS)
    assert _worker_totals(client)["write"] >= 4
    theirs = tmp_path / "theirs.zarr"
    _write_local(theirs, data)
    assert chunk_items(zarr.storage.LocalStore(ours)) == chunk_items(
        zarr.storage.LocalStore(theirs)
    )


def test_xarray_round_trip_with_shards(client: Any, tmp_path: Path) -> None:
    xr = pytest.importorskip("xarray")
    data = _data()
    ds = xr.Dataset({"v": (("z", "y", "x"), data)}).chunk(dict(zip("zyx", SHARDS)))
    path = tmp_path / "x.zarr"
    client.run(_install_counters)
    ds.to_zarr(
        path, zarr_format=3, consolidated=False, encoding={"v": {"chunks": INNER, "shards": SHARDS}}
    )
    back = xr.open_zarr(path, consolidated=False)
    assert int(back.v.sum().compute()) == int(data.sum(dtype="u8"))
    totals = _worker_totals(client)
    assert totals["write"] >= 4 and totals["read"] >= 4


def test_worker_killed_mid_job_result_still_right(client: Any, tmp_path: Path) -> None:
    """A worker process killed (SIGKILL) while tasks run: the nanny restarts
    it, the plugin configures it again, and the result is still right."""
    import signal

    data = _data()
    path = tmp_path / "a.zarr"
    _write_local(path, data)
    # many small tasks, so some are still pending when the worker dies
    x = da.from_zarr(str(path), chunks=INNER)
    blocks = x.map_blocks(lambda b: (time.sleep(0.02), b)[1], dtype=x.dtype)
    future = client.compute(blocks.sum(dtype="u8"))
    deadline = time.monotonic() + 60
    while not client.processing() or not any(client.processing().values()):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.01)
    pid = next(iter(client.run(os.getpid).values()))
    os.kill(pid, signal.SIGKILL)
    assert future.result(timeout=120) == data.sum(dtype="u8")
    client.wait_for_workers(2, timeout=300)  # a loaded CI host restarts slowly
    assert pid not in _run_on_live_workers(client, os.getpid).values()  # a new process
    paths = _run_on_live_workers(client, lambda: zarr.config.get("codec_pipeline.path"))
    assert set(paths.values()) == {FUSED}, paths


def _run_on_live_workers(client: Any, function: Callable[[], Any]) -> dict[str, Any]:
    """``client.run(function)`` on the workers, asked again (at most 60 s)
    while the scheduler still lists one that the kill closed: right after a
    restart the broadcast can reach a worker whose stream is gone."""
    deadline = time.monotonic() + 60
    while True:
        results = client.run(function, on_error="return")
        if not any(isinstance(r, Exception) for r in results.values()):
            return dict(results)
        assert time.monotonic() < deadline, results
        time.sleep(0.5)


def _sizes_in_task() -> tuple[int, int]:
    import zarr_fused as zf

    return zf.default_max_workers()[0], len(os.sched_getaffinity(0))


def test_threaded_worker_shares_the_cpus_between_its_task_threads() -> None:
    """A worker in this process (``processes=False``) with 2 task threads:
    each task's pool gets the CPUs divided by the task threads, so the tasks
    together never run more compute threads than there are CPUs."""
    saved = dict(os.environ)
    cluster = distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=False,  # in-process transport: no port is opened
        dashboard_address=None,
        silence_logs=50,
    )
    try:
        with distributed.Client(cluster) as c:
            count, cpus = c.submit(_sizes_in_task, pure=False).result(timeout=120)
    finally:
        cluster.close(timeout=30)
        os.environ.clear()
        os.environ.update(saved)
    assert count == max(1, cpus // 2), (count, cpus)
    assert 2 * count <= max(2, cpus), (count, cpus)


def _round_data(round_: int) -> np.ndarray:
    return np.random.default_rng(100 + round_).integers(1, 4000, SHAPE, dtype="<u2")


def _read_back(path: Path) -> np.ndarray:
    with with_pipeline(BATCHED):
        return np.asarray(zarr.open_array(zarr.storage.LocalStore(path), mode="r")[...])


def test_four_workers_writing_blocks_smaller_than_shards_lose_nothing(tmp_path: Path) -> None:
    """`to_zarr` of blocks of one inner chunk each into a sharded array, on
    four worker processes: the tasks that write the inner chunks of one
    shard run at the same time, and each reads, merges and replaces the
    shard. With the shard write lock every round reads back whole."""
    saved = dict(os.environ)
    cluster = local_cluster(n_workers=4)
    path = tmp_path / "a.zarr"
    try:
        with distributed.Client(cluster) as c:
            zarr_fused.dask.register(c)
            da.to_zarr(
                da.from_array(_round_data(0), chunks=INNER), str(path), chunks=INNER, shards=SHARDS
            )
            assert np.array_equal(_read_back(path), _round_data(0)), "to_zarr"
            target = zarr.open_array(zarr.storage.LocalStore(path), mode="r+")
            for round_ in (1, 2, 3):
                data = _round_data(round_)
                da.store(da.from_array(data, chunks=INNER), target, lock=False)
                assert np.array_equal(_read_back(path), data), f"round {round_}"
    finally:
        cluster.close(timeout=30)
        zarr.config.set({"codec_pipeline.path": BATCHED})
        os.environ.clear()
        os.environ.update(saved)
