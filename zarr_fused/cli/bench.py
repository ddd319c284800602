"""``zarr-fused bench``: one array read through every available pipeline.

Each pipeline reads the same selection of the same array. One untimed read
per pipeline is checked first (against the data written for the generated
sample, otherwise against zarr's batched pipeline), so no timing is ever
reported for a wrong answer; then ``--repeat`` timed reads run in
interleaved rounds whose order rotates each round (as in
``asv_bench/side_by_side.py``), so a noisy machine slows every pipeline
alike. The table reports the median.

The selection is parsed here, never evaluated, and resolved against the
array's shape to explicit non-negative indices before any pipeline sees it:
tensorstore reads negative indices as coordinates, not as counts from the
end, so ``-1`` would mean different things to different pipelines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import zarr
from zarr.storage import LocalStore, ZipStore

from zarr_fused.cli import (
    BENCH_PIPELINES,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)

#: codec_pipeline.path of each zarr-python pipeline (tensorstore is not one).
ZARR_PIPELINES = {
    "zarr-batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "zarr-fused": "zarr.core.codec_pipeline.FusedCodecPipeline",
    "zarr_fused": "zarr_fused.FusedCodecPipeline",
    "zarrs": "zarrs.ZarrsCodecPipeline",
}
REFERENCE = "zarr-batched"
_OPTIONAL = {"zarrs": "zarrs", "tensorstore": "tensorstore"}
_METADATA = ("zarr.json", ".zarray", ".zgroup")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _short(text: str, limit: int = 200) -> str:
    """``text`` without tensorstore's spec dump, at most ``limit`` characters."""
    text = text.split(" [tensorstore_spec=", 1)[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def _warnings_as_notes(name: str, notes: list[str]) -> Iterator[None]:
    """Turn the warnings a pipeline emits into notes under the table (once each),
    instead of multi-line warnings in the middle of the output."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        note = f"{name} warned: {_short(' '.join(str(w.message).split()))}"
        if note not in notes:
            notes.append(note)


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    raise AssertionError


# -- selection ----------------------------------------------------------------------------

_INT = r"\s*([+-]?\d+)?\s*"
_SLICE = re.compile(rf"^{_INT}:{_INT}(?::{_INT})?$")
_INDEX = re.compile(r"^\s*([+-]?\d+)\s*$")

Token = Any  # Ellipsis, an int, or a (start, stop, step) tuple of int | None


def parse_selection(text: str) -> list[Token]:
    """Parse ``"0:100,:,5"`` into tokens, without looking at any array.

    Accepts integers, ``start:stop[:step]`` slices with any part omitted and
    at most one ``...``, separated by commas. Raises `CliError` (usage) for
    anything else.
    """
    tokens: list[Token] = []
    parts = text.split(",")
    for pos, part in enumerate(parts, 1):
        if part.strip() == "...":
            if Ellipsis in tokens:
                raise CliError(f"malformed --selection {text!r}: more than one '...'")
            tokens.append(Ellipsis)
            continue
        m = _INDEX.match(part)
        if m:
            tokens.append(int(m.group(1)))
            continue
        m = _SLICE.match(part)
        if m:
            tokens.append(tuple(None if g is None else int(g) for g in m.groups()))
            continue
        what = "empty index" if not part.strip() else f"{part.strip()!r}"
        raise CliError(
            f"malformed --selection {text!r}: {what} at position {pos} (expected an integer, "
            "start:stop[:step] or '...', comma-separated)"
        )
    return tokens


def resolve_selection(
    tokens: list[Token], shape: tuple[int, ...], text: str
) -> tuple[int | slice, ...]:
    """Resolve parsed tokens against ``shape``: explicit, in range, non-empty.

    Integers and slice bounds may count from the end (negative); unlike
    NumPy, bounds outside the axis are an error rather than clipped, since a
    benchmark of a clipped region is rarely what was meant.
    """
    explicit = [t for t in tokens if t is not Ellipsis]
    if len(explicit) > len(shape):
        raise CliError(
            f"--selection {text!r} has {len(explicit)} indices but the array has "
            f"{len(shape)} dimension{'s' if len(shape) != 1 else ''} (shape {shape})"
        )
    full = (None, None, None)
    fill = [full] * (len(shape) - len(explicit))
    if Ellipsis in tokens:
        i = tokens.index(Ellipsis)
        expanded = tokens[:i] + fill + tokens[i + 1:]
    else:
        expanded = tokens + fill
    out: list[int | slice] = []
    for axis, (tok, size) in enumerate(zip(expanded, shape)):
        if isinstance(tok, int):
            if not -size <= tok < size:
                raise CliError(
                    f"--selection {text!r}: index {tok} is out of range for axis {axis} "
                    f"of size {size}"
                )
            out.append(tok + size if tok < 0 else tok)
            continue
        start, stop, step = tok
        step = 1 if step is None else step
        if step < 1:
            raise CliError(f"--selection {text!r}: step {step} on axis {axis} must be >= 1")
        bounds = []
        for value, default in ((start, 0), (stop, size)):
            if value is None:
                value = default
            elif not -size <= value <= size:
                raise CliError(
                    f"--selection {text!r}: bound {value} is out of range for axis {axis} "
                    f"of size {size}"
                )
            bounds.append(value + size if value < 0 else value)
        if bounds[0] >= bounds[1]:
            if not text:
                raise CliError(f"nothing to read: the array is empty along axis {axis} "
                               f"(shape {shape})")
            raise CliError(f"--selection {text!r} selects nothing along axis {axis}")
        out.append(slice(bounds[0], bounds[1], step))
    return tuple(out)


def format_selection(sel: tuple[int | slice, ...]) -> str:
    """``(slice(0, 10, 1), 5)`` as ``"0:10, 5"`` (``"()"`` for a 0-d array)."""

    def one(s: int | slice) -> str:
        if isinstance(s, int):
            return str(s)
        return f"{s.start}:{s.stop}" + (f":{s.step}" if s.step != 1 else "")

    return ", ".join(map(one, sel)) if sel else "()"


def selection_shape(sel: tuple[int | slice, ...]) -> tuple[int, ...]:
    return tuple(len(range(s.start, s.stop, s.step)) for s in sel if isinstance(s, slice))


# -- where the array comes from -----------------------------------------------------------


@dataclass
class Source:
    """The array to read and how each pipeline reaches it."""

    description: str
    kind: str  # "sample", "local" or "zip"
    store: Any
    array_path: str
    array: zarr.Array  # opened with zarr's batched pipeline, for metadata
    local_dir: Path | None = None  # the array's directory, for tensorstore
    path: str | None = None
    expected: np.ndarray | None = None  # the data written (generated sample)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for fn in reversed(self.cleanup):
            fn()


def _sample_geometry(size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    inner = max(1, size // 8)
    shard = inner * max(1, size // 2 // inner)  # a multiple of the inner chunk
    return (inner,) * 3, (shard,) * 3


def make_sample(size: int) -> Source:
    """Write the sharded zstd uint16 sample cube once, to a temporary directory."""
    from zarr_fused.cli.demo import _sample

    chunks, shards = _sample_geometry(size)
    data = _sample(size)
    tmp = Path(tempfile.mkdtemp(prefix="zarr_fused_bench_"))
    root = tmp / "sample.zarr"
    try:
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            arr = zarr.create_array(
                LocalStore(root), shape=data.shape, dtype=data.dtype, chunks=chunks,
                shards=shards, compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0,
            )
            arr[...] = data
        store = LocalStore(root, read_only=True)
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            arr = zarr.open_array(store, mode="r")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Source(
        description=f"generated sample, sharded zstd level 1, in {root} (removed afterwards)",
        kind="sample", store=store, array_path="", array=arr, local_dir=root,
        expected=data, cleanup=[lambda: shutil.rmtree(tmp, ignore_errors=True)],
    )


def _metadata_dirs(path: Path, store_kind: str) -> list[str]:
    """Top-level entries of a store that hold zarr metadata (for a hint)."""
    found: set[str] = set()
    if store_kind == "zip":
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                parts = name.split("/")
                if len(parts) == 2 and parts[1] in _METADATA:
                    found.add(parts[0])
    else:
        for child in path.iterdir():
            if child.is_dir() and any((child / m).is_file() for m in _METADATA):
                found.add(child.name)
    return sorted(found)


def _array_names(group: zarr.Group, limit: int = 10) -> str:
    names = []
    for name, node in group.members(max_depth=None):
        if isinstance(node, zarr.Array):
            names.append(name)
    if not names:
        return "it holds no arrays"
    shown = ", ".join(sorted(names)[:limit])
    return f"arrays: {shown}" + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _open_array(store: Any, path: Path, path_text: str, kind: str, inner: str) -> zarr.Array:
    """The array at ``inner`` in ``store``, or a `CliError` saying what is there instead."""
    from zarr.errors import NodeNotFoundError

    where = f"{path_text} (--array {inner})" if inner else path_text

    def open_node(at: str) -> zarr.Array | zarr.Group:
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            return zarr.open(store, mode="r", path=at)

    try:
        node = open_node(inner)
    except (NodeNotFoundError, FileNotFoundError):
        if inner:
            try:
                parent = open_node("")
            except Exception:
                parent = None
            if isinstance(parent, zarr.Group):
                raise CliError(
                    f"{path_text}: no array {inner!r} in this group ({_array_names(parent)})"
                ) from None
        hint = ""
        candidates = [] if inner else _metadata_dirs(path, kind)
        if candidates:
            hint = f"; zarr metadata found under: {', '.join(candidates)} (pick one with --array)"
        raise CliError(f"{where}: not a zarr array or group (no zarr metadata){hint}") from None
    except Exception as exc:
        raise CliError(f"{where}: cannot open as a zarr array: {_one_line(exc)}") from None
    if isinstance(node, zarr.Group):
        if inner:
            raise CliError(
                f"{where}: is a group, not an array ({_array_names(node)}); pick one with --array"
            )
        raise CliError(
            f"{path_text}: is a zarr group, not an array; pick one with --array NAME "
            f"({_array_names(node)})"
        )
    return node


def open_source(path_text: str, array_name: str | None) -> Source:
    """Open the array at ``path_text`` (a directory or a zip file) read-only."""
    path = Path(path_text)
    if not path.exists():
        raise CliError(f"{path_text}: no such file or directory")
    if path.is_dir():
        kind = "local"
        try:
            store: Any = LocalStore(path, read_only=True)
        except Exception as exc:
            raise CliError(f"{path_text}: cannot open: {_one_line(exc)}") from None
    elif zipfile.is_zipfile(path):
        kind = "zip"
        store = ZipStore(path, mode="r")
    else:
        raise CliError(f"{path_text}: not a zarr array (expected a directory or a .zip file)")
    inner = (array_name or "").strip("/")
    try:
        node = _open_array(store, path, path_text, kind, inner)
    except BaseException:
        store.close()
        raise
    label = f"{path_text}" + (f", array {inner!r}" if inner else "")
    return Source(
        description=f"{label} ({'zip file' if kind == 'zip' else 'directory'})",
        kind=kind, store=store, array_path=inner, array=node,
        local_dir=(path / inner) if kind == "local" else None, path=path_text,
        cleanup=[store.close],
    )


# -- the pipelines ------------------------------------------------------------------------


def _importable(module: str) -> str | None:
    """None when ``module`` imports, else why not."""
    try:
        __import__(module)
    except ImportError as exc:
        return _one_line(exc)
    return None


def why_not(name: str, source: Source) -> str | None:
    """Why pipeline ``name`` cannot read ``source`` here (None: it can)."""
    if name in _OPTIONAL:
        missing = _importable(_OPTIONAL[name])
        if missing:
            return f"not installed ({missing})"
    if name == "tensorstore":
        if source.local_dir is None:
            return "it is driven here on local directories only, not on zip files"
        if source.array.metadata.zarr_format != 3:
            return "this is a zarr v2 array; it is driven here through its zarr3 driver only"
    return None


class ZarrRunner:
    """Reads through one zarr-python codec pipeline."""

    def __init__(self, name: str, source: Source) -> None:
        self.name = name
        self.pipeline_path = ZARR_PIPELINES[name]
        self._config = {"codec_pipeline.path": self.pipeline_path}
        with zarr.config.set(self._config):
            self.array = zarr.open_array(source.store, mode="r", path=source.array_path)
        used = type(self.array.async_array.codec_pipeline)
        self.note = None
        if used.__name__ != self.pipeline_path.rsplit(".", 1)[1]:
            self.note = (f"{name}: zarr used {used.__module__}.{used.__qualname__} for this "
                         "array (the pipeline fell back)")

    def read(self, sel: tuple[int | slice, ...]) -> np.ndarray:
        with zarr.config.set(self._config):
            return np.asarray(self.array[sel])


class TensorstoreRunner:
    """Reads through tensorstore's zarr3 driver on a file kvstore."""

    pipeline_path = None
    note = None

    def __init__(self, name: str, source: Source) -> None:
        import tensorstore as ts

        self.name = name
        assert source.local_dir is not None
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(source.local_dir)}}
        self.handle = ts.open(spec, read=True).result()

    def read(self, sel: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.handle[sel].read().result())


