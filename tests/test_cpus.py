"""How many threads zarr_fused may use: `zarr_fused._cpus`.

CPU detection runs against fake ``/proc`` and ``/sys/fs/cgroup`` trees under
``tmp_path`` (the ``root`` argument); affinity and environment variables are
checked for real, in child processes.
"""

from __future__ import annotations

import json
import os
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.errors import ZarrUserWarning
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused._cpus import available_cpus, cgroup_cpu_quota, resolve_max_workers
from zarr_fused.config import MAX_WORKERS_CAP, MAX_WORKERS_KEY

from helpers import run_in_python

FUSED = "zarr_fused.FusedCodecPipeline"


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
    proc = run_in_python("-c", textwrap.dedent(code), *args, env=env)
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
        from zarr_fused._cpus import resolve_max_workers

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
    with (
        zarr.config.set({MAX_WORKERS_KEY: value}),
        pytest.warns(ZarrUserWarning, match="max_workers"),
    ):
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
    with (
        zarr.config.set({MAX_WORKERS_KEY: value}),
        pytest.warns(ZarrUserWarning, match="max_workers") as record,
    ):
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


# -- default_max_workers ----------------------------------------------------------


def _default_in_child(env: dict[str, str]) -> list[Any]:
    script = "import json, zarr_fused\nprint(json.dumps(zarr_fused.default_max_workers()))"
    out = run_in_python("-c", script, env={**os.environ, **env}, check=True)
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
    script = (
        "import os; os.environ['OMP_NUM_THREADS'] = '1'\n"
        "import json, zarr_fused\nprint(json.dumps(zarr_fused.default_max_workers()))"
    )
    out = run_in_python("-c", script, env=env, check=True)
    count, why = json.loads(out.stdout.strip())
    assert count == available_cpus()[0] and "OMP_NUM_THREADS" not in why
