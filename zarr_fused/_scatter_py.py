"""Writing decoded chunks and fill values into the caller's output array.

The native kernels (`zarr_fused._scatter`) take every basic selection of a
NumPy output with a fixed-size dtype, the GIL released; anything else (an
orthogonal or coordinate selection, object arrays, non-NumPy buffers, a
build without the extensions) takes zarr's own assignment, which is the
reference behaviour. `DecodeThenScatter` gives a codec chain that decodes
whole chunks its ``decode_into`` on top of these.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.chunk_utils import fill_value_or_default

from zarr_fused._dtypes import element_bytes, in_byte_order
from zarr_fused._native import scatter_kernels

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.indexing import SelectorTuple

    from zarr_fused._batch_chain import BatchChain
    from zarr_fused._items import ReadItem

__all__ = [
    "SWAPPABLE_KINDS",
    "DecodeThenScatter",
    "copy_into",
    "decode_group",
    "fill_missing",
    "scatter_array",
    "scatter_chunk",
]

# dtype kinds whose byte order the copy kernel reverses on the fly (per
# element, per component for complex)
SWAPPABLE_KINDS = frozenset("biufcmM")


def _basic_view(dst: np.ndarray, selection: SelectorTuple) -> np.ndarray | None:
    """``dst[selection]`` as a view when ``selection`` is basic, else None."""
    if not isinstance(selection, tuple):
        selection = (selection,)
    for s in selection:
        # bool is an int to Python but a mask to numpy (a copy, not a view)
        if type(s) is not slice and (
            not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_))
        ):
            return None
    return dst[(*selection, Ellipsis)]


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for two NumPy arrays of one fixed-size dtype and
    shape: the copy kernel (GIL released; faster than NumPy's assignment
    for the short rows of small n-d blocks), NumPy's without it."""
    if scatter_kernels is not None and not dst.dtype.hasobject:
        scatter_kernels.scatter(src, dst)
    else:
        dst[...] = src


def scatter_array(
    out: NDBuffer, out_selection: SelectorTuple, src: np.ndarray, drop_axes: tuple[int, ...]
) -> None:
    """``out[out_selection] = src`` (``src`` squeezed on ``drop_axes``)."""
    if drop_axes:
        src = src.squeeze(axis=drop_axes)
    dst = out.as_ndarray_like()
    if (
        scatter_kernels is not None
        and type(dst) is np.ndarray
        and isinstance(src, np.ndarray)
        and not dst.dtype.hasobject
    ):
        view = _basic_view(dst, out_selection)
        if view is not None and view.shape == src.shape:
            if view.dtype == src.dtype:
                scatter_kernels.scatter(src, view)
                return
            if (
                src.dtype.kind in SWAPPABLE_KINDS
                and src.dtype.itemsize > 1
                and view.dtype == src.dtype.newbyteorder()
            ):
                scatter_kernels.scatter(src, view, swap=True)
                return
    if isinstance(src, np.ndarray) and hasattr(dst, "dtype"):
        src = in_byte_order(src, dst.dtype)
    out[out_selection] = src


def scatter_chunk(
    out: NDBuffer, out_selection: SelectorTuple, chunk: NDBuffer, drop_axes: tuple[int, ...]
) -> None:
    """Scatter an already-selected decoded chunk into ``out``."""
    src = chunk.as_ndarray_like()
    if isinstance(src, np.ndarray):
        scatter_array(out, out_selection, src, drop_axes)
        return
    if drop_axes:
        chunk = chunk.squeeze(axis=drop_axes)
    out[out_selection] = chunk


class DecodeThenScatter(ABC):
    """The ``decode_into`` of a chain that decodes whole chunks only: its
    ``decode``, then the selected part written into ``out`` (`scatter_chunk`).
    zarr's chain and the hybrid chains share it; `NativeChain` writes into
    ``out`` in the kernels instead."""

    @abstractmethod
    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer: ...

    def decode_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        key, spec, chunk_selection, out_selection, _ = item
        chunk = self.decode(raw, spec, key)
        scatter_chunk(out, out_selection, chunk[chunk_selection], drop_axes)


def fill_missing(out: NDBuffer, out_selection: SelectorTuple, spec: ArraySpec) -> None:
    """Write the fill value of ``spec`` into ``out[out_selection]``."""
    value: Any = fill_value_or_default(spec)
    dst = out.as_ndarray_like()
    if scatter_kernels is not None and type(dst) is np.ndarray and not dst.dtype.hasobject:
        view = _basic_view(dst, out_selection)
        if view is not None:
            scatter_kernels.fill(view, value)
            return
    if isinstance(dst, np.ndarray) and not dst.dtype.isnative and dst.dtype.kind in "mM":
        # one element already in dst's byte order (NumPy's cast would not swap)
        value = np.frombuffer(element_bytes(value, dst.dtype), dtype=dst.dtype).reshape(())
    out[out_selection] = value


def decode_group(
    chain: BatchChain,
    batch: Sequence[ReadItem],
    out: NDBuffer,
    drop_axes: tuple[int, ...],
    fill: bytes,
    ndim: int,
    group: Sequence[tuple[int, Any]],
) -> None:
    """Decode ``group``, pairs of a batch position and its stored bytes (None
    for a missing chunk, filled with ``fill``), into ``out`` in one nogil
    call of ``chain``'s batch kernels (a native chain's, or native filters
    over one); the chunks the kernels do not place go through the chain (the
    readers that fetch apart from decoding: `zarr_fused.chunks.pipelined`,
    `zarr_fused.chunks.async_read`); missing ones it does not place get
    `fill_missing`."""
    dst = out.as_ndarray_like()
    decode = chain.kernel_batch(len(group), ndim)
    decode.set_fill(fill)
    general: list[tuple[int, Any]] = []
    for i, data in group:
        getter, spec, chunk_selection, out_selection, _ = batch[i]
        if data is None:
            queued = decode.add_missing(dst, out_selection, getter)
        else:
            queued = decode.add(
                data,
                chain.layout(spec.shape),
                chunk_selection,
                dst,
                out_selection,
                drop_axes,
                getter,
            )
        if not queued:
            general.append((i, data))
    decode.run()
    for i, data in general:
        _, spec, _, out_selection, _ = batch[i]
        if data is None:
            fill_missing(out, out_selection, spec)
        else:
            # a copy: the bytes may sit in a buffer the caller reuses
            raw = spec.prototype.buffer.from_bytes(bytes(data))
            chain.decode_into(raw, batch[i], out, drop_axes)
