"""The ``zarr-fused`` command line: info, bench, demo, and its errors.

Most cases call `zarr_fused.cli.main` in-process (an uncaught exception
fails the test, so "no traceback" holds there by construction); a few run
``python -m zarr_fused`` in a subprocess to cover the real process: its exit
status and what reaches stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, ZipStore

import zarr_fused
from zarr_fused.cli import main, peers, selection

from helpers import run_in_python

BATCHED = "zarr.core.codec_pipeline.BatchedCodecPipeline"
HAVE = {m: importlib.util.find_spec(m) is not None for m in ("zarrs", "tensorstore", "matplotlib")}
ZARR_PEERS = ["zarr-batched", "zarr-fused", "zarr_fused"] + (["zarrs"] if HAVE["zarrs"] else [])
ALL_PEERS = ZARR_PEERS + (["tensorstore"] if HAVE["tensorstore"] else [])
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # zarr settings from the environment would change what `info` reports
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARR_")}
    return run_in_python("-m", "zarr_fused", *args, env=env)


def call(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> dict[str, str]:
    """The bench table's rows, by pipeline name."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pipeline "))
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows[line.split()[0]] = line
    return rows


def assert_one_line_error(code: int, out: str, err: str, expected_code: int = 2) -> None:
    assert code == expected_code
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("zarr-fused: ")


# -- arrays on disk ---------------------------------------------------------------------


def _write(store: Any, data: np.ndarray, **kwargs: Any) -> None:
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        arr = zarr.create_array(store, shape=data.shape, dtype=data.dtype, **kwargs)
        arr[...] = data


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """User arrays of every kind bench accepts, plus things it must refuse."""
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(20240611)
    floats = rng.normal(size=(20, 30)).astype("f4")
    floats[3, 4] = floats[10, 11] = np.nan  # equality must be NaN-aware
    _write(
        LocalStore(root / "floats"),
        floats,
        chunks=(8, 8),
        compressors=zarr.codecs.ZstdCodec(level=1),
        fill_value=np.nan,
    )

    zs = ZipStore(root / "ints.zip", mode="w")
    _write(zs, rng.integers(-1000, 1000, size=(12, 10), dtype="i2"), chunks=(5, 5))
    zs.close()

    group = zarr.open_group(LocalStore(root / "group"), mode="w")
    _write(
        group.store_path.store,
        rng.integers(0, 255, (16, 16), dtype="u1"),
        chunks=(4, 4),
        shards=(8, 8),
        name="a",
    )
    group.create_group("nested")
    _write(
        group.store_path.store, rng.integers(0, 9, (9,), dtype="u4"), chunks=(4,), name="nested/b"
    )

    _write(
        LocalStore(root / "v2"), rng.normal(size=(6, 7)).astype("f8"), chunks=(3, 3), zarr_format=2
    )

    # a zipped directory: the array sits one level down
    inner = root / "wrapped_src"
    _write(LocalStore(inner / "data.zarr"), np.arange(10, dtype="i8"), chunks=(4,))
    with zipfile.ZipFile(root / "wrapped.zip", "w") as zf:
        for p in sorted(inner.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(inner).as_posix())

    # a codec zarrs and tensorstore do not know (zarr-python's numcodecs.delta)
    _write(
        LocalStore(root / "delta"),
        np.arange(12, dtype="f4"),
        chunks=(5,),
        filters=[zarr.codecs.numcodecs.Delta(dtype="f4")],
    )

    zs = ZipStore(root / "group.zip", mode="w")
    _write(zs, np.arange(5, dtype="i1"), chunks=(5,), name="q")
    zs.close()

    _write(LocalStore(root / "zero"), np.zeros((0, 4), "f4"), chunks=(2, 2))

    (root / "empty").mkdir()
    (root / "notes.txt").write_text("not zarr\n")
    return {p.name: p for p in root.iterdir()}


# -- info -----------------------------------------------------------------------------


