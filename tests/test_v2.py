"""Zarr format 2 arrays on the native path (issue 17).

Every test writes and reads the same array through zarr_fused and through
zarr's `BatchedCodecPipeline` (the oracle): values must agree, and stored
chunks must agree byte for byte wherever `byte_identical` claims it for the
array's `V2Codec`. Native cases run in strict mode, so a silent fallback to
zarr's code fails them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import resource
import zlib
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs._v2 import V2Codec
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, MemoryStore

from zarr_fused.cli.identity import byte_identical
from zarr_fused.errors import (
    ChunkSizeError,
    CorruptChunkError,
    DecompressionError,
    UnsupportedError,
)

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store, with_pipeline
from helpers.differential import Value

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}

DTYPES = [
    "|b1",
    "|i1",
    "|u1",
    "<i2",
    ">i2",
    "<u4",
    ">i4",
    "<i8",
    ">u8",
    "<f2",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    ">c16",
    "<M8[ns]",
    ">M8[s]",
    "<m8[ms]",
    ">m8[h]",
    "|S1",
    "|S5",
    "<U1",
    ">U3",
    "|V3",
]

# every compressor setting zarr writes that runs natively: blosc with each
# cname numcodecs ships (snappy is not among them), each shuffle (-1 is
# AUTOSHUFFLE) and a blocksize; zstd, gzip and zlib at several levels
COMPRESSORS = {
    "none": None,
    "blosc-lz4-auto": numcodecs.Blosc("lz4", 5, -1),
    "blosc-lz4-noshuffle": numcodecs.Blosc("lz4", 5, 0),
    "blosc-lz4-shuffle": numcodecs.Blosc("lz4", 1, 1),
    "blosc-lz4-bitshuffle": numcodecs.Blosc("lz4", 9, 2),
    "blosc-lz4hc": numcodecs.Blosc("lz4hc", 4, 1),
    "blosc-blosclz": numcodecs.Blosc("blosclz", 5, 1),
    "blosc-zstd": numcodecs.Blosc("zstd", 2, 2),
    "blosc-zstd-7": numcodecs.Blosc("zstd", 7, 1),
    "blosc-zlib": numcodecs.Blosc("zlib", 5, 1),
    "blosc-clevel0": numcodecs.Blosc("lz4", 0, 1),
    "blosc-blocksize": numcodecs.Blosc("lz4", 5, 1, blocksize=256),
    "zstd-1": numcodecs.Zstd(1),
    "zstd-3-checksum": numcodecs.Zstd(3, checksum=True),
    "zstd-9": numcodecs.Zstd(9),
    "zstd-neg": numcodecs.Zstd(-5),
    "gzip-1": numcodecs.GZip(1),
    "gzip-9": numcodecs.GZip(9),
    "zlib-1": numcodecs.Zlib(1),
    "zlib-6": numcodecs.Zlib(6),
    "zlib-9": numcodecs.Zlib(9),
    "zlib-0": numcodecs.Zlib(0),
}


def values_of(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int, mode: str = "random") -> Any:
    """Seeded values of ``dtype`` (raw bytes for void types)."""
    if dtype.kind == "V":
        n = math.prod(shape) * dtype.itemsize
        return (
            np.random.default_rng(seed).integers(0, 256, n, dtype="u1").view(dtype).reshape(shape)
        )
    return Value(seed, mode, "array", False).make(dtype, None, shape)


def create(
    store: Any,
    dtype: str,
    compressor: Any,
    *,
    order: str = "C",
    shape: tuple[int, ...] = (13, 11),
    chunks: tuple[int, ...] = (4, 5),
    separator: str = ".",
    **kwargs: Any,
) -> Any:
    return zarr.create_array(
        store,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        zarr_format=2,
        order=order,
        compressors=compressor,
        filters=kwargs.pop("filters", None),
        chunk_key_encoding={"name": "v2", "separator": separator},
        **kwargs,
    )


def must_be_identical(compressor: Any) -> bool:
    return byte_identical([V2Codec(filters=None, compressor=compressor)])


def assert_same_chunks(fused_store: Any, zarr_store: Any, compressor: Any, dtype: str) -> None:
    """The same keys; the same bytes where claimed, else the same values
    when zarr reads zarr_fused's chunks."""
    ours, theirs = chunk_items(fused_store), chunk_items(zarr_store)
    assert sorted(ours) == sorted(theirs)
    if must_be_identical(compressor):
        for key in theirs:
            assert ours[key] == theirs[key], key


