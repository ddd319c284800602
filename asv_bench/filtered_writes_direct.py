"""Whole writes of filtered unsharded chains stored by the compute threads
(``codec_pipeline.io_concurrency`` 1, a hot page cache): each chunk file
stored natively (`zarr_fused.io.local.write_parts`, as the IO threads do)
against through its key (``set_sync``, zarr's LocalStore code: the path
before), alternating write by write in one process; wall and CPU
milliseconds per write of a 1024x2048 int32 array in 64 chunks (median of
``--reps`` each), for a format-3 Delta -> Zstd chain and a format-2 Delta ->
Blosc one. Run pinned (``taskset -c 0``) and unpinned, several times.

The per-key stores are what `zarr_fused.chunks.write` falls back to when
the file kernels are not built: the script sets the module's
``io_kernels`` to None for those writes (with one IO thread nothing else
of the write reads it). zarr's own pipeline is the peer in
``latency_side_by_side.py --ops write``.

    python asv_bench/filtered_writes_direct.py --label pinned [--reps 21]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

from zarr_fused.chunks import write as chunk_write

CONFIG = {
    "codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
    "codec_pipeline.strict": True,
    "codec_pipeline.io_concurrency": 1,
}


def create(chain: str, root: str, shape: tuple[int, int]) -> Any:
    if chain == "v3-delta-zstd":
        return zarr.create_array(
            LocalStore(root),
            shape=shape,
            dtype="<i4",
            chunks=(128, 256),
            filters=[{"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}}],
            compressors=[ZstdCodec()],
            fill_value=0,
        )
    return zarr.create_array(
        LocalStore(root),
        shape=shape,
        dtype="<i4",
        chunks=(128, 256),
        zarr_format=2,
        filters=[numcodecs.Delta("<i4")],
        compressors=numcodecs.Blosc("lz4"),
        fill_value=0,
    )


def _median_ms(values: list[float]) -> float:
    return 1e3 * sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    native = chunk_write.io_kernels
    rng = np.random.default_rng(0)
    value = np.cumsum(rng.integers(-3, 4, (1024, 2048)), axis=1).astype("<i4")
    with zarr.config.set(CONFIG), tempfile.TemporaryDirectory() as tmp:
        for chain in ("v3-delta-zstd", "v2-delta-blosc"):
            array = create(chain, f"{tmp}/{chain}", value.shape)
            array[...] = value
            times: dict[str, tuple[list[float], list[float]]] = {
                "key": ([], []),
                "native": ([], []),
            }
            try:
                for i in range(2 * args.reps):
                    mode = ("key", "native")[i % 2]
                    chunk_write.io_kernels = None if mode == "key" else native
                    start, cpu_start = time.perf_counter(), time.process_time()
                    array[...] = value
                    times[mode][0].append(time.perf_counter() - start)
                    times[mode][1].append(time.process_time() - cpu_start)
            finally:
                chunk_write.io_kernels = native
            np.testing.assert_array_equal(array[...], value)
            (key_wall, key_cpu), (wall, cpu) = (
                [_median_ms(v) for v in times["key"]],
                [_median_ms(v) for v in times["native"]],
            )
            print(
                f"{args.label}\t{chain}\tper-key wall {key_wall:.2f} cpu {key_cpu:.2f}"
                f"\tnative wall {wall:.2f} cpu {cpu:.2f}"
                f"\tper-key/native wall {key_wall / wall:.2f}x cpu {key_cpu / cpu:.2f}x"
            )


if __name__ == "__main__":
    main()
