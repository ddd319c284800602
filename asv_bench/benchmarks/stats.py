"""What `zarr_fused.stats` costs: the hot whole-array read of the sharded
and unsharded zstd cubes through zarr_fused, outside and inside a
``stats()`` block (the bar: within 2% inside, nothing measurable outside).
``threads`` sets ``codec_pipeline.max_workers`` (1 is the serial twin).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ._peers import (
    LAYOUTS,
    THREADS,
    choose,
    data_dir,
    enter_config,
    exit_config,
    pipeline,
    write_reference,
)


class HotReadStats:
    params = (
        choose(["sharded-zstd", "unsharded-zstd"], ["sharded-zstd"]),
        ["without", "inside"],
        THREADS,
    )
    param_names = ("layout", "stats", "threads")
    timeout = 600
    number = 1
    repeat = (3, 10, 60.0)

    def setup(self, layout: str, stats: str, threads: int) -> None:
        import zarr
        from zarr.storage import LocalStore

        spec = LAYOUTS[layout]
        path = data_dir() / spec.name
        data = write_reference(spec, path)
        enter_config(self, {"codec_pipeline.max_workers": threads})
        with pipeline("zarr_fused"):
            self.array = zarr.open_array(LocalStore(path), mode="r")
        self.block = self._inside if stats == "inside" else contextlib.nullcontext
        with self.block():
            if not np.array_equal(self.array[...], data):
                raise AssertionError("zarr_fused read wrong data")

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    @staticmethod
    def _inside() -> Any:
        import zarr_fused

        return zarr_fused.stats()

    def time_read(self, layout: str, stats: str, threads: int) -> None:
        with self.block():
            self.array[...]
