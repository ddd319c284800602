"""Each MPI rank writes its own shard-aligned region of one sharded array
with zarr_fused, then reads another rank's region back and checks it.

    mpirun -n 2 python docs/examples/mpi_regions.py /path/to/out.zarr

Rank 0 creates the array; after a barrier every rank writes the rows of its
shard; after another barrier every rank reads the region of the next rank.
Rank 0 finally writes the same data with zarr's own pipeline into a second
store and compares the stored shards byte for byte. Prints one line per rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import zarr
from mpi4py import MPI

EDGE = 32  # shard edge; inner chunks of 16


def region_data(rank: int) -> np.ndarray:
    """The values rank ``rank`` writes (deterministic, so any rank can check)."""
    return np.random.default_rng(rank).integers(0, 60000, (EDGE, EDGE, EDGE), dtype="<u2")


def main(root: Path) -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    zarr.config.set({"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"})
    shape = (EDGE * size, EDGE, EDGE)
    if rank == 0:
        zarr.create_array(
            zarr.storage.LocalStore(root),
            shape=shape,
            dtype="<u2",
            chunks=(16, 16, 16),
            shards=(EDGE, EDGE, EDGE),
            overwrite=True,
        )
    comm.Barrier()
    arr = zarr.open_array(zarr.storage.LocalStore(root), mode="r+")
    arr[rank * EDGE : (rank + 1) * EDGE] = region_data(rank)
    comm.Barrier()
    other = (rank + 1) % size
    got = arr[other * EDGE : (other + 1) * EDGE]
    ok = bool(np.array_equal(got, region_data(other)))
    if rank == 0:
        oracle = root.with_name(root.name + ".oracle")
        with zarr.config.set(
            {"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"}
        ):
            ref = zarr.create_array(
                zarr.storage.LocalStore(oracle),
                shape=shape,
                dtype="<u2",
                chunks=(16, 16, 16),
                shards=(EDGE, EDGE, EDGE),
                overwrite=True,
            )
            for r in range(size):
                ref[r * EDGE : (r + 1) * EDGE] = region_data(r)
        for r in range(size):
            key = Path("c", str(r), "0", "0")
            ok &= (root / key).read_bytes() == (oracle / key).read_bytes()
    results = comm.gather(ok, root=0)
    print(f"rank {rank}/{size}: region of rank {other} {'ok' if ok else 'WRONG'}", flush=True)
    if rank == 0:
        print("all ranks ok" if all(results) else "FAILED", flush=True)
        return 0 if all(results) else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
