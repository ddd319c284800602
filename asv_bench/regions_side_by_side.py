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
``--repeat`` rounds (the peers take turns within each, see
``_regions_peers.timed``) and the ratios to ``read_regions``. No chunk
cache anywhere (tensorstore's cache pool is its default, empty). Timings
on a shared machine are noise: compare the ratios of one run. ``--pin
both`` runs it unpinned, then pinned to one CPU (see ``_side_by_side_cli``)::

    python asv_bench/regions_side_by_side.py --size 256 --regions 512 --pin both
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import zarr
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import regions

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _regions_peers
import _side_by_side_cli


def per_region_read(arr: Any, sels: list[Any]) -> list[Any]:
    """`read_regions` with the native plan of plain selections off (a
    benchmark-only switch, through the private plan)."""
    with mock.patch.object(regions, "_read_plain", lambda geometry, selections: None):
        return zarr_fused.read_regions(arr, sels)


def peers(path: Path, sels: list[Any]) -> dict[str, Callable[[], list[Any]]]:
    with zarr.config.set(_regions_peers.FUSED):
        arr = zarr.open_array(LocalStore(path), mode="r")
    out: dict[str, Callable[[], list[Any]]] = {
        "read_regions": lambda: zarr_fused.read_regions(arr, sels),
        "per-region": lambda: per_region_read(arr, sels),
        "staging": lambda: _regions_peers.staging_read(arr, sels),
        "one-by-one": lambda: [arr[s] for s in sels],
    }
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    return out | _regions_peers.tensorstore_peers(spec, sels)


def run(args: argparse.Namespace) -> None:
    path = args.dir / f"cube-{args.size}-{args.shard}-{args.inner}"
    _regions_peers.write_cube(path, args.size, args.shard, args.inner)
    sels = _regions_peers.selections(args.size, args.patch, args.regions, seed=1)
    print(
        f"{args.regions} regions of {args.patch}^3 in uint16 {args.size}^3 "
        f"(shards {args.shard}^3, inner {args.inner}^3, zstd), "
        f"median of {args.repeat} rounds, the peers taking turns"
    )
    fns = {n: fn for n, fn in peers(path, sels).items() if not args.only or n in args.only}
    _regions_peers.check(fns)
    results = _regions_peers.timed(fns, args.repeat)
    base = results.get("read_regions")
    print(
        f"  {'':14s} {'wall s':>8s} {'ratio':>6s} {'CPU s':>8s} {'ratio':>6s}  (ratio: / read_regions)"
    )
    for name, (wall, cpu) in results.items():
        ratios = (f"{wall / base[0]:6.2f}", f"{cpu / base[1]:6.2f}") if base else ("", "")
        print(f"  {name:14s} {wall:8.4f} {ratios[0]} {cpu:8.4f} {ratios[1]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    options = _side_by_side_cli.parser(__doc__, repeat=5)
    options.add_argument("--size", type=int, default=256, help="cube edge (default 256)")
    options.add_argument("--shard", type=int, default=128)
    options.add_argument("--inner", type=int, default=32)
    options.add_argument("--patch", type=int, default=32)
    options.add_argument("--regions", type=int, default=512)
    options.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "zf-regions")
    options.add_argument("--only", nargs="*", help="peers to run (default: all)")
    return _side_by_side_cli.main(__file__, options, argv, "read_regions, page cache", run)


if __name__ == "__main__":
    raise SystemExit(main())
