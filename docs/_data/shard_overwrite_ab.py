import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "asv_bench"))
os.environ.setdefault("ZARR_FUSED_BENCH_DIR", "/tmp/owperf/bench")
from benchmarks._peers import LAYOUTS, Writer, data_dir

from zarr_fused._localio import replace_mode

name = sys.argv[1]
rounds = int(sys.argv[2])
layout = LAYOUTS[name]
data = layout.sample()
w = Writer("zarr_fused", layout, data_dir() / f"{name}-overwrite-zarr_fused")
w.prepare()
w.write(data)
res = {"exchange": [], "rename": []}
for r in range(rounds):
    for mode in ["exchange", "rename"] if r % 2 == 0 else ["rename", "exchange"]:
        w.reopen()
        before = replace_mode("rename") if mode == "rename" else replace_mode()
        c0 = time.process_time()
        t0 = time.perf_counter()
        w.write(data)
        t = time.perf_counter() - t0
        c = time.process_time() - c0
        replace_mode(before)
        res[mode].append((t, c))
print(
    f"# {name}, CPUs {sorted(os.sched_getaffinity(0))}, {rounds} rounds, load {os.getloadavg()[0]:.1f}"
)
for k, v in res.items():
    wl, cl = zip(*v)
    print(
        f"{k:9} median {statistics.median(wl):.3f} s min {min(wl):.3f} cpu {statistics.median(cl):.3f} s  all {' '.join(f'{x:.2f}' for x in wl)}"
    )
