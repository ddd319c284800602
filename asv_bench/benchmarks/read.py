"""Reads through each pipeline and peer.

Layouts: the sharded uint16 cube (zstd, uncompressed, zstd + crc32c) and the
unsharded float32 square (blosc-lz4). Data is written once per layout into
the cache folder by zarr's default pipeline, and every timed read was
checked against it in ``setup``. ``threads`` sets
``codec_pipeline.max_workers`` (1 is the serial twin); it applies to the two
Fused pipelines only, other peers run at their defaults.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._peers import (
    LAYOUTS,
    PEERS,
    STORES,
    THREADS,
    Reader,
    choose,
    data_dir,
    enter_config,
    exit_config,
    require,
    write_reference,
)


def _setup_reader(bench: Any, layout: str, peer: str, store: str, threads: int) -> None:
    require(peer, threads)
    enter_config(bench, {"codec_pipeline.max_workers": threads})
    path = data_dir() / layout
    bench.data = write_reference(LAYOUTS[layout], path)
    bench.reader = Reader(peer, path, store)
    if not np.array_equal(bench.reader.read(), bench.data):
        raise AssertionError(f"{peer} read wrong data")


class ReadAll:
    params = (
        choose(
            ["sharded-zstd", "sharded-raw", "sharded-zstd-crc", "unsharded-blosc"],
            ["sharded-zstd", "unsharded-blosc"],
        ),
        PEERS,
        STORES,
        THREADS,
    )
    param_names = ("layout", "peer", "store", "threads")
    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self, layout: str, peer: str, store: str, threads: int) -> None:
        _setup_reader(self, layout, peer, store, threads)

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def time_read_all(self, *args: Any) -> None:
        self.reader.read()

    def peakmem_read_all(self, *args: Any) -> None:
        self.reader.read()


class ReadPatterns:
    """Small reads of the sharded zstd cube: one inner chunk, a thin slab."""

    params = (PEERS, THREADS)
    param_names = ("peer", "threads")
    timeout = 300

    def setup(self, peer: str, threads: int) -> None:
        if peer == "zarr-batched":
            raise NotImplementedError("too slow to be useful here")
        _setup_reader(self, "sharded-zstd", peer, "local", threads)
        c = LAYOUTS["sharded-zstd"].inner
        self.one = (slice(c[0], 2 * c[0]), slice(0, c[1]), slice(2 * c[2], 3 * c[2]))
        self.slab = (slice(min(100, self.data.shape[0] - 1), min(101, self.data.shape[0])),)
        for sel in (self.one, self.slab):
            if not np.array_equal(self.reader.read(sel), self.data[sel]):
                raise AssertionError(f"{peer} read wrong data")

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def time_one_inner_chunk(self, *args: Any) -> None:
        self.reader.read(self.one)

    def time_thin_slab(self, *args: Any) -> None:
        self.reader.read(self.slab)
