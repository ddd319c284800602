"""Many random patches of the sharded zstd cube: `zarr_fused.read_regions`
(one planned batch) against one ``array[sel]`` per patch through
zarr_fused, and tensorstore with every read in one ``ts.Batch``.

Patches are inner-chunk sized (32^3 at full scale, 8^3 small), at seeded
random unaligned positions; ``threads`` sets ``codec_pipeline.max_workers``
for zarr_fused (1 is the serial twin; tensorstore runs at its default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._peers import (
    LAYOUTS,
    THREADS,
    available,
    choose,
    data_dir,
    enter_config,
    exit_config,
    pipeline,
    write_reference,
)

WAYS = choose(["read_regions", "one-by-one", "tensorstore-batch"], ["read_regions"])


def _selections(shape: tuple[int, ...], patch: tuple[int, ...], n: int) -> list[Any]:
    rng = np.random.default_rng(7)
    starts = rng.integers(0, np.subtract(shape, patch) + 1, size=(n, len(shape)))
    return [
        tuple(slice(int(s), int(s) + p) for s, p in zip(start, patch, strict=True))
        for start in starts
    ]


class ReadRegions:
    params = (WAYS, choose([512, 4096], [64]), THREADS)
    param_names = ("way", "regions", "threads")
    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self, way: str, regions: int, threads: int) -> None:
        import zarr
        from zarr.storage import LocalStore

        if way == "tensorstore-batch" and (threads != 2 or not available("tensorstore")):
            raise NotImplementedError("tensorstore runs once, when installed")
        layout = LAYOUTS["sharded-zstd"]
        path = data_dir() / layout.name
        data = write_reference(layout, path)
        self.selections = _selections(data.shape, layout.inner, regions)
        enter_config(self, {"codec_pipeline.max_workers": threads})
        if way == "tensorstore-batch":
            import tensorstore as ts

            self.handle = ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
            ).result()
        else:
            with pipeline("zarr_fused"):
                self.handle = zarr.open_array(LocalStore(path), mode="r")
        self.read = getattr(self, "_" + way.replace("-", "_"))
        for got, sel in zip(self.read(), self.selections, strict=True):
            if not np.array_equal(got, data[sel]):
                raise AssertionError(f"{way} read wrong data")

    def teardown(self, *args: Any) -> None:
        exit_config(self)

    def _read_regions(self) -> list[Any]:
        import zarr_fused

        return zarr_fused.read_regions(self.handle, self.selections)

    def _one_by_one(self) -> list[Any]:
        return [self.handle[sel] for sel in self.selections]

    def _tensorstore_batch(self) -> list[Any]:
        import tensorstore as ts

        with ts.Batch() as batch:
            futures = [self.handle[sel].read(batch=batch) for sel in self.selections]
        return [f.result() for f in futures]

    def time_read_regions(self, *args: Any) -> None:
        self.read()
