"""Smoke test of an installed zarr_fused (a portable wheel in a clean root,
``make wheel-test``): it runs against the installed package, not a checkout.

* ``zarr-fused info`` reports statically bundled libraries at numcodecs'
  versions, and libdeflate at the version bundled_libs builds;
* sharded zstd, blosc, gzip and crc32c arrays written through zarr_fused
  in strict mode (no fallback to zarr's code) read back with the values
  zarr's own pipeline reads, on a LocalStore and a MemoryStore;
* the stored bytes equal zarr's at every zstd level 1-22 and every blosc
  cname x clevel x shuffle (gzip: all but the header's MTIME).

Exits non-zero on the first failure; prints one line per check.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
from zarr.storage import LocalStore, MemoryStore

FUSED = "zarr_fused.FusedCodecPipeline"
ZARR = "zarr.core.codec_pipeline.BatchedCodecPipeline"
RNG = np.random.default_rng(26)
VALUES = np.cumsum(RNG.integers(-3, 4, (64, 48)), axis=1).astype("<i4")


def check_info() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "zarr-fused"), "info"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    import numcodecs.blosc
    import numcodecs.zstd

    wanted = [
        "linkage: bundled",
        f"zstd: {numcodecs.zstd.__version__}",
        f"blosc: {numcodecs.blosc.VERSION_STRING}",
        "libdeflate: 1.26",  # tools/bundled_libs.py's, from the deflate sdist
    ]
    missing = [w for w in wanted if w not in out]
    assert not missing, f"zarr-fused info lacks {missing}:\n{out}"
    print("info: " + "; ".join(line.strip() for line in out.splitlines() if ": " in line)[:300])


def _write(store: Any, pipeline: str, compressors: list[Any], sharded: bool) -> zarr.Array:
    with zarr.config.set({"codec_pipeline.path": pipeline, "codec_pipeline.strict": True}):
        arr = zarr.create_array(
            store,
            shape=VALUES.shape,
            chunks=(8, 12),
            shards=(32, 24) if sharded else None,
            dtype=VALUES.dtype,
            compressors=compressors,
            overwrite=True,
        )
        arr[...] = VALUES
    return arr


def _stored(compressors: list[Any], pipeline: str) -> dict[str, bytes]:
    store = MemoryStore()
    _write(store, pipeline, compressors, sharded=True)
    return {k: v.to_bytes() for k, v in store._store_dict.items() if k != "zarr.json"}


def check_round_trips() -> None:
    chains = {
        "zstd": [ZstdCodec(level=3)],
        "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "gzip": [GzipCodec(level=6)],
        "crc32c": [ZstdCodec(level=1), Crc32cCodec()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for (name, chain), local in itertools.product(chains.items(), (True, False)):
            store = LocalStore(f"{tmp}/{name}") if local else MemoryStore()
            _write(store, FUSED, chain, sharded=True)
            with zarr.config.set({"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}):
                ours = zarr.open_array(store, mode="r")[5:60, 3:40]
            with zarr.config.set({"codec_pipeline.path": ZARR}):
                theirs = zarr.open_array(store, mode="r")[5:60, 3:40]
            assert np.array_equal(ours, theirs) and np.array_equal(ours, VALUES[5:60, 3:40])
            print(f"sharded {name} on {'LocalStore' if local else 'MemoryStore'}: same values")


def check_stored_bytes() -> None:
    settings: list[tuple[str, list[Any]]] = [
        (f"zstd level {lv}", [ZstdCodec(level=lv)]) for lv in range(1, 23)
    ]
    settings += [
        (f"blosc {cname} clevel {clevel} {shuffle}", [BloscCodec(cname=cname, clevel=clevel,
                                                                 shuffle=shuffle)])
        for cname in ("blosclz", "lz4", "lz4hc", "zlib", "zstd")
        for clevel in range(10)
        for shuffle in ("noshuffle", "shuffle", "bitshuffle")
    ]  # fmt: skip
    for name, chain in settings:
        assert _stored(chain, FUSED) == _stored(chain, ZARR), f"{name}: stored bytes differ"
    print(f"stored bytes equal zarr's: {len(settings)} zstd and blosc settings")


def main() -> int:
    print(f"zarr {zarr.__version__}, numcodecs {numcodecs.__version__}, python {sys.version[:6]}")
    check_info()
    check_round_trips()
    check_stored_bytes()
    print("wheel smoke test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
