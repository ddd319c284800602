"""The package builds as an sdist and installs (and works) from it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from helpers import run_in_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    outdir = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(outdir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (archive,) = outdir.glob("zarr_fused-*.tar.gz")
    return archive


def test_sdist_ships_sources_not_generated_code(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert "setup.py" in names and "pyproject.toml" in names and "MANIFEST.in" in names
    assert "zarr_fused/_scatter.pyx" in names
    assert "zarr_fused/_scatter.pxd" in names
    assert not [n for n in names if n.endswith((".c", ".so"))]


def _setup_extensions() -> list[dict[str, object]]:
    """setup.py's EXTENSIONS list, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "EXTENSIONS":
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no EXTENSIONS list")


def test_sdist_lists_every_file_the_build_needs(sdist: Path) -> None:
    """Every source and dependency of every extension, every package module
    and stub: a wheel built from the sdist alone (make wheel) needs them."""
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {str(f) for spec in _setup_extensions() for f in [*spec["sources"], *spec["depends"]]}  # type: ignore[misc]
    package = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "zarr_fused").rglob("*")
        if p.suffix in {".py", ".pyi", ".pyx", ".pxd", ".h"} or p.name == "py.typed"
    }
    assert needed <= package
    assert sorted(package - names) == []
    assert {"README.md", "pyproject.toml", "setup.py", "MANIFEST.in"} <= names


def _built_wheel() -> Path | None:
    wheels = sorted((ROOT / "dist").glob("zarr_fused-*-manylinux*.whl"))
    return wheels[-1] if wheels else None


@pytest.mark.skipif(_built_wheel() is None, reason="no portable wheel in dist/ (make wheel)")
def test_built_wheel_is_manylinux2014() -> None:
    """auditwheel reads the glibc 2.17 tag off the wheel make wheel left in
    dist/: its extensions link nothing beyond glibc."""
    tools = ROOT / ".cache" / "wheel" / "tools" / "bin"
    if not (tools / "auditwheel").is_file():
        pytest.skip("auditwheel is installed by make wheel")
    # through the tools venv's python: the script's own #! line names the
    # checkout that made the venv, which may since have moved
    out = subprocess.run(
        [str(tools / "python"), "-m", "auditwheel", "show", str(_built_wheel())],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert 'consistent with the following platform tag:\n"manylinux_2_17_' in out, out
    assert "libzstd" not in out and "libblosc" not in out


def test_installs_and_runs_from_sdist(sdist: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(sdist),
        ],
        check=True,
        capture_output=True,
        timeout=600,
        # what is checked is that the sdist builds and runs, not how fast it
        # runs: unoptimized code compiles several times faster
        env={**os.environ, "ZARR_FUSED_EXTRA_CFLAGS": "-O0"},
    )
    script = textwrap.dedent(
        f"""
        import zarr, zarr_fused, numpy as np
        assert zarr_fused.__file__.startswith({str(target)!r}), zarr_fused.__file__
        assert all(zarr_fused.native_info()["extensions"].values())
        a = zarr.create_array({{}}, shape=(9, 9), chunks=(4, 4), dtype=">f4", compressors=None)
        assert type(a._async_array.codec_pipeline) is zarr_fused.FusedCodecPipeline
        a[...] = np.arange(81).reshape(9, 9)
        assert (a[2:7:2, ::3] == np.arange(81).reshape(9, 9)[2:7:2, ::3]).all()
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_")}
    env.update(PYTHONPATH=str(target), ZARR_CODEC_PIPELINE__PATH="zarr_fused.FusedCodecPipeline")
    out = run_in_python("-c", script, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
