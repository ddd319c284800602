"""How many threads zarr_fused may use: CPU detection and thread-count rules.

Every thread count zarr_fused uses comes from `resolve_max_workers`
(``codec_pipeline.max_workers``, see `zarr_fused.config`); its default,
`default_max_workers`, starts from the CPUs this process may really run on
(`available_cpus`: affinity mask, cgroup CPU quota), capped by a native
thread limit the process was started with and shared among the task threads
of a Dask worker. The pool that runs them is `zarr_fused._pool`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from zarr_fused.config import MAX_WORKERS_CAP, MAX_WORKERS_KEY, int_setting

__all__ = [
    "available_cpus",
    "cgroup_cpu_quota",
    "default_max_workers",
    "resolve_max_workers",
]


# -- how many CPUs may this process use? ----------------------------------------


def _read_text(path: Path) -> str | None:
    # ValueError: undecodable bytes, or a NUL in a path taken from /proc
    try:
        return path.read_text()
    except (OSError, ValueError):
        return None


def _cgroup_v2_quota(root: Path, rel: str) -> float | None:
    """Smallest ``cpu.max`` quota on the path from the process's cgroup to
    the hierarchy root, in CPUs; None when unlimited or unreadable."""
    best: float | None = None
    for base in (root / "sys/fs/cgroup", root / "sys/fs/cgroup/unified"):
        cur = base / rel.lstrip("/")
        while True:
            text = _read_text(cur / "cpu.max")
            if text is not None:
                parts = text.split()
                if len(parts) == 2 and parts[0] != "max":
                    try:
                        quota = int(parts[0]) / int(parts[1])
                    except (ValueError, ArithmeticError):
                        quota = None
                    if quota is not None and quota > 0 and (best is None or quota < best):
                        best = quota
            if cur == base:
                break
            cur = cur.parent
    return best


def _cgroup_v1_quota(root: Path, rel: str) -> float | None:
    best: float | None = None
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / "sys/fs/cgroup" / mount
        for cur in (base / rel.lstrip("/"), base):
            q = _read_text(cur / "cpu.cfs_quota_us")
            p = _read_text(cur / "cpu.cfs_period_us")
            if q is None or p is None:
                continue
            try:
                quota, period = int(q), int(p)
            except ValueError:
                continue
            if quota > 0 and period > 0:
                try:
                    value = quota / period
                except ArithmeticError:
                    continue
                if best is None or value < best:
                    best = value
    return best


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None.

    Reads cgroup v2 ``cpu.max`` and cgroup v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` for the cgroups named in ``/proc/self/cgroup``;
    ``root`` exists for tests.
    """
    root = Path(root)
    text = _read_text(root / "proc/self/cgroup")
    if text is None:
        return None
    quotas: list[float] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            q = _cgroup_v2_quota(root, rel)
        elif "cpu" in controllers.split(","):
            q = _cgroup_v1_quota(root, rel)
        else:
            continue
        if q is not None:
            quotas.append(q)
    return min(quotas) if quotas else None


# The cgroup files take ~1 ms to read, and every batch asks: keep the quota
# for a few seconds (per process: a forked child reads them anew).
_QUOTA_TTL = 5.0
_quota_cache: tuple[int, float, float | None] | None = None  # (pid, when, quota)


def _cached_quota(root: str | os.PathLike[str]) -> float | None:
    global _quota_cache
    if str(root) != "/":
        return cgroup_cpu_quota(root)
    now = time.monotonic()
    cache = _quota_cache
    if cache is not None and cache[0] == os.getpid() and now - cache[1] < _QUOTA_TTL:
        return cache[2]
    quota = cgroup_cpu_quota(root)
    _quota_cache = (os.getpid(), now, quota)
    return quota


