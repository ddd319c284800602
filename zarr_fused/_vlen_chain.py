"""Variable-length string and bytes chunks on the native kernels.

zarr stores ``str`` arrays (`VariableLengthUTF8`) and variable-length bytes
arrays (`VariableLengthBytes`) with numcodecs' vlen framing: in format 3
through the array->bytes codecs ``vlen-utf8`` / ``vlen-bytes`` followed by
bytes->bytes codecs, in format 2 through a `V2Codec` whose only filter is
numcodecs' ``VLenUTF8`` / ``VLenBytes``, then its compressor. A `VlenChain`
runs either with `zarr_fused._vlen`: the compressor, the checksums and the
framing in C with the GIL released, the items' objects made in one loop.

The chunk's items are framed in C order (format 3; zarr makes the chunk
contiguous first) or in the array's ``order`` (format 2, which flattens the
chunk in that order). Strings of a ``str`` array (NumPy's ``StringDType``)
go between the frame and the array with no Python object at all; bytes
(object arrays) are made as objects in one loop.

Sharded vlen arrays read and write through `zarr_fused.shard.vlen`, which
fetches and lays out shards natively and runs each inner chunk through this
chain (``decode_chunk``, ``decode_chunk_into``, ``encode_chunk``, whose
errors name the inner chunk and its shard).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec
from zarr.core.buffer import cpu

from zarr_fused._items import describe_chunk
from zarr_fused._native import codec_kernels, vlen_kernels
from zarr_fused._native_gate import NativeOrFallback
from zarr_fused._zarr_compat import V2Codec

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._buffers import RawBuffer
    from zarr_fused._items import ReadItem

    #: `zarr_fused._chain._bytes_to_bytes_params`: the kernel parameters of
    #: bytes->bytes codecs (named in reasons), or why they have none
    BytesParams = Callable[[tuple[Codec, ...], str], tuple[str, dict[str, Any]]]
    #: `zarr_fused._v2.v2_vlen_params`: (strings?, kernel parameters) of a
    #: format-2 vlen chunk, or None
    V2Params = Callable[[V2Codec, BytesParams], tuple[bool, dict[str, Any]] | None]


class _Fallback(Protocol):
    """The chain that runs the chunks a `VlenChain` declines (zarr's)."""

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer: ...

    def decode_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None: ...

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None: ...


__all__ = ["VlenChain", "vlen_chain"]

#: the format-3 array->bytes codecs, and whether their items are strings
_V3_CODECS: dict[type, bool] = {VLenUTF8Codec: True, VLenBytesCodec: False}


class VlenChain(NativeOrFallback):
    """A vlen chunk (see the module) through `zarr_fused._vlen`."""

    native = True
    reason = ""

    def __init__(
        self,
        spec: ArraySpec,
        params: dict[str, Any],
        utf8: bool,
        order: str,
        fallback: _Fallback,
        *,
        v2: bool = False,
    ) -> None:
        self.zdtype = spec.dtype
        self.dtype: np.dtype[Any] = spec.dtype.to_native_dtype()
        self.kernel = codec_kernels.ChainKernel(**params, itemsize=1, swap_unit=0)
        self.utf8 = utf8
        #: strings held in NumPy's StringDType: the kernels pack and read them
        #: without Python objects
        self.strings = utf8 and self.dtype.kind == "T" and not hasattr(self.dtype, "na_object")
        #: the order the frame lists the chunk's items in
        self.order = order
        #: format 2: that order is the chunk spec's, which must not change
        self.v2 = v2
        self.fallback = fallback

    def handles(self, spec: ArraySpec) -> bool:
        """Whether this chunk spec is the one the chain was built for."""
        return (
            (spec.dtype is self.zdtype or spec.dtype == self.zdtype)
            and issubclass(spec.prototype.nd_buffer, cpu.NDBuffer)
            and (not self.v2 or spec.order == self.order)
        )

    def _decode_flat(self, raw: Buffer | RawBuffer, items: np.ndarray, where: object) -> np.ndarray:
        """Decode the chunk's items into ``items`` (flat, C-contiguous, of
        the chain's string dtype or of objects), in frame order; errors
        name ``where``."""
        if self.strings and items.dtype == self.dtype:
            return vlen_kernels.decode_strings(self.kernel, raw.as_numpy_array(), items, where)
        return vlen_kernels.decode(
            self.kernel, raw.as_numpy_array(), items.size, self.utf8, where, items
        )

    def _whole_chunk_view(
        self, out: NDBuffer, item: ReadItem, drop_axes: tuple[int, ...]
    ) -> np.ndarray | None:
        """The region of ``out`` that a whole chunk read fills, when the
        kernels can decode into it directly: contiguous, in frame order, of
        the chain's own items; else None."""
        _, spec, chunk_selection, out_selection, _ = item
        dst = out.as_ndarray_like()
        if drop_axes or type(dst) is not np.ndarray or not _whole(chunk_selection, spec.shape):
            return None
        if not isinstance(out_selection, tuple):
            return None
        if not all(type(s) is slice and s.step in (None, 1) for s in out_selection):
            return None
        return self._frame_view(dst[out_selection], spec.shape)

    def _frame_view(self, view: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
        """``view`` (a chunk of ``shape``) as the array the kernels decode
        the frame's items into (its transpose for F order), or None when
        they cannot write into it: not the chain's own items, not
        contiguous in frame order, read-only."""
        if not (self.strings or self.dtype == np.dtype(object)) or view.dtype != self.dtype:
            return None
        order_ok = view.flags.c_contiguous if self.order == "C" else view.flags.f_contiguous
        if view.shape != shape or not order_ok or not view.flags.writeable:
            return None
        return view if self.order == "C" else view.T

    def decode_array(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> np.ndarray:
        """The whole chunk as a new NumPy array of the array's data type."""
        return self.decode_chunk(raw, spec, describe_chunk(key))

    def decode_chunk(self, raw: Buffer | RawBuffer, spec: ArraySpec, where: object) -> np.ndarray:
        """`decode_array`, its errors naming ``where``."""
        count = math.prod(spec.shape)
        if self.strings:
            items = self._decode_flat(raw, np.empty(count, dtype=self.dtype), where)
        else:
            items = self._decode_flat(raw, np.empty(count, dtype=object), where)
        chunk = items.reshape(spec.shape, order=self.order)  # type: ignore[call-overload]
        if self.dtype != chunk.dtype:
            return chunk.astype(self.dtype)
        return chunk

    def decode_handled_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None:
        key, *_ = item
        view = self._whole_chunk_view(out, item, drop_axes)
        if view is not None:
            self._decode_flat(raw, view.reshape(-1), describe_chunk(key))
            return
        # NumPy's assignment (what zarr does): the scatter kernels copy no
        # object or StringDType elements, whose storage the arrays own
        super().decode_handled_into(raw, item, out, drop_axes)

    def decode_chunk_into(self, raw: Buffer | RawBuffer, view: np.ndarray, where: object) -> bool:
        """Decode a whole chunk of ``view``'s shape straight into ``view``
        when the kernels can write into it (see `_frame_view`); False, with
        ``view`` untouched, when they cannot. Errors name ``where``."""
        frame = self._frame_view(view, view.shape)
        if frame is None:
            return False
        self._decode_flat(raw, frame.reshape(-1), where)
        return True

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        data = array.as_ndarray_like()
        if not self.handles(spec) or type(data) is not np.ndarray or data.shape != spec.shape:
            return self.fallback.encode(array, spec)
        return spec.prototype.buffer.from_array_like(self.encode_chunk(data, describe_chunk(key)))

    def encode_chunk(self, data: np.ndarray, where: object) -> np.ndarray:
        """The encoded bytes of the chunk ``data`` (a NumPy array of the
        chunk spec this chain handles), errors naming ``where``."""
        if self.strings and data.dtype == self.dtype:
            values = np.ascontiguousarray(np.ravel(data, order=self.order))  # type: ignore[call-overload]
            encoded = vlen_kernels.encode_strings(self.kernel, values, where)
        else:
            # the items as objects, in the frame's order, as numcodecs takes them
            values = np.ravel(data.astype(object, copy=False), order=self.order)  # type: ignore[call-overload]
            encoded = vlen_kernels.encode(
                self.kernel, np.ascontiguousarray(values), self.utf8, where
            )
        return encoded


def _whole(selection: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``selection`` selects every element of a chunk of ``shape``,
    in order."""
    if not isinstance(selection, tuple) or len(selection) != len(shape):
        return False
    return all(
        type(s) is slice and s.indices(n) == (0, n, 1)
        for s, n in zip(selection, shape, strict=True)
    )


def vlen_chain(
    codecs: tuple[Codec, ...],
    spec: ArraySpec,
    fallback: _Fallback,
    bytes_params: BytesParams,
    v2_params: V2Params,
) -> VlenChain | None:
    """A `VlenChain` for an evolved codec list when the kernels cover it
    (see the module), else None; ``fallback`` runs the chunks it declines."""
    if vlen_kernels is None or codec_kernels is None or not codecs:
        return None
    if not issubclass(spec.prototype.nd_buffer, cpu.NDBuffer):
        return None
    first = codecs[0]
    if len(codecs) == 1 and type(first) is V2Codec:
        found = v2_params(first, bytes_params)
        if found is None:
            return None
        utf8, params = found
        return VlenChain(spec, params, utf8, spec.order, fallback, v2=True)
    if type(first) not in _V3_CODECS:
        return None
    names = " -> ".join(type(c).__name__ for c in codecs)
    reason, params = bytes_params(codecs[1:], names)
    if reason:
        return None
    return VlenChain(spec, params, _V3_CODECS[type(first)], "C", fallback)
