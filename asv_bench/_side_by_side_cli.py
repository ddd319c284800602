"""The command line the side-by-side scripts share: ``--repeat`` and
``--pin``, and the run that goes with them.

``--pin on`` restricts the process to its lowest CPU first (like
``taskset -c 0``; zarr_fused then sizes its pool to 1); ``--pin both`` runs
the script again in two child processes, unpinned then pinned, with the
same arguments. Every run starts with a header naming its CPUs and the load
average, so the two halves of a ``--pin both`` output tell themselves apart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence


def parser(doc: str | None, repeat: int | None = 7) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--pin`` and,
    unless ``repeat`` is None (a script that takes its rounds otherwise),
    ``--repeat``."""
    out = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    if repeat is not None:
        out.add_argument("--repeat", type=int, default=repeat)
    out.add_argument("--pin", choices=["off", "on", "both"], default="off")
    return out


def _both(script: str, argv: Sequence[str]) -> int:
    # argparse keeps the last of a repeated option, so the child's --pin
    # appended after the caller's arguments wins over their "both"
    for pin in ("off", "on"):
        cmd = [sys.executable, script, *argv, "--pin", pin]
        if subprocess.run(cmd, check=False).returncode:
            return 1
    return 0


def header(title: str, pin: str, repeat: int) -> list[str]:
    """Pin this process when ``pin`` is ``on``; the header lines of a run."""
    if pin == "on":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    cpus = sorted(os.sched_getaffinity(0))
    pinned = "pinned" if pin == "on" else "unpinned"
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return [
        f"# {title}, CPUs {cpus} ({pinned}), {repeat} rounds",
        f"# load average at the start: {load}",
    ]


def main(
    script: str,
    options: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    title: str,
    body: Callable[[argparse.Namespace], None],
) -> int:
    """Parse ``argv``; for ``--pin both`` run ``script`` twice, else print
    the header and run ``body`` with the parsed arguments (which hold
    ``repeat``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = options.parse_args(argv)
    if args.pin == "both":
        return _both(script, argv)
    print("\n".join(header(title, args.pin, args.repeat)), flush=True)
    body(args)
    return 0


def chains_main(
    script: str,
    doc: str | None,
    argv: Sequence[str] | None,
    title: str,
    run: Callable[[int, str], list[str]],
    repeat: int = 7,
) -> int:
    """`main` for a script that times named codec chains: ``--only`` keeps
    the chains whose name has that text; ``run(repeat, only)`` returns the
    lines to print."""
    options = parser(doc, repeat)
    options.add_argument("--only", default="", help="only the chains whose name has this")

    def body(args: argparse.Namespace) -> None:
        print("\n".join(run(args.repeat, args.only)), flush=True)

    return main(script, options, argv, title, body)
