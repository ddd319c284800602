"""Array->array stages of a hybrid chain that run native kernels.

A hybrid chain runs each of its stages with three methods,
``resolve_metadata``, ``decode`` and ``encode`` (a chunk and its spec
before the stage). `stage` gives the one for a zarr codec: a native stage
whose work runs in `zarr_fused._filters` with the GIL released where there
is a kernel (`native_stage`), else a `PythonStage` running zarr's own code.
A chunk a kernel cannot take (another data type or byte order than the
codec's own, a non-NumPy buffer, an empty chunk) goes through zarr's
codec, which is the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.codecs.numcodecs import Delta

from zarr_fused._native import filter_kernels
from zarr_fused._zarr_compat import codec_decode_sync, codec_encode_sync

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

__all__ = ["NativeDelta", "PythonStage", "native_stage", "stage"]

#: (kind, item size) pairs the delta kernel covers
_DELTA_TYPES = {("i", n) for n in (1, 2, 4, 8)} | {("u", n) for n in (1, 2, 4, 8)}
_DELTA_TYPES |= {("f", 4), ("f", 8)}


class PythonStage:
    """A zarr codec run with its own synchronous code."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec

    def resolve_metadata(self, spec: ArraySpec) -> ArraySpec:
        resolved: ArraySpec = self.codec.resolve_metadata(spec)
        return resolved

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        decoded: NDBuffer = codec_decode_sync(self.codec, chunk, spec)
        return decoded

    def encode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer | None:
        encoded: NDBuffer | None = codec_encode_sync(self.codec, chunk, spec)
        return encoded


class NativeDelta(PythonStage):
    """``numcodecs.delta`` without ``astype`` (or with ``astype`` equal to
    ``dtype``), run by `zarr_fused._filters.delta`."""

    def __init__(self, codec: Any, dtype: np.dtype[Any]) -> None:
        super().__init__(codec)
        self.dtype = dtype

    def _takes(self, data: Any) -> bool:
        return type(data) is np.ndarray and data.dtype == self.dtype and data.size > 0

    def decode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer:
        data: Any = chunk.as_ndarray_like()
        if not self._takes(data) or not data.flags.c_contiguous:
            return super().decode(chunk, spec)
        out = np.empty(spec.shape, dtype=self.dtype)
        assert filter_kernels is not None
        filter_kernels.delta(data, out, False)
        return spec.prototype.nd_buffer.from_ndarray_like(out)

    def encode(self, chunk: NDBuffer, spec: ArraySpec) -> NDBuffer | None:
        data: Any = chunk.as_ndarray_like()
        if not self._takes(data):
            return super().encode(chunk, spec)
        # C order, as zarr's wrapper flattens it before numcodecs does
        data = np.ascontiguousarray(data)
        out = np.empty(data.shape, dtype=self.dtype)
        assert filter_kernels is not None
        filter_kernels.delta(data, out, True)
        return spec.prototype.nd_buffer.from_ndarray_like(out)


def native_stage(codec: Codec) -> NativeDelta | None:
    """The native stage that runs ``codec``, or None when there is none."""
    if filter_kernels is None or type(codec) is not Delta:
        return None
    config: dict[str, Any] = codec.codec_config
    dtype = np.dtype(config["dtype"])
    astype = np.dtype(config.get("astype") or dtype)
    if astype != dtype or not dtype.isnative or (dtype.kind, dtype.itemsize) not in _DELTA_TYPES:
        return None
    return NativeDelta(codec, dtype)


def stage(codec: Codec) -> PythonStage:
    """How a hybrid chain runs ``codec``: natively where it can."""
    return native_stage(codec) or PythonStage(codec)
