#!/usr/bin/env python
"""Sharded reads of an array opened afresh for each read, the store's shard
call measurement lent to the new reader (now) or not (before).

zarr builds a new reader with every array it opens; without the lend
(`zarr_fused.shard.pipelined.SHARD_CALLS`) each such reader's first read
goes through the IO threads to measure the files. Both ways run in one
process, in alternating rounds, on the chains given (their sharded layout,
the geometry of real_chains_side_by_side.py): median and least wall, median
CPU, and how many reads went through the IO threads.

    python asv_bench/shard_lend_side_by_side.py --pin both --repeat 61 --only lz4-u2
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zarr
from zarr.storage import LocalStore
from zarr_fused_testing.chains import CHAINS

from zarr_fused.shard import pipelined

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _side_by_side_cli
import real_chains_side_by_side as chains

#: cheap chains (a hand-off weighs most) and the transposed one of issue 27
DEFAULT = ("lz4-u2", "shuffle-lz4-u2", "delta-i4-zstd", "transpose-quantize-f8-zstd")


class _Toggle:
    """`pipelined.SHARD_CALLS` that lends only while ``lend`` is set."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.lend_on = True
        self.pipelined = 0

    def lend(self, root: bytes, probe: Any) -> None:
        if self.lend_on:
            self.real.lend(root, probe)

    def note(self, root: bytes, probe: Any) -> None:
        self.pipelined += 1  # noted after each pipelined read
        self.real.note(root, probe)

    def forget(self, root: bytes) -> None:
        self.real.forget(root)


def _measure(name: str, path: Path, repeat: int, toggle: _Toggle) -> list[str]:
    def read() -> None:
        with zarr.config.set(chains.CONFIGS[chains.OURS]):
            zarr.open_array(LocalStore(path), mode="r")[:]

    read()
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    through_io = {True: 0, False: 0}
    for r in range(repeat):
        for lend in (True, False) if r % 2 else (False, True):
            toggle.lend_on = lend
            before = toggle.pipelined
            c0, t0 = time.process_time(), time.perf_counter()
            read()
            wall[lend].append(time.perf_counter() - t0)
            cpu[lend].append(time.process_time() - c0)
            through_io[lend] += toggle.pipelined - before
    lines = []
    for lend, label in ((False, "before"), (True, "lent")):
        lines.append(
            f"{name} sharded, {label}: wall median {1e3 * statistics.median(wall[lend]):.2f} "
            f"min {1e3 * min(wall[lend]):.2f} cpu median {1e3 * statistics.median(cpu[lend]):.2f}"
            f" ms; {through_io[lend]}/{repeat} reads through the IO threads"
        )
    ratios = [
        statistics.median(wall[False]) / statistics.median(wall[True]),
        min(wall[False]) / min(wall[True]),
        statistics.median(cpu[False]) / statistics.median(cpu[True]),
    ]
    lines.append(
        f"{name} sharded, before/lent: wall median {ratios[0]:.3f}x, min {ratios[1]:.3f}x, "
        f"cpu {ratios[2]:.3f}x"
    )
    return lines


def run(repeat: int, only: str = "") -> list[str]:
    names = [n for n in CHAINS if only in n and CHAINS[n]["format"] == 3] if only else DEFAULT
    toggle = _Toggle(pipelined.SHARD_CALLS)
    pipelined.SHARD_CALLS = toggle  # type: ignore[misc]
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = Path(tmp) / name
            chains._write(path, CHAINS[name], True)
            measured = _measure(name, path, repeat, toggle)
            print("\n".join(measured), flush=True)
            lines += measured
    return []


def main(argv: list[str] | None = None) -> int:
    return _side_by_side_cli.chains_main(
        __file__, __doc__, argv, "sharded reads, shard calls lent or not", run, repeat=61
    )


if __name__ == "__main__":
    sys.exit(main())
