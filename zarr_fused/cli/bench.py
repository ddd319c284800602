"""``zarr-fused bench``: one array read through every available pipeline.

Each pipeline reads the same selection of the same array. One untimed read
per pipeline is checked first (against the data written for the generated
sample, otherwise against zarr's batched pipeline), so no timing is ever
reported for a wrong answer; then ``--repeat`` timed reads run in
interleaved rounds whose order rotates each round (as in
``asv_bench/side_by_side.py``), so a noisy machine slows every pipeline
alike. The table reports the median. Last, one more read through
zarr_fused inside `zarr_fused.stats` prints where its time and bytes went
(docs/stats.md reads the breakdown).

The steps live next door: `selection` (``--selection``), `source` (where
the array comes from), `peers` (the pipelines and their runners) and `report`
(the results of a run, and what is printed and written).
"""

from __future__ import annotations

import argparse
import sys
import time

from zarr_fused.cli.common import (
    BENCH_PIPELINES,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    ZARR_PIPELINES,
    CliError,
    human,
    one_line,
    short,
)
from zarr_fused.cli.peers import Runner, compare, make_runner, warnings_as_notes, why_not
from zarr_fused.cli.report import (
    BenchRun,
    Progress,
    Result,
    check_output,
    check_plot,
    print_header,
    print_summary,
    print_table,
    write_json,
    write_plot,
)
from zarr_fused.cli.selection import Token, parse_selection, resolve_selection
from zarr_fused.cli.source import Source, make_sample, open_source
from zarr_fused.stats import Stats, stats


def run_bench(args: argparse.Namespace) -> int:
    """``zarr-fused bench``; returns the exit status."""
    # Everything that can be checked without data is checked first, so a
    # typo fails at once instead of after the reads.
    names, named = _choose_pipelines(args.pipelines)
    tokens = parse_selection(args.selection) if args.selection is not None else []
    check_output("--json", args.json)
    check_plot(args.plot)
    if args.path is None and args.array is not None:
        raise CliError("--array needs PATH (the generated sample is a single array)")
    source = _open_source(args)
    try:
        return _bench(args, source, names, named, tokens)
    finally:
        source.close()


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
                + ", ".join(BENCH_PIPELINES)
                + ")"
            )
    return [p for p in BENCH_PIPELINES if p in names], True


def _open_source(args: argparse.Namespace) -> Source:
    if args.path is not None:
        return open_source(args.path, args.array)
    try:
        return make_sample(args.size)
    except MemoryError:
        raise CliError(
            f"--size {args.size}: not enough memory for the sample "
            f"({human(args.size**3 * 2)} of uint16)",
            EXIT_FAILURE,
        ) from None


def _bench(
    args: argparse.Namespace, source: Source, names: list[str], named: bool, tokens: list[Token]
) -> int:
    sel = resolve_selection(tokens, source.array.shape, args.selection or "")
    run = BenchRun(source, sel, args.selection, args.repeat, named)
    names = _skip_unavailable(run, names)
    print_header(run)
    if source.expected is not None:
        run.reference, run.ref_name = source.expected[sel], "the data written"
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = Progress(len(names) * (1 + args.repeat), show, sys.stderr)
    try:
        runners: dict[str, Runner] = {}  # the pipelines whose checked read returned data
        for name in names:
            runner = _checked_read(run, name, progress)
            if runner is not None:
                runners[name] = runner
        _timed_rounds(run, runners, progress)
    finally:
        progress.close()

    print_table(run)
    print_summary(run)
    if "zarr_fused" in runners and run.results["zarr_fused"].status != "failed":
        print_breakdown(runners["zarr_fused"], run.sel)
    if args.json:
        write_json(run, args.json)
    if args.plot:
        write_plot(run, args.plot)
    if not run.results:
        raise CliError("no pipeline could run (" + "; ".join(run.notes) + ")", EXIT_USAGE)
    if run.bad:
        raise CliError(
            "pipelines failed or read different data: " + ", ".join(run.bad), EXIT_FAILURE
        )
    return EXIT_OK


def _skip_unavailable(run: BenchRun, names: list[str]) -> list[str]:
    """The pipelines that can run here; the others are noted as skipped (or,
    when named with --pipelines, are an error)."""
    for name in names:
        reason = why_not(name, run.source)
        if reason is None:
            continue
        if run.named:
            raise CliError(f"pipeline {name} cannot run: {reason}")
        run.skipped[name] = reason
    runnable = [n for n in names if n not in run.skipped]
    run.results = {n: Result(n, ZARR_PIPELINES.get(n)) for n in runnable}
    run.notes = [f"{n} skipped: {r}" for n, r in run.skipped.items()]
    return runnable


