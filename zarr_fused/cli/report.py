"""The results of one ``zarr-fused bench`` run and what it shows of them:
the progress bar, the header, the table and the notes under it, the
``--json`` document and the ``--plot`` chart."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import zarr

from zarr_fused._cpus import available_cpus
from zarr_fused._version import __version__
from zarr_fused.cli.common import EXIT_FAILURE, REFERENCE, CliError, human, one_line, short
from zarr_fused.cli.selection import format_selection, selection_shape
from zarr_fused.cli.source import Source


@dataclass
class Result:
    """What one pipeline did."""

    name: str
    pipeline_path: str | None
    status: str = "pending"  # reference, identical, differs, failed
    detail: str | None = None
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def bad(self) -> bool:
        return self.status in ("differs", "failed")


@dataclass
class BenchRun:
    """One run: what is read, and what each pipeline made of it."""

    source: Source
    sel: tuple[int | slice, ...]
    selection_text: str | None  # as given with --selection (None: the whole array)
    repeat: int
    named: bool  # the pipelines were named with --pipelines
    results: dict[str, Result] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why
    notes: list[str] = field(default_factory=list)
    reference: np.ndarray | None = None  # what every read is compared with
    ref_name: str | None = None

    @property
    def out_shape(self) -> tuple[int, ...]:
        return selection_shape(self.sel)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.out_shape, dtype=np.int64)) * self.source.array.dtype.itemsize

    @property
    def rows(self) -> list[Result]:
        return list(self.results.values())

    @property
    def base(self) -> float | None:
        """The reference pipeline's median time (None when it did not run)."""
        return self.results[REFERENCE].median if REFERENCE in self.results else None

    @property
    def bad(self) -> list[str]:
        return [r.name for r in self.rows if r.bad]

    @property
    def ok(self) -> bool:
        return not self.bad and bool(self.results)


# -- progress -------------------------------------------------------------------------


class Progress:
    """A one-line text bar on ``stream``, redrawn at the start of every run."""

    def __init__(self, total: int, enabled: bool, stream: TextIO, width: int = 30) -> None:
        self.total, self.enabled, self.stream, self.width = total, enabled, stream, width
        self.done = 0
        self._drawn = 0

    def _draw(self, label: str) -> None:
        if not self.enabled:
            return
        filled = self.width * self.done // max(1, self.total)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

    def start(self, label: str) -> None:
        self._draw(label)

    def advance(self, steps: int = 1) -> None:
        self.done += steps

    def close(self) -> None:
        if not self.enabled or not self._drawn:
            return
        self._draw("done")
        if self.stream.isatty():
            self.stream.write("\r" + " " * self._drawn + "\r")
        else:
            self.stream.write("\n")
        self.stream.flush()


# -- the text -------------------------------------------------------------------------


def print_header(run: BenchRun) -> None:
    """Versions, threads, the array and what is read."""
    arr = run.source.array
    cpus, why = available_cpus()
    shards = getattr(arr, "shards", None)
    print(f"zarr_fused {__version__} bench (zarr {zarr.__version__}); {cpus} threads ({why})")
    print(f"array: {run.source.description}")
    print(
        f"  {arr.dtype} {arr.shape}, zarr v{arr.metadata.zarr_format}, "
        + (f"shards {shards}, " if shards else "")
        + f"chunks {arr.chunks}"
    )
    region = f"[{format_selection(run.sel)}]" if run.selection_text is not None else "whole array"
    print(
        f"read: {region} -> {arr.dtype} {run.out_shape}, {human(run.nbytes)}; "
        f"median of {run.repeat} run{'s' if run.repeat != 1 else ''} after one checked read"
    )
    print(flush=True)


def _check_column(run: BenchRun, r: Result) -> str:
    if r.status == "differs":
        return f"DIFFERS from {run.ref_name}: {r.detail}"
    if r.status == "failed":
        return f"FAILED: {short(r.detail or '')}"
    return {"reference": "reference", "identical": "identical"}.get(r.status, "")


def print_table(run: BenchRun) -> None:
    """One row per pipeline: median time, throughput, speed-up, check."""
    base, nbytes = run.base, run.nbytes
    print(f"{'pipeline':<14}{'median s':>11}{'GB/s':>9}{'vs batched':>12}  check")
    for r in run.rows:
        med = r.median
        t = f"{med:>11.5f}" if med else f"{'-':>11}"
        gbps = f"{nbytes / med / 1e9:>9.3f}" if med else f"{'-':>9}"
        ratio = f"{base / med:>11.2f}x" if med and base else f"{'-':>12}"
        print(f"{r.name:<14}{t}{gbps}{ratio}  {_check_column(run, r)}")
    print()


