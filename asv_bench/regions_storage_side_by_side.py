#!/usr/bin/env python
"""Many random patches of one sharded array on slow storage, side by side.

`regions_side_by_side.py` reads from a hot page cache. This script reads
the same regions (``--regions`` random unaligned ``--patch``^3 patches of a
sharded zstd uint16 cube) where every file call or request is a round trip:

* ``--storage latency``: every ``open`` and ``read`` of the cube's files
  waits ``--latency-us`` first (the faultfs shim preloaded into a child
  process, as ``latency_side_by_side.py`` does: a Lustre/GPFS/NFS model);
* ``--storage cold``: the page cache dropped before every timed read
  (root only), no added latency;
* ``--storage hot``: a hot page cache, no added latency (the check that
  the choice between the IO threads and the compute threads keeps the
  fast path fast);
* ``--storage s3``: moto's S3 server behind the latency proxy (``--latency-ms``
  per request), zarr through obstore's ``S3Store``, tensorstore through its
  ``s3`` kvstore (as ``s3_side_by_side.py`` sets them up). The servers run
  in this process' children started before the pinning, so ``--pin on`` pins
  the client only.

The peers:

* ``read_regions``: `zarr_fused.read_regions`, as it runs (on a local store,
  the fan-out read; on S3, the staging read);
* ``fan-out-io1``: the same with ``codec_pipeline.io_concurrency=1`` (the
  compute threads fetch their own shards: the fan-out without the IO
  threads; local stores only);
* ``staging``: `read_regions` with the fan-out read off (the blocks read
  through the pipeline into a staging array; local stores only);
* ``one-by-one``: one ``array[sel]`` per region through zarr_fused;
* ``ts-batch``: tensorstore, every read issued inside one ``ts.Batch``;
* ``ts-one-by-one``: tensorstore, one read at a time.

Every peer's values are checked against the others' before anything is
timed; rounds take turns between the peers, each reading once untimed and
once timed (see ``_regions_peers.timed``), and the medians are
printed with their ratios to ``read_regions``, wall and CPU (the process'
user + system time over all threads). Compare ratios of one run only::

    python asv_bench/regions_storage_side_by_side.py --storage latency --latency-us 1000
    python asv_bench/regions_storage_side_by_side.py --storage cold --size 512 --regions 256
    python asv_bench/regions_storage_side_by_side.py --storage s3 --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zarr

import zarr_fused

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _regions_peers
from benchmarks._latency import build_shim, drop_page_cache, shim_env

PEERS = ["read_regions", "fan-out-io1", "staging", "one-by-one", "ts-batch", "ts-one-by-one"]
BUCKET = "zarr-fused-regions"


def _io1_read(arr: Any, sels: list[Any]) -> list[Any]:
    with zarr.config.set({"codec_pipeline.io_concurrency": 1}):
        return zarr_fused.read_regions(arr, sels)


def peers(
    store: Any, ts_spec: dict[str, Any], sels: list[Any], local: bool
) -> dict[str, Callable[[], list[Any]]]:
    with zarr.config.set(_regions_peers.FUSED):
        arr = zarr.open_array(store, mode="r")
    out: dict[str, Callable[[], list[Any]]] = {
        "read_regions": lambda: zarr_fused.read_regions(arr, sels)
    }
    if local:
        out["fan-out-io1"] = lambda: _io1_read(arr, sels)
        out["staging"] = lambda: _regions_peers.staging_read(arr, sels)
    out["one-by-one"] = lambda: [arr[s] for s in sels]
    return out | _regions_peers.tensorstore_peers(ts_spec, sels)


def report(title: str, results: dict[str, tuple[float, float]]) -> None:
    base = results["read_regions"]
    print(f"## {title}")
    print(f"  {'':14s} {'wall s':>8s} {'ratio':>6s} {'CPU s':>8s} {'ratio':>6s}  (/ read_regions)")
    for name, (wall, cpu) in results.items():
        print(f"  {name:14s} {wall:8.4f} {wall / base[0]:6.2f} {cpu:8.4f} {cpu / base[1]:6.2f}")
    print(flush=True)


# -- the child: one pinning, one storage ---------------------------------------------------


def child(args: argparse.Namespace) -> int:
    if args.pin == "on":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cpus = sorted(os.sched_getaffinity(0))
    sels = _regions_peers.selections(args.size, args.patch, args.regions, seed=1)
    local = args.storage != "s3"
    if local:
        from zarr.storage import LocalStore

        path = cube_path(args)
        store: Any = LocalStore(path)
        ts_spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    else:
        store, ts_spec = s3_handles(args.endpoint)
    fns = {n: fn for n, fn in peers(store, ts_spec, sels, local).items() if n in args.peers}
    _regions_peers.check(fns)
    prepare = None
    if args.storage == "cold":
        why = drop_page_cache()
        if why is not None:
            print(f"cold cache skipped: {why}")
            return 0
        prepare = drop_page_cache
    what = {
        "latency": f"{args.latency_us} us per file call",
        "cold": "cold page cache",
        "hot": "hot page cache",
        "s3": f"S3 (moto), {args.latency_ms:g} ms per request",
    }[args.storage]
    title = (
        f"{args.regions} regions of {args.patch}^3, uint16 {args.size}^3 (shards "
        f"{args.shard}^3, inner {args.inner}^3, zstd): {what}, CPUs {cpus} "
        f"({'pinned' if args.pin == 'on' else 'unpinned'}), median of {args.repeat}"
    )
    report(title, _regions_peers.timed(fns, args.repeat, prepare))
    return 0


def cube_path(args: argparse.Namespace) -> Path:
    return args.dir / f"cube-{args.size}-{args.shard}-{args.inner}"


def s3_handles(endpoint: str) -> tuple[Any, dict[str, Any]]:
    from zarr.storage import ObjectStore
    from zarr_fused_testing.s3 import REGION, obstore_s3

    store = ObjectStore(obstore_s3(BUCKET, endpoint, "cube"))
    ts_spec = {
        "driver": "zarr3",
        "kvstore": {
            "driver": "s3",
            "bucket": BUCKET,
            "path": "cube/",
            "endpoint": endpoint,
            "aws_region": REGION,
            "aws_credentials": {"type": "environment"},
        },
    }
    return store, ts_spec


@contextlib.contextmanager
def s3_servers(args: argparse.Namespace) -> Iterator[str]:
    """moto behind the latency proxy, the cube copied there (through zarr,
    without the latency); yields the proxy's endpoint."""
    from zarr.storage import LocalStore, ObjectStore
    from zarr_fused_testing.s3 import LatencyProxy, MotoServer, obstore_s3

    with MotoServer() as moto, LatencyProxy(moto.endpoint) as proxy:
        moto.create_bucket(BUCKET)
        with zarr.config.set(_regions_peers.FUSED):
            src = zarr.open_array(LocalStore(cube_path(args)), mode="r")
            dst = zarr.create_array(
                ObjectStore(obstore_s3(BUCKET, moto.endpoint, "cube")),
                shape=src.shape,
                dtype=src.dtype,
                chunks=src.chunks,
                shards=src.shards,
                compressors=src.compressors,
                fill_value=src.fill_value,
            )
            dst[...] = src[...]
        proxy.latency = args.latency_ms / 1000
        yield proxy.endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=["latency", "cold", "hot", "s3"], default="latency")
    parser.add_argument("--latency-us", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=256, help="cube edge (default 256)")
    parser.add_argument("--shard", type=int, default=128)
    parser.add_argument("--inner", type=int, default=32)
    parser.add_argument("--patch", type=int, default=32)
    parser.add_argument("--regions", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pin", choices=["off", "on", "both"], default="both")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=PEERS)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "zf-regions-io")
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if "read_regions" not in args.peers:
        args.peers.insert(0, "read_regions")
    if args.child:
        return child(args)
    _regions_peers.write_cube(cube_path(args), args.size, args.shard, args.inner)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTFS_")}
    env.pop("LD_PRELOAD", None)
    if args.storage == "latency":
        shim = build_shim(args.dir / "shim")
        if shim is None:
            print("skipped: the faultfs shim did not build (no C compiler?)")
            return 0
        env = shim_env(shim, cube_path(args), args.latency_us)
    # tensorstore's "environment" credentials (moto takes any)
    from zarr_fused_testing.s3 import ACCESS_KEY, REGION, SECRET_KEY

    env.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    env.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    env.setdefault("AWS_REGION", REGION)
    with contextlib.ExitStack() as stack:
        extra: list[str] = []
        if args.storage == "s3":
            extra = ["--endpoint", stack.enter_context(s3_servers(args))]
        for pin in ["off", "on"] if args.pin == "both" else [args.pin]:
            cmd = [sys.executable, __file__, "--child", "--pin", pin, *extra]
            cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in _PASSED]
            cmd += ["--peers", *args.peers]
            sys.stdout.flush()
            if subprocess.run(cmd, env=env, check=False).returncode:
                return 1
    return 0


#: the options a child gets as they were given
_PASSED = (
    "storage",
    "latency_us",
    "latency_ms",
    "size",
    "shard",
    "inner",
    "patch",
    "regions",
    "repeat",
    "dir",
)


if __name__ == "__main__":
    raise SystemExit(main())
