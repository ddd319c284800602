"""What a `zarr_fused.stats` block costs a hot read, side by side in one process.

256^3 uint16, zstd level 1, 32^3 chunks, sharded (128^3 shards) and
unsharded, written once into the directory given; then interleaved rounds
(the order alternating) of a whole read and a 40^3 slab read, each read
without a block and inside its own block. Prints the medians of wall time
and of process CPU time (all threads), their ratio inside / without, and
the median of the per-round ratios; then, for each array, the native
kernels' time split of one whole read (`Stats.thread_seconds`, summed over
threads) beside its wall time:

    .venv/bin/python asv_bench/stats_ratios.py /tmp/stats-data 41
    taskset -c 0 .venv/bin/python asv_bench/stats_ratios.py /tmp/stats-data 41
"""

import contextlib
import statistics
import sys
import time

import numpy as np
import zarr
from zarr.codecs import ZstdCodec

import zarr_fused

FUSED = "zarr_fused.FusedCodecPipeline"
root = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 21
data = np.random.default_rng(0).integers(0, 2000, (256, 256, 256)).astype("uint16")
layouts = {
    "sharded": {"chunks": (32,) * 3, "shards": (128,) * 3},
    "unsharded": {"chunks": (32,) * 3},
}
arrays = {}
with zarr.config.set({"codec_pipeline.path": FUSED}):
    for name, kw in layouts.items():
        a = zarr.create_array(
            f"{root}/{name}",
            shape=data.shape,
            dtype=data.dtype,
            fill_value=0,
            overwrite=True,
            compressors=ZstdCodec(level=1),
            **kw,
        )
        a[...] = data
        arrays[name] = zarr.open_array(f"{root}/{name}", mode="r")
sels = {"whole": Ellipsis, "slab40": (slice(70, 110),) * 3}
modes = {"without": contextlib.nullcontext, "inside": zarr_fused.stats}
res: dict = {}
for r in range(rounds):
    for name, a in arrays.items():
        for sname, sel in sels.items():
            for m in list(modes) if r % 2 == 0 else list(modes)[::-1]:
                with modes[m]():
                    c0, w0 = time.process_time(), time.perf_counter()
                    a[sel]
                    w1, c1 = time.perf_counter(), time.process_time()
                res.setdefault((name, sname, m), []).append((w1 - w0, c1 - c0))
for name in arrays:
    for sname in sels:
        inside, without = res[(name, sname, "inside")], res[(name, sname, "without")]
        w = [statistics.median(x[0] for x in v) for v in (without, inside)]
        c = [statistics.median(x[1] for x in v) for v in (without, inside)]
        pw = statistics.median(a[0] / b[0] for a, b in zip(inside, without))
        pc = statistics.median(a[1] / b[1] for a, b in zip(inside, without) if b[1] > 0)
        print(
            f"{name:9s} {sname:6s} wall {w[0] * 1e3:8.2f} -> {w[1] * 1e3:8.2f} ms "
            f"ratio {w[1] / w[0]:.3f} (paired {pw:.3f}) | cpu {c[0] * 1e3:7.2f} -> "
            f"{c[1] * 1e3:7.2f} ms ratio {c[1] / c[0]:.3f} (paired {pc:.3f})"
        )
with zarr.config.set({"codec_pipeline.path": FUSED}):
    for name, a in arrays.items():
        with zarr_fused.stats() as s:
            a[...]
        split = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(s.thread_seconds.items()))
        print(f"{name:9s} whole  wall {s.seconds['read'] * 1e3:.1f} ms | threads: {split} ms")