def write_and_compare(
    tmp_path: Path,
    dtype: str,
    compressor: Any,
    order: str,
    *,
    store_kind: str = "memory",
    fill_value: Any = None,
    write_empty_chunks: bool = False,
    separator: str = ".",
    selection: Any = (slice(None),),
    seed: int = 0,
    mode: str = "random",
    strict: bool = True,
) -> tuple[Any, Any]:
    """Write the same value through both pipelines into fresh stores,
    compare the stored chunks, then read each store through both pipelines."""
    kwargs: dict[str, Any] = {"config": {"write_empty_chunks": write_empty_chunks}}
    if fill_value is not None:
        kwargs["fill_value"] = fill_value
    probe = np.empty((13, 11), dtype="u1")[selection]
    value = values_of(np.dtype(dtype), probe.shape, seed, mode)
    stores = {}
    for name, path in (
        ("fused", STRICT if strict else {"codec_pipeline.path": FUSED}),
        ("zarr", {"codec_pipeline.path": BATCHED}),
    ):
        with zarr.config.set(path):
            store = make_store(store_kind, tmp_path, name)
            array = create(store, dtype, compressor, order=order, separator=separator, **kwargs)
            array[selection] = value
            stores[name] = store
    assert_same_chunks(stores["fused"], stores["zarr"], compressor, dtype)
    for store in stores.values():
        with with_pipeline(BATCHED):
            expected = zarr.open_array(store, mode="r+")[...]
        with zarr.config.set(STRICT if strict else {"codec_pipeline.path": FUSED}):
            array = zarr.open_array(store, mode="r+")
            assert_same_values(array[...], expected)
            assert_same_values(array[selection], expected[selection])
    return stores["fused"], stores["zarr"]


# -- values and stored bytes -----------------------------------------------------------


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
def test_dtypes(tmp_path: Path, dtype: str, order: str) -> None:
    write_and_compare(
        tmp_path, dtype, numcodecs.Blosc("lz4", 5, -1), order, selection=(slice(1, 12), slice(2, 9))
    )


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
def test_dtypes_uncompressed(tmp_path: Path, dtype: str, order: str) -> None:
    write_and_compare(tmp_path, dtype, None, order)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f4", ">i2", "|u1", "<U2"])
@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_compressors(tmp_path: Path, name: str, dtype: str, order: str) -> None:
    write_and_compare(tmp_path, dtype, COMPRESSORS[name], order, mode="repetitive", seed=3)


@pytest.mark.parametrize("name", ["zlib-1", "zlib-9", "blosc-lz4-auto", "zstd-1", "none"])
def test_stored_bytes_claimed(name: str) -> None:
    """The claim covers the common format-2 settings on this host's
    libraries (zlib shares Python's libz; see `byte_identical`)."""
    assert must_be_identical(COMPRESSORS[name])


@pytest.mark.parametrize("store_kind", ["local", "memory", "zip", "nosync"])
@pytest.mark.parametrize("separator", [".", "/"])
def test_stores_and_separators(tmp_path: Path, store_kind: str, separator: str) -> None:
    """Native LocalStore IO, MemoryStore and the async path (ZipStore, a
    store without synchronous IO) write the keys zarr writes."""
    write_and_compare(
        tmp_path,
        "<f8",
        numcodecs.Zstd(1),
        "F",
        store_kind=store_kind,
        separator=separator,
        selection=(slice(2, 13), slice(0, 7)),
    )
    if store_kind == "local":
        files = sorted(
            str(p.relative_to(tmp_path / "fused"))
            for p in (tmp_path / "fused").rglob("*")
            if p.is_file()
        )
        assert f"0{separator}0" in files
        assert f"3{separator}1" in files


@pytest.mark.parametrize("write_empty_chunks", [True, False])
@pytest.mark.parametrize("store_kind", ["local", "memory"])
def test_write_empty_chunks(tmp_path: Path, store_kind: str, write_empty_chunks: bool) -> None:
    """Chunks left equal to the fill value are dropped exactly as zarr drops
    them (keys compared), and missing chunks read as the fill value."""
    write_and_compare(
        tmp_path,
        ">i4",
        numcodecs.Blosc("zstd", 3, 2),
        "C",
        fill_value=7,
        store_kind=store_kind,
        write_empty_chunks=write_empty_chunks,
        mode="mixed",
        selection=(slice(0, 9), slice(None)),
    )


