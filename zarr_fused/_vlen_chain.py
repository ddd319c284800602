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
(object arrays) are made as objects in one loop. A read of slices and
integers places the selected items straight into the output, however
strided (a one-chunk `zarr_fused._vlen.VlenRegion`); other reads decode the
chunk whole and assign it as zarr does.

Sharded vlen arrays read and write through `zarr_fused.shard.vlen`, which
fetches and lays out shards natively and decodes a shard's selected inner
chunks in one `VlenRegion` call; the selections that call does not take,
and writes, run each inner chunk through this chain (``decode_chunk``,
``decode_chunk_into``, ``encode_chunk``, whose errors name the inner chunk
and its shard).
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
    from zarr_fused._vlen import VlenRegion

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

    def _region(self, raw: Buffer, item: ReadItem, dst: Any) -> VlenRegion | None:
        """The chunk's selected items decoded straight into their places in
        ``dst`` (a strided view: any selection of slices and integers), or
        None when the kernels cannot write there (not a writeable NumPy
        array of the chain's own items, another selection)."""
        key, spec, chunk_selection, out_selection, _ = item
        if type(dst) is not np.ndarray or vlen_kernels is None or not dst.flags.writeable:
            return None
        if dst.dtype != object and not (self.strings and dst.dtype == self.dtype):
            return None
        rows = _rows(chunk_selection, out_selection, spec.shape, dst.ndim)
        if rows is None:
            return None
        ndim = len(spec.shape)
        payload = raw.as_numpy_array()
        return vlen_kernels.VlenRegion(
            self.kernel,
            payload,
            np.array([[0, payload.size]], dtype=np.uint64),
            rows[0],
            (1,) * ndim,
            rows[1],
            spec.shape,
            (1,) * ndim,
            dst,
            self.utf8,
            "" if dst.dtype != object else None,
            key,
            _describe,
            order=self.order,
        )

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
        dst = out.as_ndarray_like()
        if lone_object(dst):
            self.fallback.decode_into(raw, item, out, drop_axes)
            return
        region = None if drop_axes else self._region(raw, item, dst)
        if region is not None:
            region.decode(0, 1)
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


def lone_object(dst: Any) -> bool:
    """Whether ``dst`` is a 0-d object array: zarr assigns the one selected
    item as a 0-d array of it, which NumPy stores as the element itself (a
    0-d array inside the 0-d output, nested once more per assignment, as a
    shard's inner chunk takes two); zarr's code reproduces that, one item
    at a time, where the kernels would place the item itself."""
    return type(dst) is np.ndarray and dst.ndim == 0 and dst.dtype == object


def _describe(key: tuple[Any, int]) -> str:
    """Names the chunk of a one-chunk `VlenRegion` (``(chunk key, 0)``)."""
    return describe_chunk(key[0])


def _rows(
    chunk_selection: Any, out_selection: Any, shape: tuple[int, ...], out_ndim: int
) -> tuple[list[tuple[int, int, int, int, int]], list[int]] | None:
    """The rows and output axes of a one-chunk `VlenRegion` reading
    ``chunk_selection`` of a chunk of ``shape`` into ``out_selection``:
    slices and integers of the chunk into contiguous slices of an output
    of ``out_ndim`` axes (zarr's basic and orthogonal indexers drop an
    integer's axis); None for other selections."""
    if not isinstance(chunk_selection, tuple) or not isinstance(out_selection, tuple):
        return None
    if len(chunk_selection) != len(shape) or len(out_selection) != out_ndim:
        return None
    rows: list[tuple[int, int, int, int, int]] = []
    axes: list[int] = []
    for sel, n in zip(chunk_selection, shape, strict=True):
        if type(sel) is slice:
            axis = len(axes) - axes.count(-1)
            place = out_selection[axis] if axis < out_ndim else None
            start, stop, step = sel.indices(n)
            count = len(range(start, stop, step))
            if type(place) is not slice or place.step not in (None, 1) or count == 0:
                return None
            first = place.start or 0
            if place.stop is None or place.stop - first != count:
                return None
            rows.append((0, start, step, count, first))
            axes.append(axis)
        elif isinstance(sel, (int, np.integer)) and not isinstance(sel, (bool, np.bool_)):
            if not 0 <= sel < n:
                return None
            rows.append((0, int(sel), 1, 1, 0))
            axes.append(-1)
        else:
            return None
    return rows, axes


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
