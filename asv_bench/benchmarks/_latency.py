"""The latency shim and the page-cache drop, shared by the asv latency
benchmarks (``latency.py``) and ``latency_side_by_side.py``.

The shim is ``tests/shims/faultfs.c`` in its delay mode: preloaded into a
process (``LD_PRELOAD``), it makes every ``open``, ``read``, ``write``,
``rename`` and ``fsync`` of the files whose path holds ``FAULTFS_MARKER``
wait ``FAULTFS_DELAY_US`` microseconds first, each thread on its own, as
requests in flight on a network filesystem do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parents[2] / "tests" / "shims" / "faultfs.c"
#: the calls the shim delays (faultfs' call groups)
DELAYED_OPS = "open,create,read,write,rename,fsync"


def build_shim(directory: Path) -> Path | None:
    """faultfs compiled into ``directory`` (None when there is no source or
    no C compiler that builds it); rebuilt only when the source is newer."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not SHIM_SOURCE.exists():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "faultfs.so"
    if target.exists() and target.stat().st_mtime >= SHIM_SOURCE.stat().st_mtime:
        return target
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(target), str(SHIM_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        return None
    return target


def shim_env(shim: Path, marker: Path, latency_us: int) -> dict[str, str]:
    """This process's environment with the shim preloaded, delaying the
    calls on files under ``marker`` by ``latency_us``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTFS_")}
    env.pop("LD_PRELOAD", None)
    env.update(
        LD_PRELOAD=str(shim),
        FAULTFS_MARKER=str(marker),
        FAULTFS_OPS=DELAYED_OPS,
        FAULTFS_MODE="delay",
        FAULTFS_DELAY_US=str(latency_us),
    )
    return env


def drop_page_cache() -> str | None:
    """Drop the page cache; None on success, else why it cannot be."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        return f"cannot drop the page cache ({e}); the cold-cache scenario needs root"
    return None
