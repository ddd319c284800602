"""Zarr format 2 chunks on the native kernels.

zarr 3 reads and writes a format-2 array through one codec, `V2Codec`: an
optional chain of numcodecs filters, then an optional numcodecs compressor,
over the chunk's bytes in the array's ``order`` ("C" or "F") and in the byte
order of its data type. That is the same stored layout a format-3 chain
``[transpose] -> bytes -> [compressor]`` describes, so this module turns a
`V2Codec` into the kernel parameters `zarr_fused._chain.native_chain_params`
makes for such a chain:

- ``order`` "F" is a transpose that reverses the axes (an F-order chunk's
  bytes are the C-order bytes of its transpose);
- the bytes are stored in the data type's own byte order (a ``>f4`` array
  stores big-endian values and holds them big-endian in memory);
- numcodecs' ``Blosc``, ``Zstd``, ``GZip`` and ``LZ4`` are the kernels the
  format-3 codecs of the same names use (zarr's format-3 codecs call the
  same numcodecs classes); ``Zlib`` is the zlib-format mode of the gzip
  kernel;
- a ``Shuffle`` filter alone before a compressor is the kernel's byte
  shuffle, as format 3's ``numcodecs.shuffle`` before it.

Other filters with a fixed output size (``Delta``, ``FixedScaleOffset``,
``Quantize``, ``BitRound``, ``AsType``, ``Shuffle``) make a hybrid chain
(`zarr_fused._hybrid`): the compressor runs natively over the filtered
bytes, whose size `v2_filtered_layout` derives from the filters'
parameters (the native decompressor insists on it). A ``Shuffle`` last
among them goes into the compressor's kernel as its byte shuffle
(`split_v2_shuffle`); the filters before it run native kernels when each
has one (``Delta``, ``FixedScaleOffset``, ``Quantize``, ``BitRound``,
``AsType`` on the types `zarr_fused._filter_stages` covers; a ``Shuffle``
elsewhere is `V2Shuffle`), in C or F order, and strict mode accepts the
array; else they run zarr's code, and strict mode rejects it.

What stays on zarr's code, per array, with the reason recorded in the plan:

- other filters (``PackBits``, ``Categorize``, ...); a lone ``VLenUTF8``
  or ``VLenBytes`` filter (object strings and bytes) is a vlen chain
  instead (`zarr_fused._vlen_chain`), native with the compressors above;
- every other compressor (``BZ2``, ``LZMA``, ``Zfpy``, ...), subclasses of
  the numcodecs classes, and what `native_chain_params` refuses for format 3
  too (object and structured data types, non-CPU buffers, blosc compressors
  missing from either c-blosc).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from numcodecs.astype import AsType
from numcodecs.bitround import BitRound
from numcodecs.blosc import Blosc
from numcodecs.delta import Delta
from numcodecs.fixedscaleoffset import FixedScaleOffset
from numcodecs.gzip import GZip
from numcodecs.lz4 import LZ4
from numcodecs.quantize import Quantize
from numcodecs.shuffle import Shuffle
from numcodecs.vlen import VLenBytes, VLenUTF8
from numcodecs.zlib import Zlib
from numcodecs.zstd import Zstd
from zarr.codecs.blosc import BloscCodec
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.gzip import GzipCodec
from zarr.codecs.numcodecs import LZ4 as NumcodecsLZ4
from zarr.codecs.transpose import TransposeCodec
from zarr.codecs.zstd import ZstdCodec
from zarr.core.dtype.common import HasEndianness

from zarr_fused._zarr_compat import V2Codec

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.abc.codec import Codec
    from zarr.core.array_spec import ArraySpec

__all__ = [
    "V2Codec",
    "V2Shuffle",
    "compressor_params",
    "split_v2_shuffle",
    "v2_byte_identical",
    "v2_chain_params",
    "v2_filtered_layout",
    "v2_order_kept",
    "v2_vlen_params",
]

#: the object filters of vlen chains, and whether their items are strings
_VLEN_FILTERS: dict[type, bool] = {VLenUTF8: True, VLenBytes: False}

#: numcodecs Blosc's shuffle numbers as the kernel names them (AUTOSHUFFLE,
#: -1, is resolved per item size first, as numcodecs does)
_BLOSC_SHUFFLES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def _codec_id(codec: Any) -> str:
    return str(getattr(codec, "codec_id", type(codec).__name__))


def _blosc_params(compressor: Blosc, itemsize: int) -> tuple[str, dict[str, Any]]:
    """numcodecs' ``blosc.compress`` settings: the type size is the
    codec's own, else the item size of the array; AUTOSHUFFLE is bitshuffle
    for one-byte items and byte shuffle otherwise."""
    typesize = compressor._typesize if getattr(compressor, "_typesize", None) else itemsize
    shuffle = compressor.shuffle
    if shuffle == Blosc.AUTOSHUFFLE:
        shuffle = Blosc.BITSHUFFLE if typesize == 1 else Blosc.SHUFFLE
    if shuffle not in _BLOSC_SHUFFLES:
        return f"zarr format 2 Blosc with shuffle {shuffle} is run by zarr", {}
    return "", {
        "compressor": "blosc",
        "cname": compressor.cname,
        "clevel": compressor.clevel,
        "shuffle": _BLOSC_SHUFFLES[shuffle],
        "typesize": typesize,
        "blocksize": compressor.blocksize,
    }


def compressor_params(compressor: Any, itemsize: int) -> tuple[str, dict[str, Any]]:
    """("", the kernel's compressor settings) or (why not, {})."""
    kind = type(compressor)
    if compressor is None:
        return "", {"compressor": None}
    if kind is Zstd:
        return "", {
            "compressor": "zstd",
            "level": compressor.level,
            "checksum": bool(compressor.checksum),
        }
    if kind is GZip:
        return "", {"compressor": "gzip", "level": compressor.level}
    if kind is Zlib:
        return "", {"compressor": "zlib", "level": compressor.level}
    if kind is Blosc:
        return _blosc_params(compressor, itemsize)
    if kind is LZ4:
        return "", {"compressor": "lz4", "acceleration": compressor.acceleration}
    return f"no native kernel for the zarr format 2 compressor {_codec_id(compressor)!r}", {}


def _filtered_item(f: Any, count: int, itemsize: int) -> tuple[int, int] | None:
    """The element count and item size ``f`` encodes ``count`` items of
    ``itemsize`` bytes to; None for a filter whose output size is not fixed
    by those (or that zarr_fused does not know). numcodecs views its input
    as the filter's own type first (a ``Delta`` after a ``Shuffle`` sees
    the shuffled bytes as its items)."""
    kind = type(f)
    if kind in (Delta, FixedScaleOffset, Quantize):
        source, encoded = np.dtype(f.dtype), np.dtype(f.astype)
    elif kind is AsType:
        source, encoded = np.dtype(f.decode_dtype), np.dtype(f.encode_dtype)
    elif kind is BitRound:
        return count, itemsize  # the same bits, viewed as integers
    elif kind is Shuffle:
        return count * itemsize, 1  # bytes
    else:
        return None
    nbytes = count * itemsize
    if nbytes % source.itemsize:
        return None  # numcodecs' view raises: zarr's code does so
    return nbytes // source.itemsize, encoded.itemsize


def v2_filtered_layout(filters: tuple[Any, ...], spec: ArraySpec) -> tuple[str, int, int]:
    """``("", count, item size)`` of a chunk of ``spec`` after ``filters``
    (the array the compressor receives), or ``(why not, 0, 0)``."""
    dtype = spec.dtype.to_native_dtype()
    if dtype.hasobject:
        return f"data type {spec.dtype} is decoded by zarr", 0, 0
    count, itemsize = math.prod(spec.shape), dtype.itemsize
    for f in filters:
        item = _filtered_item(f, count, itemsize)
        if item is None:
            return f"the zarr format 2 filter {_codec_id(f)!r} has no fixed output size", 0, 0
        count, itemsize = item
    if itemsize not in (1, 2, 4, 8):
        return f"filtered items of {itemsize} bytes are decoded by zarr", 0, 0
    return "", count, itemsize


def layout_codecs(spec: ArraySpec) -> tuple[Codec, ...]:
    """The format-3 array->bytes codecs that store a chunk of ``spec`` as
    `V2Codec` does: a reversing transpose for order "F", then bytes in the
    data type's own byte order."""
    ndim = len(spec.shape)
    codecs: list[Codec] = []
    if spec.order == "F" and ndim > 1:
        codecs.append(TransposeCodec(order=tuple(range(ndim - 1, -1, -1))))
    endian = spec.dtype.endianness if isinstance(spec.dtype, HasEndianness) else None
    codecs.append(BytesCodec(endian=endian))
    return tuple(codecs)


def _shuffle_filter(codec: V2Codec) -> int | None:
    """The element size of a lone ``Shuffle`` filter (the kernel's byte
    shuffle), or None for any other filters or none."""
    filters = codec.filters or ()
    if len(filters) == 1 and type(filters[0]) is Shuffle:
        shuffle: Any = filters[0]  # numcodecs is untyped
        return max(int(shuffle.elementsize), 0)
    return None


def v2_order_kept(filters: tuple[Any, ...]) -> bool:
    """Whether numcodecs ``filters`` hand the compressor an F-order chunk's
    items in F order, the order zarr's `V2Codec` reads them back in.

    `V2Codec` casts the chunk to the array's order; ``Delta``,
    ``FixedScaleOffset`` and ``Shuffle`` flatten it as it is laid out
    (``"A"``), and ``AsType`` and ``Quantize`` keep its layout, but
    ``BitRound`` copies it with ``ndarray.copy()``, which is C order: zarr
    stores the C-order items of such a chunk and reads them back as F order
    (the values come back scrambled). Only zarr's code reproduces that."""
    for f in filters:
        kind = type(f)
        if kind in (Delta, FixedScaleOffset, Shuffle):
            return True
        if kind is BitRound:
            return False
    return True


def split_v2_shuffle(codec: V2Codec) -> tuple[tuple[Any, ...], V2Codec] | None:
    """(the filters before it, a `V2Codec` of the compressor with it) when
    ``codec``'s last filter is a ``Shuffle``: the compressor's kernel
    unshuffles what it decompresses in the same pass, as for a lone
    ``Shuffle``; None for any other last filter or none."""
    filters = tuple(codec.filters or ())
    if not filters or type(filters[-1]) is not Shuffle:
        return None
    return filters[:-1], V2Codec(filters=filters[-1:], compressor=codec.compressor)


class V2Shuffle:
    """numcodecs' ``Shuffle`` on a chunk's filtered items (1-d, contiguous),
    where the compressor's kernel cannot take it (no compressor, or filters
    after it): byte ``j`` of element ``i`` goes to ``j * count + i``, one
    strided NumPy copy (no Python per element, the GIL released). The
    stage interface of `zarr_fused._filter_stages` (``decode_flat``,
    ``encode_flat``); None for what numcodecs refuses (items that are not
    whole elements), which zarr's code then raises about."""

    def __init__(self, elementsize: int) -> None:
        self.elementsize = int(elementsize)

    def _planes(self, data: np.ndarray[Any, Any], encode: bool) -> np.ndarray[Any, Any] | None:
        if not data.flags.c_contiguous:
            return None
        raw = data.reshape(-1).view(np.uint8)
        size = self.elementsize
        if size <= 1 or raw.size == 0:
            return raw  # numcodecs copies the bytes as they are
        if raw.size % size:
            return None
        out = np.empty_like(raw)
        if encode:
            out.reshape(size, -1)[...] = raw.reshape(-1, size).T
        else:
            out.reshape(-1, size)[...] = raw.reshape(size, -1).T
        return out

    def encode_flat(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        return self._planes(data, True)

    def decode_flat(self, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        return self._planes(data, False)


def v2_chain_params(
    codec: V2Codec,
    spec: ArraySpec,
    layout_params: Callable[[tuple[Codec, ...], ArraySpec], tuple[str, dict[str, Any]]],
) -> tuple[str, dict[str, Any]]:
    """``("", kernel parameters)`` when the native kernels cover ``codec``
    for ``spec``, else ``(why not, {})``. ``layout_params`` is
    `native_chain_params`, which checks the data type and buffers and lays
    out the chunk for the format-3 codecs of `layout_codecs`."""
    shuffle = _shuffle_filter(codec)
    if codec.filters and shuffle is None:
        names = ", ".join(_codec_id(f) for f in codec.filters)
        return f"zarr format 2 filters ({names}) are applied by zarr", {}
    reason, params = layout_params(layout_codecs(spec), spec)
    if reason:
        return reason, {}
    # numcodecs' Shuffle hands the compressor bytes (Blosc's type size 1)
    itemsize = params["itemsize"] if shuffle is None else 1
    reason, compressor = compressor_params(codec.compressor, itemsize)
    if reason:
        return reason, {}
    if shuffle is not None and shuffle > 1:
        if compressor["compressor"] is None:
            return "zarr format 2 Shuffle without a compressor is applied by zarr", {}
        if (math.prod(spec.shape) * params["itemsize"]) % shuffle:
            # numcodecs raises for these chunks: zarr's code does so
            return f"chunks of {spec.shape} are not whole {shuffle}-byte elements", {}
        compressor["byte_shuffle"] = shuffle
    if compressor["compressor"] == "blosc":
        # the same checks as a format-3 blosc codec: both c-blosc builds
        stand_in = (
            *layout_codecs(spec),
            BloscCodec(
                cname=compressor["cname"],
                clevel=compressor["clevel"],
                shuffle=compressor["shuffle"],
                typesize=compressor["typesize"],
                blocksize=compressor["blocksize"],
            ),
        )
        reason, _ = layout_params(stand_in, spec)
        if reason:
            return reason, {}
    params.update(compressor)
    return "", params


def v2_vlen_params(
    codec: V2Codec,
    bytes_params: Callable[[tuple[Codec, ...], str], tuple[str, dict[str, Any]]],
) -> tuple[bool, dict[str, Any]] | None:
    """(strings?, kernel parameters) of a chunk whose only filter is
    ``VLenUTF8`` or ``VLenBytes`` and whose compressor has a kernel (the vlen
    filter hands it bytes: item size 1), else None. ``bytes_params`` checks
    a blosc compressor as a format-3 blosc codec
    (`zarr_fused._chain._bytes_to_bytes_params`)."""
    filters = codec.filters or ()
    if len(filters) != 1 or type(filters[0]) not in _VLEN_FILTERS:
        return None
    reason, params = compressor_params(codec.compressor, 1)
    if not reason and params["compressor"] == "blosc":
        stand_in = BloscCodec(
            cname=params["cname"],
            clevel=params["clevel"],
            shuffle=params["shuffle"],
            typesize=params["typesize"],
            blocksize=params["blocksize"],
        )
        reason, _ = bytes_params((stand_in,), "BloscCodec")
    if reason:
        return None
    return _VLEN_FILTERS[type(filters[0])], params


def v2_byte_identical(
    codec: V2Codec, versions: dict[str, Any], identical: Callable[[Codec], bool]
) -> bool:
    """`byte_identical` for a `V2Codec`: its compressor judged as the
    format-3 codec that runs the same kernel (``identical``); Zlib as gzip
    without the header's time stamp. Filters, and compressors zarr's code
    runs, are zarr's own bytes."""
    # a numcodecs codec: numcodecs has no type information, so its attributes
    # are looked up untyped once its exact class is known
    compressor: Any = codec.compressor
    if compressor is None:
        return True
    kind = type(compressor)
    if kind is Zstd:
        return identical(ZstdCodec(level=compressor.level, checksum=bool(compressor.checksum)))
    if kind is GZip:
        return identical(GzipCodec(level=compressor.level))
    if kind is Zlib:
        # levels 1-9 only, as for gzip (see `_codec_identical`)
        return versions["zlib"] == versions["python_zlib"] and 1 <= compressor.level <= 9
    if kind is Blosc:
        return identical(BloscCodec(cname=compressor.cname, clevel=compressor.clevel))
    if kind is LZ4:
        return identical(NumcodecsLZ4(acceleration=compressor.acceleration))
    return True
