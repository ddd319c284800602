"""The thread pool and its sizing: `zarr_fused._pool` and `zarr_fused.config`.

CPU detection runs against fake ``/proc`` and ``/sys/fs/cgroup`` trees under
``tmp_path`` (the ``root`` argument); affinity, environment variables and
fork are checked for real, in child processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.errors import ZarrUserWarning
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import _pool
from zarr_fused._pool import (
    available_cpus,
    cgroup_cpu_quota,
    get_pool,
    in_worker_thread,
    pool_size,
    resolve_max_workers,
    run_parallel,
)
from zarr_fused.config import MAX_WORKERS_CAP, MAX_WORKERS_KEY, STRICT_KEY, strict_mode

FUSED = "zarr_fused.FusedCodecPipeline"
# A generous bound for anything that could hang: a deadlock fails the test.
TIMEOUT = 30.0
# Forking a process that runs threads is exactly what these tests do on purpose.
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"


def make_tree(root: Path, files: dict[str, str | bytes | None]) -> Path:
    """Files under ``root`` (``None``: a directory of that name)."""
    for rel, content in files.items():
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- cgroup CPU quota ---------------------------------------------------------------

V2 = "0::/a/b\n"
V2_LEAF = "sys/fs/cgroup/a/b/cpu.max"
V1 = "4:cpu,cpuacct:/x\n"
V1_DIR = "sys/fs/cgroup/cpu,cpuacct/x"

QUOTA_CASES = [
    # cgroup v2
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "150000 100000\n"}, 1.5, id="v2-leaf"),
    pytest.param(
        {
            "proc/self/cgroup": V2,
            V2_LEAF: "150000 100000\n",
            "sys/fs/cgroup/a/cpu.max": "50000 100000\n",
        },
        0.5,
        id="v2-smaller-parent-wins",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V2,
            V2_LEAF: "150000 100000\n",
            "sys/fs/cgroup/cpu.max": "25000 100000\n",
        },
        0.25,
        id="v2-smaller-root-wins",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V2,
            V2_LEAF: "150000 100000\n",
            "sys/fs/cgroup/a/cpu.max": "400000 100000\n",
        },
        1.5,
        id="v2-larger-parent-ignored",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V2,
            V2_LEAF: "max 100000\n",
            "sys/fs/cgroup/a/cpu.max": "200000 100000\n",
        },
        2.0,
        id="v2-unlimited-leaf-limited-parent",
    ),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "max 100000\n"}, None, id="v2-unlimited"),
    pytest.param(
        {"proc/self/cgroup": V2, "sys/fs/cgroup/unified/a/b/cpu.max": "300000 100000\n"},
        3.0,
        id="v2-hybrid-unified-mount",
    ),
    pytest.param(
        {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "250000 100000\n"},
        2.5,
        id="v2-root-cgroup",
    ),
    pytest.param({"proc/self/cgroup": V2}, None, id="v2-no-cpu-max"),
    # cgroup v1
    pytest.param(
        {
            "proc/self/cgroup": V1,
            f"{V1_DIR}/cpu.cfs_quota_us": "200000\n",
            f"{V1_DIR}/cpu.cfs_period_us": "100000\n",
        },
        2.0,
        id="v1-cpu,cpuacct",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V1,
            "sys/fs/cgroup/cpu/x/cpu.cfs_quota_us": "50000\n",
            "sys/fs/cgroup/cpu/x/cpu.cfs_period_us": "100000\n",
        },
        0.5,
        id="v1-cpu-mount",
    ),
    pytest.param(
        {
            "proc/self/cgroup": "1:cpu:/x\n2:cpuacct:/x\n",
            "sys/fs/cgroup/cpu/x/cpu.cfs_quota_us": "120000\n",
            "sys/fs/cgroup/cpu/x/cpu.cfs_period_us": "100000\n",
        },
        1.2,
        id="v1-separate-cpu-line",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V1,
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "75000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
        0.75,
        id="v1-namespaced-mount-root",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V1,
            f"{V1_DIR}/cpu.cfs_quota_us": "-1\n",
            f"{V1_DIR}/cpu.cfs_period_us": "100000\n",
        },
        None,
        id="v1-unlimited",
    ),
    pytest.param(
        {"proc/self/cgroup": V1, f"{V1_DIR}/cpu.cfs_quota_us": "200000\n"},
        None,
        id="v1-missing-period",
    ),
    pytest.param(
        {
            "proc/self/cgroup": "4:memory:/x\n",
            f"{V1_DIR}/cpu.cfs_quota_us": "200000\n",
            f"{V1_DIR}/cpu.cfs_period_us": "100000\n",
        },
        None,
        id="v1-no-cpu-controller",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V1 + V2,
            f"{V1_DIR}/cpu.cfs_quota_us": "300000\n",
            f"{V1_DIR}/cpu.cfs_period_us": "100000\n",
            V2_LEAF: "150000 100000\n",
        },
        1.5,
        id="v1-and-v2-smaller-wins",
    ),
    # missing or garbage: None, never an exception
    pytest.param({}, None, id="no-proc-file"),
    pytest.param({"proc/self/cgroup": ""}, None, id="empty-proc-file"),
    pytest.param(
        {"proc/self/cgroup": "hello\n::::\nno colons here\n1:2\n"}, None, id="garbage-proc-file"
    ),
    pytest.param({"proc/self/cgroup": None}, None, id="proc-file-is-a-directory"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "lots of cpu"}, None, id="cpu.max-words"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: ""}, None, id="cpu.max-empty"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "150000"}, None, id="cpu.max-one-field"),
    pytest.param(
        {"proc/self/cgroup": V2, V2_LEAF: "150000 100000 7"}, None, id="cpu.max-three-fields"
    ),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "150000 0"}, None, id="cpu.max-zero-period"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "0 100000"}, None, id="cpu.max-zero-quota"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "-5 100000"}, None, id="cpu.max-negative"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: "1.5e5 100000"}, None, id="cpu.max-float"),
    pytest.param({"proc/self/cgroup": V2, V2_LEAF: None}, None, id="cpu.max-is-a-directory"),
    pytest.param(
        {"proc/self/cgroup": V2, V2_LEAF: b"\xff\xfe\x00 \x80"}, None, id="cpu.max-not-text"
    ),
    pytest.param(
        {"proc/self/cgroup": V2, V2_LEAF: "1" + "0" * 400 + " 1"}, None, id="cpu.max-huge"
    ),
    pytest.param({"proc/self/cgroup": b"0::/\xff\xfe\n"}, None, id="proc-file-not-text"),
    pytest.param({"proc/self/cgroup": "0::/a\x00b\n"}, None, id="proc-file-nul-in-path"),
    pytest.param(
        {
            "proc/self/cgroup": V1,
            f"{V1_DIR}/cpu.cfs_quota_us": "plenty\n",
            f"{V1_DIR}/cpu.cfs_period_us": "100000\n",
        },
        None,
        id="v1-quota-garbage",
    ),
    pytest.param(
        {
            "proc/self/cgroup": V1,
            f"{V1_DIR}/cpu.cfs_quota_us": "200000\n",
            f"{V1_DIR}/cpu.cfs_period_us": "0\n",
        },
        None,
        id="v1-zero-period",
    ),
]


@pytest.mark.parametrize(("files", "expected"), QUOTA_CASES)
def test_cgroup_cpu_quota(tmp_path: Path, files: dict[str, Any], expected: float | None) -> None:
    quota = cgroup_cpu_quota(make_tree(tmp_path, files))
    if expected is None:
        assert quota is None
    else:
        assert quota == pytest.approx(expected)


def test_cgroup_cpu_quota_accepts_str_root(tmp_path: Path) -> None:
    make_tree(tmp_path, {"proc/self/cgroup": V2, V2_LEAF: "150000 100000\n"})
    assert cgroup_cpu_quota(str(tmp_path)) == pytest.approx(1.5)


# -- available_cpus ----------------------------------------------------------------


def fake_affinity(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(count)), raising=False)


def quota_tree(root: Path, quota: str) -> Path:
    return make_tree(root, {"proc/self/cgroup": V2, V2_LEAF: quota})


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [
        pytest.param(8, "150000 100000", 2, id="8cpus-quota1.5"),
        pytest.param(8, "100000 100000", 1, id="8cpus-quota1"),
        pytest.param(8, "50000 100000", 1, id="8cpus-quota0.5"),
        pytest.param(8, "1 100000", 1, id="8cpus-tiny-quota"),
        pytest.param(8, "350000 100000", 4, id="8cpus-quota3.5"),
        pytest.param(4, "390000 100000", 4, id="4cpus-quota3.9"),
    ],
)
def test_available_cpus_capped_by_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, affinity: int, quota: str, expected: int
) -> None:
    fake_affinity(monkeypatch, affinity)
    count, why = available_cpus(quota_tree(tmp_path, quota))
    assert count == expected
    assert f"{affinity} CPUs in this process's affinity mask" in why
    if expected < affinity:
        assert "cgroup CPU quota" in why
        assert f"capped at {expected}" in why
    else:
        assert "quota" not in why


@pytest.mark.parametrize(
    ("affinity", "quota"),
    [
        pytest.param(2, "400000 100000", id="quota-above-affinity"),
        pytest.param(2, "200000 100000", id="quota-equal-affinity"),
        pytest.param(2, "max 100000", id="unlimited"),
        pytest.param(1, "50000 100000", id="one-cpu-small-quota"),
    ],
)
def test_available_cpus_quota_does_not_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, affinity: int, quota: str
) -> None:
    fake_affinity(monkeypatch, affinity)
    count, why = available_cpus(quota_tree(tmp_path, quota))
    assert count == affinity
    assert "quota" not in why


def test_available_cpus_without_cgroup_uses_affinity(tmp_path: Path) -> None:
    count, why = available_cpus(tmp_path)
    if hasattr(os, "sched_getaffinity"):
        assert count == len(os.sched_getaffinity(0))
        assert "affinity" in why
    else:
        assert count == (os.cpu_count() or 1)
    assert count >= 1


@pytest.mark.parametrize(
    ("cpu_count", "expected"),
    [pytest.param(6, 6, id="cpu_count=6"), pytest.param(None, 1, id="cpu_count=None")],
)
def test_available_cpus_without_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_count: int | None, expected: int
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpu_count)
    count, why = available_cpus(tmp_path)
    assert count == expected
    assert "os.cpu_count()" in why


def test_available_cpus_never_below_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_affinity(monkeypatch, 0)  # an empty mask cannot happen, but must not give 0
    count, _ = available_cpus(quota_tree(tmp_path, "1 100000"))
    assert count == 1


def test_available_cpus_is_exported() -> None:
    assert zarr_fused.available_cpus is available_cpus
    count, why = zarr_fused.available_cpus()
    assert count >= 1
    assert isinstance(why, str) and why


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is not available"
)
def test_affinity_mask_is_respected() -> None:
    """A process pinned to one CPU (taskset, a batch scheduler) gets one worker."""
    result = run_python(
        """
        import json, os
        import zarr, zarr_fused
        from zarr_fused._pool import resolve_max_workers

        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        with zarr.config.set({"codec_pipeline.max_workers": None}):
            workers = resolve_max_workers()
        count, why = zarr_fused.available_cpus()
        print(json.dumps({"count": count, "why": why, "workers": workers}))
        """
    )
    assert result["count"] == 1, result
    assert result["workers"] == 1, result
    assert "affinity" in result["why"]


# -- resolve_max_workers ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(1, 1, id="1"),
        pytest.param(2, 2, id="2"),
        pytest.param(7, 7, id="7"),
        pytest.param(MAX_WORKERS_CAP, MAX_WORKERS_CAP, id="cap"),
        pytest.param("3", 3, id="str-3"),
        pytest.param(" 4 ", 4, id="str-4-spaces"),
        pytest.param("+5", 5, id="str-plus-5"),
        pytest.param("4\n", 4, id="str-4-newline"),
        pytest.param(str(MAX_WORKERS_CAP), MAX_WORKERS_CAP, id="str-cap"),
    ],
)
def test_resolve_max_workers_valid(value: Any, expected: int) -> None:
    with zarr.config.set({MAX_WORKERS_KEY: value}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_max_workers() == expected


def test_resolve_max_workers_none_is_available_cpus() -> None:
    with zarr.config.set({MAX_WORKERS_KEY: None}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_max_workers() == available_cpus()[0]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("fast", id="str-fast"),
        pytest.param("", id="str-empty"),
        pytest.param("0", id="str-0"),
        pytest.param("-3", id="str-minus-3"),
        pytest.param("2.5", id="str-2.5"),
        pytest.param("1e3", id="str-1e3"),
        pytest.param("+", id="str-plus"),
        pytest.param("++4", id="str-plus-plus-4"),
        pytest.param("\N{SUPERSCRIPT TWO}", id="str-superscript-2"),
        pytest.param(0, id="0"),
        pytest.param(-3, id="-3"),
        pytest.param(2.5, id="2.5"),
        pytest.param(4.0, id="4.0"),
        pytest.param(True, id="True"),
        pytest.param(False, id="False"),
        pytest.param([], id="list"),
        pytest.param([2], id="list-2"),
    ],
)
def test_resolve_max_workers_invalid_warns_and_uses_default(value: Any) -> None:
    with zarr.config.set({MAX_WORKERS_KEY: value}):
        with pytest.warns(ZarrUserWarning, match="max_workers"):
            workers = resolve_max_workers()
    assert workers == available_cpus()[0]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(MAX_WORKERS_CAP + 1, id="cap+1"),
        pytest.param(10_000, id="10000"),
        pytest.param("1000", id="str-1000"),
    ],
)
def test_resolve_max_workers_above_cap_warns_and_clamps(value: Any) -> None:
    with zarr.config.set({MAX_WORKERS_KEY: value}):
        with pytest.warns(ZarrUserWarning, match="max_workers") as record:
            workers = resolve_max_workers()
    assert workers == MAX_WORKERS_CAP
    assert str(MAX_WORKERS_CAP) in str(record[0].message)


@pytest.mark.parametrize(
    "env_value", [pytest.param("fast", id="fast"), pytest.param("0", id="zero")]
)
def test_invalid_max_workers_env_var_warns_but_reads(tmp_path: Path, env_value: str) -> None:
    """A typo in ZARR_CODEC_PIPELINE__MAX_WORKERS must not break reads."""
    rng = np.random.default_rng(11)
    data = rng.integers(-1000, 1000, size=(30, 20), dtype="int32")
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        arr = zarr.create_array(
            LocalStore(tmp_path / "data"), shape=data.shape, chunks=(8, 8), dtype=data.dtype
        )
        arr[:] = data
    env = dict(os.environ)
    env["ZARR_CODEC_PIPELINE__PATH"] = FUSED
    env["ZARR_CODEC_PIPELINE__MAX_WORKERS"] = env_value
    result = run_python(
        """
        import json, sys, warnings
        import numpy as np, zarr
        from zarr.storage import LocalStore

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            arr = zarr.open_array(LocalStore(sys.argv[1]), mode="r")
            values = arr[:]
        np.save(sys.argv[2], values)
        pipeline = type(arr._async_array.codec_pipeline)
        print(json.dumps({
            "pipeline": f"{pipeline.__module__}.{pipeline.__qualname__}",
            "warnings": [[w.category.__name__, str(w.message)] for w in caught],
        }))
        """,
        str(tmp_path / "data"),
        str(tmp_path / "values.npy"),
        env=env,
    )
    assert result["pipeline"] == FUSED
    np.testing.assert_array_equal(np.load(tmp_path / "values.npy"), data, strict=True)
    assert any(
        category == "ZarrUserWarning" and "max_workers" in message
        for category, message in result["warnings"]
    ), result["warnings"]


# -- strict_mode -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(True, True, id="True"),
        pytest.param(False, False, id="False"),
        pytest.param("true", True, id="str-true"),
        pytest.param("false", False, id="str-false"),
        pytest.param("TRUE", True, id="str-TRUE"),
        pytest.param(" yes ", True, id="str-yes"),
        pytest.param("off", False, id="str-off"),
        pytest.param("1", True, id="str-1"),
        pytest.param("0", False, id="str-0"),
        pytest.param("", False, id="str-empty"),
        pytest.param(1, True, id="1"),
        pytest.param(0, False, id="0"),
    ],
)
def test_strict_mode_valid(value: Any, expected: bool) -> None:
    with zarr.config.set({STRICT_KEY: value}), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert strict_mode() is expected


def test_strict_mode_default_is_off() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert strict_mode() is False


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("maybe", id="str-maybe"),
        pytest.param("strict", id="str-strict"),
        pytest.param(2, id="2"),
        pytest.param(-1, id="-1"),
        pytest.param(1.5, id="1.5"),
        pytest.param([], id="list"),
    ],
)
def test_strict_mode_invalid_warns_and_is_off(value: Any) -> None:
    with zarr.config.set({STRICT_KEY: value}):
        with pytest.warns(ZarrUserWarning, match="strict"):
            assert strict_mode() is False


# -- run_parallel ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "max_workers"),
    [
        pytest.param(0, 4, id="empty"),
        pytest.param(1, 4, id="one-item"),
        pytest.param(50, 1, id="50-items-1-worker"),
        pytest.param(50, 2, id="50-items-2-workers"),
        pytest.param(50, 4, id="50-items-4-workers"),
        pytest.param(3, 16, id="more-workers-than-items"),
    ],
)
def test_run_parallel_keeps_input_order(n: int, max_workers: int) -> None:
    rng = np.random.default_rng(n * 100 + max_workers)
    items = [int(x) for x in rng.integers(0, 1000, size=n)]
    assert run_parallel(lambda x: (x, x * x), items, max_workers) == [(x, x * x) for x in items]


@pytest.mark.parametrize(
    ("n", "max_workers"),
    [
        pytest.param(10, 1, id="max_workers=1"),
        pytest.param(10, 0, id="max_workers=0"),
        pytest.param(1, 8, id="single-item"),
    ],
)
def test_run_parallel_inline_uses_no_pool(
    monkeypatch: pytest.MonkeyPatch, n: int, max_workers: int
) -> None:
    def no_pool(threads: int) -> Any:
        raise AssertionError(f"get_pool({threads}) called for an inline run")

    monkeypatch.setattr(_pool, "get_pool", no_pool)
    threads_before = set(threading.enumerate())
    idents: list[int] = []

    def fn(x: int) -> int:
        idents.append(threading.get_ident())
        return x + 1

    assert run_parallel(fn, list(range(n)), max_workers) == [x + 1 for x in range(n)]
    assert idents == [threading.get_ident()] * n
    assert set(threading.enumerate()) <= threads_before


def test_run_parallel_uses_workers_and_caller() -> None:
    """Three items each block until all three run: only three threads at once
    (the caller and two pool threads) can get past the barrier."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    idents: dict[int, int] = {}

    def fn(i: int) -> int:
        barrier.wait()
        idents[i] = threading.get_ident()
        return i

    assert run_parallel(fn, [0, 1, 2], 3) == [0, 1, 2]
    assert len(set(idents.values())) == 3
    assert threading.get_ident() in idents.values()
    assert pool_size() >= 2