def make_runner(name: str, source: Source) -> ZarrRunner | TensorstoreRunner:
    return TensorstoreRunner(name, source) if name == "tensorstore" else ZarrRunner(name, source)


def compare(got: np.ndarray, ref: np.ndarray) -> str | None:
    """None when ``got`` equals ``ref`` (values, shape, dtype; NaN == NaN), else how not."""
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} instead of {ref.dtype}"
    if got.shape != ref.shape:
        return f"shape {got.shape} instead of {ref.shape}"
    equal_nan = ref.dtype.kind in "fcmM"
    if np.array_equal(got, ref, equal_nan=equal_nan):
        return None
    same = got == ref
    if equal_nan:
        same |= np.isnan(got) & np.isnan(ref)
    return f"{np.size(same) - np.count_nonzero(same)} of {ref.size} elements differ"


# -- progress ------------------------------------------------------------------------------


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

    def advance(self) -> None:
        self.done += 1

    def close(self) -> None:
        if not self.enabled or not self._drawn:
            return
        self._draw("done")
        if self.stream.isatty():
            self.stream.write("\r" + " " * self._drawn + "\r")
        else:
            self.stream.write("\n")
        self.stream.flush()


# -- the command -----------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    pipeline_path: str | None
    status: str = "pending"  # reference, identical, differs, failed
    detail: str | None = None
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def _choose_pipelines(spec: str | None) -> tuple[list[str], bool]:
    """The pipelines asked for, in table order, and whether they were named."""
    if spec is None:
        return list(BENCH_PIPELINES), False
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise CliError("--pipelines is empty (choose from: " + ", ".join(BENCH_PIPELINES) + ")")
    for n in names:
        if n not in BENCH_PIPELINES:
            raise CliError(
                f"unknown pipeline {n!r} in --pipelines (choose from: "
                + ", ".join(BENCH_PIPELINES) + ")"
            )
    return [p for p in BENCH_PIPELINES if p in names], True


