#!/usr/bin/env python
"""How far each chain's read sits above its codec library's floor.

For each chain of `zarr_fused_testing.chains` (the geometry of
real_chains_side_by_side.py; ``--only`` picks them), in interleaved rounds
(`side_by_side.rounds`):

- ``floor``: the library alone, the chain's own kernel (the `ChainKernel`
  zarr_fused's plan built, so the library and settings our build links)
  decoding every stored frame (chunk files, or a shard's inner chunks)
  from memory into one reused buffer;
- ``files``: the stored files read natively into one buffer each
  (`zarr_fused._fileio.read_files_into`, hot page cache);
- ``zarr_fused`` and ``zarr-batched``: the whole read of the array
  (``open_array(...)[:]``), zarr_fused in strict mode, values checked
  against zarr's first.

Each chain gets its median wall times, its least wall times and its
median CPU times (all threads; on a busy host the least and the CPU times
move less than the median wall), each ending with what is left of ours
once the floor and the file reads are taken out (the scatter into the
output, zarr's call around the pipeline, our Python), Batched/ours, and
Batched/(floor + files): the most Batched/ours can be while the codec
library and the page cache copy stay what they are.

    python asv_bench/floor_side_by_side.py --repeat 9 --pin both --only transpose
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore
from zarr_fused_testing.chains import CHAINS, shardings

from zarr_fused import _fileio
from zarr_fused.shard.index import whole_shard

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _side_by_side_cli
import real_chains_side_by_side as chains
from side_by_side import rounds

FLOOR, FILES = "floor", "files"
#: the chains issue 27 found at the 2x bar (the default of --only)
AT_THE_BAR = ("transpose-quantize-f8-zstd", "v2-gzip-f8-F", "v2-bitround-f4-blosc")


def _plan(path: Path) -> Any:
    with zarr.config.set(chains.CONFIGS[chains.OURS]):
        array = zarr.open_array(LocalStore(path), mode="r")
    return array, array._async_array.codec_pipeline.plan


def _kernel(chain: Any) -> Any:
    """The `ChainKernel` under a native chain, or under native filters."""
    kernel = getattr(chain, "kernel", None)
    return kernel if kernel is not None else chain.tail.kernel


def _files(path: Path) -> list[Path]:
    names = ("zarr.json", ".zarray", ".zattrs", ".zgroup")
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name not in names)


def _frames(path: Path) -> tuple[list[bytes], int, Any]:
    """The stored frames, the bytes each decodes to, and the kernel."""
    array, plan = _plan(path)
    reader = plan.reader
    files = _files(path)
    if not hasattr(reader, "fmt"):  # whole chunk files
        nbytes = math.prod(array.chunks) * array.dtype.itemsize
        return [f.read_bytes() for f in files], nbytes, _kernel(plan.chain)
    inner = reader.inner_shape
    shard_shape = array.shards
    grid = tuple(s // i for s, i in zip(shard_shape, inner, strict=True))
    frames = []
    for f in files:
        data = np.frombuffer(f.read_bytes(), dtype=np.uint8)
        shard = whole_shard(data, f.name, reader.fmt, grid)
        frames.extend(bytes(data[o : o + n]) for o, n in shard.entries.tolist())
    return frames, math.prod(inner) * array.dtype.itemsize, _kernel(reader.chain)


def _floor(path: Path) -> Callable[[], Any]:
    frames, nbytes, kernel = _frames(path)
    out = np.empty(nbytes, dtype=np.uint8)

    def floor() -> None:
        for frame in frames:
            kernel.decode(frame, nbytes, out)

    return floor


def _file_reads(path: Path) -> Callable[[], Any]:
    files = _files(path)
    paths = [os.fsencode(f) for f in files]
    sizes = np.array([f.stat().st_size + 1 for f in files], dtype=np.intp)
    offsets = np.zeros(len(files), dtype=np.intp)
    np.cumsum(sizes[:-1], out=offsets[1:])
    arena = np.empty(int(sizes.sum()), dtype=np.uint8)
    lengths = np.empty(len(files), dtype=np.intp)

    def files_read() -> None:
        _fileio.read_files_into(paths, arena, offsets, sizes, lengths, bytearray(1))

    return files_read


def _measure(name: str, sharded: bool, path: Path, repeat: int) -> list[str]:
    expected = np.asarray(chains._reader(chains.CONFIGS[chains.BATCHED], path)())
    ours, _ = chains._ours(path, expected)
    cases = {
        FLOOR: (_floor(path), None),
        FILES: (_file_reads(path), None),
        chains.OURS: (ours, None),
        chains.BATCHED: (chains._reader(chains.CONFIGS[chains.BATCHED], path), None),
    }
    results = rounds(cases, repeat)
    layout = "sharded" if sharded else "unsharded"
    lines = [f"{name} ({layout})"]
    for measure, label in (("median", "wall median"), ("min", "wall min"), ("cpu", "CPU median")):
        ms = {k: 1e3 * v[measure] for k, v in results.items()}
        rest = ms[chains.OURS] - ms[FLOOR] - ms[FILES]
        ceiling = ms[chains.BATCHED] / (ms[FLOOR] + ms[FILES])
        lines += [
            f"  {label} ms: " + ", ".join(f"{k} {ms[k]:.1f}" for k in cases),
            (
                f"    ours - floor - files {rest:.1f} ms; Batched/ours "
                f"{ms[chains.BATCHED] / ms[chains.OURS]:.2f}x; "
                f"Batched/(floor + files) {ceiling:.2f}x"
            ),
        ]
    return lines


def run(repeat: int, only: str = "") -> list[str]:
    lines: list[str] = []
    names = [n for n in CHAINS if only in n] if only else list(AT_THE_BAR)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = CHAINS[name]
            for sharded in shardings(case):
                path = Path(tmp) / f"{name}-{sharded}"
                chains._write(path, case, sharded)
                measured = _measure(name, sharded, path, repeat)
                print("\n".join(measured), flush=True)
                lines += measured
    return []


def main(argv: list[str] | None = None) -> int:
    return _side_by_side_cli.chains_main(
        __file__, __doc__, argv, "codec floors, local store", run, repeat=7
    )


if __name__ == "__main__":
    sys.exit(main())
