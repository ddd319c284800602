"""The Dask cluster zarr_fused is tested and measured under.

Two worker processes with one task thread each on 127.0.0.1, no dashboard,
distributed's logs silenced below CRITICAL: a user's ``LocalCluster``, small
enough for a two-core host. The Dask tests (tests/test_dask.py) and the Dask
benchmarks (asv_bench/benchmarks/dask_cluster.py, asv_bench/dask_*.py) start
theirs here, so they measure what the tests check. Nothing here imports zarr
or zarr_fused, and distributed only when a cluster is started.
"""

from __future__ import annotations

import logging
from typing import Any

CLUSTER_OPTIONS: dict[str, Any] = {
    "n_workers": 2,
    "threads_per_worker": 1,
    "processes": True,
    "dashboard_address": None,
    "host": "127.0.0.1",
    "silence_logs": logging.CRITICAL,
}


def local_cluster(**changes: Any) -> Any:
    """A started ``distributed.LocalCluster`` with `CLUSTER_OPTIONS`, but
    for ``changes`` (e.g. ``n_workers``); the caller closes it."""
    from distributed import LocalCluster

    return LocalCluster(**{**CLUSTER_OPTIONS, **changes})
