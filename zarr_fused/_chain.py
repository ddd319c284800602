"""Codec chains of one chunk: native kernels where zarr_fused has them,
zarr's `ChunkTransform` otherwise.

A chain turns stored bytes into a chunk array and back. Every chain offers
the same three operations, so the read and write paths never care which
kind they hold:

``decode(raw, spec)``
    the chunk as an NDBuffer (zarr's ``ChunkTransform.decode_chunk``);
``decode_into(raw, item, out, drop_axes)``
    decode the chunk of a batch item (`zarr_fused._items.ReadItem`, which
    names it in errors) and write its selected part straight into ``out``;
``encode(array, spec)``
    bytes to store, or None when a codec elides the chunk.

`build_chain` recognises the chains the native kernels cover,
``[transpose...] -> bytes -> [numcodecs.shuffle] -> [zstd | gzip | blosc |
numcodecs.gzip | numcodecs.zlib | numcodecs.lz4] with crc32c before or after
the compressor`` (after it only, with a shuffle), for fixed-size data types
on CPU buffers; ``vlen-utf8 | vlen-bytes -> [the same compressors and
checksums]`` are `zarr_fused._vlen_chain`'s. For any other chain it records
why it stays on zarr's code (`zarr_fused._hybrid` then runs what it can of
it natively).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from zarr.codecs.blosc import BloscCodec
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.crc32c_ import Crc32cCodec
from zarr.codecs.gzip import GzipCodec
from zarr.codecs.numcodecs import LZ4 as NumcodecsLZ4
from zarr.codecs.numcodecs import GZip as NumcodecsGZip
from zarr.codecs.numcodecs import Shuffle as NumcodecsShuffle
from zarr.codecs.numcodecs import Zlib as NumcodecsZlib
from zarr.codecs.transpose import TransposeCodec
from zarr.codecs.zstd import ZstdCodec
from zarr.core.buffer import cpu
from zarr.core.dtype.common import HasEndianness
from zarr.core.dtype.npy.structured import Struct

from zarr_fused._batch_chain import BatchChain, StoredBytes
from zarr_fused._items import describe_chunk
from zarr_fused._native import batch_kernels, codec_kernels, scatter_kernels
from zarr_fused._scatter_py import DecodeThenScatter
from zarr_fused._v2 import V2Codec, v2_chain_params, v2_vlen_params
from zarr_fused._vlen_chain import vlen_chain
from zarr_fused._zarr_compat import ChunkTransform, numcodec_inside

if TYPE_CHECKING:
    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

    from zarr_fused._items import ReadItem

__all__ = [
    "Chain",
    "NativeChain",
    "StoredBytes",
    "TransformChain",
    "build_chain",
    "native_chain_params",
    "native_tail",
]

# dtype kinds the native chain stores: fixed-size, no Python objects
NATIVE_KINDS = frozenset("biufcmMSUV")


class Chain(Protocol):
    """``key`` (a byte getter/setter) only names the chunk in errors."""

    native: bool
    #: why this chain is not native ("" for a native chain)
    reason: str

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer: ...

    def decode_into(
        self, raw: Buffer, item: ReadItem, out: NDBuffer, drop_axes: tuple[int, ...]
    ) -> None: ...

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None: ...


class TransformChain(DecodeThenScatter):
    """zarr's own synchronous codec chain."""

    native = False

    def __init__(self, transform: ChunkTransform, reason: str) -> None:
        self.transform = transform
        self.reason = reason

    def decode(self, raw: Buffer, spec: ArraySpec, key: Any = None) -> NDBuffer:
        return self.transform.decode_chunk(raw, spec)

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        return self.transform.encode_chunk(array, spec)


