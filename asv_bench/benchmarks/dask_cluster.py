"""Reads and writes under a Dask ``distributed`` cluster (worker processes).

One ``LocalCluster`` of two single-threaded worker processes per benchmark
setup, configured the way a user would: zarr_fused through
`zarr_fused.dask.register`, the other pipelines by a worker plugin setting
``codec_pipeline.path`` in every worker. ``asv_bench/dask_side_by_side.py``
runs the same scenarios side by side in one process.
"""

from __future__ import annotations

import numpy as np

from ._peers import PIPELINES, available, choose, data_dir

PEERS = choose(list(PIPELINES), ["zarr_fused", "zarr-batched"])


class DaskSharded:
    """``da.from_zarr(path).sum()`` (read-all) and a shard-aligned
    ``da.to_zarr(x, path)`` (write-all) of a sharded zstd array."""

    params = (PEERS,)
    param_names = ("peer",)
    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self, peer: str) -> None:
        if not available(peer):
            raise NotImplementedError(f"{peer} is not installed")
        try:
            import dask.array as da
            from distributed import Client
        except ImportError as exc:
            raise NotImplementedError("dask and distributed are not installed") from exc
        import zarr
        from zarr.codecs import ZstdCodec
        from zarr_fused_testing.cluster import local_cluster

        import zarr_fused.dask

        edge = choose([256], [64])[0]
        self.shard, self.inner = edge // 4, edge // 16
        root = data_dir() / f"dask-{edge}"
        self.source = root / "source.zarr"
        self.data = np.random.default_rng(0).integers(0, 4000, (edge,) * 3, dtype="<u2")
        if not (self.source / "zarr.json").exists():
            arr = zarr.create_array(
                zarr.storage.LocalStore(self.source),
                shape=self.data.shape,
                dtype="<u2",
                chunks=(self.inner,) * 3,
                shards=(self.shard,) * 3,
                compressors=ZstdCodec(level=1),
                overwrite=True,
            )
            arr[...] = self.data
        self.target = root / f"out-{peer}.zarr"
        self.cluster = local_cluster()
        self.client = Client(self.cluster, set_as_default=False)
        if peer == "zarr_fused":
            zarr_fused.dask.register(self.client)
        else:  # the same plugin, with another pipeline (importable in the workers)
            plugin = zarr_fused.dask.ZarrFusedPlugin({"codec_pipeline.path": PIPELINES[peer]})
            self.client.register_plugin(plugin, name="pipeline")
        self.da = da
        total = self.client.compute(da.from_zarr(str(self.source)).sum(dtype="u8")).result()
        if int(total) != int(self.data.sum(dtype="u8")):
            raise AssertionError(f"{peer} read a wrong sum under Dask")
        self.time_write_all(peer)
        with zarr.config.set({"codec_pipeline.path": PIPELINES["zarr-batched"]}):
            written = zarr.open_array(zarr.storage.LocalStore(self.target), mode="r")[...]
        if not np.array_equal(written, self.data):
            raise AssertionError(f"{peer} wrote wrong data under Dask")

    def teardown(self, peer: str) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
            self.cluster.close()

    def time_read_all(self, peer: str) -> None:
        self.client.compute(self.da.from_zarr(str(self.source)).sum(dtype="u8")).result()

    def time_write_all(self, peer: str) -> None:
        from zarr.codecs import ZstdCodec

        self.target.mkdir(parents=True, exist_ok=True)
        x = self.da.from_zarr(str(self.source), chunks=(self.shard,) * 3)
        self.da.to_zarr(
            x,
            str(self.target),
            chunks=(self.inner,) * 3,
            shards=(self.shard,) * 3,
            compressors=ZstdCodec(level=1),
            mode="w",
            compute=False,
        ).compute(scheduler=self.client)
