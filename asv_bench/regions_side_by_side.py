"""Many random patches of one sharded array, side by side.

Reads ``--regions`` random unaligned ``--patch``^3 regions of a sharded zstd
uint16 cube (shards 128^3, inner chunks 32^3 by default) through

* ``read_regions``: `zarr_fused.read_regions`, all regions as one batch;
* ``per-region``: the same, with every selection parsed into a region
  object and its result allocated alone (the plan before plain selections
  were planned natively, for the ratio in one run);
* ``staging``: the same, with the fan-out read off (the blocks decoded into
  a staging array through the pipeline, then copied out: the design the
  fan-out replaced, for the ratio of the two in one run);
* ``one-by-one``: one ``array[sel]`` per region through zarr_fused;
* ``ts-batch``: tensorstore, every read issued inside one ``ts.Batch``;
* ``ts-one-by-one``: tensorstore, one read at a time,

checks that every peer returns the same values, and prints the median of
``--repeat`` rounds (the peers take turns within each, see `timed`) and
the ratios to ``read_regions``. No chunk cache
anywhere (tensorstore's cache pool is its default, empty). Timings on a
shared machine are noise: compare the ratios of one run. For the pinned
figures run it under ``taskset -c 0``::

    python asv_bench/regions_side_by_side.py --size 256 --regions 512
    taskset -c 0 python asv_bench/regions_side_by_side.py --size 256 --regions 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import regions

FUSED = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"}


def write_cube(path: Path, size: int, shard: int, inner: int) -> None:
    """The sample cube (smooth values, so zstd has work) unless present."""
    if (path / ".complete").exists():
        return
    with zarr.config.set(FUSED):
        arr = zarr.create_array(
            LocalStore(path),
            shape=(size,) * 3,
            chunks=(shard,) * 3,
            dtype="uint16",
            serializer=ShardingCodec(
                chunk_shape=(inner,) * 3, codecs=[BytesCodec(), ZstdCodec(level=1)]
            ),
            compressors=None,
            overwrite=True,
        )
        rng = np.random.default_rng(0)
        for z in range(0, size, shard):
            block = np.indices((shard, size, size), dtype=np.uint32).sum(axis=0) + z
            block = block + rng.integers(0, 16, size=block.shape, dtype=np.uint32)
            arr[z : z + shard] = block.astype(np.uint16)
    (path / ".complete").touch()


def selections(size: int, patch: int, n: int, seed: int) -> list[tuple[slice, ...]]:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, size - patch + 1, size=(n, 3))
    return [tuple(slice(int(s), int(s) + patch) for s in start) for start in starts]


def staging_read(arr: Any, sels: list[Any]) -> list[Any]:
    """`read_regions` with the fan-out read off: every array then keeps
    the staging design (a benchmark-only switch, through the private plan)."""
    with mock.patch.object(regions._FanOut, "of", classmethod(lambda cls, geometry: None)):
        return zarr_fused.read_regions(arr, sels)


def per_region_read(arr: Any, sels: list[Any]) -> list[Any]:
    """`read_regions` with the native plan of plain selections off (a
    benchmark-only switch, through the private plan)."""
    with mock.patch.object(regions, "_read_plain", lambda geometry, selections: None):
        return zarr_fused.read_regions(arr, sels)


def peers(path: Path, sels: list[Any]) -> dict[str, Callable[[], list[Any]]]:
    with zarr.config.set(FUSED):
        arr = zarr.open_array(LocalStore(path), mode="r")
    out: dict[str, Callable[[], list[Any]]] = {
        "read_regions": lambda: zarr_fused.read_regions(arr, sels),
        "per-region": lambda: per_region_read(arr, sels),
        "staging": lambda: staging_read(arr, sels),
        "one-by-one": lambda: [arr[s] for s in sels],
    }
    try:
        import tensorstore as ts
    except ImportError:
        print("tensorstore not installed: its rows are left out")
        return out
    handle = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}).result()

    def ts_batch() -> list[Any]:
        with ts.Batch() as batch:
            futures = [handle[s].read(batch=batch) for s in sels]
        return [f.result() for f in futures]

    out["ts-batch"] = ts_batch
    out["ts-one-by-one"] = lambda: [handle[s].read().result() for s in sels]
    return out


def timed(
    fns: dict[str, Callable[[], list[Any]]], repeat: int
) -> dict[str, tuple[float, float, list[Any]]]:
    """Per peer, the median wall and CPU seconds (the process' user +
    system time, every thread's, which a busy machine disturbs less than
    the wall clock) and the values read.

    The peers take turns, so that a change in the machine's load falls on
    all of them alike rather than on whichever ran then. Within its turn a
    peer reads once untimed, then once timed: what the peer before it left
    behind does not fall on it (after tensorstore's reads, the next peer's
    new result pages fault in slower: read_regions took 0.73 s of CPU right
    after a ``ts.Batch`` read, 0.45 s after itself), and each is measured as
    a loop calling it again and again runs it.
    """
    values = {name: fn() for name, fn in fns.items()}  # warm: page cache, pools
    walls: dict[str, list[float]] = {name: [] for name in fns}
    cpus: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            fn()
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu)
    return {
        name: (statistics.median(walls[name]), statistics.median(cpus[name]), values[name])
        for name in fns
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="cube edge (default 256)")
    parser.add_argument("--shard", type=int, default=128)
    parser.add_argument("--inner", type=int, default=32)
    parser.add_argument("--patch", type=int, default=32)
    parser.add_argument("--regions", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "zf-regions")
    parser.add_argument("--only", nargs="*", help="peers to run (default: all)")
    args = parser.parse_args(argv)
    path = args.dir / f"cube-{args.size}-{args.shard}-{args.inner}"
    write_cube(path, args.size, args.shard, args.inner)
    sels = selections(args.size, args.patch, args.regions, seed=1)
    cpus = len(os.sched_getaffinity(0))
    print(
        f"{args.regions} regions of {args.patch}^3 in uint16 {args.size}^3 "
        f"(shards {args.shard}^3, inner {args.inner}^3, zstd), {cpus} CPU(s), "
        f"median of {args.repeat} rounds, the peers taking turns"
    )
    results: dict[str, tuple[float, float]] = {}
    reference: list[Any] | None = None
    fns = {n: fn for n, fn in peers(path, sels).items() if not args.only or n in args.only}
    for name, (wall, cpu, values) in timed(fns, args.repeat).items():
        if reference is None:
            reference = values
        elif not all(np.array_equal(a, b) for a, b in zip(reference, values, strict=True)):
            raise AssertionError(f"{name} read other values")
        results[name] = (wall, cpu)
    base = results.get("read_regions")
    print(
        f"  {'':14s} {'wall s':>8s} {'ratio':>6s} {'CPU s':>8s} {'ratio':>6s}  (ratio: / read_regions)"
    )
    for name, (wall, cpu) in results.items():
        ratios = (f"{wall / base[0]:6.2f}", f"{cpu / base[1]:6.2f}") if base else ("", "")
        print(f"  {name:14s} {wall:8.4f} {ratios[0]} {cpu:8.4f} {ratios[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
