"""Arrays on S3, through zarr's ``ObjectStore`` over obstore's ``S3Store``
(zarr's pipelines, zarr_fused, zarrs) or tensorstore's ``s3`` kvstore.

Reads and writes are served by the light static server of the tests
(``testing/zarr_fused_testing/s3_static.py``, writable, as ``s3_side_by_side.py --server
static``): one asyncio process serving the files zarr's Batched pipeline
wrote to a local directory and storing what is PUT there, adding the latency
itself. moto answers a few hundred requests a second on a busy host (about
2.6 ms of CPU per PUT), so behind it a 1024-object read or write measures
moto; against the static server (thousands a second) it measures the client.

The scenarios, stores and peers are those of ``asv_bench/s3_side_by_side.py``
(which also reports requests, bytes and client CPU); the arrays are smaller
under ``ZARR_FUSED_BENCH_SCALE=small``. Each benchmark process starts its own
server in ``setup`` over its own temporary directory and stops it (and
removes the directory) in ``teardown``; every start is bounded by the
helper's timeouts, and a server that cannot start skips the benchmark.

Not part of the quick CI run (``ZARR_FUSED_BENCH_QUICK=1``): each setup
starts a server and writes an array, seconds for the four benchmarks even
at the small scale.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ._peers import QUICK, available, choose, scale

# s3_side_by_side (asv_bench/); the servers come from zarr_fused_testing
_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT / "asv_bench"))

PEERS = choose(["zarr_fused", "zarr-fused", "zarr-batched", "zarrs", "tensorstore"], ["zarr_fused"])
LATENCIES = choose([0, 20], [0])  # ms added per request


def _scenario(name: str) -> Any:
    """The side-by-side scenario ``name``, shrunk at the small scale."""
    from s3_side_by_side import SCENARIOS

    scenario = SCENARIOS[name]
    if scale() == "full":
        return scenario
    if scenario.inner is not None:  # 2 x 2 x 2 shards of 4 x 4 x 4 inner chunks
        return dataclasses.replace(scenario, shape=(64,) * 3, chunks=(32,) * 3, inner=(8,) * 3)
    return dataclasses.replace(scenario, shape=(512, 512), chunks=(32, 32))  # 256 objects


class _S3:
    """One scenario's source array on a fresh static server, opened by one
    peer (``latency`` ms per request), for writing too when ``writes``."""

    scenario = ""
    writes = False
    params = (PEERS, LATENCIES)
    param_names = ("peer", "latency_ms")
    timeout = 600
    number = 1
    repeat = (2, 5, 60.0)

    def setup(self, peer: str, latency_ms: int) -> None:
        if QUICK:
            raise NotImplementedError("the S3 benchmarks are not part of the quick run")
        if not available(peer):
            raise NotImplementedError(f"{peer} is not installed")
        try:
            import obstore  # noqa: F401
            from zarr_fused_testing.s3 import ACCESS_KEY, REGION, SECRET_KEY, ServerUnavailable
        except ImportError as exc:
            raise NotImplementedError(f"the S3 benchmarks need obstore: {exc}") from exc
        # tensorstore's "environment" credentials; the server accepts any
        os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        os.environ.setdefault("AWS_REGION", REGION)
        self.servers: list[Any] = []
        self.root: str | None = None
        try:
            self._start_static(peer)
        except ServerUnavailable as exc:
            self.teardown(peer, latency_ms)
            raise NotImplementedError(f"no S3 server: {exc}") from exc
        except BaseException:
            self.teardown(peer, latency_ms)
            raise
        self.servers[-1].reset(latency=latency_ms / 1000)

    def _start_static(self, peer: str) -> None:
        """Write the source array with zarr's pipeline to a local directory,
        serve it with the static server and check ``peer`` reads it back."""
        import zarr
        from s3_side_by_side import BUCKET, WRITER, Peer, zarr_config
        from zarr.storage import LocalStore
        from zarr_fused_testing.s3_static import StaticS3Server

        self.root = tempfile.mkdtemp(prefix="asv-s3-static-")
        self.s3 = _scenario(self.scenario)
        self.data = self.s3.data()
        with zarr.config.set(zarr_config(WRITER)):
            local = LocalStore(os.path.join(self.root, BUCKET, "source"))
            self.s3.create(local)[...] = self.data
        static = StaticS3Server(Path(self.root), writable=self.writes)
        self.servers.append(static)
        static.start()
        self.peer = Peer(peer, "obstore", static.endpoint, "source")
        self.peer.open(write=self.writes)
        if not np.array_equal(self.peer.read(Ellipsis), self.data):
            raise AssertionError(f"{peer} read wrong values from S3")

    def teardown(self, peer: str, latency_ms: int) -> None:
        for server in reversed(getattr(self, "servers", [])):
            server.stop()
        self.servers = []
        if getattr(self, "root", None):
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


class S3Sharded(_S3):
    """uint16 256^3 in 128^3 shards of 32^3 zstd inner chunks (8 objects)."""

    scenario = "sharded"

    def time_whole(self, peer: str, latency_ms: int) -> None:
        self.peer.read(Ellipsis)

    def time_slab(self, peer: str, latency_ms: int) -> None:
        # a[100:101] of 256 (the side-by-side slab), at the same depth when small
        row = self.s3.shape[0] * 100 // 256
        self.peer.read((slice(row, row + 1), slice(None), slice(None)))


class S3Unsharded(_S3):
    """float32 2048^2 in 64^2 zstd chunks (1024 objects)."""

    scenario = "unsharded"

    def time_whole(self, peer: str, latency_ms: int) -> None:
        self.peer.read(Ellipsis)


class S3UnshardedWrite(_S3):
    """The unsharded array written whole (1024 PUTs)."""

    scenario = "unsharded"
    writes = True

    def time_write_all(self, peer: str, latency_ms: int) -> None:
        self.peer.write(self.data)