def _check_output(option: str, target: str | None) -> None:
    if target is None:
        return
    p = Path(target)
    if p.is_dir():
        raise CliError(f"{option} {target}: is a directory")
    if not p.parent.is_dir():
        raise CliError(f"{option} {target}: directory {str(p.parent)!r} does not exist")


def _check_plot(target: str | None) -> None:
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
    _check_output("--plot", target)


def plot(results: list[Result], nbytes: int, title: str, target: str) -> None:
    """Bar chart of GB/s per pipeline (pipelines that failed are left out)."""
    from matplotlib.figure import Figure

    timed = [r for r in results if r.median]
    fig = Figure(figsize=(1.6 * max(3, len(timed)) + 1, 4), layout="constrained")
    ax = fig.add_subplot()
    values = [nbytes / r.median / 1e9 for r in timed]  # type: ignore[operator]
    colors = ["#d62728" if r.status in ("differs", "failed") else
              "#1f77b4" if r.name == "zarr_fused" else "#7f7f7f" for r in timed]
    bars = ax.bar([r.name for r in timed], values, color=colors)
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2)
    ax.set_ylabel("GB/s (decoded bytes / median time)")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.15)
    fig.savefig(target)


def run_bench(args: argparse.Namespace) -> int:
    """``zarr-fused bench``; returns the exit status."""
    # Everything that can be checked without data is checked first, so a
    # typo fails at once instead of after the reads.
    names, named = _choose_pipelines(args.pipelines)
    tokens = parse_selection(args.selection) if args.selection is not None else []
    _check_output("--json", args.json)
    _check_plot(args.plot)
    if args.path is None and args.array is not None:
        raise CliError("--array needs PATH (the generated sample is a single array)")

    if args.path is None:
        try:
            source = make_sample(args.size)
        except MemoryError:
            raise CliError(f"--size {args.size}: not enough memory for the sample "
                           f"({_human(args.size**3 * 2)} of uint16)", EXIT_FAILURE) from None
    else:
        source = open_source(args.path, args.array)
    try:
        return _bench(args, source, names, named, tokens)
    finally:
        source.close()


