"""The filtered decode kernel alone: one `DecodeBatch` of 64 uncompressed
chunks through a filter chain into a C-order output, CPU milliseconds per
``batch.run()`` (min and median of ``--reps`` runs), per case.

The cases are the row walker's (`zarr_fused._codec_batch._decode_rows`):
whole chunks of 128x256 items, their short-row twins of 1024x16 items (a
delta running sum carried across 1024 rows of 64 bytes each), and a part of
each chunk. No file IO and no zarr: only the kernels' work, so two builds
compare by running this script against each in turn (swap the built
extensions, or two checkouts), pinned (``taskset -c 0``) and unpinned.

    python asv_bench/filter_rows_kernel.py --reps 21 [--only delta]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numcodecs
import numpy as np

from zarr_fused import _filters
from zarr_fused._codec_batch import ChunkLayout, DecodeBatch
from zarr_fused._codecs import ChainKernel

N_CHUNKS = 64
FSO = ("fixedscaleoffset", "<f8", "<i2", 280.0, 100.0)


@dataclass(frozen=True)
class Case:
    """A filter chain (its kernel steps and numcodecs' encoder), a chunk
    shape and how much of each chunk the batch selects."""

    name: str
    steps: tuple[Any, ...]
    codec: Any
    dtype: str
    chunk: tuple[int, int]
    part: bool = False


CASES = [
    Case("delta-i4 whole", (("delta", "<i4"),), numcodecs.Delta("<i4"), "<i4", (128, 256)),
    Case(
        "delta-i4 short rows whole", (("delta", "<i4"),), numcodecs.Delta("<i4"), "<i4", (1024, 16)
    ),
    Case(
        "fso whole",
        (FSO,),
        numcodecs.FixedScaleOffset(280, 100, "<f8", "<i2"),
        "<f8",
        (128, 256),
    ),
    Case(
        "fso short rows whole",
        (FSO,),
        numcodecs.FixedScaleOffset(280, 100, "<f8", "<i2"),
        "<f8",
        (1024, 16),
    ),
    Case(
        "fso part",
        (FSO,),
        numcodecs.FixedScaleOffset(280, 100, "<f8", "<i2"),
        "<f8",
        (128, 256),
        part=True,
    ),
]


def _values(case: Case, rng: np.random.Generator) -> np.ndarray:
    if case.dtype == "<i4":
        return rng.integers(-1000, 1000, case.chunk, dtype="<i4")
    return (280 + rng.standard_normal(case.chunk)).astype(case.dtype)


def prepare(case: Case) -> Callable[[], Any]:
    """A function that builds and runs the case's batch once."""
    rng = np.random.default_rng(0)
    rows, cols = case.chunk
    grid = (8, 8) if rows == 128 else (1, 64)
    out = np.zeros((grid[0] * rows, grid[1] * cols), dtype=case.dtype)
    stored = [np.frombuffer(case.codec.encode(_values(case, rng)), np.uint8) for _ in range(4)]
    itemsize = len(stored[0]) // (rows * cols)
    kernel = ChainKernel(
        compressor=None, outer_crcs=0, inner_crcs=0, itemsize=itemsize, swap_unit=0
    )
    filters = _filters.FilterChain(list(case.steps))
    layout = ChunkLayout(case.chunk, out.itemsize)
    inner = (
        (slice(1, rows - 1), slice(3, cols - 3)) if case.part else (slice(0, rows), slice(0, cols))
    )
    cells = [(i, j) for i in range(grid[0]) for j in range(grid[1])]

    def run() -> Any:
        batch = DecodeBatch(kernel, N_CHUNKS, 2)
        batch.set_filters(filters)
        for k, (i, j) in enumerate(cells):
            target = tuple(
                slice(o * n + s.start, o * n + s.stop)
                for o, n, s in zip((i, j), case.chunk, inner, strict=True)
            )
            batch.add(stored[k % len(stored)], layout, inner, out, target, (), f"c/{i}/{j}")
        start = time.process_time()
        batch.run()
        return time.process_time() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--label", default="", help="a first column for every line")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {args.label or 'build'}: CPUs {cpus}, load {os.getloadavg()}")
    for case in CASES:
        if args.only not in case.name:
            continue
        run = prepare(case)
        run()  # warm
        times = sorted(run() for _ in range(args.reps))
        lead = f"{args.label}\t" if args.label else ""
        print(f"{lead}{case.name}\t{1e3 * times[0]:.3f}\t{1e3 * times[len(times) // 2]:.3f}")


if __name__ == "__main__":
    main()
