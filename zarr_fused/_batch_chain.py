"""What the chains the nogil batch kernels run share: `BatchChain`.

`zarr_fused._chain.NativeChain` (a codec chain) and
`zarr_fused._hybrid.FilteredChain` (native filters over a native tail) are
both run by `zarr_fused._codec_batch`'s batches: a chunk's element layout,
a chunk decoded whole, or into its place in an output, through a batch of
one, are the same for both (and a group of fetched chunks decoded in one
batch: `zarr_fused._scatter_py.decode_group`); only the batch each builds
differs (`BatchChain.kernel_batch`).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zarr_fused._dtypes import empty
from zarr_fused._items import describe_chunk
from zarr_fused._native import batch_kernels
from zarr_fused._native_gate import NativeOrFallback

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._items import ReadItem

__all__ = ["BatchChain", "StoredBytes"]


class StoredBytes(Protocol):
    """Stored bytes as `BatchChain.decode_array` reads them: a zarr
    `Buffer`, or any view with the same method (the shard reader's)."""

    def as_numpy_array(self) -> np.ndarray: ...


class BatchChain(NativeOrFallback):
    """A chain the nogil batch kernels (`zarr_fused._codec_batch`) run:
    the element layout of its chunks, and a chunk decoded whole or into its
    place in an output through a batch of one (`kernel_batch`, which each
    chain builds its own way)."""

    order: tuple[int, ...] | None
    _layouts: dict[tuple[int, ...], Any]
    _lock: threading.Lock
    #: whether its encode batches write chunk files themselves (a batch
    #: with filters encodes into memory only: a chunk they refuse is zarr's
    #: code to encode)
    encodes_to_files = True

    def writes_into(self, out: Any, spec: ArraySpec) -> bool:
        """Whether the kernels can decode chunks of ``spec`` straight into
        ``out`` (a NumPy array of the chain's own dtype)."""
        return type(out) is np.ndarray and out.dtype == self.dtype and self.handles(spec)

    def layout(self, shape: tuple[int, ...]) -> Any:
        """The element layout of a chunk of ``shape`` (cached per shape)."""
        layout = self._layouts.get(shape)
        if layout is None:
            layout = batch_kernels.ChunkLayout(shape, self.dtype.itemsize, self.order)
            with self._lock:
                self._layouts[shape] = layout
        return layout

    @abstractmethod
    def encode_bound(self, nbytes: int) -> int:
        """The most bytes a chunk of ``nbytes`` value bytes encodes to."""

    @abstractmethod
    def encode_batch(
        self,
        capacity: int,
        ndim: int,
        describe: Any = describe_chunk,
        arena: np.ndarray | None = None,
    ) -> Any:
        """An `EncodeBatch`; its results are views into ``arena`` (see there)."""

    @abstractmethod
    def encode_swap(self, array: np.ndarray) -> bool | None:
        """Whether encoding ``array`` swaps bytes; None when the batch
        cannot take its data type."""

    @abstractmethod
    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        """The bytes to store for one chunk, or None when a codec elides it."""

    @abstractmethod
    def kernel_batch(self, capacity: int, ndim: int, describe: Any = describe_chunk) -> Any:
        """A `DecodeBatch` whose errors name chunks with ``describe``."""

    def decode_array(self, raw: StoredBytes, spec: ArraySpec, key: Any = None) -> np.ndarray:
        """The whole chunk as a new NumPy array of the chain's value type."""
        array = empty(spec.shape, self.dtype)
        batch = self.kernel_batch(1, array.ndim)
        batch.add(raw.as_numpy_array(), self.layout(spec.shape), (), array, (), (), key)
        batch.run()
        return array

    def decode_handled_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        key, spec, chunk_selection, out_selection, _ = item
        dst = out.as_ndarray_like()
        if type(dst) is np.ndarray and dst.dtype == self.dtype:
            batch = self.kernel_batch(1, max(dst.ndim, len(spec.shape)))
            layout = self.layout(spec.shape)
            raw_items = raw.as_numpy_array()
            if batch.add(raw_items, layout, chunk_selection, dst, out_selection, drop_axes, key):
                batch.run()
                return
        # advanced selections: decode natively, select and assign with NumPy
        super().decode_handled_into(raw, item, out, drop_axes)