def _bench(
    args: argparse.Namespace, source: Source, names: list[str], named: bool, tokens: list[Token]
) -> int:
    import zarr_fused

    arr = source.array
    sel = resolve_selection(tokens, arr.shape, args.selection or "")
    out_shape = selection_shape(sel)
    nbytes = int(np.prod(out_shape, dtype=np.int64)) * arr.dtype.itemsize

    skipped: dict[str, str] = {}
    for name in names:
        reason = why_not(name, source)
        if reason is None:
            continue
        if named:
            raise CliError(f"pipeline {name} cannot run: {reason}")
        skipped[name] = reason
    names = [n for n in names if n not in skipped]

    cpus, why = zarr_fused.available_cpus()
    shards = getattr(arr, "shards", None)
    print(f"zarr_fused {zarr_fused.__version__} bench (zarr {zarr.__version__}); "
          f"{cpus} threads ({why})")
    print(f"array: {source.description}")
    print(f"  {arr.dtype} {arr.shape}, zarr v{arr.metadata.zarr_format}, "
          + (f"shards {shards}, " if shards else "") + f"chunks {arr.chunks}")
    region = f"[{format_selection(sel)}]" if args.selection is not None else "whole array"
    print(f"read: {region} -> {arr.dtype} {out_shape}, {_human(nbytes)}; "
          f"median of {args.repeat} run{'s' if args.repeat != 1 else ''} after one checked read")
    print(flush=True)

    results = {n: Result(n, ZARR_PIPELINES.get(n)) for n in names}
    notes: list[str] = [f"{n} skipped: {r}" for n, r in skipped.items()]
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = Progress(len(names) * (1 + args.repeat), show, sys.stderr)

    runners: dict[str, Any] = {}
    reference = source.expected[sel] if source.expected is not None else None
    ref_name = "the data written" if reference is not None else None
    try:
        for name in names:
            progress.start(f"{name}: checked read")
            res = results[name]
            try:
                with _warnings_as_notes(name, notes):
                    runner = make_runner(name, source)
            except Exception as exc:
                progress.advance()
                progress.done += args.repeat  # its timed runs will not happen
                if name == "tensorstore" and not named:
                    # an independent reader with its own codec registry: an array
                    # it cannot open is outside its scope, not a failed check
                    skipped[name] = f"cannot open this array ({_short(_one_line(exc))})"
                    notes.append(f"{name} skipped: {skipped[name]}")
                    del results[name]
                else:
                    res.status, res.detail = "failed", _one_line(exc)
                continue
            try:
                with _warnings_as_notes(name, notes):
                    got = runner.read(sel)
            except Exception as exc:
                res.status, res.detail = "failed", _one_line(exc)
                progress.advance()
                progress.done += args.repeat
                continue
            progress.advance()
            if runner.note:
                notes.append(runner.note)
            runners[name] = runner
            if reference is None:
                reference, ref_name = got, name
                res.status = "reference"
                continue
            diff = compare(got, reference)
            res.status, res.detail = ("identical", None) if diff is None else ("differs", diff)
            del got

        order = list(runners)
        for rnd in range(args.repeat):
            k = rnd % max(1, len(order))
            for name in order[k:] + order[:k]:
                res = results[name]
                progress.start(f"{name}: run {rnd + 1}/{args.repeat}")
                if res.status != "failed":
                    try:
                        with _warnings_as_notes(name, notes):
                            t0 = time.perf_counter()
                            runners[name].read(sel)
                            res.times.append(time.perf_counter() - t0)
                    except Exception as exc:
                        res.status, res.detail, res.times = "failed", _one_line(exc), []
                progress.advance()
    finally:
        progress.close()

    rows = list(results.values())
    base = results[REFERENCE].median if REFERENCE in results else None
    print(f"{'pipeline':<14}{'median s':>11}{'GB/s':>9}{'vs batched':>12}  check")
    for r in rows:
        med = r.median
        t = f"{med:>11.5f}" if med else f"{'-':>11}"
        gbps = f"{nbytes / med / 1e9:>9.3f}" if med else f"{'-':>9}"
        ratio = f"{base / med:>11.2f}x" if med and base else f"{'-':>12}"
        check = {"reference": "reference", "identical": "identical"}.get(r.status, "")
        if r.status == "differs":
            check = f"DIFFERS from {ref_name}: {r.detail}"
        elif r.status == "failed":
            check = f"FAILED: {_short(r.detail or '')}"
        print(f"{r.name:<14}{t}{gbps}{ratio}  {check}")
    print()
    if base:
        print("vs batched: zarr-batched's median time / this pipeline's (above 1: faster)")
    if ref_name and reference is not None:
        print(f"checked against {ref_name}" + (
            " (the generated sample)" if source.expected is not None else ""))
    for note in notes:
        print(f"note: {note}")

    bad = [r.name for r in rows if r.status in ("differs", "failed")]
    ok = not bad and bool(rows)
    if ok and len(rows) > 1:
        print(f"all {len(rows)} pipelines read identical data")
    elif ok and source.expected is not None:
        print(f"{rows[0].name} read identical data")
    elif ok:
        print(f"only {rows[0].name} ran: nothing to compare its result with")

    if args.json:
        doc = _json_doc(args, source, sel, out_shape, nbytes, rows, base, ref_name, skipped, ok)
        try:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        except OSError as exc:
            raise CliError(f"cannot write --json {args.json}: {_one_line(exc)}",
                           EXIT_FAILURE) from None
    if args.plot:
        title = (f"{source.path or 'generated sample'}: {arr.dtype} {out_shape}, "
                 f"{_human(nbytes)}, median of {args.repeat}")
        try:
            plot(rows, nbytes, title, args.plot)
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot write --plot {args.plot}: {_one_line(exc)}",
                           EXIT_FAILURE) from None
    if not rows:
        raise CliError("no pipeline could run (" + "; ".join(notes) + ")", EXIT_USAGE)
    if bad:
        raise CliError("pipelines failed or read different data: " + ", ".join(bad),
                       EXIT_FAILURE)
    return EXIT_OK


