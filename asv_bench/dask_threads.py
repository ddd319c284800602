#!/usr/bin/env python
"""Compute threads per core under a Dask ``LocalCluster``, measured.

Two worker processes with one task thread each read a sharded array
(``from_zarr(path, chunks=shards).sum()``) in a loop, while this process
samples ``/proc/<pid>/task/*/stat`` of every worker every few milliseconds.
It reports, per configuration, the compute threads zarr_fused started in
the workers (``zarr_fused`` pool threads plus the task threads) and how
many threads of the workers were runnable at once, per core:

- ``default``: zarr_fused's own default under Dask (`zarr_fused.dask.register`);
- ``one per CPU``: ``max_workers`` set to the CPUs of the affinity mask,
  which is what the default was before it followed the worker's share.

    python asv_bench/dask_threads.py --edge 256 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr_fused_testing.cluster import CLUSTER_OPTIONS, local_cluster


def _thread_names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def _runnable(pids: list[int]) -> int:
    """Threads of ``pids`` in state R right now."""
    running = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # the state follows the command name in parentheses
            if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"R":
                running += 1
    return running


def _measure(source: str, shard: int, settings: dict[str, Any], seconds: float) -> dict[str, Any]:
    import dask.array as da
    from distributed import Client

    import zarr_fused.dask

    cpus = len(os.sched_getaffinity(0))
    with (
        local_cluster() as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        zarr_fused.dask.register(client, **settings)
        pids = list(client.run(os.getpid).values())
        x = da.from_zarr(source, chunks=(shard,) * 3).sum(dtype="u8")
        client.compute(x).result()  # warm: plans built, pools started
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(_runnable(pids))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        deadline = time.perf_counter() + seconds
        rounds = 0
        try:
            while time.perf_counter() < deadline:
                client.compute(x).result()
                rounds += 1
        finally:
            stop.set()
            sampler.join()
        names = client.run(_thread_names)
    task_threads = CLUSTER_OPTIONS["n_workers"] * CLUSTER_OPTIONS["threads_per_worker"]
    pool_threads = {
        addr: sum(1 for n in ns if n.startswith("zarr_fused_") or n == "zarr_fused")
        for addr, ns in names.items()
    }
    return {
        "rounds": rounds,
        "pool threads per worker": sorted(pool_threads.values()),
        "compute threads per core": (sum(pool_threads.values()) + task_threads) / cpus,
        "runnable per core (mean)": statistics.fmean(samples) / cpus,
        "runnable per core (p95)": sorted(samples)[int(0.95 * (len(samples) - 1))] / cpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edge", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    edge = args.edge
    shard, inner = edge // 4, edge // 16
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        source = str(Path(tmp) / "a.zarr")
        a = zarr.create_array(
            source,
            shape=(edge,) * 3,
            chunks=(inner,) * 3,
            shards=(shard,) * 3,
            dtype="u2",
            compressors=ZstdCodec(level=1),
        )
        a[...] = np.random.default_rng(0).integers(0, 1000, a.shape, dtype="u2")
        print(
            f"# compute threads under LocalCluster({CLUSTER_OPTIONS['n_workers']} workers x "
            f"{CLUSTER_OPTIONS['threads_per_worker']} thread, processes), "
            f"uint16 {edge}^3, {cpus} CPUs, {args.seconds:g} s each"
        )
        for label, settings in (
            ("default", {}),
            (f"one per CPU (max_workers={cpus})", {"max_workers": cpus}),
        ):
            result = _measure(source, shard, settings, args.seconds)
            print(f"## {label}")
            for key, value in result.items():
                shown = f"{value:.2f}" if isinstance(value, float) else value
                print(f"  {key:<28}{shown}")


if __name__ == "__main__":
    main()
