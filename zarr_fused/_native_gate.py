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

import numpy as np
from zarr.core.buffer import cpu

if TYPE_CHECKING:
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
    #: the chunk spec and the NumPy value type the kernels were built for,
    #: and the transpose of the stored items (None: none)
    spec: ArraySpec
    dtype: np.dtype[Any]
    transpose: tuple[int, ...] | None = None

    def handles(self, spec: ArraySpec) -> bool:
        """Whether ``spec`` is the one the kernels were built for: the
        chain's data type, in CPU buffers."""
        return (spec.dtype is self.zdtype or spec.dtype == self.zdtype) and issubclass(
            spec.prototype.nd_buffer, cpu.NDBuffer
        )

    def decode_refused(self, payload: np.ndarray[Any, Any], where: str) -> np.ndarray[Any, Any]:
        """zarr's decoding (``fallback``) of a chunk of the kernels' spec
        whose stored values a native filter refused (an integer
        scale_offset's remainder, a float cast into integers): its values
        in C order, or zarr's own error for them, of zarr's type, its
        message led by ``where`` (the chunk, as the batches name it)."""
        raw = self.spec.prototype.buffer.from_array_like(payload)
        try:
            decoded = self.fallback.decode(raw, self.spec)
        except Exception as exc:
            try:
                named = type(exc)(f"{where}: {exc}")
            except Exception:  # an error type made otherwise: zarr's own, with a note
                exc.add_note(where)
                raise exc from None
            raise named from exc
        values = decoded.as_numpy_array().astype(self.dtype, copy=False)
        if self.transpose is not None:
            values = values.transpose(self.transpose)
        return np.ascontiguousarray(values)

    def encode_refused(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """zarr's encoding (``fallback``) of a chunk of the kernels' spec
        that a native filter refused (a value an integer type cannot
        hold): ``values`` are its items in stored order (transposed by
        ``transpose``), as bytes; None to store nothing."""
        shape = self.spec.shape
        if self.transpose is None:
            chunk = values.view(self.dtype).reshape(shape)
        else:
            stored = values.view(self.dtype).reshape([shape[i] for i in self.transpose])
            chunk = stored.transpose(np.argsort(self.transpose))
        nd_buffer = self.spec.prototype.nd_buffer.from_ndarray_like(chunk)
        encoded = self.fallback.encode(nd_buffer, self.spec)
        return None if encoded is None else encoded.as_numpy_array()

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
