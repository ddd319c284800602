"""1024 files of 14 KB in 32 directories, written and os.sync()ed, then
replaced: temporary file + rename over the target, temporary file +
renameat2(RENAME_EXCHANGE) + unlink, or in place (O_TRUNC). Serial, then
with N threads (argv: rounds N). Run pinned with taskset -c 0."""

import ctypes
import os
import resource
import statistics
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2
root = "/tmp/owperf/loop"
payload = os.urandom(14000)


def files():
    for i in range(32):
        for j in range(32):
            yield f"{root}/{i}/{j}"


def prepare():
    for i in range(32):
        os.makedirs(f"{root}/{i}", exist_ok=True)
    for f in files():
        with open(f, "wb") as fh:
            fh.write(payload)
    os.sync()


def rename_over():
    for f in files():
        t = f + ".tmp"
        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, payload)
        os.close(fd)
        os.rename(t, f)


def exchange():
    for f in files():
        t = f + ".tmp"
        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, payload)
        os.close(fd)
        if libc.renameat2(AT_FDCWD, t.encode(), AT_FDCWD, f.encode(), RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), f)
        os.unlink(t)


def inplace():
    for f in files():
        fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, payload)
        os.close(fd)


modes = {"rename_over": rename_over, "exchange": exchange, "inplace": inplace}
res = {m: [] for m in modes}
prepare()
for r in range(int(sys.argv[1])):
    for m, fn in modes.items():
        os.sync()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        res[m].append((t, ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime))
for m, v in res.items():
    if not v:
        continue
    w, c = zip(*v)
    print(
        f"{m:12} wall median {statistics.median(w) * 1e3:.1f} ms min {min(w) * 1e3:.1f} cpu {statistics.median(c) * 1e3:.1f} ms"
    )
from concurrent.futures import ThreadPoolExecutor


def threaded(fn1, n):
    fl = list(files())

    def run(k):
        for f in fl[k::n]:
            fn1(f)

    def go():
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(run, range(n)))

    return go


def ro1(f):
    t = f + ".tmp"
    fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, payload)
    os.close(fd)
    os.rename(t, f)


def ex1(f):
    t = f + ".tmp"
    fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, payload)
    os.close(fd)
    if libc.renameat2(AT_FDCWD, t.encode(), AT_FDCWD, f.encode(), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), f)
    os.unlink(t)


N = int(sys.argv[2])
modes2 = {f"ro x{N}": threaded(ro1, N), f"ex x{N}": threaded(ex1, N)}
res = {m: [] for m in modes2}
for r in range(int(sys.argv[1])):
    for m, fn in modes2.items():
        os.sync()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        res[m].append((t, ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime))
for m, v in res.items():
    w, c = zip(*v)
    print(
        f"{m:12} wall median {statistics.median(w) * 1e3:.1f} ms min {min(w) * 1e3:.1f} cpu {statistics.median(c) * 1e3:.1f} ms"
    )
