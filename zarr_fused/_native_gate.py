"""The gate in front of every native codec chain: `NativeOrFallback`.

A native chain's kernels are built for one chunk spec (its data type, CPU
buffers; a format-2 chain also its memory order). A chunk spec they were
not built for goes whole to the chain's ``fallback``, zarr's own chain, so
that every chain answers ``decode`` and ``decode_into`` for any spec the
same way. This module imports nothing of zarr_fused, so the chain modules
(`zarr_fused._chain`, `zarr_fused._hybrid`, `zarr_fused._vlen_chain`) can
all stand on it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from zarr.core.buffer import cpu

if TYPE_CHECKING:
    import numpy as np
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._items import ReadItem

__all__ = ["NativeOrFallback"]


class NativeOrFallback(ABC):
    """A chunk spec the chain does not handle (``handles`` false) goes whole
    to ``fallback``; the others decode with the chain's own
    ``decode_array`` and ``decode_handled_into``."""

    fallback: Any
    zdtype: Any

    def handles(self, spec: ArraySpec) -> bool:
        """Whether ``spec`` is the one the kernels were built for: the
        chain's data type, in CPU buffers."""
        return (spec.dtype is self.zdtype or spec.dtype == self.zdtype) and issubclass(
            spec.prototype.nd_buffer, cpu.NDBuffer
        )

    @abstractmethod
    def decode_array(self, raw: Any, spec: ArraySpec, key: Any = None) -> np.ndarray: ...

    def decode_handled_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        """Decode a chunk the chain handles into ``out``: here the whole
        chunk, its selected part assigned as zarr assigns it; chains whose
        kernels write into ``out`` do better first."""
        key, spec, chunk_selection, out_selection, _ = item
        chunk = self.decode_array(raw, spec, key)[chunk_selection]
        if drop_axes:
            chunk = chunk.squeeze(axis=drop_axes)
        out[out_selection] = chunk

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer:
        if not self.handles(spec):
            return self.fallback.decode(raw, spec)
        return spec.prototype.nd_buffer.from_ndarray_like(self.decode_array(raw, spec, key))

    def decode_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        _, spec, *_ = item
        if not self.handles(spec):
            self.fallback.decode_into(raw, item, out, drop_axes)
            return
        self.decode_handled_into(raw, item, out, drop_axes)
