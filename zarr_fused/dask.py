"""Select zarr_fused in every worker of a Dask ``distributed`` cluster.

One line in the client::

    import zarr_fused.dask
    zarr_fused.dask.register(client)

registers a worker plugin that sets zarr's configuration in every current
worker and in every worker that joins later (restarts, adaptive scaling),
and sets the same configuration in the client process. ``distributed`` is
imported only by this module; zarr_fused itself never needs it.

What it sets: ``codec_pipeline.path`` (zarr_fused) plus any keyword given,
for example ``register(client, max_workers=2)`` for
``codec_pipeline.max_workers``, ``strict=True`` for
``codec_pipeline.strict``, or ``settings={"async.concurrency": 64}`` for
any other zarr key. Leave ``max_workers`` unset to let each worker size its
threads from its share of the machine (`zarr_fused.default_max_workers`).
"""

from __future__ import annotations

from typing import Any

import zarr
from distributed import Client, WorkerPlugin

__all__ = ["ZarrFusedPlugin", "register", "worker_settings"]

PIPELINE = "zarr_fused.FusedCodecPipeline"


def worker_settings(
    *,
    max_workers: int | None = None,
    strict: bool | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The zarr configuration `register` installs (see the module doc)."""
    chosen: dict[str, Any] = {"codec_pipeline.path": PIPELINE}
    if max_workers is not None:
        chosen["codec_pipeline.max_workers"] = max_workers
    if strict is not None:
        chosen["codec_pipeline.strict"] = strict
    chosen.update(settings or {})
    return chosen


class ZarrFusedPlugin(WorkerPlugin):
    """Sets zarr's configuration in a worker when it starts (or at once, in
    workers already running when the plugin is registered)."""

    name = "zarr-fused"

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = dict(settings)

    def setup(self, worker: Any) -> None:
        # process-wide: every task thread of the worker reads it
        zarr.config.set(self.settings)


def register(
    client: Client,
    *,
    max_workers: int | None = None,
    strict: bool | None = None,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Select zarr_fused in every worker of ``client``'s cluster, now and
    after restarts, and in this process. Returns the settings installed."""
    chosen = worker_settings(max_workers=max_workers, strict=strict, settings=settings)
    client.register_plugin(ZarrFusedPlugin(chosen), name=ZarrFusedPlugin.name)
    zarr.config.set(chosen)
    return chosen