def available_cpus(root: str | os.PathLike[str] = "/") -> tuple[int, str]:
    """How many CPUs this process may actually run on, and why.

    The affinity mask (``taskset``, a batch scheduler's CPU binding, Dask's
    worker pinning) bounds it first, then a cgroup CPU quota (containers,
    Slurm/Kubernetes CPU limits), rounded up. ``os.cpu_count()`` is only the
    last resort: it counts the machine's CPUs, which oversubscribes a job
    that was given a few of them. The affinity mask is read on every call
    (Dask and batch systems change it at run time); the cgroup quota is
    re-read after a few seconds.
    """
    if hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
        why = f"{count} CPUs in this process's affinity mask"
    else:
        count = os.cpu_count() or 1
        why = f"{count} CPUs reported by os.cpu_count()"
    quota = _cached_quota(root)
    if quota is not None and math.ceil(quota) < count:
        count = max(1, math.ceil(quota))
        why += f", capped at {count} by a cgroup CPU quota of {quota:g} CPUs"
    return max(1, count), why


_start_env: tuple[int, dict[bytes, bytes] | None] | None = None


def _environment_at_start() -> dict[bytes, bytes] | None:
    """The environment this process was started with (``/proc/self/environ``,
    read once per process), or None where it cannot be read.

    Not ``os.environ``: a process that creates a Dask ``LocalCluster`` sets
    ``OMP_NUM_THREADS=1`` in its own ``os.environ`` for the workers it
    spawns, and that must not shrink its own reads.
    """
    global _start_env
    pid = os.getpid()
    if _start_env is None or _start_env[0] != pid:
        try:
            raw = Path("/proc/self/environ").read_bytes()
            env: dict[bytes, bytes] | None = dict(
                item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item
            )
        except OSError:
            env = None
        _start_env = (pid, env)
    return _start_env[1]


def _thread_limit_variable() -> tuple[int, str] | None:
    """``OMP_NUM_THREADS`` from the environment the process started with, as
    a positive integer (its first level when it lists nested levels), or None
    when unset or not a number."""
    start = _environment_at_start()
    if start is None:
        text = os.environ.get("OMP_NUM_THREADS", "")
    else:
        text = os.fsdecode(start.get(b"OMP_NUM_THREADS", b""))
    try:
        value = int(text.split(",")[0].strip())
    except ValueError:
        return None
    return (value, "OMP_NUM_THREADS") if value >= 1 else None


def _dask_worker_threads() -> int | None:
    """The task threads of the Dask workers living in this process, or None
    outside a Dask worker. Never imports distributed."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        workers = list(distributed.Worker._instances)
        threads = sum(int(w.state.nthreads) for w in workers if w.status.name == "running")
    except Exception:  # a distributed version without these attributes
        return None
    return threads or None


def default_max_workers() -> tuple[int, str]:
    """The thread count used when ``codec_pipeline.max_workers`` is unset,
    and why.

    Start from the CPUs this process may use (`available_cpus`). A thread
    limit for native libraries in the environment the process was started
    with (``OMP_NUM_THREADS``: Dask's nanny sets it to 1 in every worker,
    batch launchers often to a rank's share) caps it. Inside a Dask worker, the worker's own task
    threads already run one task per core it was given, so each task gets
    the CPUs divided by the task threads of this process: never more compute
    threads than CPUs.
    """
    count, why = available_cpus()
    limit = _thread_limit_variable()
    if limit is not None and limit[0] < count:
        count = limit[0]
        why += f", capped at {count} by {limit[1]}"
    tasks = _dask_worker_threads()
    if tasks is not None:
        share = max(1, count // tasks)
        if share < count:
            why += f", {share} per task of the {tasks} Dask worker threads in this process"
            count = share
    return count, why


def resolve_max_workers() -> int:
    """Threads for one batch, from ``codec_pipeline.max_workers``
    (`zarr_fused.config.int_setting`: never raises; an invalid value warns
    and uses `default_max_workers`, one above `MAX_WORKERS_CAP` warns and is
    clamped)."""
    return int_setting(
        MAX_WORKERS_KEY,
        cap=MAX_WORKERS_CAP,
        default=lambda: default_max_workers()[0],
        stacklevel=2,
    )
