"""The transposed scatter of transpose-quantize-f8-zstd on its own: 64 chunks
of 128x256 items, each stored transposed (a C-order 256x128 block), copied
into a warm 1024x2048 C-order output through `zarr_fused._scatter.scatter`,
against the same chunks copied untransposed; median and min CPU seconds of
30 passes, per item size. Run pinned (``taskset -c 0``) and unpinned."""

import sys
import time

import numpy as np

from zarr_fused._scatter import scatter

CHUNK = (128, 256)
SHAPE = (1024, 2048)


def passes(chunks: list[np.ndarray], out: np.ndarray, reps: int = 30) -> list[float]:
    cells = [
        (slice(i, i + CHUNK[0]), slice(j, j + CHUNK[1]))
        for i in range(0, SHAPE[0], CHUNK[0])
        for j in range(0, SHAPE[1], CHUNK[1])
    ]
    times = []
    for _ in range(reps):
        start = time.process_time()
        for k, cell in enumerate(cells):
            scatter(chunks[k % len(chunks)], out, cell)
        times.append(time.process_time() - start)
    return sorted(times)


def main(dtype: str) -> None:
    rng = np.random.default_rng(0)
    stored = [rng.standard_normal(CHUNK[::-1]).astype(dtype) for _ in range(4)]
    out = np.zeros(SHAPE, dtype)
    transposed = passes([s.T for s in stored], out)
    plain = passes([s.reshape(CHUNK) for s in stored], out)
    print(
        f"{dtype}: transposed median {1e3 * transposed[15]:.2f} ms min {1e3 * transposed[0]:.2f};"
        f" plain median {1e3 * plain[15]:.2f} min {1e3 * plain[0]:.2f}"
    )


for name in sys.argv[1:] or ["<f8", "<f4", "<i2"]:
    main(name)
