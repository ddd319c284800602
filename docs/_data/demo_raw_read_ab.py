"""The demo's unsharded raw read (uint16 256^3, 64^3 raw chunks, 64 files of
512 KiB), interleaved: zarr's Batched, zarr_fused, and zarr_fused with
FILE_BYTES unbounded (the judgement before this change)."""

import os
import shutil
import statistics
import sys
import time

import numpy as np
import zarr
from zarr.storage import LocalStore

import zarr_fused.chunks.pipelined as PL
from zarr_fused.cli.sample import sample_data, sample_geometry

data = sample_data(256)
chunks, _ = sample_geometry(256)
root = "/tmp/owperf/demo_raw"
shutil.rmtree(root, ignore_errors=True)
with zarr.config.set({"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"}):
    zarr.create_array(
        LocalStore(root),
        shape=data.shape,
        dtype=data.dtype,
        chunks=tuple(2 * c for c in chunks),
        compressors=None,
    )[...] = data
P = {
    "zarr batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "zarr_fused": "zarr_fused.FusedCodecPipeline",
    "zarr_fused before": "zarr_fused.FusedCodecPipeline",
}
FB = PL.FILE_BYTES
arrs = {}
for k, p in P.items():
    PL.FILE_BYTES = float("inf") if k.endswith("before") else FB
    with zarr.config.set({"codec_pipeline.path": p}):
        arrs[k] = zarr.open_array(LocalStore(root), mode="r")
        assert np.array_equal(arrs[k][...], data)
res = {k: [] for k in P}
names = list(P)
for r in range(int(sys.argv[1])):
    for k in names[r % 3 :] + names[: r % 3]:
        PL.FILE_BYTES = float("inf") if k.endswith("before") else FB
        with zarr.config.set({"codec_pipeline.path": P[k]}):
            c0 = time.process_time()
            t0 = time.perf_counter()
            arrs[k][...]
            t = time.perf_counter() - t0
            c = time.process_time() - c0
        res[k].append((t, c))
print(
    f"# CPUs {sorted(os.sched_getaffinity(0))}, {sys.argv[1]} rounds, load {os.getloadavg()[0]:.1f}"
)
base = statistics.median(w for w, _ in res["zarr_fused"])
for k, v in res.items():
    w, c = zip(*v)
    print(
        f"{k:18} median {statistics.median(w) * 1e3:7.1f} ms  min {min(w) * 1e3:6.1f}  cpu {statistics.median(c) * 1e3:6.1f} ms  zarr_fused speedup {statistics.median(w) / base:.2f}x"
    )
