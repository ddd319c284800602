"""The codec chains real datasets use, and the values each one stores.

One catalogue of chains as climate archives, microscopy and zarr's own docs
write them (filters, serializer, compressors, dtype): format 3, each usable
unsharded or as the inner chain of a shard, and format 2.
tests/test_real_chains.py checks every chain in strict mode against zarr's
own pipeline; asv_bench/real_chains_side_by_side.py times every chain's
read. Both take the chains, the values and the arrays from here, so the
table of speed-ups covers exactly the chains the checklist tests.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs.scale_offset import ScaleOffset
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec
from zarr.core.dtype import VariableLengthBytes

#: the module cast_value's codec needs (an optional install)
CAST_VALUE_MODULE = "cast_value_rs"

#: the small geometry the tests check every chain on: partial edge chunks on
#: both axes, and these inner chunks when the chain is a shard's
CHECK_SHAPE = (37, 29)
CHECK_CHUNKS = (16, 12)
CHECK_INNER = (8, 6)


def values_of(kind: str, dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``kind``: ``ints`` (a random walk, what delta is for; non-negative for
    unsigned types), ``temperatures`` (kelvin around 273), ``small`` (two
    decimals in [0, 100), what fixedscaleoffset is for), else wide floats."""
    rng = np.random.default_rng(seed)
    if kind == "ints":
        value = np.cumsum(rng.integers(-5, 6, size=shape), axis=-1)
        if np.dtype(dtype).kind == "u":
            value = np.abs(value)
    elif kind == "temperatures":
        value = 273.15 + 30 * rng.standard_normal(shape)
    elif kind == "small":
        value = rng.uniform(0, 100, size=shape).round(2)
    else:
        value = 1000 * rng.standard_normal(shape)
    return value.astype(dtype)


