"""What the two `read_regions` side-by-side scripts share
(``regions_side_by_side.py`` from the page cache,
``regions_storage_side_by_side.py`` from slow storage): the sample cube and
its regions, the peers both time, the check of their values and the
rounds in which they take turns."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import regions

FUSED = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"}

Peers = dict[str, Callable[[], list[Any]]]


def write_cube(path: Path, size: int, shard: int, inner: int) -> None:
    """The sample cube (smooth values, so zstd has work) unless present."""
    if (path / ".complete").exists():
        return
    with zarr.config.set(FUSED):
        arr = zarr.create_array(
            LocalStore(path),
            shape=(size,) * 3,
            chunks=(shard,) * 3,
            dtype="uint16",
            serializer=ShardingCodec(
                chunk_shape=(inner,) * 3, codecs=[BytesCodec(), ZstdCodec(level=1)]
            ),
            compressors=None,
            overwrite=True,
        )
        rng = np.random.default_rng(0)
        for z in range(0, size, shard):
            block = np.indices((shard, size, size), dtype=np.uint32).sum(axis=0) + z
            block = block + rng.integers(0, 16, size=block.shape, dtype=np.uint32)
            arr[z : z + shard] = block.astype(np.uint16)
    (path / ".complete").touch()


def selections(size: int, patch: int, n: int, seed: int) -> list[tuple[slice, ...]]:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, size - patch + 1, size=(n, 3))
    return [tuple(slice(int(s), int(s) + patch) for s in start) for start in starts]


def staging_read(arr: Any, sels: list[Any]) -> list[Any]:
    """`read_regions` with the fan-out read off: every array then keeps
    the staging design (a benchmark-only switch, through the private plan)."""
    with mock.patch.object(regions._FanOut, "of", classmethod(lambda cls, geometry: None)):
        return zarr_fused.read_regions(arr, sels)


def tensorstore_peers(spec: dict[str, Any], sels: list[Any]) -> Peers:
    """``ts-batch`` (every read issued inside one ``ts.Batch``) and
    ``ts-one-by-one`` on the array ``spec`` opens; none, said so, without
    tensorstore."""
    try:
        import tensorstore as ts
    except ImportError:
        print("tensorstore not installed: its rows are left out")
        return {}
    handle = ts.open(spec).result()

    def ts_batch() -> list[Any]:
        with ts.Batch() as batch:
            futures = [handle[s].read(batch=batch) for s in sels]
        return [f.result() for f in futures]

    return {
        "ts-batch": ts_batch,
        "ts-one-by-one": lambda: [handle[s].read().result() for s in sels],
    }


def check(fns: Peers) -> None:
    """Every peer reads the values the first one reads (this also warms
    the page cache and the pools before anything is timed)."""
    reference = None
    for name, fn in fns.items():
        values = fn()
        if reference is None:
            reference = values
        elif not all(np.array_equal(a, b) for a, b in zip(reference, values, strict=True)):
            raise SystemExit(f"{name} read other values")


def timed(
    fns: Peers, repeat: int, prepare: Callable[[], Any] | None = None
) -> dict[str, tuple[float, float]]:
    """Per peer, the median wall and CPU seconds (the process' user +
    system time, every thread's, which a busy machine disturbs less than
    the wall clock) of ``repeat`` timed calls.

    The peers take turns, so that a change in the machine's load falls on
    all of them alike rather than on whichever ran then. Within its turn a
    peer reads once untimed, then once timed: what the peer before it left
    behind does not fall on it (after tensorstore's reads, the next peer's
    new result pages fault in slower), and each is measured as a loop
    calling it again and again runs it. ``prepare`` (a cache drop) runs
    before each read, untimed.
    """
    walls: dict[str, list[float]] = {name: [] for name in fns}
    cpus: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            if prepare is not None:
                prepare()
            fn()
            if prepare is not None:
                prepare()
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in fns}
