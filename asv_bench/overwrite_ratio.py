#!/usr/bin/env python
"""Unsharded overwrite after ``os.sync()``: zarr's BatchedCodecPipeline
against zarr_fused, pinned and unpinned, as ratios from one run.

The array is the ``unsharded-blosc`` layout of ``benchmarks/_peers.py``
(float32 2048^2 in 64^2 chunks, blosc lz4: 1024 chunk files), written once
by each pipeline into its own folder. Then the rounds alternate the
pipelines; before each timed write a new handle is opened and
``os.sync()`` writes the page cache back, so every write replaces chunk
files whose blocks are on disk. ``zarr_fused rename`` is the same writer
replacing each file with a plain rename instead of exchange + unlink
(`zarr_fused._localio.replace_mode`).

Printed per pipeline: median wall seconds, median CPU seconds (user +
system of all the process's threads, ``time.process_time``) and Batched /
that pipeline for both (higher: faster than Batched). The script runs
itself twice in child processes: unpinned, then pinned to CPU 0 (as
``taskset -c 0``; zarr_fused sizes its pools from the affinity mask).

    .venv/bin/python asv_bench/overwrite_ratio.py [--repeat 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FUSED = "zarr_fused.FusedCodecPipeline"
BATCHED = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def run(root: Path, repeat: int) -> None:
    import numpy as np
    import zarr
    from zarr.storage import LocalStore

    sys.path.insert(0, str(HERE))
    from benchmarks._peers import LAYOUTS

    from zarr_fused._localio import replace_mode

    layout = LAYOUTS["unsharded-blosc"]
    data = layout.sample()

    def write(pipeline: str, folder: str) -> None:
        with zarr.config.set({"codec_pipeline.path": pipeline}):
            zarr.open_array(LocalStore(root / folder), mode="r+")[...] = data

    def write_renaming() -> None:
        before = replace_mode("rename")
        try:
            write(FUSED, "fused")
        finally:
            replace_mode(before)

    cases = {
        "zarr batched": lambda: write(BATCHED, "batched"),
        "zarr_fused": lambda: write(FUSED, "fused"),
        "zarr_fused rename": write_renaming,
    }
    for pipeline, folder in ((BATCHED, "batched"), (FUSED, "fused")):
        with zarr.config.set({"codec_pipeline.path": pipeline}):
            layout.create(LocalStore(root / folder))
        write(pipeline, folder)
        with zarr.config.set({"codec_pipeline.path": BATCHED}):
            assert np.array_equal(zarr.open_array(LocalStore(root / folder))[...], data)

    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            os.sync()
            c0, t0 = time.process_time(), time.perf_counter()
            cases[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)

    cpus = sorted(os.sched_getaffinity(0))
    print(f"# CPUs {cpus}, {repeat} rounds, load {os.getloadavg()[0]:.1f}")
    base_wall = statistics.median(wall["zarr batched"])
    base_cpu = statistics.median(cpu["zarr batched"])
    for name in names:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"{name:18s} wall {w:7.3f} s  cpu {c:6.3f} s  "
            f"batched/this: wall {base_wall / w:5.2f}x  cpu {base_cpu / c:5.2f}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where the arrays go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.dir or Path(tempfile.gettempdir()) / "zarr_fused_overwrite_ratio"
    if args.child:
        run(root, args.repeat)
        return
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        "unsharded overwrite after os.sync(), 1024 chunk files",
        flush=True,
    )
    for pin in (None, {0}):
        command = [sys.executable, __file__, "--child", "--repeat", str(args.repeat)]
        command += ["--dir", str(root)]
        subprocess.run(
            command,
            check=True,
            preexec_fn=None if pin is None else (lambda cpus=pin: os.sched_setaffinity(0, cpus)),
        )


if __name__ == "__main__":
    main()