def test_write_fill_over_existing_deletes(tmp_path: Path) -> None:
    """Writing the fill value over stored chunks deletes them, as zarr does."""
    with zarr.config.set(STRICT):
        store = LocalStore(tmp_path / "a")
        array = create(store, "<f4", numcodecs.Zlib(1), fill_value=1.5)
        array[...] = values_of(np.dtype("<f4"), (13, 11), 1)
        array[:8, :] = 1.5
        keys = sorted(chunk_items(store))
    assert keys == sorted(f"{i}.{j}" for i in (2, 3) for j in range(3))


# -- fill values as zarr 3 reads format-2 metadata ----------------------------------------


def _write_zarray(
    root: Path,
    dtype: str,
    fill_value: Any,
    order: str = "C",
    compressor: dict[str, Any] | None = None,
) -> None:
    root.mkdir(parents=True)
    meta = {
        "zarr_format": 2,
        "shape": [6, 5],
        "chunks": [3, 2],
        "dtype": dtype,
        "compressor": compressor,
        "fill_value": fill_value,
        "order": order,
        "filters": None,
        "dimension_separator": ".",
    }
    (root / ".zarray").write_text(json.dumps(meta))


FILL_VALUES = [
    pytest.param("<f4", None, id="f4-null"),
    pytest.param("<f8", "NaN", id="f8-NaN"),
    pytest.param(">f4", "Infinity", id="f4-Infinity"),
    pytest.param("<f2", "-Infinity", id="f2--Infinity"),
    pytest.param("<f8", 2.5, id="f8-2.5"),
    pytest.param("<i4", None, id="i4-null"),
    pytest.param(">i2", -3, id="i2--3"),
    pytest.param("|b1", True, id="bool-true"),
    pytest.param("|S3", base64.b64encode(b"ab").decode(), id="S3-base64"),
    pytest.param("|S3", None, id="S3-null"),
    pytest.param("<U2", "xy", id="U2-string"),
    pytest.param(">U2", None, id="U2-null"),
    pytest.param("<M8[s]", 86400, id="M8-int"),
    pytest.param("<m8[ms]", None, id="m8-null"),
    pytest.param("<c8", ["NaN", 1.0], id="c8-NaN-1"),
]


@pytest.mark.parametrize(("dtype", "fill_value"), FILL_VALUES)
def test_fill_values_from_metadata(tmp_path: Path, dtype: str, fill_value: Any) -> None:
    """A hand-written .zarray: missing chunks read as zarr reads them, and a
    partial write stores what zarr stores."""
    compressor = {"id": "zstd", "level": 1, "checksum": False}
    for name in ("fused", "zarr"):
        _write_zarray(tmp_path / name, dtype, fill_value, compressor=compressor)
    value = values_of(np.dtype(dtype), (2, 3), 5)
    results = {}
    for name, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            array = zarr.open_array(LocalStore(tmp_path / name), mode="r+")
            before = array[...]
            array[1:3, 1:4] = value
            results[name] = (before, array[...])
    assert_same_values(results["fused"][0], results["zarr"][0])
    assert_same_values(results["fused"][1], results["zarr"][1])
    assert_same_chunks(
        LocalStore(tmp_path / "fused"), LocalStore(tmp_path / "zarr"), numcodecs.Zstd(1), dtype
    )


# -- selections (hypothesis, seeded) -------------------------------------------------------


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    shape = tuple(draw(st.integers(1, 12)) for _ in range(draw(st.integers(1, 3))))
    chunks = tuple(draw(st.integers(1, side + 1)) for side in shape)
    return {
        "dtype": draw(st.sampled_from(DTYPES)),
        "compressor": draw(st.sampled_from(list(COMPRESSORS))),
        "order": draw(st.sampled_from("CF")),
        "shape": shape,
        "chunks": chunks,
        "write": draw(
            st.tuples(
                *(st.tuples(st.integers(0, s), st.integers(0, s), st.integers(1, 3)) for s in shape)
            )
        ),
        "read": draw(
            st.tuples(
                *(
                    st.tuples(st.integers(-s, s), st.integers(-s, s), st.integers(1, 3))
                    for s in shape
                )
            )
        ),
        "points": draw(st.integers(0, 2**16)),
        "seed": draw(st.integers(0, 2**16)),
        "write_empty_chunks": draw(st.booleans()),
        "store": draw(st.sampled_from(["memory", "local"])),
    }


