"""Reads under filesystem latency and from a cold page cache (issue 14).

`LatencyRead` models a parallel or network filesystem (Lustre, GPFS, NFS)
on the local disk: the faultfs shim (``_latency``) delays every file call
on the benchmark's data by ``latency_us``. The shim must be preloaded at
process start, so each case runs its reads in a child process with the
shim loaded and reports the median seconds of its timed reads
(``track_*``; setup and the check of the data are untimed, in the child
too). `ColdRead` drops the page cache before each timed read, in process.
Both skip (``NotImplementedError``) where the shim does not build or the
page cache cannot be dropped (not root, a read-only ``/proc/sys``).

Cases: the unsharded float32 square (1024 blosc chunk files) read whole,
and a thin slab ``a[100:101]`` across the sharded uint16 cube; peers
zarr_fused (and ``zarr_fused-io1``: ``codec_pipeline.io_concurrency`` 1,
its IO in the compute threads), zarrs and tensorstore. zarr's own
pipelines take seconds per read at these latencies and are left out.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._latency import build_shim, drop_page_cache, shim_env
from ._peers import LAYOUTS, QUICK, Reader, available, choose, data_dir, write_reference

CASES = ["unsharded-all", "sharded-slab"]
PEERS = choose(["zarr_fused", "zarr_fused-io1", "zarrs", "tensorstore"], ["zarr_fused"])
#: timed reads per case (the median is reported)
ROUNDS = 1 if QUICK else 7


def _case(case: str) -> tuple[str, Any]:
    """The layout and selection of ``case``."""
    if case == "unsharded-all":
        return "unsharded-blosc", Ellipsis
    row = 100 % LAYOUTS["sharded-zstd"].shape[0]
    return "sharded-zstd", (slice(row, row + 1),)


def _reader(peer: str, path: Path) -> Any:
    """A reader of ``peer``; ``zarr_fused-io1`` pins ``io_concurrency`` to 1."""
    reader = Reader("zarr_fused" if peer == "zarr_fused-io1" else peer, path)
    if peer != "zarr_fused-io1":
        return reader
    import zarr

    class _IO1:
        def read(self, selection: Any) -> np.ndarray:
            with zarr.config.set({"codec_pipeline.io_concurrency": 1}):
                return reader.read(selection)

    return _IO1()


def _check_peer(peer: str) -> None:
    base = "zarr_fused" if peer == "zarr_fused-io1" else peer
    if not available(base):
        raise NotImplementedError(f"{base} is not installed")


def timed_reads(case: str, peer: str, rounds: int, cold: bool) -> list[float]:
    """Seconds of ``rounds`` reads of ``case`` by ``peer`` (each checked once,
    untimed, against the data written); ``cold`` drops the page cache
    before each."""
    layout, selection = _case(case)
    path = data_dir() / layout
    expected = write_reference(LAYOUTS[layout], path)[selection]
    reader = _reader(peer, path)
    if not np.array_equal(reader.read(selection), expected):
        raise AssertionError(f"{peer} read wrong data ({case})")
    seconds = []
    for _ in range(rounds):
        if cold:
            drop_page_cache()
        start = time.perf_counter()
        reader.read(selection)
        seconds.append(time.perf_counter() - start)
    return seconds


class LatencyRead:
    """Reads with every file call delayed by ``latency_us`` (in a child process)."""

    params = (CASES, PEERS, choose([200, 1000], [200]))
    param_names = ("case", "peer", "latency_us")
    timeout = 600
    unit = "seconds"

    def setup_cache(self) -> str:
        for layout in ("unsharded-blosc", "sharded-zstd"):  # written without the shim
            write_reference(LAYOUTS[layout], data_dir() / layout)
        shim = build_shim(data_dir().parent / "shim")
        return "" if shim is None else str(shim)

    def setup(self, shim: str, case: str, peer: str, latency_us: int) -> None:
        if not shim:
            raise NotImplementedError("the faultfs shim did not build (no C compiler?)")
        _check_peer(peer)

    def track_read_seconds(self, shim: str, case: str, peer: str, latency_us: int) -> float:
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from benchmarks.latency import timed_reads; "
            "print(json.dumps(timed_reads(sys.argv[2], sys.argv[3], int(sys.argv[4]), False)))"
        )
        root = str(Path(__file__).resolve().parent.parent)
        result = subprocess.run(
            [sys.executable, "-c", code, root, case, peer, str(ROUNDS)],
            env=shim_env(Path(shim), data_dir(), latency_us),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"the latency child failed:\n{result.stderr}")
        return statistics.median(json.loads(result.stdout.strip().splitlines()[-1]))


class ColdRead:
    """Reads from a cold page cache (dropped before each timed read)."""

    params = (CASES, PEERS)
    param_names = ("case", "peer")
    timeout = 600
    unit = "seconds"

    def setup(self, case: str, peer: str) -> None:
        _check_peer(peer)
        why = drop_page_cache()
        if why is not None:
            raise NotImplementedError(why)

    def track_read_seconds(self, case: str, peer: str) -> float:
        return statistics.median(timed_reads(case, peer, ROUNDS, cold=True))
