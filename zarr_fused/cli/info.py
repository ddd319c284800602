"""``zarr-fused info``: what this build runs natively and how it is configured."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import cast

import numcodecs
import numpy as np
import zarr
from zarr.core.config import config as zarr_config

from zarr_fused._cpus import default_max_workers, resolve_max_workers
from zarr_fused._native import missing_message, native_info
from zarr_fused._version import __version__
from zarr_fused.cli.common import EXIT_OK
from zarr_fused.config import (
    MAX_WORKERS_KEY,
    SHARD_WRITE_LOCK_KEY,
    STRICT_KEY,
    shard_write_lock,
    strict_mode,
)


def run_info() -> int:
    """Print versions, extensions, native codecs, libraries, threads and settings."""
    print(f"zarr_fused {__version__}")
    print(
        f"versions: zarr {zarr.__version__}, numpy {np.__version__}, "
        f"numcodecs {numcodecs.__version__}, python {sys.version.split()[0]}"
    )
    _print_native()
    cpus, why = default_max_workers()
    print(f"default threads: {cpus} ({why})")
    _print_settings()
    return EXIT_OK


def _print_native() -> None:
    info = native_info()
    extensions = cast("dict[str, bool]", info["extensions"])
    codecs = cast("list[str]", info["codecs"])
    libraries = cast("dict[str, object]", info["libraries"])
    print("compiled extensions:")
    for name, ok in extensions.items():
        print(f"  {name}: {'ok' if ok else 'MISSING'}")
    missing = missing_message()
    if missing:
        print(f"  {missing}")
    print(f"native codecs: {', '.join(codecs) or 'none'}")
    print("linked libraries:" if libraries else "linked libraries: none (extensions missing)")
    for name, version in libraries.items():
        if name == "crc32c":
            print(f"  crc32c implementation on this CPU: {version}")
        elif isinstance(version, list):
            print(f"  {name}: {', '.join(map(str, version))}")
        else:
            print(f"  {name}: {version}")


def _setting(read: Callable[[], object]) -> tuple[object, str]:
    """Call ``read()``; returns its value and, when it warned, the warning's text
    (an invalid setting is shown next to its value, not as a separate warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read()
    return value, "; ".join(str(w.message) for w in caught)


def _print_settings() -> None:
    path = zarr_config.get("codec_pipeline.path")
    selected = "is" if path == "zarr_fused.FusedCodecPipeline" else "is not"
    print("settings:")
    print(f"  codec_pipeline.path: {path} (zarr_fused {selected} selected)")
    raw = zarr_config.get(MAX_WORKERS_KEY, default=None)
    workers, warned = _setting(resolve_max_workers)
    origin = "default: the CPUs above" if raw is None else "set"
    print(
        f"  {MAX_WORKERS_KEY}: {raw!r} ({origin}) -> {workers} threads per batch"
        + (f" [{warned}]" if warned else "")
    )
    raw = zarr_config.get(STRICT_KEY, default=False)
    strict, warned = _setting(strict_mode)
    effect = "raise where no native path applies" if strict else "fall back to zarr's code"
    print(
        f"  {STRICT_KEY}: {raw!r} -> {'on' if strict else 'off'} ({effect})"
        + (f" [{warned}]" if warned else "")
    )
    raw = zarr_config.get(SHARD_WRITE_LOCK_KEY, default=True)
    locked, warned = _setting(shard_write_lock)
    effect = (
        "partial shard updates held across threads and processes"
        if locked
        else "no hold: writes must be shard-aligned"
    )
    print(
        f"  {SHARD_WRITE_LOCK_KEY}: {raw!r} -> {'on' if locked else 'off'} ({effect})"
        + (f" [{warned}]" if warned else "")
    )
