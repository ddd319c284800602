"""zarr_fused: a Cython-compiled codec pipeline backend for zarr-python 3.

Enable it for every array of a process::

    import zarr
    zarr.config.set({"codec_pipeline.path": "zarr_fused.FusedCodecPipeline"})

or with ``ZARR_CODEC_PIPELINE__PATH=zarr_fused.FusedCodecPipeline`` in the
environment (no import needed: zarr finds the pipeline through its
``zarr.codec_pipeline`` entry point).
"""

from zarr_fused._cpus import available_cpus, default_max_workers
from zarr_fused._native import native_info
from zarr_fused._version import __version__
from zarr_fused.errors import (
    CorruptChunkError,
    NativeExtensionError,
    UnsupportedError,
    ZarrFusedError,
    ZarrFusedWarning,
)
from zarr_fused.pipeline import FusedCodecPipeline
from zarr_fused.regions import read_regions
from zarr_fused.stats import Stats, stats

__all__ = [
    "CorruptChunkError",
    "FusedCodecPipeline",
    "NativeExtensionError",
    "Stats",
    "UnsupportedError",
    "ZarrFusedError",
    "ZarrFusedWarning",
    "__version__",
    "available_cpus",
    "default_max_workers",
    "native_info",
    "read_regions",
    "stats",
]
