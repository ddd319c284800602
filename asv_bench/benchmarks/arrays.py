"""Whole-array reads and writes through each pipeline and peer.

Data is written once per layout into a cache folder (``ZARR_FUSED_BENCH_DIR``,
default under the system temp directory) by zarr's default pipeline; every
timed read was checked against it in ``setup``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._peers import LAYOUTS, PEERS, Reader, Writer, available, data_dir, write_reference

UNSHARDED = ["f32-2048sq-blosc-lz4", "f32-2048sq-zstd"]


class ReadUnsharded:
    params = (UNSHARDED, PEERS, ["local", "memory"], [1, 2])
    param_names = ["layout", "peer", "store", "threads"]
    timeout = 300

    def setup(self, layout: str, peer: str, store: str, threads: int) -> None:
        if not available(peer):
            raise NotImplementedError(f"{peer} is not installed")
        if threads != 2 and peer not in ("zarr_fused", "zarr-fused"):
            raise NotImplementedError("thread count applies to the Fused pipelines")
        import zarr

        self._config = zarr.config.set({"codec_pipeline.max_workers": threads})
        self._config.__enter__()
        path = data_dir() / layout
        self.data = write_reference(LAYOUTS[layout], path)
        self.reader = Reader(peer, path, store)
        if not np.array_equal(self.reader.read(), self.data):
            raise AssertionError(f"{peer} read wrong data")

    def teardown(self, *args: Any) -> None:
        config = getattr(self, "_config", None)
        if config is not None:
            config.__exit__(None, None, None)

    def time_read_all(self, *args: Any) -> None:
        self.reader.read()

    def peakmem_read_all(self, *args: Any) -> None:
        self.reader.read()


class WriteUnsharded:
    params = (UNSHARDED, PEERS, ["local", "memory"])
    param_names = ["layout", "peer", "store"]
    timeout = 300
    number = 1
    repeat = (3, 10, 60.0)

    def setup(self, layout: str, peer: str, store: str) -> None:
        if not available(peer):
            raise NotImplementedError(f"{peer} is not installed")
        spec = LAYOUTS[layout]
        self.data = spec.sample()
        self.writer = Writer(peer, spec, data_dir() / f"{layout}-write-{peer}-{store}", store)
        self.writer.prepare()
        self.writer.write(self.data)
        if not np.array_equal(self.writer.read_back(), self.data):
            raise AssertionError(f"{peer} wrote wrong data")
        self.writer.prepare()

    def time_write_all(self, *args: Any) -> None:
        self.writer.write(self.data)


SHARDED = ["u16-512cube-sharded-zstd", "u16-512cube-sharded-raw", "u16-512cube-sharded-zstd-crc"]


class ReadSharded:
    """Whole-array reads of the 512^3 uint16 cube (shards 128^3, inner 32^3)."""

    params = (SHARDED, PEERS, ["local", "memory"], [1, 2])
    param_names = ["layout", "peer", "store", "threads"]
    timeout = 600
    number = 1
    repeat = (2, 5, 120.0)

    def setup(self, layout: str, peer: str, store: str, threads: int) -> None:
        ReadUnsharded.setup(self, layout, peer, store, threads)  # type: ignore[arg-type]

    def teardown(self, *args: Any) -> None:
        config = getattr(self, "_config", None)
        if config is not None:
            config.__exit__(None, None, None)

    def time_read_all(self, *args: Any) -> None:
        self.reader.read()

    def peakmem_read_all(self, *args: Any) -> None:
        self.reader.read()


class ReadShardedPatterns:
    """Small reads of the sharded zstd cube: one inner chunk, a thin slab."""

    params = (PEERS, [1, 2])
    param_names = ["peer", "threads"]
    timeout = 300

    def setup(self, peer: str, threads: int) -> None:
        if peer == "zarr-batched":
            raise NotImplementedError("too slow to be useful here")
        ReadUnsharded.setup(self, "u16-512cube-sharded-zstd", peer, "local", threads)  # type: ignore[arg-type]
        sel = (slice(32, 64), slice(0, 32), slice(64, 96))
        if not np.array_equal(self.reader.read(sel), self.data[sel]):
            raise AssertionError(f"{peer} read wrong data")

    def teardown(self, *args: Any) -> None:
        config = getattr(self, "_config", None)
        if config is not None:
            config.__exit__(None, None, None)

    def time_one_inner_chunk(self, *args: Any) -> None:
        self.reader.read((slice(32, 64), slice(0, 32), slice(64, 96)))

    def time_thin_slab(self, *args: Any) -> None:
        self.reader.read((slice(100, 101),))
