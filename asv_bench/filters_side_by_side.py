#!/usr/bin/env python
"""Side-by-side reads of arrays whose codec chains carry filters.

zarr's `BatchedCodecPipeline`, zarr_fused and zarrs (where installed) read
the same local array, a whole-array read each, in interleaved rounds (see
`side_by_side.rounds`); results are ratios to zarr_fused. zarrs runs in its
strict mode, so a chain it does not support is reported as such rather
than timed on zarr's code. Every peer's result is checked first.

    python asv_bench/filters_side_by_side.py --repeat 7 --pin both
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs.scale_offset import ScaleOffset
from zarr.storage import LocalStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _side_by_side_cli
from side_by_side import rounds, table

PEERS = {
    "zarr-batched": {"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"},
    "zarr_fused": {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"},
    "zarrs": {"codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True},
}

SHAPE = (1024, 2048)
SHARD = (512, 1024)  # 2 MB of float32 or int32 per shard
CHUNK = (128, 256)


def _data(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype.startswith("<i"):  # a random walk (astype-f8-i4 truncates the floats)
        return np.cumsum(rng.integers(-3, 4, size=SHAPE), axis=1).astype(dtype)
    base = 280 + 10 * np.sin(np.linspace(0, 20, SHAPE[1]))[None, :]
    return (base + rng.standard_normal(SHAPE)).astype(dtype)


CHAINS: dict[str, dict[str, Any]] = {
    "delta-i4 -> zstd": {"dtype": "<i4", "filters": lambda: [znc.Delta(dtype="<i4")]},
    "fixedscaleoffset-f8-i2 -> zstd": {
        "dtype": "<f8",
        "filters": lambda: [znc.FixedScaleOffset(offset=280, scale=100, dtype="<f8", astype="<i2")],
    },
    "bitround-f4 -> zstd": {"dtype": "<f4", "filters": lambda: [znc.BitRound(keepbits=10)]},
    "quantize-f4 -> zstd": {
        "dtype": "<f4",
        "filters": lambda: [znc.Quantize(digits=2, dtype="<f4")],
    },
    "scale_offset-i4 -> zstd": {
        "dtype": "<i4",
        "filters": lambda: [ScaleOffset(offset=100, scale=2)],
    },
    "scale_offset-i8-negate -> zstd": {
        "dtype": "<i8",
        "filters": lambda: [ScaleOffset(offset=1000, scale=-1)],
    },
    "astype-i4-i2 -> zstd": {
        "dtype": "<i4",
        "filters": lambda: [znc.AsType(encode_dtype="<i2", decode_dtype="<i4")],
    },
    "astype-f8-i4 -> zstd": {
        "dtype": "<f8",
        "filters": lambda: [znc.AsType(encode_dtype="<i4", decode_dtype="<f8")],
    },
    "delta-i4-astype-i2 -> zstd": {
        "dtype": "<i4",
        "filters": lambda: [znc.Delta(dtype="<i4", astype="<i2")],
    },
    "delta-f8-astype-f4 -> zstd": {
        "dtype": "<f8",
        "filters": lambda: [znc.Delta(dtype="<f8", astype="<f4")],
    },
}


def _write(path: Path, chain: dict[str, Any], sharded: bool) -> np.ndarray:
    data = _data(chain["dtype"])
    compressors = [ZstdCodec(level=1)]
    with zarr.config.set(PEERS["zarr-batched"]):
        if sharded:
            serializer = ShardingCodec(
                chunk_shape=CHUNK, codecs=[*chain["filters"](), BytesCodec(), *compressors]
            )
            array = zarr.create_array(
                LocalStore(path),
                shape=SHAPE,
                chunks=SHARD,
                dtype=chain["dtype"],
                serializer=serializer,
                compressors=None,
            )
        else:
            array = zarr.create_array(
                LocalStore(path),
                shape=SHAPE,
                chunks=CHUNK,
                dtype=chain["dtype"],
                filters=chain["filters"](),
                compressors=compressors,
            )
        array[:] = data
        return np.asarray(array[:])


def _write_v2(path: Path) -> np.ndarray:
    data = _data("<i4")
    with zarr.config.set(PEERS["zarr-batched"]):
        array = zarr.create_array(
            LocalStore(path),
            shape=SHAPE,
            chunks=CHUNK,
            dtype="<i4",
            zarr_format=2,
            filters=[numcodecs.Delta(dtype="<i4")],
            compressors=numcodecs.Blosc("lz4", 5, 1),
        )
        array[:] = data
        return np.asarray(array[:])


def _reader(peer: str, path: Path) -> Any:
    def read() -> Any:
        with zarr.config.set(PEERS[peer]):
            return zarr.open_array(LocalStore(path), mode="r")[:]

    return read


def _compare(title: str, path: Path, expected: np.ndarray, repeat: int) -> list[str]:
    cases = {}
    skipped = []
    for peer in PEERS:
        if peer == "zarrs" and "zarrs" not in sys.modules:
            try:
                import zarrs  # noqa: F401
            except ImportError:
                continue
        read = _reader(peer, path)
        try:
            got = read()
        except Exception as exc:  # a peer that cannot read this chain
            skipped.append(f"{peer}: {type(exc).__name__}")
            continue
        if not np.array_equal(got, expected, equal_nan=True):
            raise SystemExit(f"{peer} read wrong data for {title}")
        cases[peer] = (read, None)
    lines = table(title, rounds(cases, repeat), unit=("GB/s", expected.nbytes))
    if skipped:
        lines.append("not supported: " + ", ".join(skipped))
    return lines


def run(repeat: int, only: str = "") -> list[str]:
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, chain in CHAINS.items():
            if only not in name:
                continue
            for sharded in (False, True):
                label = f"{name} ({'sharded' if sharded else 'unsharded'})"
                path = Path(tmp) / label.replace(" ", "_")
                expected = _write(path, chain, sharded)
                out += _compare(label, path, expected, repeat)
        if only:
            return out
        path = Path(tmp) / "v2"
        out += _compare("v2 delta -> blosc (unsharded)", path, _write_v2(path), repeat)
    return out


def main(argv: list[str] | None = None) -> int:
    return _side_by_side_cli.chains_main(__file__, __doc__, argv, "filter chains, local store", run)


if __name__ == "__main__":
    sys.exit(main())