def print_summary(run: BenchRun) -> None:
    """The lines under the table: legend, reference, notes, verdict."""
    rows = run.rows
    if run.base:
        print("vs batched: zarr-batched's median time / this pipeline's (above 1: faster)")
    if run.ref_name and run.reference is not None:
        print(
            f"checked against {run.ref_name}"
            + (" (the generated sample)" if run.source.expected is not None else "")
        )
    for note in run.notes:
        print(f"note: {note}")
    if run.ok and len(rows) > 1:
        print(f"all {len(rows)} pipelines read identical data")
    elif run.ok and run.source.expected is not None:
        print(f"{rows[0].name} read identical data")
    elif run.ok:
        print(f"only {rows[0].name} ran: nothing to compare its result with")


# -- --json ---------------------------------------------------------------------------


def _pipeline_doc(r: Result, nbytes: int, base: float | None) -> dict[str, Any]:
    return {
        "name": r.name,
        "codec_pipeline": r.pipeline_path,
        "status": r.status,
        "detail": r.detail,
        "times_s": r.times,
        "median_s": r.median,
        "gb_per_s": nbytes / r.median / 1e9 if r.median else None,
        "speedup_vs_zarr_batched": base / r.median if r.median and base else None,
    }


def json_doc(run: BenchRun) -> dict[str, Any]:
    """Everything the text shows, as a JSON-ready dict."""
    import numcodecs

    source, arr = run.source, run.source.array
    cpus, why = available_cpus()
    shards = getattr(arr, "shards", None)
    return {
        "versions": {
            "zarr_fused": __version__,
            "zarr": zarr.__version__,
            "numpy": np.__version__,
            "numcodecs": numcodecs.__version__,
            "python": sys.version.split()[0],
        },
        "threads": {"count": cpus, "reason": why},
        "array": {
            "source": source.kind,
            "path": source.path,
            "array": source.array_path or None,
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "chunks": list(arr.chunks),
            "shards": list(shards) if shards else None,
            "zarr_format": arr.metadata.zarr_format,
        },
        "selection": {
            "expression": run.selection_text,
            "resolved": format_selection(run.sel),
            "shape": list(run.out_shape),
            "nbytes": run.nbytes,
        },
        "repeat": run.repeat,
        "reference": run.ref_name,
        "pipelines": [_pipeline_doc(r, run.nbytes, run.base) for r in run.rows],
        "skipped": run.skipped,
        "ok": run.ok,
    }


def write_json(run: BenchRun, target: str) -> None:
    try:
        Path(target).write_text(json.dumps(json_doc(run), indent=2) + "\n")
    except OSError as exc:
        raise CliError(f"cannot write --json {target}: {one_line(exc)}", EXIT_FAILURE) from None


# -- --plot ---------------------------------------------------------------------------


def check_output(option: str, target: str | None) -> None:
    """Fail before any read when ``target`` cannot be written."""
    if target is None:
        return
    p = Path(target)
    if p.is_dir():
        raise CliError(f"{option} {target}: is a directory")
    if not p.parent.is_dir():
        raise CliError(f"{option} {target}: directory {str(p.parent)!r} does not exist")


def check_plot(target: str | None) -> None:
    """Fail before any read when the chart cannot be drawn into ``target``."""
    if target is None:
        return
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install matplotlib") from None
    suffix = Path(target).suffix.lower().lstrip(".")
    supported = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in supported:
        raise CliError(
            f"--plot {target}: unsupported image format {suffix!r} "
            f"(use one of: {', '.join(sorted(supported))})"
        )
    check_output("--plot", target)


def plot(results: list[Result], nbytes: int, title: str, target: str) -> None:
    """Bar chart of GB/s per pipeline (pipelines that failed are left out)."""
    from matplotlib.figure import Figure

    timed = [(r, r.median) for r in results if r.median]
    fig = Figure(figsize=(1.6 * max(3, len(timed)) + 1, 4), layout="constrained")
    ax = fig.add_subplot()
    values = [nbytes / median / 1e9 for _, median in timed]
    colors = [
        "#d62728" if r.bad else "#1f77b4" if r.name == "zarr_fused" else "#7f7f7f" for r, _ in timed
    ]
    bars = ax.bar([r.name for r, _ in timed], values, color=colors)
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2)
    ax.set_ylabel("GB/s (decoded bytes / median time)")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.15)
    fig.savefig(target)


def write_plot(run: BenchRun, target: str) -> None:
    arr = run.source.array
    title = (
        f"{run.source.path or 'generated sample'}: {arr.dtype} {run.out_shape}, "
        f"{human(run.nbytes)}, median of {run.repeat}"
    )
    try:
        plot(run.rows, run.nbytes, title, target)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot write --plot {target}: {one_line(exc)}", EXIT_FAILURE) from None
