"""Command line of zarr_fused: ``zarr-fused`` / ``python -m zarr_fused``."""

from __future__ import annotations

import argparse
import sys


def _info() -> int:
    import numpy as np
    import zarr

    import zarr_fused
    from zarr_fused._pool import available_cpus, resolve_max_workers

    info = zarr_fused.native_info()
    cpus, why = available_cpus()
    print(f"zarr_fused {zarr_fused.__version__}")
    print(f"zarr {zarr.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    for name, ok in info["extensions"].items():  # type: ignore[union-attr]
        print(f"extension {name}: {'ok' if ok else 'MISSING'}")
    print(f"native codecs: {', '.join(info['codecs']) or 'none'}")  # type: ignore[arg-type]
    for name, version in info["libraries"].items():  # type: ignore[union-attr]
        print(f"  {name}: {version if not isinstance(version, list) else ', '.join(version)}")
    print(f"available CPUs: {cpus} ({why})")
    print(f"threads per batch (codec_pipeline.max_workers): {resolve_max_workers()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zarr-fused", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, native codecs, thread count")
    demo = sub.add_parser("demo", help="write and read a sample array through every pipeline")
    demo.add_argument("--edge", type=int, default=256, help="edge length of the cubic sample")
    demo.add_argument("--repeat", type=int, default=3, help="timed repetitions (best is kept)")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    from zarr_fused._demo import run_demo

    return run_demo(edge=args.edge, repeat=args.repeat)


if __name__ == "__main__":
    sys.exit(main())
