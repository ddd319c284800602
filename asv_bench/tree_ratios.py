"""A quick before/after check between two builds of zarr_fused.

It runs zarr_fused and zarr's BatchedCodecPipeline on the same data in one
process (256^3 uint16, zstd, 32^3 chunks; sharded with 128^3 shards and
unsharded), 7 interleaved rounds each, and prints Batched / zarr_fused
(higher is faster) for a whole read, a 40^3 slab read and a whole write.
Run it with each tree's venv, alternating trees, and compare the ratios:

    .venv/bin/python asv_bench/tree_ratios.py /tmp/ratios-data
    taskset -c 0 .venv/bin/python asv_bench/tree_ratios.py /tmp/ratios-data

The first argument is a directory for the arrays.
"""

import statistics
import sys
import time

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

FUSED = "zarr_fused.FusedCodecPipeline"
BATCHED = "zarr.core.codec_pipeline.BatchedCodecPipeline"
root = sys.argv[1]
rng = np.random.default_rng(0)
data = (rng.integers(0, 2000, (256, 256, 256))).astype("uint16")


def mk(name, **kw):
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        a = zarr.create_array(
            f"{root}/{name}", shape=data.shape, dtype=data.dtype, fill_value=0, overwrite=True, **kw
        )
        a[...] = data
    return name


cases = {
    "sharded": mk(
        "sharded", chunks=(32, 32, 32), shards=(128, 128, 128), compressors=ZstdCodec(level=1)
    ),
    "unsharded": mk("unsharded", chunks=(32, 32, 32), compressors=ZstdCodec(level=1)),
}


def read(name, pipe, sel=Ellipsis):
    with zarr.config.set({"codec_pipeline.path": pipe}):
        a = zarr.open_array(f"{root}/{name}")
        return a[sel]


def write(name, pipe):
    with zarr.config.set({"codec_pipeline.path": pipe}):
        a = zarr.open_array(f"{root}/{name}")
        a[...] = data


ops = []
for name in cases:
    ops.append((f"read {name}", lambda p, n=name: read(n, p)))
    ops.append((f"read {name} 40^3 slab", lambda p, n=name: read(n, p, (slice(20, 60),) * 3)))
    ops.append((f"write {name}", lambda p, n=name: write(n, p)))
assert np.array_equal(read("sharded", FUSED), data) and np.array_equal(
    read("unsharded", FUSED), data
)
for label, fn in ops:
    t = {FUSED: [], BATCHED: []}
    for r in range(7):
        for p in (FUSED, BATCHED) if r % 2 else (BATCHED, FUSED):
            t0 = time.perf_counter()
            fn(p)
            t[p].append(time.perf_counter() - t0)
    print(
        f"{label:28s} batched/fused = {statistics.median(t[BATCHED]) / statistics.median(t[FUSED]):.2f}",
        flush=True,
    )
