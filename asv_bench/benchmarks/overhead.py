"""Fixed costs of a pipeline: tiny reads and writes, and opening an array
(which builds zarr_fused's per-array plan)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._peers import PIPELINES, THREADS, available, enter_config, exit_config


class Overhead:
    params = (list(PIPELINES), THREADS)
    param_names = ("pipeline", "threads")

    def setup(self, pipeline: str, threads: int) -> None:
        if not available(pipeline):
            raise NotImplementedError(f"{pipeline} is not installed")
        import zarr
        from zarr.storage import MemoryStore

        enter_config(
            self,
            {"codec_pipeline.path": PIPELINES[pipeline], "codec_pipeline.max_workers": threads},
        )
        self.store = MemoryStore()
        self.array = zarr.create_array(
            self.store,
            shape=(64, 64),
            chunks=(32, 32),
            dtype="float32",
            compressors=zarr.codecs.ZstdCodec(level=1),
        )
        self.value = np.arange(32 * 32, dtype="float32").reshape(32, 32)
        self.array[:32, :32] = self.value
        if not np.array_equal(self.array[:32, :32], self.value):
            raise AssertionError("wrong data")

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def time_read_one_chunk(self, *args: Any) -> None:
        self.array[:32, :32]

    def time_read_missing_chunk(self, *args: Any) -> None:
        self.array[32:, 32:]

    def time_write_one_chunk(self, *args: Any) -> None:
        self.array[:32, :32] = self.value

    def time_open_array(self, *args: Any) -> None:
        import zarr

        zarr.open_array(self.store, mode="r")