class NativeChain(BatchChain):
    """A codec chain run by `zarr_fused._codecs.ChainKernel`."""

    native = True
    reason = ""

    def __init__(self, spec: ArraySpec, params: dict[str, Any], fallback: TransformChain) -> None:
        self.zdtype = spec.dtype
        self.dtype: np.dtype[Any] = params.pop("dtype")
        self.stored: np.dtype[Any] = params.pop("stored")
        self.order: tuple[int, ...] | None = params.pop("order")
        self.kernel = codec_kernels.ChainKernel(**params)
        self.fallback = fallback
        self._layouts: dict[tuple[int, ...], Any] = {}
        self._lock = threading.Lock()

    def decode_batch(self, capacity: int, ndim: int) -> Any:
        return self.kernel_batch(capacity, ndim)

    def kernel_batch(self, capacity: int, ndim: int, describe: Any = describe_chunk) -> Any:
        return batch_kernels.DecodeBatch(self.kernel, capacity, ndim, describe)

    def encode_batch(
        self,
        capacity: int,
        ndim: int,
        describe: Any = describe_chunk,
        arena: np.ndarray | None = None,
    ) -> Any:
        """An `EncodeBatch`; its results are views into ``arena`` (see there)."""
        return batch_kernels.EncodeBatch(self.kernel, capacity, ndim, describe, arena)

    def encode_bound(self, nbytes: int) -> int:
        """The most bytes a chunk of ``nbytes`` can encode to."""
        return self.kernel.max_encoded_size(nbytes)

    def encode_swap(self, array: np.ndarray) -> bool | None:
        """Whether encoding ``array`` swaps bytes; None when the kernel
        cannot take its data type."""
        if array.dtype == self.stored:
            return False
        if array.dtype == self.dtype:
            return self.kernel.swap_unit != 0
        return None

    def encode(self, array: NDBuffer, spec: ArraySpec, key: Any = None) -> Buffer | None:
        data = array.as_ndarray_like()
        if not self.handles(spec) or type(data) is not np.ndarray or data.shape != spec.shape:
            return self.fallback.encode(array, spec)
        swap = self.encode_swap(data)
        if swap is None:
            return self.fallback.encode(array, spec)
        batch = self.encode_batch(1, data.ndim)
        batch.add(data, self.layout(spec.shape), swap, key)
        (encoded,) = batch.run()
        return spec.prototype.buffer.from_array_like(encoded)


@functools.cache
def _zarr_blosc_compressors() -> frozenset[str]:
    """The blosc compressors zarr itself can use (numcodecs' c-blosc)."""
    from numcodecs import blosc

    return frozenset(blosc.list_compressors())


def _bytes_to_bytes_params(codecs: tuple[Codec, ...], names: str) -> tuple[str, dict[str, Any]]:
    """The kernel parameters of the codecs after ``bytes``: at most one
    compressor, crc32c before and/or after it, a byte shuffle right before
    it; ``(why not, {})`` otherwise."""
    params: dict[str, Any] = {"compressor": None, "outer_crcs": 0, "inner_crcs": 0}
    for codec in codecs:
        # exact types: a subclass may change what the codec does
        if type(codec) is Crc32cCodec:
            params["outer_crcs" if params["compressor"] else "inner_crcs"] += 1
        elif params["compressor"] is not None:
            return f"no native kernel for the codec chain {names}", {}
        elif type(codec) is NumcodecsShuffle:
            # what zarr runs: numcodecs' Shuffle (the element size evolved
            # from the data type when the metadata has none)
            if "byte_shuffle" in params or params["inner_crcs"]:
                return f"no native kernel for the codec chain {names}", {}
            params["byte_shuffle"] = max(numcodec_inside(codec).elementsize, 0)
        elif type(codec) is NumcodecsLZ4:
            params.update(compressor="lz4", acceleration=numcodec_inside(codec).acceleration)
        elif type(codec) is ZstdCodec:
            params.update(compressor="zstd", level=codec.level, checksum=codec.checksum)
        elif type(codec) is GzipCodec:
            params.update(compressor="gzip", level=codec.level)
        elif type(codec) in (NumcodecsGZip, NumcodecsZlib):
            # ``numcodecs.gzip`` / ``numcodecs.zlib``: numcodecs' GZip (what
            # zarr's gzip codec runs too) and Zlib (format 2's zlib kernel)
            numcodec = numcodec_inside(codec)
            kind = "gzip" if type(codec) is NumcodecsGZip else "zlib"
            params.update(compressor=kind, level=numcodec.level)
        elif type(codec) is BloscCodec:
            cname = codec.cname
            if cname not in codec_kernels.library_versions()["blosc_compressors"]:
                return f"the system c-blosc has no {cname} compressor", {}
            if cname not in _zarr_blosc_compressors():
                # zarr refuses it (numcodecs' c-blosc lacks it): so does its code
                return f"zarr's blosc (numcodecs) has no {cname} compressor", {}
            params.update(
                compressor="blosc",
                cname=cname,
                clevel=codec.clevel,
                shuffle=codec.shuffle,
                typesize=codec.typesize,
                blocksize=codec.blocksize,
            )
        else:
            return f"no native kernel for the codec chain {names}", {}
    if params.get("byte_shuffle", 0) > 1 and (params["compressor"] is None or params["inner_crcs"]):
        return f"no native kernel for the codec chain {names} (a shuffle without a compressor)", {}
    if params["compressor"] is None:
        # a crc32c without a compressor protects the stored bytes directly
        params["outer_crcs"], params["inner_crcs"] = params["inner_crcs"], 0
    return "", params