def test_info_fields() -> None:
    import numcodecs

    res = run_cli("info")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith(f"zarr_fused {zarr_fused.__version__}\n")
    assert f"zarr {zarr.__version__}" in out
    assert f"numpy {np.__version__}" in out
    assert f"numcodecs {numcodecs.__version__}" in out
    assert f"python {sys.version.split()[0]}" in out
    info = zarr_fused.native_info()
    for name, ok in info["extensions"].items():  # type: ignore[union-attr]
        assert f"  {name}: {'ok' if ok else 'MISSING'}\n" in out
    codecs: list[str] = info["codecs"]  # type: ignore[assignment]
    assert "native codecs: " + (", ".join(codecs) or "none") in out
    libraries: dict[str, Any] = info["libraries"]  # type: ignore[assignment]
    for lib in ("linkage", "zstd", "zlib", "blosc"):
        if lib in libraries:
            assert f"  {lib}: {libraries[lib]}\n" in out
    if "crc32c" in libraries:
        assert f"crc32c implementation on this CPU: {libraries['crc32c']}" in out
    cpus, why = zarr_fused.default_max_workers()
    assert f"default threads: {cpus} ({why})" in out
    assert "codec_pipeline.max_workers: None" in out
    assert "codec_pipeline.strict: False -> off" in out
    assert "codec_pipeline.shard_write_lock: True -> on" in out
    assert res.stderr == ""


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param(
            {"codec_pipeline.max_workers": 1},
            "max_workers: 1 (set) -> 1 threads per batch",
            id="max_workers-1",
        ),
        pytest.param(
            {"codec_pipeline.max_workers": "abc"}, "Ignoring invalid", id="max_workers-bad"
        ),
        pytest.param({"codec_pipeline.strict": True}, "strict: True -> on", id="strict-on"),
        pytest.param(
            {"codec_pipeline.shard_write_lock": False},
            "shard_write_lock: False -> off (no hold",
            id="shard_write_lock-off",
        ),
        pytest.param(
            {"codec_pipeline.shard_write_lock": "maybe"},
            "shard_write_lock: 'maybe' -> on (partial shard updates held across threads and "
            "processes) [Ignoring invalid",
            id="shard_write_lock-bad",
        ),
        pytest.param(
            {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"},
            "(zarr_fused is selected)",
            id="selected",
        ),
    ],
)
def test_info_reports_settings(
    capsys: pytest.CaptureFixture[str], settings: dict[str, Any], expected: str
) -> None:
    with zarr.config.set(settings):
        code, out, err = call(capsys, "info")
    assert code == 0
    assert expected in out
    assert err == ""


# -- bench: successful runs -----------------------------------------------------------


def test_bench_sample_subprocess() -> None:
    res = run_cli("bench", "--size", "32", "--repeat", "1")
    assert res.returncode == 0, res.stderr
    rows = table_rows(res.stdout)
    assert list(rows) == ALL_PEERS
    for row in rows.values():
        assert row.rstrip().endswith("identical"), row
    assert f"all {len(ALL_PEERS)} pipelines read identical data" in res.stdout
    assert "checked against the data written" in res.stdout
    assert res.stderr == ""  # not a terminal, no --progress: no bar


@pytest.mark.parametrize(
    ("target", "array", "skip_note"),
    [
        pytest.param("floats", None, None, id="local-float-nan"),
        pytest.param("ints.zip", None, "not on zip files", id="zip"),
        pytest.param("group", "a", None, id="group-sharded"),
        pytest.param("group", "nested/b", None, id="group-nested"),
        pytest.param("v2", None, "zarr v2 array", id="zarr-v2"),
    ],
)
def test_bench_user_array(
    capsys: pytest.CaptureFixture[str],
    disk: dict[str, Path],
    target: str,
    array: str | None,
    skip_note: str | None,
) -> None:
    args = ["bench", str(disk[target]), "--repeat", "1"]
    if array:
        args += ["--array", array]
    code, out, err = call(capsys, *args)
    assert code == 0, err
    rows = table_rows(out)
    expected = ALL_PEERS if skip_note is None else ZARR_PEERS
    assert list(rows) == expected
    assert rows["zarr-batched"].rstrip().endswith("reference")
    for name in expected[1:]:
        assert rows[name].rstrip().endswith("identical"), rows[name]
    if skip_note and HAVE["tensorstore"]:
        assert "note: tensorstore skipped: " in out and skip_note in out
    assert f"all {len(expected)} pipelines read identical data" in out