def _slices(bounds: tuple[tuple[int, int, int], ...]) -> tuple[slice, ...]:
    return tuple(slice(a, b, step) for a, b, step in bounds)


@settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_cases())
def test_selections(tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]) -> None:
    """Partial strided writes, then basic, orthogonal and coordinate reads:
    values and stored chunks as zarr's."""
    dtype = np.dtype(case["dtype"])
    compressor = COMPRESSORS[case["compressor"]]
    shape = case["shape"]
    write_sel = _slices(case["write"])
    value = values_of(dtype, np.empty(shape, "u1")[write_sel].shape, case["seed"], "mixed")
    rng = np.random.default_rng(case["points"])
    orthogonal = tuple(np.sort(rng.choice(s, rng.integers(1, s + 1), replace=False)) for s in shape)
    coords = tuple(rng.integers(0, s, 5) for s in shape)
    root = tmp_path_factory.mktemp("sel")
    stores = {}
    reads = {}
    for name, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(case["store"], root, name)
            array = zarr.create_array(
                store,
                shape=shape,
                chunks=case["chunks"],
                dtype=dtype,
                zarr_format=2,
                order=case["order"],
                compressors=compressor,
                filters=None,
                config={"write_empty_chunks": case["write_empty_chunks"]},
            )
            array[write_sel] = value
            reads[name] = (
                array[_slices(case["read"])],
                array.oindex[orthogonal],
                array.vindex[coords],
                array[...],
            )
            stores[name] = store
    for ours, theirs in zip(reads["fused"], reads["zarr"], strict=True):
        assert_same_values(ours, theirs)
    assert_same_chunks(stores["fused"], stores["zarr"], compressor, case["dtype"])


# -- F-order chunks into the output --------------------------------------------------------
# zarr reads an order "F" array into an F-ordered output: a chunk whose
# region there is contiguous (it spans every axis but the last) decodes
# straight into the output, others go through the sorted, or tiled, strided
# copy. A caller's C-ordered ``out`` gets the transposing copy.

F_GEOMETRIES = [
    pytest.param((13, 11), (13, 11), "<f4", id="one-chunk"),
    pytest.param((12, 20), (12, 5), "<f4", id="full-columns"),
    pytest.param((6, 5, 8), (6, 5, 3), ">i2", id="3d-full-planes"),
    pytest.param((70, 45), (33, 20), "<f8", id="partial-regions"),
    pytest.param((300, 200), (260, 150), "|u1", id="tiles-u1"),
    pytest.param((9, 80, 70), (4, 40, 35), "<c16", id="3d-tiles-c16"),
]


def _f_order_pair(
    tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str
) -> tuple[Any, Any]:
    """An order "F" blosc array written by zarr, and the value written."""
    value = values_of(np.dtype(dtype), shape, 5)
    store = LocalStore(tmp_path / "f")
    with with_pipeline(BATCHED):
        array = create(
            store, dtype, COMPRESSORS["blosc-lz4-shuffle"], order="F", shape=shape, chunks=chunks
        )
        array[...] = value
    return store, value


@pytest.mark.parametrize(("shape", "chunks", "dtype"), F_GEOMETRIES)
def test_f_order_read_into_f_output(
    tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str
) -> None:
    store, value = _f_order_pair(tmp_path, shape, chunks, dtype)
    with zarr.config.set(STRICT):
        got = zarr.open_array(store, mode="r")[...]
    assert got.flags.f_contiguous
    assert_same_values(got, value)


@pytest.mark.parametrize(("shape", "chunks", "dtype"), F_GEOMETRIES)
def test_f_order_read_into_c_out(
    tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str
) -> None:
    store, value = _f_order_pair(tmp_path, shape, chunks, dtype)
    out = np.zeros(shape, dtype=dtype)
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        array.get_basic_selection(
            ..., out=default_buffer_prototype().nd_buffer.from_numpy_array(out)
        )
    assert_same_values(out, value)


# -- corrupt chunks ---------------------------------------------------------------------------

CORRUPT_COMPRESSORS = ["none", "blosc-lz4-auto", "zstd-1", "gzip-1", "zlib-1"]


