#!/usr/bin/env python
"""What replacing a written-back file costs the writing process, three ways.

1024 files of 14 KB in 32 directories are written and ``os.sync()``-ed;
then, in each round, every file is replaced by 8 threads (the order of the
three ways rotating, ``os.sync()`` before each):

- ``exchange+sfr``: what zarr_fused does to an existing chunk: a temporary
  file, ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, ``renameat2(...,
  RENAME_EXCHANGE)``, ``unlink`` of the old file (`zarr_fused._localio`);
- ``exchange``: the same without starting the writeback;
- ``inplace``: ``open(O_TRUNC)`` + ``write``, as zarrs does (not atomic: a
  reader or a crash may see a part).

Prints median wall, user and system CPU seconds of the process (all its
threads) per 1024 files. Writeback the kernel's flusher threads do later
is not counted; writeback started by ``sync_file_range`` is. Linux only.

    python asv_bench/replace_cost.py [ROUNDS] [DIR]
    taskset -c 0 python asv_bench/replace_cost.py [ROUNDS] [DIR]
"""

from __future__ import annotations

import ctypes
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE, SYNC_FILE_RANGE_WRITE = -100, 2, 2
PAYLOAD = os.urandom(14000)


def exchange(path: str, start_writeback: bool) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, PAYLOAD)
    if start_writeback:
        LIBC.sync_file_range(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), SYNC_FILE_RANGE_WRITE)
    os.close(fd)
    if LIBC.renameat2(AT_FDCWD, tmp.encode(), AT_FDCWD, path.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
    os.unlink(tmp)


def inplace(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, PAYLOAD)
    os.close(fd)


WAYS: dict[str, Callable[[str], None]] = {
    "exchange+sfr": lambda path: exchange(path, True),
    "exchange": lambda path: exchange(path, False),
    "inplace": inplace,
}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(tempfile.gettempdir(), "replace_cost")
    files = [f"{root}/{i}/{j}" for i in range(32) for j in range(32)]
    for i in range(32):
        os.makedirs(f"{root}/{i}", exist_ok=True)
    for path in files:
        with open(path, "wb") as f:
            f.write(PAYLOAD)
    results: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
    names = list(WAYS)
    with ThreadPoolExecutor(8) as pool:
        for r in range(rounds):
            for way in names[r % 3 :] + names[: r % 3]:
                os.sync()
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                list(pool.map(WAYS[way], files))
                wall = time.perf_counter() - t0
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                results[way].append((wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime))
    print(
        f"# CPUs {sorted(os.sched_getaffinity(0))}, {rounds} rounds, load {os.getloadavg()[0]:.1f}"
    )
    for way, runs in results.items():
        wall, user, system = (statistics.median(column) for column in zip(*runs, strict=True))
        print(
            f"{way:13} wall {wall * 1e3:7.1f} ms  user {user * 1e3:6.1f} ms  sys {system * 1e3:6.1f} ms"
        )


if __name__ == "__main__":
    main()