def native_chain_params(codecs: tuple[Codec, ...], spec: ArraySpec) -> tuple[str, dict[str, Any]]:
    """``("", kernel parameters)`` when the native kernels cover ``codecs``
    for ``spec``, else ``(why not, {})``."""
    if scatter_kernels is None or codec_kernels is None:
        return "the compiled extensions are missing", {}
    if len(codecs) == 1 and type(codecs[0]) is V2Codec:  # zarr format 2
        return v2_chain_params(codecs[0], spec, native_chain_params)
    names = " -> ".join(type(c).__name__ for c in codecs)
    order: tuple[int, ...] | None = None
    index = 0
    for codec in codecs:
        if type(codec) is not TransposeCodec:
            break
        order = codec.order if order is None else tuple(order[i] for i in codec.order)
        index += 1
    bytes_codec = codecs[index] if index < len(codecs) else None
    if type(bytes_codec) is not BytesCodec:
        return f"no native kernel for the codec chain {names}", {}
    reason, params = _bytes_to_bytes_params(codecs[index + 1 :], names)
    if reason:
        return reason, {}
    if isinstance(spec.dtype, Struct):
        return "structured data types are decoded by zarr", {}
    dtype = spec.dtype.to_native_dtype()
    shuffle = params.get("byte_shuffle", 0)
    if shuffle > 1 and (math.prod(spec.shape) * dtype.itemsize) % shuffle:
        # numcodecs raises for these chunks: zarr's code does so
        return f"chunks of {spec.shape} {dtype} are not whole {shuffle}-byte elements", {}
    if dtype.kind not in NATIVE_KINDS or dtype.hasobject or dtype.fields is not None:
        return f"data type {spec.dtype} is decoded by zarr", {}
    if not issubclass(spec.prototype.nd_buffer, cpu.NDBuffer):
        return "non-CPU buffers are decoded by zarr", {}
    if isinstance(spec.dtype, HasEndianness):
        stored = replace(spec.dtype, endianness=bytes_codec.endian).to_native_dtype()  # type: ignore[call-arg]
    else:
        stored = dtype
    swap_unit = 0
    if stored != dtype and dtype.itemsize > 1:
        swap_unit = {"c": dtype.itemsize // 2, "U": 4}.get(dtype.kind, dtype.itemsize)
    params.update(
        dtype=dtype, stored=stored, order=order, itemsize=dtype.itemsize, swap_unit=swap_unit
    )
    return "", params


def build_chain(codecs: tuple[Codec, ...], spec: ArraySpec, transform: ChunkTransform) -> Chain:
    """The chain for an evolved codec list: native if the kernels cover it."""
    reason, params = native_chain_params(codecs, spec)
    fallback = TransformChain(transform, reason or "native chain declined this chunk")
    if reason:
        vlen = vlen_chain(codecs, spec, fallback, _bytes_to_bytes_params, v2_vlen_params)
        return vlen or fallback
    return NativeChain(spec, params, fallback)


def native_tail(codecs: tuple[Codec, ...], spec: ArraySpec, reason: str) -> NativeChain | None:
    """The native chain for ``codecs`` run after Python stages (see
    `zarr_fused._hybrid`) on chunks of ``spec``, or None when the kernels do
    not cover them; ``reason`` says why the whole chain is not native."""
    why_not, params = native_chain_params(codecs, spec)
    if why_not:
        return None
    return NativeChain(spec, params, TransformChain(ChunkTransform(codecs=codecs), reason))
