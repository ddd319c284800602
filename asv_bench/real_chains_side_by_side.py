#!/usr/bin/env python
"""Side-by-side reads of every codec chain real datasets use.

The chains are the checklist tests/test_real_chains.py tests
(`zarr_fused_testing.chains`), each format-3 chain unsharded and sharded,
each format-2 chain unsharded. zarr's `BatchedCodecPipeline` writes each
array once; then zarr's pipeline, zarr_fused in strict mode and zarrs in
its strict mode (where installed) read it whole, in interleaved rounds
(`side_by_side.rounds`). A chain zarr_fused's strict mode rejects is "not
native" and is timed with strict mode off (zarr's code behind zarr_fused);
a chain zarrs rejects is "unsupported". Every peer's read is checked
against zarr's first. The run ends with one table: chain | layout | native
| Batched/ours and zarrs/ours (median wall and CPU seconds, all threads).

    python asv_bench/real_chains_side_by_side.py --repeat 3 --pin both
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore
from zarr_fused_testing.chains import (
    CHAINS,
    NOT_NATIVE,
    chain_values,
    create_chain_array,
    shardings,
)

from zarr_fused.errors import UnsupportedError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _side_by_side_cli
from side_by_side import rounds, table

BATCHED, OURS, ZARRS = "zarr-batched", "zarr_fused", "zarrs"
FUSED = "zarr_fused.FusedCodecPipeline"
CONFIGS = {
    BATCHED: {"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"},
    OURS: {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True},
    ZARRS: {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True},
}
#: zarr_fused for a chain its strict mode rejects
NOT_STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": False}


@dataclass(frozen=True)
class Geometry:
    shape: tuple[int, int]
    chunks: tuple[int, int]  # the shards' shape when sharded
    inner: tuple[int, int]  # the inner chunks' shape when sharded


#: 4 to 16 MB of numbers; variable-length items (Python objects, a few tens
#: of bytes each) on a grid 16 times smaller, to keep zarr's reads short
NUMBERS = Geometry((1024, 2048), (128, 256), (128, 256))
NUMBERS_SHARDED = Geometry((1024, 2048), (512, 1024), (128, 256))
VLEN = Geometry((256, 512), (32, 64), (32, 64))
VLEN_SHARDED = Geometry((256, 512), (128, 256), (32, 64))


def _geometry(case: dict[str, Any], sharded: bool) -> Geometry:
    vlen = case["values"] in ("str", "bytes")
    if sharded:
        return VLEN_SHARDED if vlen else NUMBERS_SHARDED
    return VLEN if vlen else NUMBERS


@dataclass
class Row:
    """One line of the summary table."""

    chain: str
    layout: str
    native: str
    batched: str = "-"
    zarrs: str = "-"


def _write(path: Path, case: dict[str, Any], sharded: bool) -> None:
    geometry = _geometry(case, sharded)
    with zarr.config.set(CONFIGS[BATCHED]):
        inner = geometry.inner if sharded else None
        array = create_chain_array(LocalStore(path), case, geometry.shape, geometry.chunks, inner)
        array[:] = chain_values(case, geometry.shape, 0)


def _reader(config: dict[str, Any], path: Path) -> Callable[[], Any]:
    def read() -> Any:
        with zarr.config.set(config):
            return zarr.open_array(LocalStore(path), mode="r")[:]

    return read


def _same(got: Any, expected: np.ndarray) -> bool:
    return bool(np.array_equal(got, expected, equal_nan=expected.dtype.kind in "fc"))


def _checked(path: Path, config: dict[str, Any], expected: np.ndarray) -> Callable[[], Any]:
    read = _reader(config, path)
    if not _same(read(), expected):
        raise SystemExit(f"zarr_fused read wrong data from {path.name}")
    return read


def _ours(path: Path, expected: np.ndarray) -> tuple[Callable[[], Any], str]:
    """zarr_fused's reader and whether the chain is native: strict mode's,
    or, where strict mode rejects the chain, the fallback's."""
    try:
        return _checked(path, CONFIGS[OURS], expected), "yes"
    except UnsupportedError:
        return _checked(path, NOT_STRICT, expected), "no"