def test_run_parallel_marks_threads_as_workers_only_while_running() -> None:
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def fn(i: int) -> bool:
        barrier.wait()
        return in_worker_thread()

    assert not in_worker_thread()
    assert run_parallel(fn, [0, 1], 2) == [True, True]
    assert not in_worker_thread()


class Recorder:
    """Which items started and ended, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: set[int] = set()
        self.ended: set[int] = set()

    def start(self, i: int) -> None:
        with self.lock:
            self.started.add(i)

    def end(self, i: int) -> None:
        with self.lock:
            self.ended.add(i)


def test_run_parallel_raises_lowest_index_failure() -> None:
    barrier = threading.Barrier(4, timeout=TIMEOUT)
    item3_failed = threading.Event()

    def fn(i: int) -> int:
        barrier.wait()
        if i == 3:
            item3_failed.set()
            raise ValueError("item 3")
        if i == 1:
            # item 3 fails first in time; item 1 still wins by index
            item3_failed.wait(TIMEOUT)
            time.sleep(0.02)
            raise KeyError("item 1")
        return i

    with pytest.raises(KeyError, match="item 1") as info:
        run_parallel(fn, [0, 1, 2, 3], 4)
    notes = getattr(info.value, "__notes__", [])
    assert any("1 other item" in note for note in notes), notes


def test_run_parallel_single_failure_has_no_note() -> None:
    barrier = threading.Barrier(3, timeout=TIMEOUT)

    def fn(i: int) -> int:
        barrier.wait()
        if i == 2:
            raise RuntimeError("only item 2")
        return i

    with pytest.raises(RuntimeError, match="only item 2") as info:
        run_parallel(fn, [0, 1, 2], 3)
    assert not getattr(info.value, "__notes__", [])


def test_run_parallel_inline_failure_propagates() -> None:
    seen: list[int] = []

    def fn(i: int) -> int:
        seen.append(i)
        if i == 2:
            raise ValueError("item 2")
        return i

    with pytest.raises(ValueError, match="item 2"):
        run_parallel(fn, list(range(6)), 1)
    assert seen == [0, 1, 2]


def test_run_parallel_waits_for_workers_before_raising() -> None:
    """Item 0 fails at once while items 1 and 2 are still running: the raise
    must come only after they ended, so nothing runs on after the call."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    rec = Recorder()

    def fn(i: int) -> int:
        rec.start(i)
        try:
            barrier.wait()
            if i == 0:
                raise OSError("item 0")
            time.sleep(0.3)
            return i
        finally:
            rec.end(i)

    with pytest.raises(OSError, match="item 0"):
        run_parallel(fn, [0, 1, 2], 3)
    with rec.lock:
        assert rec.started == {0, 1, 2}
        assert rec.ended == rec.started


