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
from typing import TYPE_CHECKING, NoReturn

from zarr_fused.cli.common import (
    BENCH_PIPELINES,
    EXIT_FAILURE,
    EXIT_USAGE,
    PROG,
    CliError,
)

__all__ = ["CliError", "build_parser", "main"]

DEFAULT_SIZE = 256
DEFAULT_REPEAT = 5


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


# -- the parser --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = _Parser(
        prog=PROG,
        description="zarr_fused: a Cython-compiled codec pipeline backend for zarr-python 3.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,bench,demo}")
    _add_info(sub)
    _add_bench(sub)
    _add_demo(sub)
    return parser


if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[_Parser]


def _add_info(sub: Subparsers) -> None:
    sub.add_parser(
        "info",
        help="versions, native codecs, linked libraries, thread count, settings",
        description="Print the versions of zarr_fused and its dependencies, whether each "
        "compiled extension imported, the codecs run natively, the linked C libraries, the "
        "crc32c implementation this CPU uses, the default thread count and why, and the "
        "effective codec_pipeline settings.",
    )


def _add_bench(sub: Subparsers) -> None:
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
        "path",
        nargs="?",
        metavar="PATH",
        help="a zarr array (or group, with --array): a directory, or a .zip file "
        "(read-only ZipStore); default: a generated sample",
    )
    bench.add_argument(
        "--array", metavar="NAME", help="path of the array inside the group at PATH (e.g. 'raw/s0')"
    )
    _add_count(
        bench,
        "--size",
        DEFAULT_SIZE,
        f"edge of the generated sample cube (default {DEFAULT_SIZE}: "
        f"{DEFAULT_SIZE**3 * 2 // 2**20} MiB)",
    )
    _add_count(
        bench,
        "--repeat",
        DEFAULT_REPEAT,
        f"timed reads per pipeline, median reported (default {DEFAULT_REPEAT})",
    )
    _add_bench_choices(bench)
    _add_bench_outputs(bench)


def _add_bench_choices(bench: argparse.ArgumentParser) -> None:
    """What is read, and by which pipelines."""
    bench.add_argument(
        "--pipelines",
        metavar="LIST",
        help="comma-separated subset of: " + ", ".join(BENCH_PIPELINES),
    )
    bench.add_argument(
        "--selection",
        metavar="EXPR",
        help="read this region instead of the whole array: NumPy-style "
        "integers, start:stop[:step] slices and '...', comma-separated, "
        "e.g. '0:100,:,5' (use --selection=-5: when it starts with a minus)",
    )


def _add_bench_outputs(bench: argparse.ArgumentParser) -> None:
    """What is shown and written besides the table."""
    bench.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    bench.add_argument(
        "--plot",
        metavar="FILE",
        help="bar chart of GB/s per pipeline (needs matplotlib), e.g. out.png",
    )


def _add_demo(sub: Subparsers) -> None:
    demo = sub.add_parser(
        "demo",
        help="write and read a sample array through every pipeline (make demo)",
        description="Write and read sample arrays (sharded zstd, unsharded raw) through every "
        "available pipeline, check that the values read back and the stored bytes are "
        "identical, and print the timings side by side.",
    )
    _add_count(demo, "--edge", 256, "edge length of the cubic sample (default 256)")
    _add_count(demo, "--repeat", 3, "timed repetitions, best is kept (default 3)")


def _add_count(parser: argparse.ArgumentParser, flag: str, default: int, text: str) -> None:
    """A positive integer option ``flag`` (shown as ``N``)."""
    parser.add_argument(flag, type=_positive_int, default=default, metavar="N", help=text)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "info":
        from zarr_fused.cli.info import run_info

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
