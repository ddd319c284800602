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

__all__ = ["merge_and_encode", "merge_owned"]


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
    if chunk_is_empty(merged, spec):
        return None
    return chain.encode(merged, spec, setter)


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