def test_run_parallel_stops_taking_items_after_failure() -> None:
    rec = Recorder()
    n = 60

    def fn(i: int) -> int:
        rec.start(i)
        try:
            if i == 0:
                raise ValueError("item 0")
            time.sleep(0.02)
            return i
        finally:
            rec.end(i)

    with pytest.raises(ValueError, match="item 0"):
        run_parallel(fn, list(range(n)), 2)
    with rec.lock:
        assert rec.ended == rec.started
        assert len(rec.started) < n


def run_with_timeout(target: Any) -> Any:
    """Run ``target()`` in a daemon thread; fail (not hang) if it deadlocks."""
    result: dict[str, Any] = {}

    def runner() -> None:
        try:
            result["value"] = target()
        except BaseException as exc:  # reported in the test thread
            result["error"] = exc

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "deadlock: run_parallel did not return"
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.mark.parametrize(
    ("outer_workers", "inner_workers", "n"),
    [
        pytest.param(2, 2, 64, id="2x2"),
        pytest.param(4, 4, 32, id="4x4"),
        pytest.param(2, 8, 16, id="2x8"),
    ],
)
def test_run_parallel_nested_runs_inline(outer_workers: int, inner_workers: int, n: int) -> None:
    def inner(x: int) -> int:
        return threading.get_ident()

    def outer(i: int) -> tuple[int, list[int]]:
        return threading.get_ident(), run_parallel(inner, list(range(10)), inner_workers)

    results = run_with_timeout(lambda: run_parallel(outer, list(range(n)), outer_workers))
    assert len(results) == n
    for ident, inner_idents in results:
        assert inner_idents == [ident] * 10


