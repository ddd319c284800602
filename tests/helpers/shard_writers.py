"""Processes that write (and read) inner chunks of one shared shard.

The functions here run in spawned children (``multiprocessing``'s spawn
context imports this module in each child), so they take only picklable
arguments and report through a queue. `run_writers` is the scenario of
concurrent partial-shard updates from several processes: every process
owns some inner chunks of one shard and writes each of them, one write per
inner chunk, once per round; after each round every process checks its
own inner chunks.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

import numpy as np
import zarr

from helpers import FUSED

#: seconds a round, a child or a queue read may take before the test fails
TIMEOUT = 120.0
INNER = 8
SHARD = 64


def create_shared(path: str, pipeline: str = FUSED) -> None:
    """The 64x64 int32 array of one 64x64 shard of 8x8 inner chunks."""
    with zarr.config.set({"codec_pipeline.path": pipeline}):
        zarr.create_array(
            zarr.storage.LocalStore(path),
            shape=(SHARD, SHARD),
            chunks=(INNER, INNER),
            shards=(SHARD, SHARD),
            dtype="int32",
            fill_value=-1,
        )


def owned(rank: int, processes: int) -> list[tuple[int, int]]:
    """The inner chunks (row, column of the inner grid) ``rank`` writes: a
    share of the 64, interleaved so every row holds several writers."""
    grid = SHARD // INNER
    cells = [(r, c) for r in range(grid) for c in range(grid)]
    return cells[rank::processes]


def value_of(rank: int, round_: int) -> int:
    return 1000 * (round_ + 1) + rank


def _write_rounds(
    path: str,
    rank: int,
    processes: int,
    rounds: int,
    config: dict[str, Any],
    barrier: Any,
    results: Any,
) -> None:
    """A child: each round, write every owned inner chunk (one write each,
    in a per-round shuffled order), wait for all, count own chunks lost."""
    try:
        rng = np.random.default_rng(1234 + rank)
        lost = []
        with zarr.config.set(config):
            arr = zarr.open_array(zarr.storage.LocalStore(path), mode="r+")
            cells = owned(rank, processes)
            for round_ in range(rounds):
                barrier.wait(TIMEOUT)
                value = value_of(rank, round_)
                for k in rng.permutation(len(cells)):
                    r, c = cells[int(k)]
                    arr[r * INNER : (r + 1) * INNER, c * INNER : (c + 1) * INNER] = value
                barrier.wait(TIMEOUT)
                whole = arr[...]
                lost.append(
                    sum(
                        not np.all(
                            whole[r * INNER : (r + 1) * INNER, c * INNER : (c + 1) * INNER] == value
                        )
                        for r, c in cells
                    )
                )
                barrier.wait(TIMEOUT)  # nobody writes the next round while others check
        results.put((rank, lost))
    except BaseException:
        results.put((rank, traceback.format_exc()))


def run_writers(
    path: str, processes: int, rounds: int, config: dict[str, Any]
) -> dict[int, list[int]]:
    """Spawn ``processes`` writers of the shared array at ``path``; their
    lost inner chunks per round, by rank (raises what a child raised)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_write_rounds, args=(path, rank, processes, rounds, config, barrier, results)
        )
        for rank in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        answers = dict(results.get(timeout=TIMEOUT * 2) for _ in procs)
        for proc in procs:
            proc.join(TIMEOUT)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [answer for answer in answers.values() if isinstance(answer, str)]
    assert not errors, errors[0]
    assert all(proc.exitcode == 0 for proc in procs)
    return answers