def _json_doc(
    args: argparse.Namespace, source: Source, sel: tuple[int | slice, ...],
    out_shape: tuple[int, ...], nbytes: int, rows: list[Result], base: float | None,
    ref_name: str | None, skipped: dict[str, str], ok: bool,
) -> dict[str, Any]:
    import numcodecs

    import zarr_fused

    arr = source.array
    cpus, why = zarr_fused.available_cpus()
    shards = getattr(arr, "shards", None)
    return {
        "versions": {
            "zarr_fused": zarr_fused.__version__, "zarr": zarr.__version__,
            "numpy": np.__version__, "numcodecs": numcodecs.__version__,
            "python": sys.version.split()[0],
        },
        "threads": {"count": cpus, "reason": why},
        "array": {
            "source": source.kind, "path": source.path, "array": source.array_path or None,
            "shape": list(arr.shape), "dtype": str(arr.dtype),
            "chunks": list(arr.chunks), "shards": list(shards) if shards else None,
            "zarr_format": arr.metadata.zarr_format,
        },
        "selection": {
            "expression": args.selection, "resolved": format_selection(sel),
            "shape": list(out_shape), "nbytes": nbytes,
        },
        "repeat": args.repeat,
        "reference": ref_name,
        "pipelines": [
            {
                "name": r.name,
                "codec_pipeline": r.pipeline_path,
                "status": r.status,
                "detail": r.detail,
                "times_s": r.times,
                "median_s": r.median,
                "gb_per_s": nbytes / r.median / 1e9 if r.median else None,
                "speedup_vs_zarr_batched": base / r.median if r.median and base else None,
            }
            for r in rows
        ],
        "skipped": skipped,
        "ok": ok,
    }