def _stored(tmp_path: Path, name: str) -> tuple[LocalStore, Path]:
    store = LocalStore(tmp_path / "a")
    with zarr.config.set(STRICT):
        array = create(store, "<f4", COMPRESSORS[name])
        array[...] = values_of(np.dtype("<f4"), (13, 11), 2)
    return store, tmp_path / "a" / "1.2"


def _read_raises(store: Any, kind: type[Exception]) -> str:
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r+")
        with pytest.raises(kind) as info:
            array[...]
    return str(info.value)


@pytest.mark.parametrize("name", CORRUPT_COMPRESSORS)
def test_truncated_chunk(tmp_path: Path, name: str) -> None:
    store, path = _stored(tmp_path, name)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "1.2" in _read_raises(store, CorruptChunkError)


@pytest.mark.parametrize("name", CORRUPT_COMPRESSORS[1:])
def test_garbage_chunk(tmp_path: Path, name: str) -> None:
    store, path = _stored(tmp_path, name)
    path.write_bytes(bytes(np.random.default_rng(4).integers(0, 256, 300, dtype="u1")))
    assert "1.2" in _read_raises(store, CorruptChunkError)


@pytest.mark.parametrize("name", CORRUPT_COMPRESSORS[1:])
def test_flipped_bytes(tmp_path: Path, name: str) -> None:
    """Damage inside the frame: a typed error (or, where the format has no
    check, a clean read of other values; never a crash or zarr's errors)."""
    store, path = _stored(tmp_path, name)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data)):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r+")
        try:
            array[...]
        except CorruptChunkError as error:
            assert "1.2" in str(error)


@pytest.mark.parametrize("store_kind", ["memory", "nosync"])
@pytest.mark.parametrize("name", CORRUPT_COMPRESSORS[1:])
def test_corrupt_chunk_other_stores(tmp_path: Path, name: str, store_kind: str) -> None:
    """MemoryStore and the async path raise the same typed errors."""
    store = make_store(store_kind, tmp_path)
    with zarr.config.set(STRICT):
        array = create(store, "<f4", COMPRESSORS[name])
        array[...] = values_of(np.dtype("<f4"), (13, 11), 2)
        asyncio.run(store.set("1.2", default_buffer_prototype().buffer.from_bytes(b"\x01" * 40)))
    assert "1.2" in _read_raises(store, CorruptChunkError)


def _bomb(name: str, nbytes: int) -> bytes:
    zeros = bytes(nbytes)
    if name == "zlib":
        return zlib.compress(zeros, 9)
    if name == "gzip":
        return numcodecs.GZip(9).encode(zeros)
    if name == "zstd":
        return numcodecs.Zstd(19).encode(zeros)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["zlib", "gzip", "zstd"])
def test_decompression_bomb(tmp_path: Path, name: str) -> None:
    """A small frame that inflates to 256 MiB is refused with a size error
    without the process growing by anything like that."""
    store = LocalStore(tmp_path / "a")
    compressor = {"zlib": numcodecs.Zlib(1), "gzip": numcodecs.GZip(1), "zstd": numcodecs.Zstd(1)}[
        name
    ]
    with zarr.config.set(STRICT):
        create(store, "<f4", compressor)
    (tmp_path / "a" / "0.0").write_bytes(_bomb(name, 256 << 20))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message = _read_raises(store, ChunkSizeError)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert "0.0" in message
    assert grown_kib < 64 * 1024


def test_zstd_claim_refused_before_allocating(tmp_path: Path) -> None:
    """A zstd frame whose header claims 2**40 bytes (numcodecs would try to
    allocate them) is refused from its header."""
    store, path = _stored(tmp_path, "zstd-1")
    # frame header descriptor 0xE0: single segment, 8-byte content size;
    # then one empty raw block marked last
    frame = b"\x28\xb5\x2f\xfd\xe0" + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00"
    path.write_bytes(frame)
    message = _read_raises(store, ChunkSizeError)
    assert "1.2" in message
    assert str(1 << 40) in message


def test_blosc_claim_refused(tmp_path: Path) -> None:
    store, path = _stored(tmp_path, "blosc-lz4-auto")
    other = numcodecs.Blosc("lz4", 5, 1).encode(np.zeros(1000, "<f4"))
    path.write_bytes(other)
    assert "1.2" in _read_raises(store, ChunkSizeError)


