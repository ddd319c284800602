"""MPI ranks writing and reading shard-aligned regions of one array
(docs/examples/mpi_regions.py under ``mpirun -n 2``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "mpi_regions.py"


def test_two_ranks_write_and_read_their_regions(tmp_path: Path) -> None:
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
    proc = subprocess.run(
        [mpirun, "-n", "2", sys.executable, str(EXAMPLE), str(tmp_path / "out.zarr")],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all ranks ok" in proc.stdout
    assert proc.stdout.count(" ok") == 3  # both ranks and the summary
