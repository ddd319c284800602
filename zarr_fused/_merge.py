"""Merging a written value into a chunk, by zarr's rules: shared by the
chunk paths, the shard engine and the async path."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
from zarr.core.chunk_utils import chunk_is_empty, fill_value_or_default
from zarr.core.indexing import is_scalar

from zarr_fused._dtypes import in_byte_order
from zarr_fused._zarr_compat import merge_chunk_array

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._chain import Chain
    from zarr_fused._items import WriteItem

__all__ = ["is_empty_chunk", "merge_and_encode", "merge_owned"]


def merge_and_encode(
    chain: Chain,
    existing: Buffer | None,
    value: NDBuffer,
    item: WriteItem,
    drop_axes: tuple[int, ...],
) -> Buffer | None:
    """Bytes to store for one chunk, or None when it must not be stored."""
    setter, spec, chunk_selection, out_selection, is_complete = item
    existing_array = None if existing is None else chain.decode(existing, spec, setter)
    merged = merge_chunk_array(
        existing_array, value, out_selection, spec, chunk_selection, is_complete, drop_axes
    )
    if is_empty_chunk(merged, spec):
        return None
    return chain.encode(merged, spec, setter)


#: data kinds whose elements NumPy compares one by one through their
#: objects or string storage (objects, StringDType)
_SLOW_COMPARE = frozenset("OT")


def is_empty_chunk(chunk: NDBuffer, spec: ArraySpec) -> bool:
    """zarr's `chunk_is_empty` (its rule, its comparison), told at once by
    the chunk's first element when that differs from the fill value.

    zarr compares a first block of 16384 elements before it can say a
    chunk is not empty, one by one for strings and objects. An element
    that differs by zarr's own comparison (applied to a one-element view)
    means the whole differs too, so the answer is zarr's either way."""
    if spec.config.write_empty_chunks:
        return False
    data = chunk.as_ndarray_like()
    first_differs = (
        data.ndim > 0
        and data.size > 1
        and data.dtype.kind in _SLOW_COMPARE
        and not chunk_is_empty(chunk[(slice(0, 1),) * data.ndim], spec)
    )
    return not first_differs and chunk_is_empty(chunk, spec)


def merge_owned(
    existing: np.ndarray | None,
    value: NDBuffer,
    out_selection: SelectorTuple,
    spec: ArraySpec,
    chunk_selection: SelectorTuple,
    is_complete: bool,
    drop_axes: tuple[int, ...],
) -> np.ndarray:
    """zarr's `_merge_chunk_array`, for an ``existing`` array the caller owns
    (freshly decoded), which is merged in place instead of copied first.

    The native paths that call it run on CPU buffers only, whose arrays are
    NumPy's: the casts below say so to the type checker."""
    if is_complete and value.shape != ():
        selected = value[out_selection]
        if selected.shape == spec.shape:
            return cast("np.ndarray", selected.as_ndarray_like())
    if existing is None:
        chunk = cast(
            "np.ndarray",
            spec.prototype.nd_buffer.create(
                shape=spec.shape,
                dtype=spec.dtype.to_native_dtype(),
                order=spec.order,
                fill_value=fill_value_or_default(spec),
            ).as_ndarray_like(),
        )
    else:
        chunk = existing
    if chunk_selection == () or is_scalar(value.as_ndarray_like(), spec.dtype.to_native_dtype()):
        chunk_value = value
    else:
        chunk_value = value[out_selection]
        if drop_axes:
            item = tuple(None if i in drop_axes else slice(None) for i in range(spec.ndim))
            chunk_value = chunk_value[item]
    chunk[chunk_selection] = in_byte_order(
        cast("np.ndarray", chunk_value.as_ndarray_like()), chunk.dtype
    )
    return chunk