def test_run_parallel_concurrent_callers_share_the_pool() -> None:
    """Several threads that each start a parallel loop: none deadlocks, each
    gets its own results."""

    def caller(k: int) -> list[int]:
        return run_parallel(lambda x: x * k, list(range(40)), 3)

    def all_callers() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(8)]

        def one(k: int) -> None:
            out[k] = caller(k)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        return out

    results = run_with_timeout(all_callers)
    assert results == [[x * k for x in range(40)] for k in range(8)]


# -- get_pool / pool_size ------------------------------------------------------------


def test_pool_only_grows() -> None:
    big = get_pool(4)
    assert pool_size() >= 4
    assert get_pool(2) is big
    assert pool_size() >= 4
    assert get_pool(1) is big
    size = pool_size()
    grown = get_pool(size + 1)
    assert pool_size() == size + 1
    assert grown is not big
    assert get_pool(size) is grown


@pytest.mark.parametrize("threads", [pytest.param(0, id="0"), pytest.param(-2, id="-2")])
def test_get_pool_rejects_nonpositive(threads: int) -> None:
    with pytest.raises(ValueError, match="threads"):
        get_pool(threads)


def test_pool_resets_when_pid_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop for forks that bypass os.register_at_fork."""
    old = get_pool(2)
    monkeypatch.setattr(_pool, "_pool_pid", -1)
    assert pool_size() == 0
    fresh = get_pool(1)
    assert fresh is not old
    assert pool_size() == 1
    assert run_parallel(lambda x: -x, [1, 2, 3], 2) == [-1, -2, -3]


# -- fork ---------------------------------------------------------------------------


def _child_pool_check(conn: Any) -> None:
    """In a forked child: the pool is gone and a new one works."""
    try:
        size_at_start = pool_size()
        barrier = threading.Barrier(2, timeout=TIMEOUT)

        def fn(x: int) -> tuple[int, int]:
            if x < 2:
                barrier.wait()
            return x * 3, threading.get_ident()

        results = run_parallel(fn, list(range(10)), 2)
        conn.send(
            {
                "size_at_start": size_at_start,
                "values": [v for v, _ in results],
                "threads": len({t for _, t in results}),
                "size_after": pool_size(),
            }
        )
    except BaseException as exc:
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def _warm_pool() -> None:
    """Pool threads alive (and idle) in the parent."""
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    run_parallel(lambda i: barrier.wait(), [0, 1, 2], 3)
    assert pool_size() >= 2
    assert any(t.name.startswith("zarr_fused") for t in threading.enumerate())


def check_child_result(result: dict[str, Any]) -> None:
    assert "error" not in result, result
    assert result["size_at_start"] == 0
    assert result["values"] == [x * 3 for x in range(10)]
    assert result["threads"] == 2
    assert result["size_after"] >= 1


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available")
def test_os_fork_child_gets_a_fresh_pool() -> None:
    _warm_pool()
    read_end, write_end = multiprocessing.Pipe(duplex=False)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            read_end.close()
            _child_pool_check(write_end)
            code = 0
        finally:
            os._exit(code)
    write_end.close()
    try:
        assert read_end.poll(TIMEOUT), "the forked child did not answer"
        result = read_end.recv()
    finally:
        deadline = time.monotonic() + TIMEOUT
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child did not exit")
            time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    check_child_result(result)
    assert pool_size() >= 2  # the parent's pool is untouched


@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork start method"
)
def test_multiprocessing_fork_child_gets_a_fresh_pool() -> None:
    _warm_pool()
    ctx = multiprocessing.get_context("fork")
    read_end, write_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_pool_check, args=(write_end,))
    proc.start()
    write_end.close()
    try:
        assert read_end.poll(TIMEOUT), "the forked child did not answer"
        result = read_end.recv()
        proc.join(TIMEOUT)
        assert not proc.is_alive()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 0
    check_child_result(result)


# -- the hop off the event loop ------------------------------------------------------


def test_off_loop_returns_the_result_from_another_thread() -> None:
    import asyncio

    from zarr_fused._pool import in_worker_thread, off_loop

    def work(a: int, *, b: int) -> tuple[int, int, bool]:
        return a + b, threading.get_ident(), in_worker_thread()

    async def main() -> tuple[tuple[int, int, bool], int]:
        return await off_loop(work, 2, b=3), threading.get_ident()

    (value, worker, in_pool), loop_thread = asyncio.run(main())
    assert value == 5
    assert worker != loop_thread
    assert not in_pool  # a batch run there still spreads over the pool


def test_off_loop_raises_the_exception_and_carries_the_context() -> None:
    import asyncio
    import contextvars

    from zarr_fused._pool import off_loop

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def boom() -> None:
        raise KeyError(var.get())

    async def main() -> None:
        var.set("caller's")
        with pytest.raises(KeyError, match="caller's"):
            await off_loop(boom)

    asyncio.run(main())


def test_off_loop_cancelled_waiter_leaves_no_error() -> None:
    import asyncio

    from zarr_fused._pool import off_loop

    release = threading.Event()
    finished = threading.Event()

    def slow() -> int:
        release.wait(5)
        finished.set()
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(off_loop(slow))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        assert await asyncio.to_thread(finished.wait, 5)
        await asyncio.sleep(0.05)  # the late result reaches the loop and is dropped

    loop = asyncio.new_event_loop()
    errors: list[Any] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert errors == []


# -- default_max_workers ----------------------------------------------------------


def _default_in_child(env: dict[str, str]) -> list[Any]:
    script = "import json, zarr_fused\nprint(json.dumps(zarr_fused.default_max_workers()))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("value", "capped"),
    [("1", True), ("1,4", True), ("1000", False), ("0", False), ("many", False), ("", False)],
)
def test_omp_num_threads_at_start_caps_the_default(value: str, capped: bool) -> None:
    cpus = available_cpus()[0]
    count, why = _default_in_child({"OMP_NUM_THREADS": value})
    if capped:
        assert count == 1 and "OMP_NUM_THREADS" in why
    else:
        assert count == cpus and "OMP_NUM_THREADS" not in why


def test_omp_num_threads_set_later_does_not_cap() -> None:
    """A process that creates a Dask LocalCluster sets OMP_NUM_THREADS=1 in
    its own environment for the workers it spawns; its own reads keep their
    threads."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    script = ("import os; os.environ['OMP_NUM_THREADS'] = '1'\n"
              "import json, zarr_fused\nprint(json.dumps(zarr_fused.default_max_workers()))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    count, why = json.loads(out.stdout.strip())
    assert count == available_cpus()[0] and "OMP_NUM_THREADS" not in why