def _strings(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = ["", "ice", "héllo", "日本語", "x" * 70]
    picks = rng.integers(0, len(words), size=shape)
    return np.array([words[i] + str(j) for j, i in enumerate(picks.flat)]).reshape(shape)


def _bytes(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty(int(np.prod(shape)), dtype=object)
    out[:] = [rng.bytes(int(n)) for n in rng.integers(0, 30, size=out.size)]
    return out.reshape(shape)


def chain_values(case: dict[str, Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values of the kind ``case`` stores, seeded."""
    kind = case["values"]
    if kind == "str":
        return _strings(shape, seed)
    if kind == "bytes":
        return _bytes(shape, seed)
    return values_of(kind, case["dtype"], shape, seed)


def _cast_value(data_type: str) -> Any:
    importlib.import_module(CAST_VALUE_MODULE)
    from zarr.codecs.cast_value import CastValue

    return CastValue(data_type=data_type, out_of_range="clamp")


def _v3(
    filters: Any,
    compressors: Any,
    dtype: str,
    values: str,
    fill: Any = 0,
    requires: str | None = None,
) -> dict[str, Any]:
    return _chain(3, filters, compressors, dtype, values, fill, requires=requires)


def _v2(
    filters: Any, compressor: Any, dtype: str, values: str, fill: Any = 0, order: str = "C"
) -> dict[str, Any]:
    return _chain(2, filters, compressor, dtype, values, fill, requires=None, order=order)


def _chain(
    zarr_format: int,
    filters: Any,
    compressors: Any,
    dtype: str,
    values: str,
    fill: Any,
    **more: Any,
) -> dict[str, Any]:
    return {
        "format": zarr_format,
        "filters": filters,
        "compressors": compressors,
        "dtype": dtype,
        "values": values,
        "fill": fill,
        **more,
    }


def _zstd() -> list[Any]:
    return [ZstdCodec(level=3)]


#: name -> chain; filters and compressors are factories (codecs are made
#: fresh for each array); ``requires`` names a module the chain's codecs
#: need that may not be installed
CHAINS: dict[str, dict[str, Any]] = {
    # format 3
    "bitround-f4-zstd": _v3(lambda: [znc.BitRound(keepbits=10)], _zstd, "<f4", "floats"),
    "fixedscaleoffset-f8-i2-zstd": _v3(
        lambda: [znc.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")],
        _zstd,
        "<f8",
        "temperatures",
        fill=7,
    ),
    "delta-i4-zstd": _v3(lambda: [znc.Delta(dtype="<i4")], _zstd, "<i4", "ints", fill=-1),
    "delta-f8-astype-f4-zstd": _v3(
        lambda: [znc.Delta(dtype="<f8", astype="<f4")], _zstd, "<f8", "floats"
    ),
    "quantize-f4-zstd": _v3(lambda: [znc.Quantize(digits=3, dtype="<f4")], _zstd, "<f4", "floats"),
    "quantize-f8-astype-f4-zstd": _v3(
        lambda: [znc.Quantize(digits=2, dtype="<f8", astype="<f4")], _zstd, "<f8", "floats"
    ),
    "astype-f8-f4-zstd": _v3(
        lambda: [znc.AsType(encode_dtype="<f4", decode_dtype="<f8")], _zstd, "<f8", "floats"
    ),
    "shuffle-zstd-f4": _v3(
        list, lambda: [znc.Shuffle(elementsize=4), ZstdCodec(level=1)], "<f4", "floats"
    ),
    "shuffle-lz4-u2": _v3(list, lambda: [znc.Shuffle(), znc.LZ4()], "<u2", "ints"),
    "lz4-u2": _v3(list, lambda: [znc.LZ4()], "<u2", "ints"),
    "lz4-crc32c-i2": _v3(list, lambda: [znc.LZ4(), Crc32cCodec()], "<i2", "ints"),
    "zlib-i2": _v3(list, lambda: [znc.Zlib(level=1)], "<i2", "ints"),
    "gzip-f4": _v3(list, lambda: [znc.GZip(level=5)], "<f4", "floats"),
    "zarr-gzip-u2": _v3(list, lambda: [GzipCodec(level=1)], "<u2", "ints"),
    "scale_offset-f4-zstd": _v3(
        lambda: [ScaleOffset(offset=10, scale=4)], _zstd, "<f4", "small", fill=np.nan
    ),
    "scale_offset-i4-zstd": _v3(
        lambda: [ScaleOffset(offset=100, scale=2)], _zstd, "<i4", "ints", fill=0
    ),
    "cast_value-f8-i2-zstd": _v3(
        lambda: [_cast_value("int16")],
        _zstd,
        "<f8",
        "small",
        fill=7,
        requires=CAST_VALUE_MODULE,
    ),
    "scale_offset-cast_value-f4-u2-zstd": _v3(
        lambda: [ScaleOffset(offset=-50, scale=100), _cast_value("uint16")],
        _zstd,
        "<f4",
        "small",
        fill=7,
        requires=CAST_VALUE_MODULE,
    ),
    "transpose-quantize-f8-zstd": _v3(
        lambda: [TransposeCodec(order=(1, 0)), znc.Quantize(digits=4, dtype="<f8")],
        _zstd,
        "<f8",
        "floats",
    ),
    "vlen-utf8-zstd": _v3("vlen-utf8", _zstd, "str", "str", fill=""),
    "vlen-bytes-zstd": _v3("vlen-bytes", _zstd, "bytes", "bytes", fill=b""),
    # format 2
    "v2-delta-i4-blosc": _v2(
        lambda: [numcodecs.Delta(dtype="<i4")], lambda: numcodecs.Blosc("lz4", 5), "<i4", "ints"
    ),
    "v2-fixedscaleoffset-f8-i2-zstd": _v2(
        lambda: [numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")],
        lambda: numcodecs.Zstd(level=3),
        "<f8",
        "temperatures",
    ),
    "v2-fixedscaleoffset-f8-i2-zstd-F": _v2(
        lambda: [numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")],
        lambda: numcodecs.Zstd(level=3),
        "<f8",
        "temperatures",
        order="F",
    ),
    "v2-quantize-f4-zlib": _v2(
        lambda: [numcodecs.Quantize(digits=3, dtype="<f4")],
        lambda: numcodecs.Zlib(level=1),
        "<f4",
        "floats",
    ),
    "v2-bitround-f4-blosc": _v2(
        lambda: [numcodecs.BitRound(keepbits=10)],
        lambda: numcodecs.Blosc("zstd", 3, 1),
        "<f4",
        "floats",
    ),
    "v2-shuffle-lz4": _v2(lambda: [numcodecs.Shuffle(elementsize=2)], numcodecs.LZ4, "<u2", "ints"),
    "v2-delta-shuffle-zstd": _v2(
        lambda: [numcodecs.Delta(dtype="<i4"), numcodecs.Shuffle(elementsize=4)],
        lambda: numcodecs.Zstd(level=1),
        "<i4",
        "ints",
    ),
    "v2-astype-f8-f4-zstd": _v2(
        lambda: [numcodecs.AsType(encode_dtype="<f4", decode_dtype="<f8")],
        lambda: numcodecs.Zstd(level=1),
        "<f8",
        "floats",
    ),
    "v2-delta-astype-gzip": _v2(
        lambda: [
            numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4"),
            numcodecs.Delta(dtype="<i4", astype="<i2"),
        ],
        lambda: numcodecs.GZip(level=5),
        "<f8",
        "small",
    ),
    "v2-lz4-f8": _v2(None, numcodecs.LZ4, "<f8", "floats"),
    "v2-zlib-i2": _v2(None, lambda: numcodecs.Zlib(level=1), "<i2", "ints"),
    "v2-gzip-f8-F": _v2(None, lambda: numcodecs.GZip(level=6), "<f8", "floats", order="F"),
    "v2-fixedscaleoffset-shuffle-zlib-F": _v2(
        lambda: [
            numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2"),
            numcodecs.Shuffle(elementsize=2),
        ],
        lambda: numcodecs.Zlib(level=1),
        "<f8",
        "temperatures",
        order="F",
    ),
    "v2-vlen-utf8-zstd": _v2(
        lambda: [numcodecs.VLenUTF8()], lambda: numcodecs.Zstd(level=1), "str", "str", fill=""
    ),
    "v2-vlen-bytes-zstd": _v2(
        lambda: [numcodecs.VLenBytes()], lambda: numcodecs.Zstd(level=1), "bytes", "bytes", fill=b""
    ),
}

#: (chain name, sharded) -> why zarr_fused still runs zarr's code for it
NOT_NATIVE: dict[tuple[str, bool], str] = {
    **{
        ("quantize-f8-astype-f4-zstd", sharded): "zarr 3.4.2 cannot read it back either (no kernel)"
        for sharded in (False, True)
    },
}


def shardings(case: dict[str, Any]) -> tuple[bool, ...]:
    """The layouts a chain comes in: format 3 unsharded and sharded, format 2
    unsharded only."""
    return (False, True) if case["format"] == 3 else (False,)


def _dtype(case: dict[str, Any]) -> Any:
    return {"str": str, "bytes": VariableLengthBytes()}.get(case["dtype"], case["dtype"])


def create_chain_array(
    store: Any,
    case: dict[str, Any],
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    inner: tuple[int, ...] | None = None,
) -> Any:
    """An empty array of chain ``case`` in ``store``: in chunks of
    ``chunks``, or, given ``inner`` (format 3 only), in shards of ``chunks``
    whose inner chunks of ``inner`` carry the whole chain."""
    common: dict[str, Any] = {
        "shape": shape,
        "chunks": chunks,
        "dtype": _dtype(case),
        "fill_value": case["fill"],
    }
    filters = case["filters"]
    if case["format"] == 2:
        return zarr.create_array(
            store,
            zarr_format=2,
            order=case["order"],
            filters=filters() if filters else None,
            compressors=case["compressors"](),
            **common,
        )
    if isinstance(filters, str):  # a vlen serializer
        serializer: Any = VLenUTF8Codec() if filters == "vlen-utf8" else VLenBytesCodec()
        filter_codecs: list[Any] = []
    else:
        serializer, filter_codecs = BytesCodec(), filters()
    if inner is not None:
        sharding = ShardingCodec(
            chunk_shape=inner, codecs=[*filter_codecs, serializer, *case["compressors"]()]
        )
        return zarr.create_array(
            store, serializer=sharding, filters=None, compressors=None, **common
        )
    return zarr.create_array(
        store,
        serializer=serializer,
        filters=filter_codecs,
        compressors=case["compressors"](),
        **common,
    )


#: one chain of each kernel family (filter, compressor, serializer, format
#: 2), the subset the storage tests (tests/test_chains_storage.py) run on
#: S3 and zip stores, where every chain of `CHAINS` would take minutes
KERNEL_FAMILIES: dict[str, str] = {
    "bitround": "bitround-f4-zstd",
    "fixedscaleoffset": "fixedscaleoffset-f8-i2-zstd",
    "delta": "delta-i4-zstd",
    "quantize": "quantize-f4-zstd",
    "shuffle": "shuffle-zstd-f4",
    "lz4": "lz4-crc32c-i2",
    "deflate": "gzip-f4",
    "scale_offset": "scale_offset-f4-zstd",
    "cast_value": "scale_offset-cast_value-f4-u2-zstd",
    "vlen": "vlen-utf8-zstd",
    "v2": "v2-delta-i4-blosc",
}

#: a gzip member's header up to its time (magic, deflate, any flags)
_GZIP_HEADER = re.compile(rb"(\x1f\x8b\x08[\x00-\xff])[\x00-\xff]{4}", re.DOTALL)


def without_gzip_mtime(stored: bytes) -> bytes:
    """``stored`` with the time in every gzip member's header zeroed: gzip
    writes the clock there, so two writes of one chunk a second apart
    differ (a shard holds a member per inner chunk)."""
    return _GZIP_HEADER.sub(lambda m: m.group(1) + bytes(4), stored)