@pytest.mark.parametrize(
    ("expr", "shape"),
    [
        pytest.param("2:10,5", (8,), id="slice-int"),
        pytest.param("...,::7", (20, 5), id="ellipsis-step"),
        pytest.param("-1", (30,), id="negative-int"),
        pytest.param(" 3:-3:2 , : ", (7, 30), id="spaces-negative-stop"),
        pytest.param("4,4", (), id="scalar"),
    ],
)
def test_bench_selection(
    capsys: pytest.CaptureFixture[str],
    disk: dict[str, Path],
    tmp_path: Path,
    expr: str,
    shape: tuple[int, ...],
) -> None:
    out_json = tmp_path / "r.json"
    code, _out, err = call(
        capsys,
        "bench",
        str(disk["floats"]),
        "--repeat",
        "1",
        f"--selection={expr}",
        "--json",
        str(out_json),
    )
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert doc["selection"]["expression"] == expr
    assert tuple(doc["selection"]["shape"]) == shape
    assert doc["selection"]["nbytes"] == int(np.prod(shape)) * 4
    assert doc["ok"] is True


@pytest.mark.parametrize(
    ("expr", "numpy_index"),
    [
        pytest.param("1:-1", (slice(1, -1),), id="negative-stop"),
        pytest.param("-3:,...", (slice(-3, None), Ellipsis), id="negative-start"),
        pytest.param("...,-2", (Ellipsis, -2), id="ellipsis-first"),
        pytest.param("::2,1,0:5:3", (slice(None, None, 2), 1, slice(0, 5, 3)), id="steps"),
        pytest.param("5", (5,), id="leading-int"),
    ],
)
def test_selection_matches_numpy(expr: str, numpy_index: tuple[Any, ...]) -> None:
    data = np.random.default_rng(7).integers(0, 100, (6, 5, 8))
    sel = selection.resolve_selection(selection.parse_selection(expr), data.shape, expr)
    assert all(s >= 0 if isinstance(s, int) else s.start >= 0 for s in sel)
    np.testing.assert_array_equal(data[sel], data[numpy_index], strict=True)
    assert selection.selection_shape(sel) == data[numpy_index].shape


def test_bench_json_structure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "bench.json"
    code, _, err = call(capsys, "bench", "--size", "16", "--repeat", "2", "--json", str(out_json))
    assert code == 0, err
    doc = json.loads(out_json.read_text())
    assert set(doc) == {
        "versions",
        "threads",
        "array",
        "selection",
        "repeat",
        "reference",
        "pipelines",
        "skipped",
        "ok",
    }
    assert doc["versions"]["zarr_fused"] == zarr_fused.__version__
    assert doc["array"] == {
        "source": "sample",
        "path": None,
        "array": None,
        "shape": [16, 16, 16],
        "dtype": "uint16",
        "chunks": [2, 2, 2],
        "shards": [8, 8, 8],
        "zarr_format": 3,
    }
    assert doc["selection"]["nbytes"] == 16**3 * 2
    assert doc["repeat"] == 2 and doc["ok"] is True
    assert doc["reference"] == "the data written"
    assert [p["name"] for p in doc["pipelines"]] == ALL_PEERS
    for p in doc["pipelines"]:
        assert p["status"] == "identical"
        assert len(p["times_s"]) == 2
        assert p["median_s"] == pytest.approx(float(np.median(p["times_s"])))
        assert p["gb_per_s"] == pytest.approx(16**3 * 2 / p["median_s"] / 1e9)
    batched = doc["pipelines"][0]
    assert batched["codec_pipeline"] == BATCHED
    assert batched["speedup_vs_zarr_batched"] == pytest.approx(1.0)


def test_bench_pipelines_subset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call(
        capsys, "bench", "--size", "16", "--repeat", "1", "--pipelines", "zarr_fused, zarr-batched"
    )
    assert code == 0, err
    rows = table_rows(out)
    assert list(rows) == ["zarr-batched", "zarr_fused"]  # table order, not the order asked
    assert rows["zarr-batched"].split()[3] == "1.00x"
    assert "all 2 pipelines read identical data" in out


def test_bench_without_batched_has_no_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call(
        capsys, "bench", "--size", "16", "--repeat", "1", "--pipelines", "zarr_fused"
    )
    assert code == 0, err
    assert table_rows(out)["zarr_fused"].split()[3] == "-"
    assert "zarr_fused read identical data" in out


@pytest.mark.skipif(not HAVE["tensorstore"], reason="tensorstore is not installed")
def test_bench_tensorstore_cannot_open_is_skipped(
    capsys: pytest.CaptureFixture[str], disk: dict[str, Path]
) -> None:
    code, out, err = call(capsys, "bench", str(disk["delta"]), "--repeat", "1")
    assert code == 0, err
    assert "tensorstore" not in table_rows(out)
    note = next(line for line in out.splitlines() if line.startswith("note: tensorstore"))
    assert note.startswith("note: tensorstore skipped: cannot open this array (")
    assert "tensorstore_spec" not in note


