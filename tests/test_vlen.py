"""Variable-length strings and bytes on the native kernels (`zarr_fused._vlen`,
`zarr_fused._vlen_chain`).

zarr's own pipeline (`BatchedCodecPipeline`) is the oracle: every array is
written and read through both, and values and stored chunks must agree byte
for byte. Native cases run in strict mode, so a silent fallback to zarr's
code fails them. Corrupt frames (truncated, lying counts, invalid UTF-8)
must raise a clear error naming the chunk, never crash.
"""

from __future__ import annotations

import functools
import struct
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.dtype import VariableLengthBytes
from zarr.testing.strategies import basic_indices
from zarr_fused_testing.chains import CHAINS, create_chain_array

from zarr_fused._native import codec_kernels, vlen_kernels
from zarr_fused._native_gate import NativeOrFallback
from zarr_fused._vlen_chain import VlenChain
from zarr_fused.errors import ChunkSizeError, CorruptChunkError, UnsupportedError

from helpers import (
    BATCHED,
    FUSED,
    STRICT,
    assert_same_read,
    assert_same_values,
    chunk_items,
    make_store,
    read_both,
    with_pipeline,
)
from helpers.gil import spins_during

pytestmark = [
    pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning"),
    pytest.mark.skipif(vlen_kernels is None, reason="compiled extensions missing"),
]


V3_COMPRESSORS = {
    "none": None,
    "zstd": ZstdCodec(level=3),
    "zstd-checksum": ZstdCodec(level=1, checksum=True),
    "gzip": GzipCodec(level=5),
    "blosc-lz4": BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"),
    "blosc-zstd": BloscCodec(cname="zstd", clevel=3, shuffle="noshuffle"),
    "zstd-crc32c": [ZstdCodec(level=1), Crc32cCodec()],
    "crc32c-gzip": [Crc32cCodec(), GzipCodec(level=1)],
    "crc32c": Crc32cCodec(),
}
V2_COMPRESSORS = {
    "none": None,
    "zstd": numcodecs.Zstd(level=1),
    "gzip": numcodecs.GZip(level=6),
    "zlib": numcodecs.Zlib(level=1),
    "blosc-auto": numcodecs.Blosc("lz4", 5, -1),
    "blosc-shuffle": numcodecs.Blosc("zstd", 3, 1),
}

WORDS = ["", "a", "héllo", "日本語", "emoji 🎉🐍", "x" * 300, "tab\tnl\n", "\x00nul"]


def _strings(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(WORDS), size=shape)
    return np.array([WORDS[i] + str(j) for j, i in enumerate(picks.flat)]).reshape(shape)


def _bytes(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flat = [rng.bytes(int(n)) for n in rng.integers(1, 40, size=int(np.prod(shape)))]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _create(store: Any, fmt: int, compressor: Any, kind: str, **kwargs: Any) -> zarr.Array:
    dtype: Any = str if kind == "str" else VariableLengthBytes()
    fill = kwargs.pop("fill_value", "" if kind == "str" else b"")
    return zarr.create_array(
        store,
        shape=kwargs.pop("shape", (7, 5)),
        chunks=kwargs.pop("chunks", (3, 2)),
        dtype=dtype,
        zarr_format=fmt,
        compressors=compressor,
        fill_value=fill,
        **kwargs,
    )


def _side_by_side(
    tmp_path: Path,
    store_kind: str,
    fmt: int,
    compressor: Any,
    kind: str,
    value: np.ndarray,
    selection: Any = ...,
    **kwargs: Any,
) -> tuple[zarr.Array, np.ndarray, np.ndarray, dict[str, bytes], dict[str, bytes]]:
    """Write ``value`` into ``selection`` with zarr_fused (strict) and zarr;
    both arrays read back whole; their stored chunks."""
    results = []
    for name, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        store = make_store(store_kind, tmp_path, name)
        with zarr.config.set(config):
            array = _create(store, fmt, compressor, kind, **dict(kwargs))
            array[selection] = value
            got = array[...]
        if store_kind == "zip":
            store.close()
            store = zarr.storage.ZipStore(tmp_path / f"{name}.zip", mode="r")
        results.append((array, got, chunk_items(store)))
    (fused, got, fused_chunks), (_, expected, zarr_chunks) = results
    return fused, got, expected, fused_chunks, zarr_chunks


def _without_mtime(chunks: dict[str, bytes]) -> dict[str, bytes]:
    """The chunks with a gzip header's MTIME zeroed: Python's gzip (zarr's)
    writes the time there, zarr_fused writes 0 ("no time stamp")."""
    return {
        k: v[:4] + b"\0\0\0\0" + v[8:] if v[:3] == b"\x1f\x8b\x08" else v for k, v in chunks.items()
    }


@pytest.mark.parametrize("store_kind", ["memory", "local", "zip"])
@pytest.mark.parametrize("kind", ["str", "bytes"])
@pytest.mark.parametrize("compressor", list(V3_COMPRESSORS))
def test_v3_same_values_and_bytes(
    tmp_path: Path, store_kind: str, kind: str, compressor: str
) -> None:
    value = _strings((7, 5)) if kind == "str" else _bytes((7, 5))
    array, got, expected, fused_chunks, zarr_chunks = _side_by_side(
        tmp_path, store_kind, 3, V3_COMPRESSORS[compressor], kind, value
    )
    assert isinstance(array._async_array.codec_pipeline.plan.chain, VlenChain)
    assert_same_values(got, expected)
    assert_same_values(got, value.astype(got.dtype))
    assert _without_mtime(fused_chunks) == _without_mtime(zarr_chunks)
    assert len(fused_chunks) == 9  # the edge chunks are partial


@pytest.mark.parametrize("store_kind", ["memory", "local", "zip"])
@pytest.mark.parametrize("kind", ["str", "bytes"])
@pytest.mark.parametrize("compressor", list(V2_COMPRESSORS))
def test_v2_same_values_and_bytes(
    tmp_path: Path, store_kind: str, kind: str, compressor: str
) -> None:
    value = _strings((7, 5), 1) if kind == "str" else _bytes((7, 5), 1)
    array, got, expected, fused_chunks, zarr_chunks = _side_by_side(
        tmp_path, store_kind, 2, V2_COMPRESSORS[compressor], kind, value
    )
    assert isinstance(array._async_array.codec_pipeline.plan.chain, VlenChain)
    assert_same_values(got, expected)
    assert _without_mtime(fused_chunks) == _without_mtime(zarr_chunks)


@pytest.mark.parametrize("order", ["C", "F"])
def test_v2_order_f_frames_in_array_order(tmp_path: Path, order: str) -> None:
    """Format 2 frames the items in the array's order."""
    value = _strings((6, 4), 2)
    _, got, expected, fused_chunks, zarr_chunks = _side_by_side(
        tmp_path, "memory", 2, None, "str", value, chunks=(3, 4), shape=(6, 4), order=order
    )
    assert_same_values(got, expected)
    assert fused_chunks == zarr_chunks


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("fill", ["", "fill ✓"])
@pytest.mark.parametrize("write_empty", [True, False])
def test_fill_values_and_missing_chunks(
    tmp_path: Path, fmt: int, fill: str, write_empty: bool
) -> None:
    """A partial write: the untouched chunks are missing and read as the fill
    value; with ``write_empty_chunks`` off, a chunk all fill is not stored."""
    value = np.array([[fill, "b"], [fill, fill]])
    _, got, expected, fused_chunks, zarr_chunks = _side_by_side(
        tmp_path,
        "local",
        fmt,
        ZstdCodec(level=1) if fmt == 3 else numcodecs.Zstd(level=1),
        "str",
        value,
        selection=(slice(0, 2), slice(2, 4)),
        fill_value=fill,
        config={"write_empty_chunks": write_empty},
    )
    assert_same_values(got, expected)
    assert got[0, 3] == "b" and got[6, 4] == fill
    assert fused_chunks == zarr_chunks


@pytest.mark.parametrize("fmt", [2, 3])
def test_all_fill_chunk_elided(tmp_path: Path, fmt: int) -> None:
    value = np.full((3, 2), "z")
    _, got, expected, fused_chunks, zarr_chunks = _side_by_side(
        tmp_path,
        "memory",
        fmt,
        None,
        "str",
        value,
        selection=(slice(0, 3), slice(0, 2)),
        fill_value="z",
        config={"write_empty_chunks": False},
    )
    assert_same_values(got, expected)
    assert fused_chunks == zarr_chunks == {}


@pytest.mark.parametrize("fmt", [2, 3])
def test_selections_read_like_zarr(tmp_path: Path, fmt: int) -> None:
    value = _strings((7, 5), 3)
    store = make_store("memory", tmp_path)
    with zarr.config.set(STRICT):
        array = _create(store, fmt, None, "str")
        array[...] = value
        got = [array[1:6, 1], array[::2, 1:], array.oindex[[0, 6], [1, 4]], array[4]]
    with with_pipeline(BATCHED):
        zarr_array = zarr.open_array(store, mode="r")
        expected = [
            zarr_array[1:6, 1],
            zarr_array[::2, 1:],
            zarr_array.oindex[[0, 6], [1, 4]],
            zarr_array[4],
        ]
    for g, e in zip(got, expected, strict=True):
        assert_same_values(g, e)


@pytest.mark.parametrize("fmt", [2, 3])
def test_surrogates_rejected_as_zarr_rejects_them(fmt: int) -> None:
    errors = []
    for config in (STRICT, {"codec_pipeline.path": BATCHED}):
        with zarr.config.set(config):
            array = _create(zarr.storage.MemoryStore(), fmt, None, "str")
            with pytest.raises(UnicodeEncodeError) as info:
                array[0, :] = np.array(["a", "\ud800", "b", "c", "d"], dtype=object)
            errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_sharded_falls_back_with_a_reason(tmp_path: Path) -> None:
    """Sharded vlen arrays whose inner compressor has no kernel keep zarr's
    sharding codec (the others are native: `test_sharded_vlen`): the values
    are zarr's, and strict mode says why it refuses them."""
    value = _strings((8, 4), 4)
    store = make_store("memory", tmp_path)
    with with_pipeline(FUSED):
        array = zarr.create_array(
            store,
            shape=(8, 4),
            chunks=(2, 2),
            shards=(4, 4),
            dtype=str,
            compressors=[znc.BZ2(level=1)],
        )
        assert "inner chunks" in array._async_array.codec_pipeline.plan.fallback
        array[...] = value
        got = array[...]
    with with_pipeline(BATCHED):
        expected = zarr.open_array(store, mode="r")[...]
    assert_same_values(got, expected)
    with zarr.config.set(STRICT), pytest.raises(UnsupportedError, match="natively"):
        zarr.open_array(store, mode="r")[...]


# -- corrupt stored chunks -----------------------------------------------------------


def _frame(items: list[bytes], count: int | None = None) -> bytes:
    body = b"".join(struct.pack("<I", len(b)) + b for b in items)
    return struct.pack("<I", len(items) if count is None else count) + body


CORRUPT_FRAMES = [
    pytest.param(b"", "cannot hold its 4-byte item count", id="empty"),
    pytest.param(b"\x06\x00", "cannot hold its 4-byte item count", id="short-header"),
    pytest.param(_frame([b"ab"] * 6)[:-1], "runs past the frame's end", id="truncated-item"),
    pytest.param(_frame([b"ab"] * 5, count=6) + b"\x02\x00", "runs past", id="truncated-length"),
    pytest.param(_frame([b"ab"] * 6, count=5), "holds 5 items, the chunk has 6", id="few"),
    pytest.param(_frame([b"ab"] * 6, count=2**32 - 1), "holds 4294967295 items", id="lying"),
    pytest.param(_frame([b"ab"] * 5, count=6) + b"\xff" * 8, "runs past", id="huge-length"),
    pytest.param(
        _frame([b"ab"] * 5 + [b"\xff\xfe"]),
        "item 5 of the vlen-utf8 frame is not UTF-8",
        id="invalid-utf8",
    ),
    pytest.param(_frame([b"ab"] * 5 + [b"\xed\xa0\x80"]), "not UTF-8", id="encoded-surrogate"),
]


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize(("frame", "message"), CORRUPT_FRAMES)
def test_corrupt_frame_names_the_key(fmt: int, frame: bytes, message: str) -> None:
    """zarr raises ValueError (or UnicodeDecodeError, a ValueError) for these,
    or reads past nothing; zarr_fused raises a `CorruptChunkError` naming the
    chunk."""
    store = zarr.storage.MemoryStore()
    with zarr.config.set(STRICT):
        array = _create(store, fmt, None, "str", shape=(3, 2), chunks=(3, 2))
        array[...] = np.full((3, 2), "ok")
        (key,) = chunk_items(store)
        store._store_dict[key] = zarr.core.buffer.cpu.Buffer.from_bytes(frame)
        with pytest.raises(CorruptChunkError, match=message) as info:
            array[...]
    assert repr(key.rsplit("/", 1)[-1]) in str(info.value) or key in str(info.value)
    # zarr: ValueError (UnicodeDecodeError is one), or MemoryError for the
    # count that lies (numcodecs allocates that many objects first)
    with with_pipeline(BATCHED), pytest.raises((ValueError, MemoryError)):
        zarr.open_array(store, mode="r")[...]


def test_trailing_bytes_ignored_as_numcodecs_does() -> None:
    frame = _frame([b"ab", b"c"]) + b"extra"
    kernel = codec_kernels.ChainKernel()
    got = vlen_kernels.decode(kernel, frame, 2, True)
    assert list(got) == list(numcodecs.VLenUTF8().decode(frame)) == ["ab", "c"]


def test_corrupt_compressed_payload() -> None:
    kernel = codec_kernels.ChainKernel(compressor="zstd", level=1)
    payload = numcodecs.Zstd(1).encode(_frame([b"abc"] * 100))
    with pytest.raises(CorruptChunkError, match="chunk 'k'"):
        vlen_kernels.decode(kernel, payload[:-3], 100, True, "chunk 'k'")


def test_zstd_size_claim_that_lies_is_refused() -> None:
    """A frame header claiming far more than any payload expands to is an
    error, not an allocation."""
    kernel = codec_kernels.ChainKernel(compressor="zstd", level=1)
    payload = bytearray(numcodecs.Zstd(1).encode(_frame([b"abc"] * 3)))
    # a single-segment frame with an 8-byte content size field
    frame = bytearray(b"\x28\xb5\x2f\xfd\xe0") + struct.pack("<Q", 2**50) + payload[6:]
    with pytest.raises(ChunkSizeError):
        vlen_kernels.decode(kernel, bytes(frame), 3, True)


# -- the kernels against numcodecs ---------------------------------------------------

# kernel parameters, the numcodecs compressor zarr runs, whether zarr_fused
# writes its bytes (numcodecs' GZip writes the time into the gzip header)
KERNELS: dict[str, tuple[dict[str, Any], Any, bool]] = {
    "none": ({}, None, True),
    "zstd": ({"compressor": "zstd", "level": 1}, numcodecs.Zstd(1), True),
    "gzip": ({"compressor": "gzip", "level": 1}, numcodecs.GZip(1), False),
    "zlib": ({"compressor": "zlib", "level": 1}, numcodecs.Zlib(1), True),
    "blosc": (
        {"compressor": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "bitshuffle"},
        numcodecs.Blosc("lz4", 5, 2),
        True,
    ),
}


def _numcodecs_stored(values: np.ndarray, utf8: bool, compressor: Any) -> bytes:
    frame = (numcodecs.VLenUTF8() if utf8 else numcodecs.VLenBytes()).encode(values)
    return bytes(frame) if compressor is None else bytes(compressor.encode(frame))


def _check_like_numcodecs(items: list[Any], utf8: bool, kernel: str) -> None:
    params, compressor, identical = KERNELS[kernel]
    k = codec_kernels.ChainKernel(**params)
    values = np.empty(len(items), dtype=object)
    values[:] = items
    encoded = vlen_kernels.encode(k, values, utf8)
    stored = _numcodecs_stored(values, utf8, compressor)
    if identical:
        assert bytes(encoded) == stored
    assert list(vlen_kernels.decode(k, stored, len(items), utf8)) == items
    assert list(vlen_kernels.decode(k, encoded, len(items), utf8)) == items


@pytest.mark.parametrize(
    "utf8", [pytest.param(True, id="strings"), pytest.param(False, id="bytes")]
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kernel=st.sampled_from(list(KERNELS)))
def test_items_like_numcodecs(utf8: bool, data: st.DataObject, kernel: str) -> None:
    item = st.text(max_size=40) if utf8 else st.binary(max_size=40)
    items = data.draw(st.lists(item, max_size=60), label="items")
    _check_like_numcodecs(items, utf8, kernel)


@pytest.mark.parametrize("members", [1, 3])
def test_gzip_without_a_usable_size_trailer(members: int) -> None:
    """Several gzip members (whose last ISIZE is not the total) and zlib
    streams (which have none) decode by growing the output."""
    frame = _frame([b"word"] * 500)
    third = len(frame) // 3
    parts = (
        [frame] if members == 1 else [frame[:third], frame[third : 2 * third], frame[2 * third :]]
    )
    payload = b"".join(zlib.compress(p, wbits=31) for p in parts)
    kernel = codec_kernels.ChainKernel(compressor="gzip", level=1)
    assert list(vlen_kernels.decode(kernel, payload, 500, False)) == [b"word"] * 500
    kernel = codec_kernels.ChainKernel(compressor="zlib", level=1)
    payload = zlib.compress(_frame([b"x" * 1000] * 300), 9)  # compresses far below 1/4
    assert list(vlen_kernels.decode(kernel, payload, 300, False)) == [b"x" * 1000] * 300


def test_encode_normalises_none_and_zero_like_numcodecs() -> None:
    values = np.array([None, 0, "a"], dtype=object)
    k = codec_kernels.ChainKernel()
    assert bytes(vlen_kernels.encode(k, values, True)) == bytes(numcodecs.VLenUTF8().encode(values))
    with pytest.raises(TypeError, match="expected unicode string"):
        vlen_kernels.encode(k, np.array([b"a"], dtype=object), True)
    with pytest.raises(TypeError, match="expected byte string"):
        vlen_kernels.encode(k, np.array(["a"], dtype=object), False)


@pytest.mark.parametrize("size", ["exact", "larger"])
def test_decode_into_out(size: str) -> None:
    k = codec_kernels.ChainKernel()
    out = np.empty(3 if size == "exact" else 5, dtype=object)
    got = vlen_kernels.decode(k, _frame([b"a", b"b", b"c"]), 3, False, out=out)
    assert got.base is out or got is out
    assert list(out[:3]) == [b"a", b"b", b"c"]


def test_decode_out_too_small_or_wrong_type() -> None:
    k = codec_kernels.ChainKernel()
    with pytest.raises(ValueError, match="2 items, 3 needed"):
        vlen_kernels.decode(k, _frame([b"a"] * 3), 3, False, out=np.empty(2, dtype=object))
    with pytest.raises(TypeError):
        vlen_kernels.decode(k, _frame([b"a"] * 3), 3, False, out=np.empty(3, dtype=np.int64))


@pytest.mark.parametrize(
    ("kind", "compressors"),
    [
        pytest.param("str", [GzipCodec(), Crc32cCodec()], id="utf8-gzip-crc32c"),
        pytest.param("bytes", [Crc32cCodec(), ZstdCodec()], id="bytes-crc32c-zstd"),
    ],
)
def test_plan_accepts_vlen_chains_in_strict_mode(kind: str, compressors: Any) -> None:
    serializer = VLenUTF8Codec() if kind == "str" else VLenBytesCodec()
    value = _strings((4,)) if kind == "str" else _bytes((4,))
    with zarr.config.set(STRICT):
        array = _create(
            zarr.storage.MemoryStore(),
            3,
            compressors,
            kind,
            shape=(4,),
            chunks=(2,),
            serializer=serializer,
        )
        plan = array._async_array.codec_pipeline.plan
        assert plan.fallback == ""
        assert isinstance(plan.chain, VlenChain)
        array[...] = value
        got = array[...]
    assert_same_values(got, value.astype(got.dtype))


def test_unknown_compressor_keeps_zarr_code() -> None:
    with with_pipeline(FUSED):
        array = zarr.create_array(
            zarr.storage.MemoryStore(),
            shape=(4,),
            chunks=(2,),
            dtype=str,
            zarr_format=2,
            compressors=numcodecs.BZ2(1),
        )
        plan = array._async_array.codec_pipeline.plan
    assert not isinstance(plan.chain, VlenChain)
    assert "vlen-utf8" in plan.fallback


# -- StringDType arrays straight to and from the frame --------------------------------

STRING = np.dtypes.StringDType()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(st.text(max_size=40), max_size=60),
    kernel=st.sampled_from(list(KERNELS)),
)
def test_string_arrays_like_numcodecs(items: list[str], kernel: str) -> None:
    params, compressor, identical = KERNELS[kernel]
    k = codec_kernels.ChainKernel(**params)
    values = np.array(items, dtype=STRING)
    encoded = vlen_kernels.encode_strings(k, values)
    objects = np.empty(len(items), dtype=object)
    objects[:] = items
    stored = _numcodecs_stored(objects, True, compressor)
    if identical:
        assert bytes(encoded) == stored
    for payload in (stored, encoded):
        out = np.empty(len(items), dtype=STRING)
        vlen_kernels.decode_strings(k, payload, out)
        assert out.tolist() == items


@settings(max_examples=300, deadline=None)
@given(item=st.binary(max_size=12))
def test_utf8_check_is_pythons(item: bytes) -> None:
    """A stored item is refused exactly when Python's strict UTF-8 decoder
    (what numcodecs runs) refuses it."""
    k = codec_kernels.ChainKernel()
    out = np.empty(2, dtype=STRING)
    try:
        text = item.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(CorruptChunkError, match="item 1 of the vlen-utf8 frame is not UTF-8"):
            vlen_kernels.decode_strings(k, _frame([b"ok", item]), out, "chunk 'k'")
    else:
        vlen_kernels.decode_strings(k, _frame([b"ok", item]), out, "chunk 'k'")
        assert out.tolist() == ["ok", text]


def test_decode_strings_checks_out() -> None:
    k = codec_kernels.ChainKernel()
    with pytest.raises(TypeError, match="StringDType"):
        vlen_kernels.decode_strings(k, _frame([b"a"]), np.empty(1, dtype=object))
    with pytest.raises(CorruptChunkError, match="holds 1 items, the chunk has 2"):
        vlen_kernels.decode_strings(k, _frame([b"a"]), np.empty(2, dtype=STRING))
    na = np.dtypes.StringDType(na_object=None)
    with pytest.raises(TypeError, match="missing-value"):
        vlen_kernels.encode_strings(k, np.array(["a"], dtype=na))


# -- the GIL (the probe: `helpers.gil.spins_during`) ------------------------------------


@pytest.fixture(scope="module")
def many_strings() -> tuple[Any, np.ndarray, bytes]:
    """200,000 strings, a zstd kernel and their stored chunk."""
    kernel = codec_kernels.ChainKernel(compressor="zstd", level=1)
    values = _strings((200_000,), 5).astype(STRING)
    return kernel, values, bytes(vlen_kernels.encode_strings(kernel, values))


def test_decode_strings_releases_the_gil(many_strings: tuple[Any, np.ndarray, bytes]) -> None:
    kernel, values, payload = many_strings
    out = np.empty(values.size, dtype=STRING)
    assert spins_during(lambda: vlen_kernels.decode_strings(kernel, payload, out), 5) > 1000
    assert out.tolist() == values.tolist()


def test_encode_strings_releases_the_gil(many_strings: tuple[Any, np.ndarray, bytes]) -> None:
    kernel, values, payload = many_strings
    encoded: list[Any] = []
    spins = spins_during(lambda: encoded.append(vlen_kernels.encode_strings(kernel, values)), 5)
    assert spins > 1000
    assert bytes(encoded[-1]) == payload


# -- reads of slices and integers: straight into the output (`VlenRegion`) ---------


@functools.cache
def _partly_written(kind: str, fmt: int, order: str) -> zarr.storage.MemoryStore:
    """A (9, 7) array in (4, 3) chunks written by zarr, its last chunks
    never written (read as the fill value), empty items among the others."""
    store = zarr.storage.MemoryStore()
    value = _strings((9, 7), 5) if kind == "str" else _bytes((9, 7), 5)
    value[::4] = "" if kind == "str" else b""
    extra = {"order": order} if fmt == 2 else {}
    with with_pipeline(BATCHED):
        array = _create(store, fmt, None, kind, shape=(9, 7), chunks=(4, 3), **extra)
        array[:8, :6] = value[:8, :6]
    return store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    kind=st.sampled_from(["str", "bytes"]),
    layout=st.sampled_from([(3, "C"), (2, "C"), (2, "F")]),
)
def test_basic_selections_read_like_zarr(
    data: st.DataObject, kind: str, layout: tuple[int, str]
) -> None:
    """Slices (steps too) and integers, chunks read in part, missing
    chunks, format-2 frames in F order: zarr's values."""
    store = _partly_written(kind, *layout)
    selection = data.draw(basic_indices(shape=(9, 7)), label="selection")
    got, expected = read_both(store, selection)
    assert_same_read(got, expected)


@pytest.mark.parametrize("layout", [(3, "C"), (2, "F")], ids=["v3", "v2-F"])
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_read_into_a_strided_output(kind: str, layout: tuple[int, str]) -> None:
    """``out=`` a view with steps and negative strides: the selected items
    land in it, the elements between them are left alone."""
    store = _partly_written(kind, *layout)
    selection = (slice(1, 9, 2), slice(None))
    _, expected = read_both(store, selection)
    # longer than NumPy keeps inside a StringDType element: each one overwritten
    # frees its own heap string
    sentinel = "untouched, " * 3 if kind == "str" else b"untouched"
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        base = np.full((8, 14), sentinel, dtype=array.dtype)
        out = base[::-2, ::2]
        array.get_basic_selection(
            selection, out=default_buffer_prototype().nd_buffer.from_ndarray_like(out)
        )
    assert_same_values(out, expected)
    assert (base[::-2, 1::2] == sentinel).all() and (base[-2::-2] == sentinel).all()


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_basic_reads_place_items_natively(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices and integers never decode a chunk whole to assign it; a
    coordinate selection still does."""
    store = _partly_written(kind, 3, "C")
    whole = []
    original = NativeOrFallback.decode_handled_into

    def spy(self: Any, *args: Any) -> None:
        whole.append(args[1][0])
        original(self, *args)

    monkeypatch.setattr(NativeOrFallback, "decode_handled_into", spy)
    for selection in [..., (slice(1, 8, 3), 2), (5, 4)]:
        got, expected = read_both(store, selection)
        assert_same_read(got, expected)
    assert whole == []
    with zarr.config.set(STRICT):
        got = zarr.open_array(store, mode="r").vindex[[0, 5], [1, 4]]
    with with_pipeline(BATCHED):
        expected = zarr.open_array(store, mode="r").vindex[[0, 5], [1, 4]]
    assert_same_values(got, expected)
    assert whole


# -- one item read: zarr's wrapping of it --------------------------------------------------

_ONE_ITEM = {
    "ints": lambda a: a[1, 2],
    "ellipsis-ints": lambda a: a[..., 1, 2],
    "numpy-ints": lambda a: a[np.int64(1), np.int32(2)],
    "oindex-ints": lambda a: a.oindex[1, 2],
    "oindex-lists": lambda a: a.oindex[[1], [2]],
    "vindex": lambda a: a.vindex[[1], [2]],
    "mask": lambda a: a.vindex[np.eye(8, dtype=bool) & (np.arange(8) == 2)],
    "row": lambda a: a[1],
    "one-slice": lambda a: a[1, 2:3],
}


@pytest.mark.parametrize("selection", list(_ONE_ITEM))
@pytest.mark.parametrize(
    ("chain", "sharded"),
    [
        pytest.param("vlen-bytes-zstd", False, id="bytes"),
        pytest.param("vlen-bytes-zstd", True, id="bytes-sharded"),
        pytest.param("v2-vlen-bytes-zstd", False, id="v2-bytes"),
        pytest.param("vlen-utf8-zstd", False, id="str"),
        pytest.param("vlen-utf8-zstd", True, id="str-sharded"),
        pytest.param("v2-vlen-utf8-zstd", False, id="v2-str"),
    ],
)
def test_one_item_reads_wrap_it_as_zarr_does(chain: str, sharded: bool, selection: str) -> None:
    """A read of one item returns what zarr's returns, wrapping included:
    zarr assigns a lone object item into a 0-d output as a 0-d array,
    which NumPy keeps as the element (twice nested through a shard)."""
    case = CHAINS[chain]
    stores = {}
    for name, pipeline in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(pipeline):
            stores[name] = zarr.storage.MemoryStore()
            array = create_chain_array(
                stores[name],
                case,
                (8, 8),
                (4, 4) if sharded else (2, 2),
                (2, 2) if sharded else None,
            )
            items = [f"x{i}" for i in range(64)]
            array[...] = np.array(
                [s.encode() for s in items] if "bytes" in chain else items, dtype=object
            ).reshape(8, 8)
    with zarr.config.set(STRICT):
        got = _ONE_ITEM[selection](zarr.open_array(stores["fused"], mode="r"))
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = _ONE_ITEM[selection](zarr.open_array(stores["zarr"], mode="r"))
    assert_same_read(got, expected)