def _checked_read(run: BenchRun, name: str, progress: Progress) -> Runner | None:
    """Open ``name``'s runner and read once, untimed (the first good read is
    the reference when no data was written); None when that failed."""
    progress.start(f"{name}: checked read")
    res = run.results[name]
    try:
        with warnings_as_notes(name, run.notes):
            runner = make_runner(name, run.source)
    except Exception as exc:
        progress.advance(1 + run.repeat)  # its timed runs will not happen
        _cannot_open(run, name, exc)
        return None
    try:
        with warnings_as_notes(name, run.notes):
            got = runner.read(run.sel)
    except Exception as exc:
        res.status, res.detail = "failed", one_line(exc)
        progress.advance(1 + run.repeat)
        return None
    progress.advance()
    if runner.note:
        run.notes.append(runner.note)
    if run.reference is None:
        run.reference, run.ref_name = got, name
        res.status = "reference"
        return runner
    diff = compare(got, run.reference)
    res.status, res.detail = ("identical", None) if diff is None else ("differs", diff)
    return runner


def _cannot_open(run: BenchRun, name: str, exc: Exception) -> None:
    if name == "tensorstore" and not run.named:
        # an independent reader with its own codec registry: an array it
        # cannot open is outside its scope, not a failed check
        run.skipped[name] = f"cannot open this array ({short(one_line(exc))})"
        run.notes.append(f"{name} skipped: {run.skipped[name]}")
        del run.results[name]
    else:
        res = run.results[name]
        res.status, res.detail = "failed", one_line(exc)


def _timed_rounds(run: BenchRun, runners: dict[str, Runner], progress: Progress) -> None:
    """``repeat`` rounds of one timed read per pipeline, the order rotating
    each round."""
    order = list(runners)
    for rnd in range(run.repeat):
        k = rnd % max(1, len(order))
        for name in order[k:] + order[:k]:
            progress.start(f"{name}: run {rnd + 1}/{run.repeat}")
            _timed_read(run, name, runners[name])
            progress.advance()


def _timed_read(run: BenchRun, name: str, runner: Runner) -> None:
    res = run.results[name]
    if res.status == "failed":
        return
    try:
        with warnings_as_notes(name, run.notes):
            t0 = time.perf_counter()
            runner.read(run.sel)
            res.times.append(time.perf_counter() - t0)
    except Exception as exc:
        res.status, res.detail, res.times = "failed", one_line(exc), []


def print_breakdown(runner: Runner, sel: tuple[int | slice, ...]) -> None:
    """One more read through zarr_fused inside `zarr_fused.stats`, printed
    counter by counter (untimed, so the local files are sized too: the
    table holds the timings)."""
    with stats(file_sizes=True) as counts:
        runner.read(sel)
    for line in breakdown(counts):
        print(line)


def breakdown(counts: Stats) -> list[str]:
    """The lines of `print_breakdown`: requests and bytes by store kind and
    op, keys addressed, bytes decoded, coalescing, time, the native
    kernels' chunks and time split, fallbacks."""
    lines = ["zarr_fused, one read inside zarr_fused.stats():"]
    requests, moved, unsized = counts.requests, counts.bytes, counts.unsized
    for kind, op in sorted(requests):
        n = requests[kind, op]
        size = human(moved[kind, op])
        if unsized[kind, op]:
            size = "bytes not counted" if unsized[kind, op] == n else size + " (some not counted)"
        lines.append(f"  {kind} {op}: {n} request(s), {size}")
    for (what, unit), n in sorted(counts.items.items()):
        lines.append(f"  {what}: {n} {unit} in {counts.calls[what]} batch(es)")
    lines.append(f"  bytes decoded: {human(counts.bytes_decoded)}")
    ranges = counts.ranges
    if ranges:
        lines.append(
            f"  byte ranges: {ranges['asked']} asked, coalesced into {ranges['requests']} request(s)"
        )
    seconds = counts.seconds
    for what in ("read", "write", "store"):
        if seconds[what]:
            label = "store requests from Python" if what == "store" else f"{what} calls"
            lines.append(f"  time in {label}: {seconds[what] * 1e3:.1f} ms")
    lines += _native_lines(counts)
    for (what, reason), n in sorted(counts.fallbacks.items()):
        lines.append(f"  fallback ({what}, {n} batch(es)): {reason}")
    return lines


#: the phases of `Stats.thread_seconds` as the breakdown names them
_PHASE_LABELS = {
    "read_io": "file reads",
    "decode": "decode",
    "scatter": "scatter",
    "encode": "encode",
    "write_io": "file writes",
}


def _native_lines(counts: Stats) -> list[str]:
    """The native kernels' chunks and their time split (summed over threads)."""
    lines = []
    for (what, unit), n in sorted(counts.native.items()):
        verb = "decoded" if what == "read" else "encoded"
        lines.append(f"  {unit.replace('_', ' ')} {verb} natively: {n}")
    per_shard = counts.inner_chunks_per_shard()
    if per_shard is not None:
        lines.append(f"  inner chunks decoded per shard read: {per_shard:.1f}")
    spent = counts.thread_seconds
    if spent:
        split = ", ".join(
            f"{label} {spent[phase] * 1e3:.1f} ms"
            for phase, label in _PHASE_LABELS.items()
            if spent[phase]
        )
        lines.append(f"  native time, summed over threads: {split}")
    return lines
