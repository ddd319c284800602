"""What bounds the sharded transpose-quantize-f8-zstd read: its 64 inner
chunk frames (the benchmark's array, 4 shards of 4x4 inner chunks) decoded
alone, by the system libzstd zarr_fused links (into one reused buffer) and by
numcodecs' Zstd, zarr's codec; median CPU seconds of 15 passes. The shard
files come from asv_bench/real_chains_side_by_side.py's layout, written to
the folder given as the first argument."""

import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
from numcodecs import Zstd

INNER = 16  # inner chunks per shard
frames = []
for path in sorted(Path(sys.argv[1]).glob("c/*/*")):
    data = path.read_bytes()
    index = np.frombuffer(data[-(INNER * 16 + 4) : -4], dtype="<u8").reshape(INNER, 2)
    frames += [data[off : off + n] for off, n in index]
lib = ctypes.CDLL("libzstd.so.1")
lib.ZSTD_versionString.restype = ctypes.c_char_p
lib.ZSTD_decompress.restype = ctypes.c_size_t
out = ctypes.create_string_buffer(128 * 256 * 8)
codec = Zstd()


def system() -> None:
    for frame in frames:
        lib.ZSTD_decompress(out, len(out), frame, len(frame))


def numcodecs_zstd() -> None:
    for frame in frames:
        codec.decode(frame)


def median_ms(fn: Callable[[], None], reps: int = 15) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1e3 * sorted(times)[reps // 2]


version = lib.ZSTD_versionString().decode()
size = sum(map(len, frames)) / 1e6
print(f"{len(frames)} frames, {size:.1f} MB; libzstd {version}, numcodecs {numcodecs.__version__}")
for _ in range(3):
    print(
        f"system libzstd {median_ms(system):.1f} ms   numcodecs Zstd {median_ms(numcodecs_zstd):.1f} ms"
    )
