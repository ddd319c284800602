#!/usr/bin/env python
"""The cost of ``codec_pipeline.shard_write_lock`` on a single writer.

Partial-shard writes to a `LocalStore` (each holds its shard from the read
of the stored shard to the rename of the new one, `zarr_fused.io.shard_lock`)
timed with the protection on and off, alternated in one process so both
see the same machine; medians of ``--repeats`` rounds, reported as the
ratio on/off.

Cases (a 2048x2048 float32 array, 256x256 shards of 64x64 inner chunks,
zstd level 1):

- ``half-shards``: 64 writes, each the top half of one shard (8 of its 16
  inner chunks whole, the shard read and merged);
- ``offset-slab``: one write of rows 128:1920, which covers half of each
  shard of the first and last shard rows (16 partial shards, held) and the
  48 shards between whole (no hold);
- ``unaligned``: one write of rows 96:1952 and columns 32:2016, which
  covers part of every inner chunk on the shards' edges (every shard
  partial, held).

    python asv_bench/shard_lock_side_by_side.py --repeats 9
    taskset -c 0 python asv_bench/shard_lock_side_by_side.py --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

N = 2048
SHARD = 256
INNER = 64


def make(root: Path) -> tuple[zarr.Array, np.ndarray]:
    rng = np.random.default_rng(7)
    data = np.cumsum(rng.normal(size=(N, N)), axis=1).astype("float32")
    arr = zarr.create_array(
        zarr.storage.LocalStore(root),
        shape=(N, N),
        chunks=(INNER, INNER),
        shards=(SHARD, SHARD),
        dtype="float32",
        compressors=ZstdCodec(level=1),
    )
    arr[...] = data
    return arr, data


def cases(arr: zarr.Array, data: np.ndarray) -> dict[str, Callable[[], None]]:
    new = data + 1

    def half_shards() -> None:
        for r in range(0, N, SHARD):
            for c in range(0, N, SHARD):
                arr[r : r + SHARD // 2, c : c + SHARD] = new[r : r + SHARD // 2, c : c + SHARD]

    def offset_slab() -> None:
        arr[128 : N - 128, :] = new[128 : N - 128, :]

    def unaligned() -> None:
        arr[96 : N - 96, 32 : N - 32] = new[96 : N - 96, 32 : N - 32]

    return {"half-shards": half_shards, "offset-slab": offset_slab, "unaligned": unaligned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    zarr.config.set({"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"})
    with tempfile.TemporaryDirectory() as tmp:
        arr, data = make(Path(tmp) / "a.zarr")
        for name, fn in cases(arr, data).items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for k in range(args.repeats + 1):
                for lock in (True, False) if k % 2 else (False, True):
                    with zarr.config.set({"codec_pipeline.shard_write_lock": lock}):
                        start = time.perf_counter()
                        fn()
                        elapsed = time.perf_counter() - start
                    if k:  # the first round warms up
                        times[lock].append(elapsed)
            on, off = statistics.median(times[True]), statistics.median(times[False])
            print(
                f"{name:12s} on {on * 1e3:8.1f} ms  off {off * 1e3:8.1f} ms  "
                f"on/off {on / off:5.3f}  (medians of {args.repeats})"
            )


if __name__ == "__main__":
    main()
