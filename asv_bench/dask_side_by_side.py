#!/usr/bin/env python
"""zarr_fused and its peers under Dask ``distributed``, side by side.

One ``LocalCluster`` (worker processes, one task thread each) per pipeline,
all alive at once; every scenario runs for each pipeline in interleaved
rounds (the order rotates), so a noisy machine slows all of them alike.
Each pipeline is selected in its workers the way a user would: zarr_fused
through `zarr_fused.dask.register`, the others by setting
``codec_pipeline.path`` in every worker. Every result is checked before
anything is timed.

    python asv_bench/dask_side_by_side.py --edge 512 --repeat 5

Scenarios (uint16 EDGE^3, shards of EDGE/4, inner chunks of EDGE/16, zstd):
read-all (``from_zarr(path).sum()``: Dask makes one task per *inner*
chunk, ``z.chunks``, so its own scheduling dominates; "dask alone" prints
that floor), read-all with shard-aligned blocks
(``from_zarr(path, chunks=z.shards).sum()``, one task per shard), shard by shard
(one ``submit`` per shard, each opening the array by path), inner chunk by
inner chunk with 1 and with 8 tasks in flight, and a shard-aligned
``to_zarr(path)`` write of the whole array.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr_fused_testing.cluster import local_cluster

PIPELINES = {
    "zarr-batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "zarr-fused": "zarr.core.codec_pipeline.FusedCodecPipeline",
    "zarrs": "zarrs.ZarrsCodecPipeline",
    "zarr_fused": "zarr_fused.FusedCodecPipeline",
}


def _set_pipeline(path: str) -> None:
    zarr.config.set({"codec_pipeline.path": path})


def _read_region(path: str, selection: tuple[slice, ...]) -> int:
    import dask.array  # noqa: F401  (the same imports a from_zarr task has)

    arr = zarr.open_array(zarr.storage.FsspecStore.from_url(path, storage_options={}), mode="r")
    return int(arr[selection].sum(dtype="u8"))


def _windowed(client: Any, fn: Callable[..., int], items: list[Any], window: int) -> int:
    """Submit ``fn(*item)`` with at most ``window`` tasks in flight."""
    from distributed import as_completed

    total = 0
    pending = [client.submit(fn, *item, pure=False) for item in items[:window]]
    rest = iter(items[window:])
    queue = as_completed(pending, loop=client.loop)
    for future in queue:
        total += future.result()
        nxt = next(rest, None)
        if nxt is not None:
            queue.add(client.submit(fn, *nxt, pure=False))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edge", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--inner-tasks",
        type=int,
        default=64,
        help="inner chunks read in the chunk-by-chunk scenarios",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated scenario prefixes to run (read-all, shard, "
        "inner, write-all); default all",
    )
    args = parser.parse_args(argv)

    import logging

    import dask.array as da
    from distributed import Client

    logging.getLogger("distributed").setLevel(logging.ERROR)

    import zarr_fused.dask

    peers = dict(PIPELINES)
    try:
        import zarrs  # noqa: F401
    except ImportError:
        peers.pop("zarrs")
    edge, shard, inner = args.edge, args.edge // 4, args.edge // 16
    work = Path(tempfile.mkdtemp(prefix="zf_dask_bench_"))
    source = work / "source.zarr"
    data = np.random.default_rng(0).integers(0, 4000, (edge,) * 3, dtype="<u2")
    with zarr.config.set({"codec_pipeline.path": PIPELINES["zarr_fused"]}):
        arr = zarr.create_array(
            zarr.storage.LocalStore(source),
            shape=data.shape,
            dtype="<u2",
            chunks=(inner,) * 3,
            shards=(shard,) * 3,
            compressors=ZstdCodec(level=1),
        )
        arr[...] = data
    expected = int(data.sum(dtype="u8"))
    shards = [
        tuple(slice(i, i + shard) for i in (z, y, x))
        for z in range(0, edge, shard)
        for y in range(0, edge, shard)
        for x in range(0, edge, shard)
    ]
    inners = [
        (str(source), (slice(z, z + inner), slice(y, y + inner), slice(0, inner)))
        for z in range(0, edge, inner)
        for y in range(0, edge, inner)
    ][: args.inner_tasks]
    inner_expected = sum(int(data[s].sum(dtype="u8")) for _, s in inners)

    clusters: dict[str, tuple[Any, Any]] = {}
    try:
        for name, path in peers.items():
            cluster = local_cluster(n_workers=args.workers)
            client = Client(cluster, set_as_default=False)
            if name == "zarr_fused":
                zarr_fused.dask.register(client)
            else:
                client.run(_set_pipeline, path)
            clusters[name] = (cluster, client)
        zarr.config.set({"codec_pipeline.path": PIPELINES["zarr-batched"]})

        def read_all(client: Any) -> int:
            return int(client.compute(da.from_zarr(str(source)).sum(dtype="u8")).result())

        def read_all_shards(client: Any) -> int:
            x = da.from_zarr(str(source), chunks=(shard,) * 3)
            return int(client.compute(x.sum(dtype="u8")).result())

        def floor(client: Any) -> int:
            """The same task graph as read-all without any IO or decoding:
            what Dask alone costs (the sum of a constant array)."""
            chunks = da.from_zarr(str(source)).chunks
            zeros = da.zeros(data.shape, chunks=chunks, dtype=data.dtype)
            return int(client.compute(zeros.sum(dtype="u8")).result())

        def by_shard(client: Any) -> int:
            return _windowed(client, _read_region, [(str(source), s) for s in shards], 64)

        def write_all(client: Any, target: Path) -> None:
            x = da.from_zarr(str(source), chunks=(shard,) * 3)  # shard-aligned blocks
            da.to_zarr(
                x,
                str(target),
                chunks=(inner,) * 3,
                shards=(shard,) * 3,
                compressors=ZstdCodec(level=1),
                compute=False,
            ).compute(scheduler=client)

        scenarios: dict[str, tuple[Callable[..., int], int]] = {
            "read-all (from_zarr(path).sum())": (read_all, expected),
            "read-all, shard-aligned (from_zarr(path, chunks=shards).sum())": (
                read_all_shards,
                expected,
            ),
            "shard by shard (submit per shard)": (by_shard, expected),
            "inner chunks, 1 task in flight": (
                lambda c: _windowed(c, _read_region, inners, 1),
                inner_expected,
            ),
            "inner chunks, 8 tasks in flight": (
                lambda c: _windowed(c, _read_region, inners, 8),
                inner_expected,
            ),
        }
        print(
            f"# dask side by side: uint16 {edge}^3, shards {shard}^3, inner {inner}^3 zstd-1, "
            f"{args.workers} workers x 1 thread (processes), CPUs "
            f"{len(os.sched_getaffinity(0))}, repeat {args.repeat}"
        )
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]

        def selected(title: str) -> bool:
            return not wanted or any(title.startswith(w) for w in wanted)

        for title, (fn, want) in scenarios.items():
            if not selected(title):
                continue
            times: dict[str, list[float]] = {name: [] for name in clusters}
            for name, (_, client) in clusters.items():  # checked, untimed
                got = fn(client)
                if got != want:
                    raise SystemExit(f"{name}: {title} gave {got}, expected {want}")
            names = list(clusters)
            for r in range(args.repeat):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    t0 = time.perf_counter()
                    fn(clusters[name][1])
                    times[name].append(time.perf_counter() - t0)
            _report(title, times)
            if title.startswith("read-all ("):
                client = clusters["zarr_fused"][1]
                floor(client)
                spent = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    floor(client)
                    spent.append(time.perf_counter() - t0)
                print(
                    f"{'dask alone':<14}{statistics.median(spent):>10.3f}{min(spent):>10.3f}"
                    "   (the same graph, no IO: Dask's own cost)"
                )
        times = {name: [] for name in clusters}
        names = list(clusters)
        for r in range(args.repeat + 1 if selected("write-all") else 0):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                target = work / f"out-{name}-{r}.zarr"
                target.mkdir()
                t0 = time.perf_counter()
                write_all(clusters[name][1], target)
                elapsed = time.perf_counter() - t0
                got = int(zarr.open_array(str(target), mode="r")[...].sum(dtype="u8"))
                if got != expected:
                    raise SystemExit(
                        f"{name}: write-all stored a sum of {got}, expected {expected}"
                    )
                if r:  # the first round only checks
                    times[name].append(elapsed)
                shutil.rmtree(target)
        if selected("write-all"):
            _report("write-all (to_zarr(path), shard-aligned)", times)
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _report(title: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["zarr_fused"])
    print(f"## {title}")
    print(f"{'peer':<14}{'median s':>10}{'min s':>10}{'zarr_fused speedup':>20}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<14}{med:>10.3f}{min(values):>10.3f}{med / base:>19.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
