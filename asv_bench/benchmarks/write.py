"""Writes through each pipeline and peer, and partial shard updates."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._peers import (
    LAYOUTS,
    PEERS,
    STORES,
    THREADS,
    Layout,
    Writer,
    choose,
    data_dir,
    enter_config,
    exit_config,
    require,
)


class WriteAll:
    """Writing a whole array into a fresh empty one (created untimed)."""

    params = (
        choose(["sharded-zstd", "sharded-raw", "unsharded-blosc"], ["sharded-zstd"]),
        PEERS,
        STORES,
        THREADS,
    )
    param_names = ("layout", "peer", "store", "threads")
    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self, layout: str, peer: str, store: str, threads: int) -> None:
        require(peer, threads)
        enter_config(self, {"codec_pipeline.max_workers": threads})
        spec = LAYOUTS[layout]
        self.data = spec.sample()
        self.writer = Writer(peer, spec, data_dir() / f"write-{layout}-{peer}-{store}", store)
        self.writer.prepare()
        self.writer.write(self.data)
        if not np.array_equal(self.writer.read_back(), self.data):
            raise AssertionError(f"{peer} wrote wrong data")

    def setup_round(self) -> None:  # pragma: no cover - documentation of intent
        pass

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def time_write_all(self, *args: Any) -> None:
        self.writer.prepare()
        self.writer.write(self.data)


class UpdateOneInnerChunk:
    """Updating one inner chunk of a shard, against reading and rewriting
    the whole shard, over shard sizes: the update should cost about one
    shard read plus one shard write, not a re-encode of every inner chunk."""

    params = (choose([64, 128, 256], [64]), ["zarr_fused", "zarr-fused"])
    param_names = ("shard_edge", "pipeline")
    timeout = 300

    def setup(self, shard_edge: int, pipeline: str) -> None:
        import zarr
        from zarr.storage import LocalStore

        from ._peers import PIPELINES

        inner = 32
        layout = Layout(
            f"update-{shard_edge}",
            (shard_edge,) * 3,
            "uint16",
            (inner,) * 3,
            (shard_edge,) * 3,
            lambda: zarr.codecs.ZstdCodec(level=1),
        )
        self.data = layout.sample()
        enter_config(self, {"codec_pipeline.path": PIPELINES[pipeline]})
        self.array = layout.create(LocalStore(data_dir() / f"update-{shard_edge}-{pipeline}"))
        self.array[...] = self.data
        self.patch = np.full((inner,) * 3, 7, dtype="uint16")
        self.array[:inner, :inner, :inner] = self.patch
        if not np.array_equal(self.array[:inner, :inner, :inner], self.patch):
            raise AssertionError("update lost")

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def time_update_one_inner_chunk(self, *args: Any) -> None:
        self.array[:32, :32, :32] = self.patch

    def time_read_shard(self, *args: Any) -> None:
        self.array[...]

    def time_rewrite_shard(self, *args: Any) -> None:
        self.array[...] = self.data
