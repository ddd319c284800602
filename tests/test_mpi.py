"""MPI ranks writing and reading regions of one array: shard-aligned
regions (docs/examples/mpi_regions.py under ``mpirun -n 2``), and regions
interleaved inside the same shards (docs/examples/mpi_interleaved.py under
``mpirun -n 4``), where the shard write lock must keep every rank's write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def _mpirun(ranks: int, example: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``mpirun -n ranks python docs/examples/<example> args...``, finished."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    env = dict(
        os.environ,
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    return subprocess.run(
        [mpirun, "-n", str(ranks), sys.executable, str(EXAMPLES / example), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_two_ranks_write_and_read_their_regions(tmp_path: Path) -> None:
    proc = _mpirun(2, "mpi_regions.py", str(tmp_path / "out.zarr"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all ranks ok" in proc.stdout
    assert proc.stdout.count(" ok") == 3  # both ranks and the summary


def test_four_ranks_interleaved_in_shared_shards_lose_nothing(tmp_path: Path) -> None:
    """Four ranks update the same shards at once, ten rounds: every inner
    chunk holds its owner's value after every round."""
    proc = _mpirun(4, "mpi_interleaved.py", str(tmp_path / "out.zarr"), "10")
    assert "lost 0 of 1280 inner chunks" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
