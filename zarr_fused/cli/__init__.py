"""The ``zarr-fused`` command line (also ``python -m zarr_fused``).

Verbs: ``info`` (what this build runs natively and how it is configured),
``bench`` (one array read through every available pipeline, checked and
timed) and ``demo`` (what ``make demo`` runs).

Every error a user can cause ends as one line on stderr starting with
``zarr-fused: `` and a non-zero exit status: 2 for bad input (arguments,
paths, selections), 1 for failures (pipelines that disagree or raise, files
that cannot be written). A traceback is never the answer to bad input, so
argparse's own multi-line usage errors are folded into that one line too.
Heavy imports (zarr, numpy, matplotlib) happen inside the verbs, so
``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

PROG = "zarr-fused"

#: Exit statuses.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

#: What ``bench`` can compare, in table order; the first is the reference.
BENCH_PIPELINES = ("zarr-batched", "zarr-fused", "zarr_fused", "zarrs", "tensorstore")
DEFAULT_SIZE = 256
DEFAULT_REPEAT = 5


class CliError(Exception):
    """An error to report as one ``zarr-fused: ...`` line, with an exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors reported on one line like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# -- info -------------------------------------------------------------------------------


def _setting(read: Callable[[], object]) -> tuple[object, str]:
    """Call ``read()``; returns its value and, when it warned, the warning's text
    (an invalid setting is shown next to its value, not as a separate warning)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read()
    return value, "; ".join(str(w.message) for w in caught)


def run_info() -> int:
    """Print versions, extensions, native codecs, libraries, threads and settings."""
    import numcodecs
    import numpy as np
    import zarr
    from zarr.core.config import config as zarr_config

    import zarr_fused
    from zarr_fused._native import missing_message
    from zarr_fused._cpus import default_max_workers, resolve_max_workers
    from zarr_fused.config import MAX_WORKERS_KEY, STRICT_KEY, strict_mode

    info = zarr_fused.native_info()
    print(f"zarr_fused {zarr_fused.__version__}")
    print(
        f"versions: zarr {zarr.__version__}, numpy {np.__version__}, "
        f"numcodecs {numcodecs.__version__}, python {sys.version.split()[0]}"
    )
    print("compiled extensions:")
    for name, ok in info["extensions"].items():  # type: ignore[union-attr]
        print(f"  {name}: {'ok' if ok else 'MISSING'}")
    missing = missing_message()
    if missing:
        print(f"  {missing}")
    print(f"native codecs: {', '.join(info['codecs']) or 'none'}")  # type: ignore[arg-type]
    libraries: dict[str, object] = info["libraries"]  # type: ignore[assignment]
    print("linked libraries:" if libraries else "linked libraries: none (extensions missing)")
    for name, version in libraries.items():
        if name == "crc32c":
            print(f"  crc32c implementation on this CPU: {version}")
        elif isinstance(version, list):
            print(f"  {name}: {', '.join(map(str, version))}")
        else:
            print(f"  {name}: {version}")
    cpus, why = default_max_workers()
    print(f"default threads: {cpus} ({why})")

    path = zarr_config.get("codec_pipeline.path")
    selected = "is" if path == "zarr_fused.FusedCodecPipeline" else "is not"
    print("settings:")
    print(f"  codec_pipeline.path: {path} (zarr_fused {selected} selected)")
    raw = zarr_config.get(MAX_WORKERS_KEY, default=None)
    workers, warned = _setting(resolve_max_workers)
    origin = "default: the CPUs above" if raw is None else "set"
    print(f"  {MAX_WORKERS_KEY}: {raw!r} ({origin}) -> {workers} threads per batch"
          + (f" [{warned}]" if warned else ""))
    raw = zarr_config.get(STRICT_KEY, default=False)
    strict, warned = _setting(strict_mode)
    effect = "raise where no native path applies" if strict else "fall back to zarr's code"
    print(f"  {STRICT_KEY}: {raw!r} -> {'on' if strict else 'off'} ({effect})"
          + (f" [{warned}]" if warned else ""))
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = _Parser(prog=PROG, description="zarr_fused: a Cython-compiled codec pipeline "
                     "backend for zarr-python 3.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,bench,demo}")

    sub.add_parser(
        "info",
        help="versions, native codecs, linked libraries, thread count, settings",
        description="Print the versions of zarr_fused and its dependencies, whether each "
        "compiled extension imported, the codecs run natively, the linked C libraries, the "
        "crc32c implementation this CPU uses, the default thread count and why, and the "
        "effective codec_pipeline settings.",
    )

    bench = sub.add_parser(
        "bench",
        help="read one array through every available pipeline: check and time",
        description="Read a zarr array through each available pipeline (zarr's batched and "
        "fused pipelines, zarr_fused, zarrs and tensorstore when installed), check that "
        "every pipeline returns identical data (exit 1 if not), and print the median time, "
        "throughput and speed relative to zarr's batched pipeline. Without PATH, a generated "
        "sample (sharded zstd uint16 cube) is written to a temporary directory first.",
        epilog=f"Pipelines: {', '.join(BENCH_PIPELINES)}. Exit status: 0 when every pipeline read "
        "identical data, 1 when they differ or one failed, 2 for bad input.",
    )
    bench.add_argument(
        "path", nargs="?", metavar="PATH",
        help="a zarr array (or group, with --array): a directory, or a .zip file "
        "(read-only ZipStore); default: a generated sample",
    )
    bench.add_argument("--array", metavar="NAME",
                       help="path of the array inside the group at PATH (e.g. 'raw/s0')")
    bench.add_argument("--size", type=_positive_int, default=DEFAULT_SIZE, metavar="N",
                       help=f"edge of the generated sample cube (default {DEFAULT_SIZE}: "
                       f"{DEFAULT_SIZE**3 * 2 // 2**20} MiB)")
    bench.add_argument("--repeat", type=_positive_int, default=DEFAULT_REPEAT, metavar="N",
                       help=f"timed reads per pipeline, median reported (default {DEFAULT_REPEAT})")
    bench.add_argument("--pipelines", metavar="LIST",
                       help="comma-separated subset of: " + ", ".join(BENCH_PIPELINES))
    bench.add_argument("--selection", metavar="EXPR",
                       help="read this region instead of the whole array: NumPy-style "
                       "integers, start:stop[:step] slices and '...', comma-separated, "
                       "e.g. '0:100,:,5' (use --selection=-5: when it starts with a minus)")
    bench.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar on stderr (default: when stderr is a terminal)")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    bench.add_argument("--plot", metavar="FILE",
                       help="bar chart of GB/s per pipeline (needs matplotlib), e.g. out.png")

    demo = sub.add_parser(
        "demo",
        help="write and read a sample array through every pipeline (make demo)",
        description="Write and read sample arrays (sharded zstd, unsharded raw) through every "
        "available pipeline, check that the values read back and the stored bytes are "
        "identical, and print the timings side by side.",
    )
    demo.add_argument("--edge", type=_positive_int, default=256,
                      help="edge length of the cubic sample (default 256)")
    demo.add_argument("--repeat", type=_positive_int, default=3,
                      help="timed repetitions, best is kept (default 3)")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "info":
        return run_info()
    if args.command == "bench":
        from zarr_fused.cli.bench import run_bench

        return run_bench(args)
    from zarr_fused.cli.demo import run_demo

    return run_demo(edge=args.edge, repeat=args.repeat)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (``sys.exit(main())``)."""
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, or a usage error already reported
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        return _dispatch(args)
    except CliError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (`zarr-fused bench | head`): stop quietly,
        # and keep the interpreter's final flush from failing again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILURE
