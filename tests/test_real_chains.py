"""The codec chains real datasets use, each in strict mode.

One table of chains as climate archives, microscopy and zarr's own docs
write them (filters, serializer, compressors, dtype), format 3 unsharded
and as the inner chain of a shard, and format 2. Every chain is written
(whole, then a partial overwrite, then whole chunks of the fill value) and
read through zarr_fused with ``codec_pipeline.strict`` on, so a chain that
is not native fails with `UnsupportedError`, and through zarr's
`BatchedCodecPipeline`: the stored chunks and shards must be zarr's bytes,
and the values zarr's. Chains that are not native yet are listed in
`NOT_NATIVE`, each with the reason; they are strict xfails, so one that
becomes native fails here until it leaves the list.

The detailed tests of each codec are in their own files (test_filters,
test_sharded_filters, test_lz4_shuffle, test_vlen, test_v2): this file is
the checklist, not the coverage.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.codecs import numcodecs as znc
from zarr.codecs.scale_offset import ScaleOffset
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec
from zarr.core.dtype import VariableLengthBytes

from zarr_fused.errors import CorruptChunkError

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store
from helpers.filter_data import values_of

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}
ORACLE = {"codec_pipeline.path": BATCHED}

SHAPE = (37, 29)  # partial edge chunks on both axes
CHUNKS = (16, 12)
INNER = (8, 6)


def _cast_value(data_type: str) -> Any:
    pytest.importorskip("cast_value_rs")
    from zarr.codecs.cast_value import CastValue

    return CastValue(data_type=data_type, out_of_range="clamp")


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


def _values(case: dict[str, Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    kind = case["values"]
    if kind == "str":
        return _strings(shape, seed)
    if kind == "bytes":
        return _bytes(shape, seed)
    return values_of(kind, case["dtype"], shape, seed)


def _v3(filters: Any, compressors: Any, dtype: str, values: str, fill: Any = 0) -> dict[str, Any]:
    return {
        "format": 3,
        "filters": filters,
        "compressors": compressors,
        "dtype": dtype,
        "values": values,
        "fill": fill,
    }


def _v2(
    filters: Any, compressor: Any, dtype: str, values: str, fill: Any = 0, order: str = "C"
) -> dict[str, Any]:
    return {
        "format": 2,
        "filters": filters,
        "compressors": compressor,
        "dtype": dtype,
        "values": values,
        "fill": fill,
        "order": order,
    }


def _zstd() -> list[Any]:
    return [ZstdCodec(level=3)]


#: a gzip member's header up to its time (magic, deflate, any flags)
_GZIP_HEADER = re.compile(rb"(\x1f\x8b\x08[\x00-\xff])[\x00-\xff]{4}", re.DOTALL)

#: name -> chain; filters and compressors are factories (codecs are made
#: fresh for each array)
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
    "cast_value-f8-i2-zstd": _v3(lambda: [_cast_value("int16")], _zstd, "<f8", "small", fill=7),
    "scale_offset-cast_value-f4-u2-zstd": _v3(
        lambda: [ScaleOffset(offset=-50, scale=100), _cast_value("uint16")],
        _zstd,
        "<f4",
        "small",
        fill=7,
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


def _dtype(case: dict[str, Any]) -> Any:
    return {"str": str, "bytes": VariableLengthBytes()}.get(case["dtype"], case["dtype"])


def _create(store: Any, case: dict[str, Any], sharded: bool) -> Any:
    common: dict[str, Any] = {
        "shape": SHAPE,
        "chunks": CHUNKS,
        "dtype": _dtype(case),
        "fill_value": case["fill"],
    }
    if case["format"] == 2:
        filters = case["filters"]
        return zarr.create_array(
            store,
            zarr_format=2,
            order=case["order"],
            filters=filters() if filters else None,
            compressors=case["compressors"](),
            **common,
        )
    filters = case["filters"]
    if isinstance(filters, str):  # a vlen serializer
        serializer: Any = VLenUTF8Codec() if filters == "vlen-utf8" else VLenBytesCodec()
        filter_codecs: list[Any] = []
    else:
        serializer, filter_codecs = BytesCodec(), filters()
    if sharded:
        inner = ShardingCodec(
            chunk_shape=INNER, codecs=[*filter_codecs, serializer, *case["compressors"]()]
        )
        return zarr.create_array(store, serializer=inner, filters=None, compressors=None, **common)
    return zarr.create_array(
        store,
        serializer=serializer,
        filters=filter_codecs,
        compressors=case["compressors"](),
        **common,
    )


def _write(store: Any, case: dict[str, Any], sharded: bool) -> np.ndarray:
    """Whole, then a partial overwrite, then whole chunks of the fill value
    (not stored); the array read back whole."""
    array = _create(store, case, sharded)
    array[:] = _values(case, SHAPE, 0)
    array[3:8, 6:23] = _values(case, (5, 17), 1)
    array[CHUNKS[0] * 2 :, :] = case["fill"]
    return array[:]


def _without_mtime(stored: bytes) -> bytes:
    """``stored`` with the time in every gzip member's header zeroed (gzip
    writes the clock there, so two runs of one codec differ; a shard holds a
    member per inner chunk)."""
    return _GZIP_HEADER.sub(lambda m: m.group(1) + bytes(4), stored)


def _same_stored(ours: dict[str, bytes], theirs: dict[str, bytes]) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, expected in theirs.items():
        assert _without_mtime(ours[key]) == _without_mtime(expected), key


def _params() -> list[Any]:
    params = []
    for name, case in CHAINS.items():
        for sharded in (False, True) if case["format"] == 3 else (False,):
            marks = []
            reason = NOT_NATIVE.get((name, sharded))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            label = f"{name}-{'sharded' if sharded else 'unsharded'}"
            params.append(pytest.param(name, sharded, id=label, marks=marks))
    return params


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize(("name", "sharded"), _params())
@pytest.mark.parametrize("store_kind", ["local", "memory"])
def test_chain_strict_like_zarr(tmp_path: Path, name: str, sharded: bool, store_kind: str) -> None:
    case = CHAINS[name]
    with zarr.config.set(ORACLE):
        oracle_store = make_store(store_kind, tmp_path, "zarr")
        expected = _write(oracle_store, case, sharded)
    with zarr.config.set(STRICT):
        store = make_store(store_kind, tmp_path, "fused")
        got = _write(store, case, sharded)
        reread = zarr.open_array(store, mode="r")[2:35:3, 1:]
    assert_same_values(got, expected)
    assert_same_values(reread, expected[2:35:3, 1:])
    _same_stored(chunk_items(store), chunk_items(oracle_store))
    # zarr reads what zarr_fused wrote
    with zarr.config.set(ORACLE):
        assert_same_values(zarr.open_array(store, mode="r")[:], expected)


# -- a damaged zlib or gzip chunk ------------------------------------------------
#
# libdeflate reads what it decodes whole and hands the rest to zlib, whose
# error names the chunk (unsharded) or the shard (sharded) that holds it.

#: chain -> the numcodecs codec that writes its streams
DEFLATE_CHAINS = {
    "zlib-i2": lambda: numcodecs.Zlib(level=1),
    "gzip-f4": lambda: numcodecs.GZip(level=5),
    "zarr-gzip-u2": lambda: numcodecs.GZip(level=1),
    "v2-zlib-i2": lambda: numcodecs.Zlib(level=1),
    "v2-gzip-f8-F": lambda: numcodecs.GZip(level=6),
}


def _damage(raw: bytes, how: str, name: str) -> bytes:
    if how == "truncate":
        return raw[: len(raw) // 2]
    if how == "flip":  # the second quarter: stream bytes, before a shard's index
        out = bytearray(raw)
        for i in range(len(out) // 4, len(out) // 2):
            out[i] ^= 0x5A
        return bytes(out)
    # a sound stream of one byte more than the chunk holds
    size = int(np.prod(CHUNKS)) * np.dtype(CHAINS[name]["dtype"]).itemsize + 1
    return bytes(DEFLATE_CHAINS[name]().encode(bytes(size)))


def _deflate_params() -> list[Any]:
    params = []
    for name in DEFLATE_CHAINS:
        shardings = (False, True) if CHAINS[name]["format"] == 3 else (False,)
        for sharded in shardings:
            for how in ("flip",) if sharded else ("truncate", "flip", "longer"):
                label = f"{name}-{'sharded' if sharded else 'unsharded'}-{how}"
                params.append(pytest.param(name, sharded, how, id=label))
    return params


@pytest.mark.parametrize(("name", "sharded", "how"), _deflate_params())
def test_damaged_deflate_chunk_names_its_key(
    tmp_path: Path, name: str, sharded: bool, how: str
) -> None:
    case = CHAINS[name]
    store = make_store("local", tmp_path, "fused")
    with zarr.config.set(STRICT):
        _write(store, case, sharded)
    stored = chunk_items(store)
    key = min(stored)
    (tmp_path / "fused" / key).write_bytes(_damage(stored[key], how, name))
    with zarr.config.set(STRICT), pytest.raises(CorruptChunkError, match=re.escape(key)):
        zarr.open_array(store, mode="r")[:]