@pytest.mark.skipif(not HAVE["zarrs"], reason="zarrs is not installed")
def test_bench_pipeline_warnings_become_notes(
    capsys: pytest.CaptureFixture[str], disk: dict[str, Path]
) -> None:
    code, out, err = call(
        capsys, "bench", str(disk["delta"]), "--repeat", "2", "--pipelines", "zarr-batched,zarrs"
    )
    assert code == 0, err
    assert err == ""
    notes = [line for line in out.splitlines() if line.startswith("note: zarrs warned: ")]
    assert len(notes) == 1  # once, not once per read
    assert "numcodecs.delta" in notes[0]


def test_bench_zip_hint_then_array(
    capsys: pytest.CaptureFixture[str], disk: dict[str, Path]
) -> None:
    code, out, err = call(capsys, "bench", str(disk["wrapped.zip"]))
    assert_one_line_error(code, out, err)
    assert "zarr metadata found under: data.zarr" in err
    code, out, err = call(
        capsys,
        "bench",
        str(disk["wrapped.zip"]),
        "--array",
        "data.zarr",
        "--repeat",
        "1",
        "--pipelines",
        "zarr-batched,zarr_fused",
    )
    assert code == 0, err


@pytest.mark.parametrize(
    ("flag", "drawn"),
    [pytest.param([], False, id="auto-not-a-tty"), pytest.param(["--progress"], True, id="forced")],
)
def test_bench_progress(capsys: pytest.CaptureFixture[str], flag: list[str], drawn: bool) -> None:
    code, _, err = call(
        capsys,
        "bench",
        "--size",
        "8",
        "--repeat",
        "2",
        "--pipelines",
        "zarr-batched,zarr_fused",
        *flag,
    )
    assert code == 0
    if drawn:
        assert err.startswith("\r[") and err.endswith("\n")
        assert f"[{'#' * 30}] 6/6 done" in err  # 2 pipelines x (1 check + 2 runs)
    else:
        assert err == ""


# -- bench: disagreement and failure -----------------------------------------------------


def _sabotage(monkeypatch: pytest.MonkeyPatch, victim: str, how: str) -> None:
    real = peers.ZarrRunner.read

    def read(self: Any, sel: Any) -> np.ndarray:
        got = real(self, sel)
        if self.name != victim:
            return got
        if how == "raise":
            raise RuntimeError("chunk 0 is corrupt\nsecond line")
        if how == "dtype":
            return got.astype("i8")
        bad = got.copy()
        bad.flat[0] += 1
        return bad

    monkeypatch.setattr(peers.ZarrRunner, "read", read)


@pytest.mark.parametrize(
    ("how", "check"),
    [
        pytest.param(
            "value", "DIFFERS from the data written: 1 of 512 elements differ", id="value"
        ),
        pytest.param(
            "dtype", "DIFFERS from the data written: dtype int64 instead of uint16", id="dtype"
        ),
        pytest.param("raise", "FAILED: RuntimeError: chunk 0 is corrupt second line", id="raises"),
    ],
)
def test_bench_detects_wrong_results(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str, check: str
) -> None:
    _sabotage(monkeypatch, "zarr_fused", how)
    code, out, err = call(capsys, "bench", "--size", "8", "--repeat", "1")
    assert_one_line_error(code, out, err, expected_code=1)
    assert err == "zarr-fused: pipelines failed or read different data: zarr_fused\n"
    rows = table_rows(out)
    assert rows["zarr_fused"].rstrip().endswith(check)
    assert rows["zarr-fused"].rstrip().endswith("identical")
    assert "read identical data" not in out


def test_bench_difference_against_reference_pipeline(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    disk: dict[str, Path],
    tmp_path: Path,
) -> None:
    _sabotage(monkeypatch, "zarr-fused", "value")
    out_json = tmp_path / "r.json"
    code, out, _err = call(
        capsys, "bench", str(disk["floats"]), "--repeat", "1", "--json", str(out_json)
    )
    assert code == 1
    assert "DIFFERS from zarr-batched" in table_rows(out)["zarr-fused"]
    doc = json.loads(out_json.read_text())  # written even when the checks fail
    assert doc["ok"] is False
    assert {p["name"]: p["status"] for p in doc["pipelines"]}["zarr-fused"] == "differs"


