"""Codec chains of one chunk: native kernels where zarr_fused has them,
zarr's `ChunkTransform` otherwise.

A chain turns stored bytes into a chunk array and back. Every chain offers
the same three operations, so the read and write paths never care which
kind they hold:

``decode(raw, spec)``
    the chunk as an NDBuffer (zarr's ``ChunkTransform.decode_chunk``);
``decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes)``
    decode and write the selected part straight into ``out``;
``encode(array, spec)``
    bytes to store, or None when a codec elides the chunk.

`build_chain` picks the chain for an evolved codec list and records, for a
non-native chain, why it is not native.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import numpy as np
from zarr.codecs.bytes import BytesCodec
from zarr.core.buffer import cpu
from zarr.core.dtype.common import HasEndianness
from zarr.core.dtype.npy.structured import Struct

from zarr_fused._native import scatter_kernels
from zarr_fused._output import SWAPPABLE_KINDS, scatter_array, scatter_chunk
from zarr_fused.errors import CorruptChunkError

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer
    from zarr.core.chunk_utils import ChunkTransform
    from zarr.core.indexing import SelectorTuple

__all__ = ["Chain", "NativeBytesChain", "TransformChain", "build_chain"]


class Chain(Protocol):
    native: bool
    #: why this chain is not native ("" for a native chain)
    reason: str

    def decode(self, raw: Buffer, spec: ArraySpec) -> NDBuffer: ...

    def decode_into(
        self,
        raw: Buffer,
        spec: ArraySpec,
        chunk_selection: SelectorTuple,
        out: NDBuffer,
        out_selection: SelectorTuple,
        drop_axes: tuple[int, ...],
    ) -> None: ...

    def encode(self, array: NDBuffer, spec: ArraySpec) -> Buffer | None: ...


class TransformChain:
    """zarr's own synchronous codec chain."""

    native = False

    def __init__(self, transform: ChunkTransform, reason: str) -> None:
        self.transform = transform
        self.reason = reason

    def decode(self, raw: Buffer, spec: ArraySpec) -> NDBuffer:
        return self.transform.decode_chunk(raw, spec)

    def decode_into(
        self,
        raw: Buffer,
        spec: ArraySpec,
        chunk_selection: SelectorTuple,
        out: NDBuffer,
        out_selection: SelectorTuple,
        drop_axes: tuple[int, ...],
    ) -> None:
        chunk = self.transform.decode_chunk(raw, spec)
        scatter_chunk(out, out_selection, chunk[chunk_selection], drop_axes)

    def encode(self, array: NDBuffer, spec: ArraySpec) -> Buffer | None:
        return self.transform.encode_chunk(array, spec)


class NativeBytesChain:
    """The chain ``[bytes]``: fixed-size numeric chunks stored uncompressed.

    Decoding is a view of the stored bytes, or one pass of the copy kernel
    that also swaps the byte order when the stored and declared orders
    differ; `decode_into` skips the intermediate array entirely and copies
    from the stored bytes into the output.
    """

    native = True
    reason = ""

    def __init__(self, spec: ArraySpec, codec: BytesCodec, fallback: TransformChain) -> None:
        self.zdtype = spec.dtype
        self.dtype = spec.dtype.to_native_dtype()
        if isinstance(spec.dtype, HasEndianness):
            self.stored = replace(spec.dtype, endianness=codec.endian).to_native_dtype()  # type: ignore[call-arg]
        else:
            self.stored = self.dtype
        self.swap = self.stored != self.dtype
        self.fallback = fallback

    def _handles(self, spec: ArraySpec) -> bool:
        return (spec.dtype is self.zdtype or spec.dtype == self.zdtype) and issubclass(
            spec.prototype.nd_buffer, cpu.NDBuffer
        )

    def _stored_view(self, raw: Buffer, spec: ArraySpec) -> np.ndarray:
        data = raw.as_numpy_array()
        expected = self.stored.itemsize
        for s in spec.shape:
            expected *= s
        if data.nbytes != expected:
            raise CorruptChunkError(
                f"the chunk holds {data.nbytes} bytes, but {spec.shape} elements of "
                f"{self.stored} need {expected}"
            )
        return data.view(self.stored).reshape(spec.shape)

    def decode(self, raw: Buffer, spec: ArraySpec) -> NDBuffer:
        if not self._handles(spec):
            return self.fallback.decode(raw, spec)
        array = self._stored_view(raw, spec)
        if self.swap:
            array = scatter_kernels.scatter(array, swap=True)  # type: ignore[union-attr]
        return spec.prototype.nd_buffer.from_ndarray_like(array)

    def decode_into(
        self,
        raw: Buffer,
        spec: ArraySpec,
        chunk_selection: SelectorTuple,
        out: NDBuffer,
        out_selection: SelectorTuple,
        drop_axes: tuple[int, ...],
    ) -> None:
        if not self._handles(spec):
            self.fallback.decode_into(raw, spec, chunk_selection, out, out_selection, drop_axes)
            return
        selected = self._stored_view(raw, spec)[chunk_selection]
        scatter_array(out, out_selection, np.asarray(selected), drop_axes)

    def encode(self, array: NDBuffer, spec: ArraySpec) -> Buffer | None:
        data = array.as_ndarray_like()
        if not self._handles(spec) or type(data) is not np.ndarray:
            return self.fallback.encode(array, spec)
        if data.dtype == self.stored:
            flat = data if data.flags.c_contiguous else scatter_kernels.scatter(data)  # type: ignore[union-attr]
        elif data.dtype == self.dtype:
            flat = scatter_kernels.scatter(data, swap=True)  # type: ignore[union-attr]
        else:
            return self.fallback.encode(array, spec)
        return spec.prototype.buffer.from_array_like(flat.reshape(-1).view(np.uint8))


def _native_bytes_reason(codecs: tuple[Codec, ...], spec: ArraySpec) -> str:
    """'' when `NativeBytesChain` applies to ``codecs``, else why not."""
    if scatter_kernels is None:
        return "the compiled extensions are missing"
    if len(codecs) != 1 or type(codecs[0]) is not BytesCodec:
        names = " -> ".join(type(c).__name__ for c in codecs)
        return f"no native kernel for the codec chain {names}"
    if isinstance(spec.dtype, Struct):
        return "structured data types are decoded by zarr"
    native = spec.dtype.to_native_dtype()
    if native.kind not in SWAPPABLE_KINDS:
        return f"data type {spec.dtype} is decoded by zarr"
    if not issubclass(spec.prototype.nd_buffer, cpu.NDBuffer):
        return "non-CPU buffers are decoded by zarr"
    return ""


def build_chain(
    codecs: tuple[Codec, ...], spec: ArraySpec, transform: ChunkTransform
) -> Chain:
    """The chain for an evolved codec list: native if a kernel covers it."""
    reason = _native_bytes_reason(codecs, spec)
    fallback = TransformChain(transform, reason or "native chain declined this chunk")
    if reason:
        return fallback
    return NativeBytesChain(spec, codecs[0], fallback)  # type: ignore[arg-type]
