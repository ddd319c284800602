"""Stores whose keys are plain local files, served as a `LocalStore`.

Dask (``da.from_zarr(path)``, ``da.to_zarr(x, path)``) and other libraries
open local paths through zarr's `FsspecStore` over fsspec's
``LocalFileSystem``. Such a store has no synchronous IO, so zarr's pipelines
(and ours) would take the async path. The keys map exactly onto files under
``store.path``, the same files a `LocalStore` at that root reads and
writes, so zarr_fused serves those batches through a `LocalStore` and its
native file IO. Writes become atomic (temporary file + rename, as in
`LocalStore`), which is stricter than fsspec's in-place writes; reads,
missing keys and deletes behave the same. A `LocalStore` creates the
directories a key needs, so writes move only when the filesystem was opened
with ``auto_mkdir=True`` (without it, fsspec fails such writes).

Only fsspec's own ``LocalFileSystem`` qualifies (exactly that class, bare or
in fsspec's ``AsyncFileSystemWrapper``): a subclass or any other filesystem
may add behaviour (caching, callbacks, remote IO) that a `LocalStore` would
skip.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from zarr.storage import LocalStore, StorePath

from zarr_fused._zarr_compat import fsspec_store_module

__all__ = ["local_store_for", "with_local_files"]

# id(store) -> the LocalStore (or None) decided for it; stores compare by
# value and are unhashable, so entries are keyed by identity and dropped when
# their store is collected
_cache: dict[int, LocalStore | None] = {}
_lock = threading.Lock()


def _sync_fs(fs: Any) -> Any:
    """The filesystem inside fsspec's async wrapper (``fs`` itself otherwise)."""
    wrapper = sys.modules.get("fsspec.implementations.asyn_wrapper")
    if wrapper is not None and type(fs) is wrapper.AsyncFileSystemWrapper:
        return fs.sync_fs
    return fs


def _is_local_filesystem(fs: Any) -> bool:
    local = sys.modules.get("fsspec.implementations.local")
    if local is None:  # fsspec never imported: no FsspecStore exists either
        return False
    return type(_sync_fs(fs)) is local.LocalFileSystem


def local_store_for(store: Any, *, write: bool = False) -> LocalStore | None:
    """A `LocalStore` over the same files as ``store`` when ``store`` is an
    `FsspecStore` on fsspec's local filesystem (for ``write``, one that
    creates directories), else None (cached per store)."""
    fsspec_store = fsspec_store_module()
    if fsspec_store is None or type(store) is not fsspec_store.FsspecStore:
        return None
    if write and not getattr(_sync_fs(store.fs), "auto_mkdir", False):
        return None
    key = id(store)
    try:
        return _cache[key]
    except KeyError:
        pass
    local = None
    if _is_local_filesystem(store.fs) and store.path:
        local = LocalStore(store.path, read_only=store.read_only)
    with _lock:
        if key not in _cache:
            _cache[key] = local
            weakref.finalize(store, _cache.pop, key, None)
        return _cache[key]


def with_local_files[Item: tuple[Any, ...]](
    batch: list[Item], *, write: bool = False
) -> list[Item]:
    """``batch`` with its getters/setters moved to the equivalent
    `LocalStore` when they address an `FsspecStore` on local files (see
    `local_store_for`); otherwise ``batch`` itself."""
    first, *_ = batch[0]
    if type(first) is not StorePath:
        return batch
    local = local_store_for(first.store, write=write)
    if local is None:
        return batch
    store = first.store
    moved: list[Any] = []  # the items of `batch`, each with another getter
    for getter, *rest in batch:
        if type(getter) is not StorePath or getter.store is not store:
            return batch
        moved.append((StorePath(local, getter.path), *rest))
    return moved
