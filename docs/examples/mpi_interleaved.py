"""MPI ranks writing interleaved regions of the same shards with zarr_fused,
then one rank checking that no rank's write was lost.

    mpirun -n 4 python docs/examples/mpi_interleaved.py /path/to/out.zarr [ROUNDS]

The array is one row of shards; each shard is a grid of 8 x 8 inner chunks,
and rank ``r`` owns the inner-chunk rows ``r, r + size, r + 2 size, ...`` of
every shard. Every round, all ranks write their rows at once, one
``arr[...] = ...`` per row, so several ranks update every shard at the same
moment. Without protection, each update reads the stored shard, merges its
own inner chunks and replaces the shard, and the last replacement wins: the
others' inner chunks of that round are lost. With zarr_fused's shard write
lock (``codec_pipeline.shard_write_lock``, on by default) nothing is lost.

After each round, rank 0 reads the whole array and counts the inner chunks
that do not hold the value their owner wrote in that round. Prints one line
per rank, then ``lost N of M inner chunks``. Set ``ZARR_FUSED_NO_LOCK=1`` to
run it with the protection off.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import zarr
from mpi4py import MPI

INNER = 8  # inner chunk edge
GRID = 8  # inner chunks per shard edge
SHARDS = 2  # shards along the second axis
SHARD = INNER * GRID


def value(rank: int, round_: int) -> int:
    """What ``rank`` writes in round ``round_`` (never the fill value 0)."""
    return 1 + round_ * 64 + rank


def main(root: Path, rounds: int) -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    settings: dict[str, object] = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"}
    if os.environ.get("ZARR_FUSED_NO_LOCK") == "1":
        settings["codec_pipeline.shard_write_lock"] = False
    zarr.config.set(settings)
    shape = (SHARD, SHARD * SHARDS)
    if rank == 0:
        zarr.create_array(
            zarr.storage.LocalStore(root),
            shape=shape,
            dtype="<u4",
            chunks=(INNER, INNER),
            shards=(SHARD, SHARD),
            fill_value=0,
            overwrite=True,
        )
    comm.Barrier()
    arr = zarr.open_array(zarr.storage.LocalStore(root), mode="r+")
    mine = range(rank, GRID, size)
    lost = total = 0
    for round_ in range(rounds):
        comm.Barrier()  # every rank starts the round together
        for row in mine:
            arr[row * INNER : (row + 1) * INNER, :] = value(rank, round_)
        comm.Barrier()
        if rank == 0:
            lost += count_lost(arr[...], size, round_)
            total += GRID * GRID * SHARDS
    print(f"rank {rank}/{size}: wrote rows {list(mine)} in {rounds} rounds", flush=True)
    if rank != 0:
        return 0
    print(f"lost {lost} of {total} inner chunks", flush=True)
    return 0 if lost == 0 else 1


def count_lost(got: np.ndarray, size: int, round_: int) -> int:
    """The inner chunks of ``got`` that do not hold what their owner wrote
    in ``round_``."""
    lost = 0
    for row in range(GRID):
        expected = value(row % size, round_)
        for col in range(GRID * SHARDS):
            block = got[row * INNER : (row + 1) * INNER, col * INNER : (col + 1) * INNER]
            lost += int(not np.all(block == expected))
    return lost


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10))
