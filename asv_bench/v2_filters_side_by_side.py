#!/usr/bin/env python
"""Side-by-side reads and writes of zarr format 2 arrays with filter chains.

zarr's `BatchedCodecPipeline`, zarr_fused (strict mode: a chain that left
the native path would fail, not be timed on zarr's code) and zarrs (its
strict mode, where installed) read, then write, the same local array: a
whole-array read or write each, in interleaved rounds
(`side_by_side.rounds`); results are ratios to zarr_fused, with median
wall and CPU seconds (all threads). Each peer's read is checked first, and
each peer's write is read back by zarr.

    python asv_bench/v2_filters_side_by_side.py --repeat 7 --pin both
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.storage import LocalStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _side_by_side_cli
from side_by_side import rounds, table

PEERS = {
    "zarr-batched": {"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"},
    "zarr_fused": {
        "codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
        "codec_pipeline.strict": True,
    },
    "zarrs": {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True},
}

SHAPE = (1024, 2048)
CHUNK = (128, 256)

CHAINS: dict[str, dict[str, Any]] = {
    "[Delta, Shuffle] + Zstd, C": {
        "dtype": "<i4",
        "order": "C",
        "filters": lambda: [numcodecs.Delta("<i4"), numcodecs.Shuffle(4)],
        "compressor": lambda: numcodecs.Zstd(1),
    },
    "AsType f8->f4 + Blosc, C": {
        "dtype": "<f8",
        "order": "C",
        "filters": lambda: [numcodecs.AsType("<f4", "<f8")],
        "compressor": lambda: numcodecs.Blosc("lz4", 5, 1),
    },
    "[Delta, Shuffle] + Zstd, F": {
        "dtype": "<i4",
        "order": "F",
        "filters": lambda: [numcodecs.Delta("<i4"), numcodecs.Shuffle(4)],
        "compressor": lambda: numcodecs.Zstd(1),
    },
    "[FixedScaleOffset, Shuffle] + Zlib, F": {
        "dtype": "<f8",
        "order": "F",
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=280, scale=100, dtype="<f8", astype="<i2"),
            numcodecs.Shuffle(2),
        ],
        "compressor": lambda: numcodecs.Zlib(1),
    },
}


def _data(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype.startswith("<i"):
        return np.cumsum(rng.integers(-3, 4, size=SHAPE), axis=1).astype(dtype)
    base = 280 + 10 * np.sin(np.linspace(0, 20, SHAPE[1]))[None, :]
    return (base + rng.standard_normal(SHAPE)).round(2).astype(dtype)


def _create(path: Path, chain: dict[str, Any]) -> Any:
    return zarr.create_array(
        LocalStore(path),
        shape=SHAPE,
        chunks=CHUNK,
        dtype=chain["dtype"],
        order=chain["order"],
        zarr_format=2,
        filters=chain["filters"](),
        compressors=chain["compressor"](),
        overwrite=True,
    )


def _peers() -> list[str]:
    found = ["zarr-batched", "zarr_fused"]
    try:
        import zarrs  # noqa: F401
    except ImportError:
        return found
    return [*found, "zarrs"]


#: zarr_fused with its per-chunk path for format-2 filters (``--per-chunk``):
#: the chain's one-call batch kernel path and the reader's groups switched
#: off on the opened array
PER_CHUNK = "per-chunk"


def _read_per_chunk(path: Path) -> Any:
    with zarr.config.set(PEERS["zarr_fused"]):
        array = zarr.open_array(LocalStore(path), mode="r")
        plan = array._async_array.codec_pipeline.plan
        if getattr(plan.chain, "fused", None) is None:
            raise TypeError("no one-call path to switch off")
        plan.chain.fused = None
        if getattr(plan.reader, "grouped", None) is not None:  # local files in groups
            plan.reader.grouped = None
        return array[:]


def _read_cases(
    path: Path, expected: np.ndarray, per_chunk: bool = False
) -> tuple[dict[str, Any], list[str]]:
    cases, skipped = {}, []
    for peer in [*_peers(), *([PER_CHUNK] if per_chunk else [])]:

        def read(peer: str = peer) -> Any:
            if peer == PER_CHUNK:
                return _read_per_chunk(path)
            with zarr.config.set(PEERS[peer]):
                return zarr.open_array(LocalStore(path), mode="r")[:]

        try:
            got = read()
        except Exception as exc:  # a peer that cannot read this chain
            skipped.append(f"{peer}: {type(exc).__name__}")
            continue
        if not np.array_equal(got, expected, equal_nan=True):
            raise SystemExit(f"{peer} read wrong data from {path.name}")
        cases[peer] = (read, None)
    return cases, skipped


def _write_cases(
    tmp: Path, chain: dict[str, Any], data: np.ndarray, expected: np.ndarray
) -> tuple[dict[str, Any], list[str]]:
    cases, skipped = {}, []
    for peer in _peers():
        path = tmp / f"write-{peer}"
        shutil.rmtree(path, ignore_errors=True)
        with zarr.config.set(PEERS["zarr-batched"]):
            _create(path, chain)

        def write(peer: str = peer, path: Path = path) -> None:
            with zarr.config.set(PEERS[peer]):
                zarr.open_array(LocalStore(path), mode="r+")[:] = data

        try:
            write()
        except Exception as exc:  # a peer that cannot write this chain
            skipped.append(f"{peer}: {type(exc).__name__}")
            continue
        with zarr.config.set(PEERS["zarr-batched"]):
            if not np.array_equal(zarr.open_array(LocalStore(path), mode="r")[:], expected):
                raise SystemExit(f"{peer} wrote data zarr reads differently ({path.name})")
        cases[peer] = (write, None)
    return cases, skipped


def run(repeat: int, only: str = "", per_chunk: bool = False) -> list[str]:
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, chain in CHAINS.items():
            if only not in name:
                continue
            data = _data(chain["dtype"])
            path = tmp / "read"
            with zarr.config.set(PEERS["zarr-batched"]):
                array = _create(path, chain)
                array[:] = data
                expected = np.asarray(array[:])
            for kind, (cases, skipped) in (
                ("read", _read_cases(path, expected, per_chunk)),
                ("write", _write_cases(tmp, chain, data, expected)),
            ):
                unit = ("GB/s", float(data.nbytes))
                out += table(f"{name} ({kind})", rounds(cases, repeat), unit=unit)
                if skipped:
                    out.append("not supported: " + ", ".join(skipped))
    return out


def main(argv: list[str] | None = None) -> int:
    options = _side_by_side_cli.parser(__doc__)
    options.add_argument("--only", default="", help="only the chains whose name has this")
    options.add_argument(
        "--per-chunk",
        action="store_true",
        help="also read with zarr_fused's per-chunk path (its one-call path off)",
    )

    def body(args: argparse.Namespace) -> None:
        print("\n".join(run(args.repeat, args.only, args.per_chunk)), flush=True)

    return _side_by_side_cli.main(
        __file__, options, argv, "zarr format 2 filter chains, local store", body
    )


if __name__ == "__main__":
    sys.exit(main())