# -- bench: plot ---------------------------------------------------------------------------


def test_plot_without_matplotlib(tmp_path: Path) -> None:
    target = tmp_path / "out.png"
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None  # `import matplotlib` now raises ImportError
        from zarr_fused.cli import main
        sys.exit(main(["bench", "--size", "8", "--repeat", "1", "--plot", {str(target)!r}]))
        """
    )
    res = run_in_python("-c", script)
    assert res.returncode == 2
    assert res.stderr == "zarr-fused: --plot needs matplotlib: pip install matplotlib\n"
    assert res.stdout == ""
    assert not target.exists()


def test_plot_writes_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "out.png"
    code, _, err = call(capsys, "bench", "--size", "8", "--repeat", "1", "--plot", str(target))
    assert code == 0, err
    assert target.read_bytes()[:8] == PNG_SIGNATURE


# -- bad input ----------------------------------------------------------------------------

BAD_INPUT = [
    pytest.param(["bench", "{missing}"], "no such file or directory", id="missing-path"),
    pytest.param(["bench", "{notes.txt}"], "not a zarr array", id="plain-file"),
    pytest.param(["bench", "{empty}"], "not a zarr array or group", id="empty-dir"),
    pytest.param(["bench", "{group}"], "is a zarr group, not an array", id="group-no-array"),
    pytest.param(["bench", "{group}", "--array", "nope"], "no array 'nope'", id="array-missing"),
    pytest.param(
        ["bench", "{group}", "--array", "nested"], "is a group, not an array", id="array-is-group"
    ),
    pytest.param(
        ["bench", "{group.zip}"],
        "is a zarr group, not an array; pick one with --array NAME (arrays: q)",
        id="zip-group-no-array",
    ),
    pytest.param(
        ["bench", "{group.zip}", "--array", "nope"], "no array 'nope'", id="zip-array-missing"
    ),
    pytest.param(
        ["bench", "{zero}"], "nothing to read: the array is empty along axis 0", id="empty-array"
    ),
    pytest.param(["bench", "--array", "a"], "--array needs PATH", id="array-without-path"),
    pytest.param(
        ["bench", "--pipelines", "zarr_fused,fast"],
        "unknown pipeline 'fast'",
        id="unknown-pipeline",
    ),
    pytest.param(["bench", "--pipelines", ","], "--pipelines is empty", id="empty-pipelines"),
    pytest.param(
        ["bench", "--selection", "1:2:3:4"], "malformed --selection", id="selection-too-many-colons"
    ),
    pytest.param(
        ["bench", "--selection", "1,,2"], "empty index at position 2", id="selection-empty-item"
    ),
    pytest.param(
        ["bench", "--selection", "__import__('os')"], "malformed --selection", id="selection-code"
    ),
    pytest.param(
        ["bench", "--selection", "...,...,1"], "more than one '...'", id="selection-two-ellipses"
    ),
    pytest.param(
        ["bench", "--size", "8", "--selection", "8"],
        "out of range for axis 0",
        id="selection-index-out-of-range",
    ),
    pytest.param(
        ["bench", "--size", "8", "--selection=-9"],
        "out of range for axis 0",
        id="selection-negative-out-of-range",
    ),
    pytest.param(
        ["bench", "--size", "8", "--selection", ":,0:9"],
        "bound 9 is out of range",
        id="selection-bound-out-of-range",
    ),
    pytest.param(
        ["bench", "--size", "8", "--selection", "0,0,0,0"],
        "has 4 indices",
        id="selection-too-many-indices",
    ),
    pytest.param(
        ["bench", "--size", "8", "--selection", "5:5"], "selects nothing", id="selection-empty"
    ),
    pytest.param(["bench", "--size", "8", "--selection", "::0"], "step 0", id="selection-step-0"),
    pytest.param(["bench", "--repeat", "0"], "argument --repeat", id="repeat-zero"),
    pytest.param(["bench", "--size", "ten"], "argument --size", id="size-not-int"),
    pytest.param(["bench", "--json", "{missing}/r.json"], "does not exist", id="json-no-dir"),
    pytest.param(
        ["bench", "--plot", "{empty}/out.nope"], "unsupported image format", id="plot-format"
    ),
    pytest.param(["bench", "--bogus"], "unrecognized arguments", id="unknown-option"),
    pytest.param(["frobnicate"], "invalid choice", id="unknown-verb"),
    pytest.param([], "required", id="no-verb"),
    pytest.param(["demo", "--edge", "0"], "argument --edge", id="demo-edge-zero"),
]


def _fill(args: list[str], disk: dict[str, Path]) -> list[str]:
    paths = {**{k: str(v) for k, v in disk.items()}, "missing": str(disk["empty"] / "missing")}
    return [re.sub(r"\{([^}]+)\}", lambda m: paths[m.group(1)], a) for a in args]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input(
    capsys: pytest.CaptureFixture[str], disk: dict[str, Path], args: list[str], message: str
) -> None:
    if "--plot" in args:
        pytest.importorskip("matplotlib")
    code, out, err = call(capsys, *_fill(args, disk))
    assert_one_line_error(code, out, err)
    assert message in err
    assert out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["bench", "{missing}"], "no such file or directory", id="missing-path"),
        pytest.param(["bench", "{notes.txt}"], "not a zarr array", id="plain-file"),
        pytest.param(["bench", "--pipelines", "tensorflow"], "unknown pipeline", id="pipeline"),
        pytest.param(["bench", "--selection", "0:1;2"], "malformed --selection", id="selection"),
        pytest.param(
            ["bench", "--size", "4", "--selection", "4"], "out of range", id="out-of-range"
        ),
    ],
)
def test_bad_input_subprocess(disk: dict[str, Path], args: list[str], message: str) -> None:
    res = run_cli(*_fill(args, disk))
    assert_one_line_error(res.returncode, res.stdout, res.stderr)
    assert message in res.stderr
    assert res.stdout == ""


def test_named_pipeline_that_cannot_run(
    capsys: pytest.CaptureFixture[str], disk: dict[str, Path]
) -> None:
    # tensorstore is driven on local directories only: asking for it on a zip is an error,
    # whether or not it is installed
    code, out, err = call(capsys, "bench", str(disk["ints.zip"]), "--pipelines", "tensorstore")
    assert_one_line_error(code, out, err)
    assert "pipeline tensorstore cannot run" in err


@pytest.mark.parametrize(
    ("pipelines", "code"),
    [
        pytest.param([], 0, id="default-skips-it"),
        pytest.param(["--pipelines", "zarr_fused,zarrs"], 2, id="named-is-an-error"),
    ],
)
def test_bench_pipeline_not_installed(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pipelines: list[str],
    code: int,
) -> None:
    monkeypatch.setitem(peers._OPTIONAL, "zarrs", "zarr_fused_tests_no_such_module")
    got, out, err = call(capsys, "bench", "--size", "8", "--repeat", "1", *pipelines)
    assert got == code
    if code:
        assert_one_line_error(got, out, err)
        assert err.startswith("zarr-fused: pipeline zarrs cannot run: not installed (")
    else:
        assert "zarrs" not in table_rows(out)
        assert "note: zarrs skipped: not installed (" in out


# -- help, demo, entry points ---------------------------------------------------------------


@pytest.mark.parametrize(
    "verb",
    [
        pytest.param([], id="top"),
        pytest.param(["info"], id="info"),
        pytest.param(["bench"], id="bench"),
        pytest.param(["demo"], id="demo"),
    ],
)
def test_help(capsys: pytest.CaptureFixture[str], verb: list[str]) -> None:
    code, out, err = call(capsys, *verb, "--help")
    assert code == 0
    assert out.startswith("usage: zarr-fused" + (f" {verb[0]}" if verb else ""))
    assert err == ""


@pytest.mark.parametrize(
    "edge",
    [
        pytest.param(16, id="edge-16"),
        pytest.param(18, id="edge-18-shard-not-half"),
    ],  # 18 // 2 = 9 holds no whole 2-chunks
)
def test_demo_small(capsys: pytest.CaptureFixture[str], edge: int) -> None:
    code, out, _ = call(capsys, "demo", "--edge", str(edge), "--repeat", "1")
    assert code == 0
    assert out.rstrip().endswith("all checks passed")


def test_console_script() -> None:
    script = Path(sys.executable).parent / "zarr-fused"
    if not script.exists():
        pytest.skip("zarr-fused script not installed next to this interpreter")
    res = subprocess.run(
        [str(script), "bench", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0
    assert res.stdout.startswith("usage: zarr-fused bench")
