"""Local files: the keys of a `zarr.storage.LocalStore`, read and written
by zarr_fused itself (`zarr_fused._localio` and the shard kernels), inside
its nogil calls.

`local_files` decides whether a batch qualifies; `read_shard_part` reads
the index and the touched inner chunks of one shard (coalesced, preadv),
and can decode them in the same native call; `write_parts` stores a key
from several buffers. (A whole shard is read by
`zarr_fused.shard.index.read_whole_shard`.)
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from zarr.storage import LocalStore, StorePath

from zarr_fused._native import io_kernels, shard_local_kernels
from zarr_fused._zarr_compat import open_local_store
from zarr_fused.stats import CountedPath

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

__all__ = ["LOCAL_MAX_GAP", "local_files", "make_parents", "read_shard_part", "write_parts"]

#: Within a local file, a coalesced read never spans a gap wider than this.
#: zarr's ``sharding_coalesce_max_gap_bytes`` (1 MiB by default) is tuned for
#: object stores, where a request costs milliseconds; a pread from the page
#: cache costs about as much as copying a few KiB, so reading a wide gap only
#: to throw it away costs more than a second pread (docs/performance.md).
LOCAL_MAX_GAP = 16 << 10

#: the key types of a batch zarr_fused reads natively: zarr's, and the
#: same key counting its requests (inside `zarr_fused.stats`)
_KEYS = (StorePath, CountedPath)


def local_files(
    batch: Sequence[tuple[Any, ...]], *, write: bool = False, shard_io: bool = False
) -> bytes | None:
    """The path prefix of the batch's keys when they all live in one
    `zarr.storage.LocalStore` (exactly that class, so subclasses keep their
    own IO); zarr_fused then does the file IO itself, inside its nogil
    calls. None otherwise, and with ``shard_io`` also when `_localio` (which
    the shard paths use) is not built.

    Performs the checks LocalStore's own sync methods start with.
    """
    if shard_io and io_kernels is None:
        return None
    first, *_ = batch[0]
    if type(first) not in _KEYS or type(first.store) is not LocalStore:
        return None
    store = first.store
    for getter, *_ in batch:
        if type(getter) not in _KEYS or getter.store is not store:
            return None
    open_local_store(store, write=write)
    return _root_prefix(store.root)


@functools.lru_cache(maxsize=64)
def _root_prefix(root: Any) -> bytes:
    """``root`` (a LocalStore's path) as a bytes prefix for its keys."""
    return os.fsencode(root) + b"/"


def make_parents(prefix: bytes, batch: Sequence[tuple[Any, ...]]) -> None:
    """Create the directories the batch's keys live in. LocalStore does it
    on every write; once per directory per batch does the same."""
    for parent in {os.path.dirname(prefix + os.fsencode(setter.path)) for setter, *_ in batch}:
        os.makedirs(parent, exist_ok=True)


def read_shard_part(
    path: bytes,
    n_chunks: int,
    touched: np.ndarray,
    take: Callable[[int], np.ndarray],
    give: Callable[[np.ndarray | None], None],
    settings: dict[str, Any],
    decode_into: Any = None,
) -> Any:
    """Read the index and the ``touched`` inner chunks of the local shard
    at ``path`` (coalesced within ``settings["max_gap"]``).

    Without ``decode_into``: ``(entries, payload, buffer)`` with the
    entries pointing into payload (buffer goes back to ``give``), or None
    for a missing shard. With a `DecodeBatch` whose tasks for this shard
    are queued (deferred): fetch and decode in the same native call (one
    release of the GIL) and return whether the shard exists.
    """
    if decode_into is None:
        return shard_local_kernels.fetch_partial_local(
            path, n_chunks, touched, take, give=give, **settings
        )
    return shard_local_kernels.read_shard_local(
        decode_into, 0, path, n_chunks, touched, take, give, **settings
    )


def write_parts(path: bytes, parts: Any) -> None:
    """Write ``parts`` (buffers, in order) as the file at ``path``,
    atomically (writev into a temporary file, then rename)."""
    io_kernels.write_parts(path, parts)