def _strict_verdict(path: Path) -> str:
    """Whether strict mode takes a chain whose values zarr cannot check."""
    try:
        _reader(CONFIGS[OURS], path)()
    except UnsupportedError:
        return "no"
    except Exception as exc:  # a native read that fails as zarr's does
        return f"yes, but {type(exc).__name__}"
    return "yes, unchecked"


def _zarrs(path: Path, expected: np.ndarray) -> tuple[Callable[[], Any] | None, str]:
    """zarrs' reader, or None with why not."""
    try:
        importlib.import_module("zarrs")
    except ImportError:
        return None, "not installed"
    read = _reader(CONFIGS[ZARRS], path)
    try:
        got = read()
    except Exception as exc:  # a chain zarrs' strict mode does not take
        return None, f"unsupported ({type(exc).__name__})"
    if not _same(got, expected):  # reported, not timed
        return None, f"read other values{_difference(got, expected)}"
    return read, ""


def _difference(got: Any, expected: np.ndarray) -> str:
    if expected.dtype.kind not in "iufc" or np.shape(got) != expected.shape:
        return ""
    return f" (at most {np.nanmax(np.abs(np.asarray(got) - expected)):.2g} apart)"


def _ratio(results: dict[str, dict[str, float]], peer: str) -> str:
    ours = results[OURS]
    wall = results[peer]["median"] / ours["median"]
    cpu = results[peer]["cpu"] / ours["cpu"]
    return f"{wall:.2f}x / {cpu:.2f}x"


def _measure(name: str, sharded: bool, path: Path, repeat: int) -> tuple[list[str], Row]:
    """The detailed table of one array's reads, and its summary row."""
    layout = "sharded" if sharded else "unsharded"
    row = Row(name, layout, "?")
    try:
        expected = np.asarray(_reader(CONFIGS[BATCHED], path)())
    except Exception as exc:  # zarr cannot read what it wrote: nothing to time
        row.batched = f"zarr cannot read it ({type(exc).__name__})"
        row.native = _strict_verdict(path)
        return [], row
    ours, row.native = _ours(path, expected)
    if row.native == "no" and (name, sharded) not in NOT_NATIVE:
        row.native = "no (not in NOT_NATIVE)"
    cases = {BATCHED: (_reader(CONFIGS[BATCHED], path), None), OURS: (ours, None)}
    zarrs, why = _zarrs(path, expected)
    if zarrs is not None:
        cases[ZARRS] = (zarrs, None)
    results = rounds(cases, repeat)
    title = f"{name} ({layout}{', zarr_fused not strict' if row.native != 'yes' else ''})"
    lines = table(title, results, unit=("GB/s", expected.nbytes))
    row.batched = _ratio(results, BATCHED)
    row.zarrs = _ratio(results, ZARRS) if zarrs is not None else why
    return lines, row


def summary(rows: list[Row]) -> list[str]:
    """The table of every chain: ratios are the peer's median wall, then
    median CPU, seconds over zarr_fused's."""
    head = ("chain", "layout", "native", "Batched/ours wall / cpu", "zarrs/ours wall / cpu")
    cells = [head, *((r.chain, r.layout, r.native, r.batched, r.zarrs) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["## every chain: " + ", ".join(head[3:])]
    for c in cells:
        lines.append(" | ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())
    return lines


def run(repeat: int, only: str = "") -> list[str]:
    """Print each array's detailed table as it is measured; return the
    summary table."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CHAINS.items():
            if only not in name:
                continue
            for sharded in shardings(case):
                if case["requires"] and importlib.util.find_spec(case["requires"]) is None:
                    rows.append(Row(name, "-", f"{case['requires']} not installed"))
                    continue
                path = Path(tmp) / f"{name}-{sharded}"
                _write(path, case, sharded)
                lines, row = _measure(name, sharded, path, repeat)
                if lines:
                    print("\n".join(lines), flush=True)
                rows.append(row)
    return summary(rows)


def main(argv: list[str] | None = None) -> int:
    return _side_by_side_cli.chains_main(
        __file__, __doc__, argv, "real-data chains, local store", run, repeat=3
    )


if __name__ == "__main__":
    sys.exit(main())
