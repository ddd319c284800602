"""Where ``zarr-fused bench`` gets its array: a generated sample, a
directory or a zip file, opened read-only, with a one-line error saying what
is there instead when it is not an array.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore, ZipStore

from zarr_fused.cli.common import REFERENCE, ZARR_PIPELINES, CliError, one_line
from zarr_fused.cli.sample import sample_data, sample_geometry

_METADATA = ("zarr.json", ".zarray", ".zgroup")


@dataclass
class Source:
    """The array to read and how each pipeline reaches it."""

    description: str
    kind: str  # "sample", "local" or "zip"
    store: Any
    array_path: str
    array: zarr.Array  # opened with zarr's batched pipeline, for metadata
    local_dir: Path | None = None  # the array's directory, for tensorstore
    path: str | None = None
    expected: np.ndarray | None = None  # the data written (generated sample)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for fn in reversed(self.cleanup):
            fn()


def make_sample(size: int) -> Source:
    """Write the sharded zstd uint16 sample cube once, to a temporary directory."""
    chunks, shards = sample_geometry(size)
    data = sample_data(size)
    tmp = Path(tempfile.mkdtemp(prefix="zarr_fused_bench_"))
    root = tmp / "sample.zarr"
    try:
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            arr = zarr.create_array(
                LocalStore(root),
                shape=data.shape,
                dtype=data.dtype,
                chunks=chunks,
                shards=shards,
                compressors=ZstdCodec(level=1),
                fill_value=0,
            )
            arr[...] = data
        store = LocalStore(root, read_only=True)
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            arr = zarr.open_array(store, mode="r")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Source(
        description=f"generated sample, sharded zstd level 1, in {root} (removed afterwards)",
        kind="sample",
        store=store,
        array_path="",
        array=arr,
        local_dir=root,
        expected=data,
        cleanup=[lambda: shutil.rmtree(tmp, ignore_errors=True)],
    )


def _metadata_dirs(path: Path, store_kind: str) -> list[str]:
    """Top-level entries of a store that hold zarr metadata (for a hint)."""
    found: set[str] = set()
    if store_kind == "zip":
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                parts = name.split("/")
                if len(parts) == 2 and parts[1] in _METADATA:
                    found.add(parts[0])
    else:
        for child in path.iterdir():
            if child.is_dir() and any((child / m).is_file() for m in _METADATA):
                found.add(child.name)
    return sorted(found)


def _array_names(group: zarr.Group, limit: int = 10) -> str:
    names = []
    for name, node in group.members(max_depth=None):
        if isinstance(node, zarr.Array):
            names.append(name)
    if not names:
        return "it holds no arrays"
    shown = ", ".join(sorted(names)[:limit])
    return f"arrays: {shown}" + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _open_array(store: Any, path: Path, path_text: str, kind: str, inner: str) -> zarr.Array:
    """The array at ``inner`` in ``store``, or a `CliError` saying what is there instead."""
    from zarr.errors import NodeNotFoundError

    where = f"{path_text} (--array {inner})" if inner else path_text

    def open_node(at: str) -> zarr.Array | zarr.Group:
        with zarr.config.set({"codec_pipeline.path": ZARR_PIPELINES[REFERENCE]}):
            return zarr.open(store, mode="r", path=at)

    try:
        node = open_node(inner)
    except (NodeNotFoundError, FileNotFoundError):
        if inner:
            try:
                parent = open_node("")
            except Exception:
                parent = None
            if isinstance(parent, zarr.Group):
                raise CliError(
                    f"{path_text}: no array {inner!r} in this group ({_array_names(parent)})"
                ) from None
        hint = ""
        candidates = [] if inner else _metadata_dirs(path, kind)
        if candidates:
            hint = f"; zarr metadata found under: {', '.join(candidates)} (pick one with --array)"
        raise CliError(f"{where}: not a zarr array or group (no zarr metadata){hint}") from None
    except Exception as exc:
        raise CliError(f"{where}: cannot open as a zarr array: {one_line(exc)}") from None
    if isinstance(node, zarr.Group):
        if inner:
            raise CliError(
                f"{where}: is a group, not an array ({_array_names(node)}); pick one with --array"
            )
        raise CliError(
            f"{path_text}: is a zarr group, not an array; pick one with --array NAME "
            f"({_array_names(node)})"
        )
    return node


def open_source(path_text: str, array_name: str | None) -> Source:
    """Open the array at ``path_text`` (a directory or a zip file) read-only."""
    path = Path(path_text)
    if not path.exists():
        raise CliError(f"{path_text}: no such file or directory")
    if path.is_dir():
        kind = "local"
        try:
            store: Any = LocalStore(path, read_only=True)
        except Exception as exc:
            raise CliError(f"{path_text}: cannot open: {one_line(exc)}") from None
    elif zipfile.is_zipfile(path):
        kind = "zip"
        store = ZipStore(path, mode="r")
    else:
        raise CliError(f"{path_text}: not a zarr array (expected a directory or a .zip file)")
    inner = (array_name or "").strip("/")
    try:
        node = _open_array(store, path, path_text, kind, inner)
    except BaseException:
        store.close()
        raise
    label = f"{path_text}" + (f", array {inner!r}" if inner else "")
    return Source(
        description=f"{label} ({'zip file' if kind == 'zip' else 'directory'})",
        kind=kind,
        store=store,
        array_path=inner,
        array=node,
        local_dir=(path / inner) if kind == "local" else None,
        path=path_text,
        cleanup=[store.close],
    )