def test_zlib_stream_given_to_gzip_is_corrupt(tmp_path: Path) -> None:
    """The two deflate wrappers are told apart, as numcodecs does."""
    store, path = _stored(tmp_path, "gzip-1")
    path.write_bytes(zlib.compress(np.zeros(20, "<f4").tobytes()))
    assert "1.2" in _read_raises(store, DecompressionError)


# -- what falls back, and why --------------------------------------------------------------

# (Delta, FixedScaleOffset and Quantize without astype, or to an integer
# type, AsType and Delta with astype between integers or float64 to float32,
# and Shuffle have native stages: these are the forms that have none)
FALLBACKS = [
    pytest.param(
        {"filters": [numcodecs.Delta("<f4", "<f8")]},
        "<f4",
        "filters (delta)",
        id="delta",
        marks=pytest.mark.filterwarnings("ignore:invalid value encountered in cast"),
    ),
    pytest.param(
        {"filters": [numcodecs.FixedScaleOffset(0, 10, "<f8", "<f4")]},
        "<f8",
        "filters (fixedscaleoffset)",
        id="fixedscaleoffset",
    ),
    pytest.param(
        {"filters": [numcodecs.Delta(">i4"), numcodecs.Shuffle(4)]},
        ">i4",
        "filters (delta, shuffle)",
        id="big-endian-delta-shuffle",
    ),
    pytest.param(
        {"filters": [numcodecs.AsType("<f2", "<f8")]}, "<f8", "filters (astype)", id="astype"
    ),
    pytest.param(
        {"filters": [numcodecs.Quantize(2, "<f8", "<f4")]},
        "<f8",
        "filters (quantize)",
        id="quantize",
    ),
    pytest.param({"compressors": numcodecs.BZ2()}, "<i4", "'bz2'", id="bz2"),
    pytest.param({"compressors": numcodecs.LZMA()}, "<i4", "'lzma'", id="lzma"),
    pytest.param(
        {"compressors": numcodecs.BZ2()}, "|O", "filters (vlen-utf8)", id="object-strings-bz2"
    ),
]


@pytest.mark.parametrize(("kwargs", "dtype", "reason"), FALLBACKS)
def test_fallback_reason(kwargs: dict[str, Any], dtype: str, reason: str) -> None:
    """Each unsupported array says why, works through zarr's code, and
    is refused in strict mode."""
    kwargs = {"compressors": None, **kwargs}
    if dtype == "|O":
        dtype, value = str, np.array([["a", "bc"] * 5] * 4)
    else:
        value = (np.arange(40).reshape(4, 10) % 7).astype(dtype)
    with with_pipeline(FUSED):
        store = MemoryStore()
        array = zarr.create_array(
            store, shape=(4, 10), chunks=(2, 4), dtype=dtype, zarr_format=2, **kwargs
        )
        plan = array._async_array.codec_pipeline.plan
        assert reason in plan.fallback
        assert not plan.chain.native
        array[...] = value
        got = array[...]
    with with_pipeline(BATCHED):
        expected = zarr.open_array(store, mode="r+")[...]
    assert_same_values(got, expected)
    with zarr.config.set(STRICT), pytest.raises(UnsupportedError, match="natively"):
        zarr.open_array(store, mode="r+")[...]


def test_subclass_of_numcodecs_compressor_falls_back() -> None:
    class MyZstd(numcodecs.Zstd):
        codec_id = "my-zstd-v2-test"

    codec = V2Codec(filters=None, compressor=MyZstd(1))
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.dtype import parse_dtype

    from zarr_fused._chain import native_chain_params

    spec = ArraySpec(
        shape=(4,),
        dtype=parse_dtype("<i4", zarr_format=2),
        fill_value=0,
        config=ArrayConfig.from_dict({}),
        prototype=default_buffer_prototype(),
    )
    reason, params = native_chain_params((codec,), spec)
    assert "my-zstd-v2-test" in reason
    assert params == {}


def test_native_plan_for_common_settings() -> None:
    """The settings of OME-Zarr 0.4 and xarray stores are native."""
    with with_pipeline(FUSED):
        for compressor in (
            numcodecs.Blosc("zstd", 5, 2),
            numcodecs.Blosc("lz4", 5, 1),
            numcodecs.Zstd(3),
            numcodecs.Zlib(4),
            None,
        ):
            array = create(MemoryStore(), "<u2", compressor, order="F")
            plan = array._async_array.codec_pipeline.plan
            assert plan.chain.native, plan.fallback
            assert plan.fallback == ""
