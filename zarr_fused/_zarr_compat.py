"""The one place zarr_fused touches zarr-python's private API.

zarr 3.4 gives a codec pipeline no public way to reach some of what it
needs: the spec of a shard's inner chunks, the partial codecs' synchronous
entry points, the merge of a chunk written in part, whether a store can do
synchronous IO, the exceptions the obstore adapter treats as "absent", the
dict behind a `MemoryStore`, and the pieces of zarr's own fused pipeline
that zarr_fused builds on (`ChunkTransform`, `evolve_codecs`). Every such
name is imported or reached here and nowhere else, so adopting a zarr
release that moves one is a change to this file. `tests/test_zarr_compat.py`
checks each shim against the zarr installed, and that no other module uses
a private zarr name.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from zarr.abc.codec import _codec_supports_sync
from zarr.abc.store import _store_supports_sync_io
from zarr.codecs._v2 import V2Codec
from zarr.core._coalesce import coalesce_ranges
from zarr.core.chunk_utils import (
    ChunkTransform,
    _merge_chunk_array,
    evolve_codecs,
)
from zarr.core.codec_pipeline import AsyncChunkTransform
from zarr.storage._obstore import _ALLOWED_EXCEPTIONS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType

    from zarr.abc.store import Store
    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.storage import LocalStore, MemoryStore

__all__ = [
    "OBJECT_ABSENT",
    "AsyncChunkTransform",
    "ChunkTransform",
    "V2Codec",
    "array_chunk_grid",
    "coalesce_ranges",
    "codec_decode_sync",
    "codec_encode_sync",
    "codec_supports_sync",
    "decode_partial_sync",
    "encode_partial_sync",
    "evolve_codecs",
    "fsspec_store_module",
    "has_partial_decode",
    "has_partial_encode",
    "inner_chunk_spec",
    "inner_write_order",
    "memory_store_dict",
    "merge_chunk_array",
    "numcodec_inside",
    "open_local_store",
    "store_supports_sync_io",
]

#: what zarr's obstore adapter reads as "no such key" from a local or
#: memory object store; zarr_fused's own obstore reads treat them alike
OBJECT_ABSENT: tuple[type[Exception], ...] = tuple(_ALLOWED_EXCEPTIONS)

merge_chunk_array = _merge_chunk_array


def store_supports_sync_io(store: Store) -> bool:
    """Whether ``store`` serves zarr's synchronous get/set."""
    return bool(_store_supports_sync_io(store))


def inner_chunk_spec(codec: ShardingCodec, shard_spec: ArraySpec) -> ArraySpec:
    """The spec of one inner chunk of a shard with ``shard_spec``."""
    return codec._get_chunk_spec(shard_spec)


def inner_write_order(codec: ShardingCodec, grid: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    """The coordinates of a shard's inner chunks (``grid`` of them per
    axis) in the order ``codec`` writes them."""
    order: Iterable[tuple[int, ...]] = codec._subchunk_order_iter(grid, codec.subchunk_write_order)
    return order


def codec_supports_sync(codec: object) -> bool:
    """Whether ``codec`` has zarr's synchronous encode and decode."""
    return bool(_codec_supports_sync(codec))


def codec_decode_sync(codec: object, data: Any, spec: ArraySpec) -> Any:
    """``codec``'s synchronous decode of one chunk (a hybrid chain's
    Python stage)."""
    return codec._decode_sync(data, spec)  # type: ignore[attr-defined]


def codec_encode_sync(codec: object, data: Any, spec: ArraySpec) -> Any:
    """``codec``'s synchronous encode of one chunk (None: elided)."""
    return codec._encode_sync(data, spec)  # type: ignore[attr-defined]


def numcodec_inside(codec: object) -> Any:
    """The numcodecs codec one of zarr's ``numcodecs.*`` codecs runs."""
    return codec._codec  # type: ignore[attr-defined]


def open_local_store(store: LocalStore, *, write: bool) -> None:
    """Open ``store`` as its own synchronous calls do (and, for ``write``,
    raise as they do when it is read-only)."""
    store._ensure_open_sync()
    if write:
        store._check_writable()


def has_partial_decode(codec: object) -> bool:
    """Whether ``codec`` has zarr's synchronous partial decode."""
    return hasattr(codec, "_decode_partial_sync")


def has_partial_encode(codec: object) -> bool:
    """Whether ``codec`` has zarr's synchronous partial encode."""
    return hasattr(codec, "_encode_partial_sync")


def decode_partial_sync(codec: object) -> Callable[..., Any]:
    """``codec``'s synchronous partial decode: (getter, selection, spec)
    to the selected array or None."""
    method: Callable[..., Any] = codec._decode_partial_sync  # type: ignore[attr-defined]
    return method


def encode_partial_sync(codec: object) -> Callable[..., Any]:
    """``codec``'s synchronous partial encode: (setter, value, selection,
    spec) to None."""
    method: Callable[..., Any] = codec._encode_partial_sync  # type: ignore[attr-defined]
    return method


def memory_store_dict(store: MemoryStore) -> object:
    """The dict that holds a `MemoryStore`'s values (two stores over one
    dict hold the same keys)."""
    return store._store_dict


def fsspec_store_module() -> ModuleType | None:
    """zarr's fsspec store module if it was imported (importing it would
    import fsspec), else None."""
    return sys.modules.get("zarr.storage._fsspec")


def array_chunk_grid(array: Any) -> Any:
    """The chunk grid of the stored keys of a ``zarr.Array`` (its shards
    when sharded): ``is_regular`` and ``chunk_shape`` as zarr reads them."""
    return array.async_array._chunk_grid
