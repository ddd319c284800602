"""Sharded variable-length strings and bytes (`zarr_fused.shard.vlen`).

Inner chains ``vlen-utf8 | vlen-bytes -> [compressor] [-> crc32c]`` read and
write through the native shard index and layout, with each inner chunk's
frame parsed and built by `zarr_fused._vlen`. zarr's `BatchedCodecPipeline`
is the oracle for the values read and for the stored shards, byte for byte;
zarr_fused runs in strict mode, so a silent fallback fails the test.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec
from zarr.codecs.vlen_utf8 import VLenBytesCodec, VLenUTF8Codec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.dtype import VariableLengthBytes
from zarr.storage import MemoryStore
from zarr.testing.strategies import basic_indices

from zarr_fused._native import codec_kernels, vlen_kernels
from zarr_fused._vlen_chain import VlenChain
from zarr_fused.errors import CorruptChunkError, CorruptShardError
from zarr_fused.shard.vlen import VlenShardReader, VlenShardWriter

from helpers import (
    BATCHED,
    STRICT,
    assert_same_read,
    assert_same_values,
    chunk_items,
    make_store,
    read_both,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning"),
    pytest.mark.skipif(vlen_kernels is None, reason="compiled extensions missing"),
]

ZARR = {"codec_pipeline.path": BATCHED}

COMPRESSORS: dict[str, Any] = {
    "gzip": lambda: [GzipCodec(level=5)],
    "none": list,
    "zstd": lambda: [ZstdCodec(level=3)],
    "zstd-crc32c": lambda: [ZstdCodec(level=1), Crc32cCodec()],
    "blosc": lambda: [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle")],
    "crc32c": lambda: [Crc32cCodec()],
}

#: the compressors whose stored bytes are zarr's (gzip's header holds a time)
BYTE_IDENTICAL = [name for name in COMPRESSORS if name != "gzip"]

#: array shape, shard shape, inner chunk shape (edge shards and edge inner chunks)
GEOMETRIES: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "1d": ((50,), (20,), (5,)),
    "2d": ((23, 17), (10, 8), (5, 4)),
    "2d-one-inner": ((12, 12), (6, 6), (6, 6)),
    "3d": ((7, 9, 6), (4, 6, 6), (2, 3, 3)),
}

WORDS = ["", "a", "héllo", "日本語", "emoji 🎉🐍", "x" * 300, "tab\tnl\n", "\x00nul", "y" * 70_000]

#: the fill value of each kind, and another one
FILLS = {"str": ("", "fill ✓"), "bytes": (b"", b"\x00fill")}


def strings(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(WORDS), size=shape)
    return np.array([WORDS[i] + str(j % 7) for j, i in enumerate(picks.flat)]).reshape(shape)


def byte_strings(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    flat = [rng.bytes(int(n)) for n in rng.integers(0, 40, size=int(np.prod(shape)))]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def values(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return strings(shape, seed) if kind == "str" else byte_strings(shape, seed)


def create(
    store: Any,
    kind: str,
    compressor: str = "zstd",
    geometry: str = "2d",
    index_location: str = "end",
    fill: Any = None,
    index_crc: bool = True,
    **kwargs: Any,
) -> Any:
    shape, shard, inner = GEOMETRIES[geometry]
    serializer = VLenUTF8Codec() if kind == "str" else VLenBytesCodec()
    codec = ShardingCodec(
        chunk_shape=inner,
        codecs=[serializer, *COMPRESSORS[compressor]()],
        index_codecs=[BytesCodec(), Crc32cCodec()] if index_crc else [BytesCodec()],
        index_location=index_location,
    )
    dtype: Any = str if kind == "str" else VariableLengthBytes()
    return zarr.create_array(
        store,
        shape=shape,
        chunks=shard,
        dtype=dtype,
        fill_value=FILLS[kind][0] if fill is None else fill,
        serializer=codec,
        compressors=None,
        filters=None,
        **kwargs,
    )


def write_both(tmp_path: Path, kind: str, store_kind: str = "memory", **create_args: Any) -> dict:
    """The same writes through zarr_fused (strict) and zarr: a whole array,
    a partial overwrite into existing shards, a region of fill value (inner
    chunks left missing), a single element (as a region: zarr itself
    fails a bytes scalar written to one element of a bytes array)."""
    geometry = create_args.get("geometry", "2d")
    shape = GEOMETRIES[geometry][0]
    value = values(kind, shape, 0)
    patch_region = tuple(slice(1, max(2, n // 2)) for n in shape)
    patch = values(kind, value[patch_region].shape, 1)
    fill_region = tuple(slice(n // 2, None) for n in shape)
    fill = create_args.get("fill")
    fill = FILLS[kind][0] if fill is None else fill
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, who)
            array = create(store, kind, **create_args)
            array[:] = value
            array[patch_region] = patch
            array[fill_region] = fill
            array[(slice(0, 1),) * len(shape)] = value[(slice(-1, None),) * len(shape)]
            stores[who] = store
    return stores


def assert_same(stores: dict[str, Any], selection: Any = ...) -> None:
    """The same stored shards, and the same values read by both pipelines
    from each store (zarr_fused in strict mode)."""
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    for store in stores.values():
        with zarr.config.set(ZARR):
            expected = zarr.open_array(store, mode="r")
            expected_all, expected_part = expected[:], expected[selection]
        with zarr.config.set(STRICT):
            array = zarr.open_array(store, mode="r")
            assert_same_values(array[:], expected_all)
            assert_same_values(array[selection], expected_part)


@pytest.mark.parametrize("kind", ["str", "bytes"])
@pytest.mark.parametrize("compressor", BYTE_IDENTICAL)
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_sharded_vlen_matches_zarr(
    tmp_path: Path, kind: str, compressor: str, store_kind: str
) -> None:
    stores = write_both(tmp_path, kind, store_kind, compressor=compressor)
    assert_same(stores, (slice(2, 20, 3), slice(5, None)))


@pytest.mark.parametrize("index_crc", [True, False], ids=["index-crc32c", "index-bytes"])
@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_sharded_vlen_geometry(
    tmp_path: Path, kind: str, geometry: str, index_location: str, index_crc: bool
) -> None:
    stores = write_both(
        tmp_path,
        kind,
        "local",
        compressor="zstd-crc32c",
        geometry=geometry,
        index_location=index_location,
        index_crc=index_crc,
    )
    selection = tuple(slice(1, None, 2) for _ in GEOMETRIES[geometry][0])
    assert_same(stores, selection)


@pytest.mark.parametrize("write_empty_chunks", [False, True])
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_sharded_vlen_fill_values(tmp_path: Path, kind: str, write_empty_chunks: bool) -> None:
    """A fill value other than the empty string, and empty inner chunks
    stored or left out as ``write_empty_chunks`` says."""
    stores = write_both(
        tmp_path,
        kind,
        "local",
        fill=FILLS[kind][1],
        config={"write_empty_chunks": write_empty_chunks},
    )
    assert_same(stores, (slice(None), 3))


@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(None), slice(None)), id="all"),
        pytest.param((slice(3, 14), slice(2, 9)), id="box"),
        pytest.param((4, slice(None)), id="row"),
        pytest.param((slice(None, None, 4), 5), id="strided-column"),
        pytest.param((7, 3), id="point"),
        pytest.param(([0, 5, 22], slice(1, 16)), id="orthogonal"),
    ],
)
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_sharded_vlen_reads(kind: str, selection: Any) -> None:
    stores = {}
    value = values(kind, GEOMETRIES["2d"][0], 4)
    value[10:20, 8:] = FILLS[kind][0]
    for who, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            stores[who] = MemoryStore()
            create(stores[who], kind)[:] = value
    assert_same(stores, selection)
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["fused"], mode="r")
        assert_same_values(array.oindex[[1, 2, 20], [0, 16]], array[:][[1, 2, 20]][:, [0, 16]])
        assert_same_values(array.vindex[[1, 22], [3, 0]], array[:][[1, 22], [3, 0]])


@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(2, 13), slice(3, 7)), id="box"),
        pytest.param((4, slice(None)), id="row"),
        pytest.param((slice(None, None, 3), slice(1, 2)), id="strided"),
    ],
)
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_sharded_vlen_partial_writes(kind: str, selection: Any) -> None:
    """Writes into existing shards (slices, integers, steps) and writes of
    an orthogonal selection (zarr's code) leave zarr's shards."""
    stores = {}
    shape = GEOMETRIES["2d"][0]
    for who, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            stores[who] = MemoryStore()
            array = create(stores[who], kind)
            array[:] = values(kind, shape, 5)
            region = np.empty(shape, dtype=object)[selection].shape
            array[selection] = values(kind, region, 6)
            array.oindex[[0, 9, 21], [2, 3]] = values(kind, (3, 2), 7)
            array[3:5, 0:4] = FILLS[kind][1]
    assert_same(stores)


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_sharded_vlen_zip_store(tmp_path: Path, kind: str) -> None:
    """A store without synchronous IO: zarr's sharding codec lays the
    shards out, the inner chunks run on the native vlen chain."""
    value = values(kind, GEOMETRIES["2d"][0], 2)
    value[10:, 8:] = FILLS[kind][0]
    for who, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            store = make_store("zip", tmp_path, who)
            create(store, kind)[:] = value
            store.close()
    reopened = {
        who: zarr.storage.ZipStore(tmp_path / f"{who}.zip", mode="r") for who in ("fused", "zarr")
    }
    assert_same(reopened, (slice(3, 20), slice(None, None, 4)))


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_plan_is_native_vlen_shards(kind: str) -> None:
    with zarr.config.set(STRICT):
        plan = create(MemoryStore(), kind)._async_array.codec_pipeline.plan
    assert plan.read_fallback == plan.write_fallback == ""
    assert isinstance(plan.reader, VlenShardReader)
    assert isinstance(plan.writer, VlenShardWriter)
    assert isinstance(plan.reader.chain, VlenChain)


class _NoFallback:
    """A fallback path that fails the test when it is taken."""

    def read(self, *args: Any) -> Any:
        raise AssertionError("zarr's sharding codec read a batch")

    def write_held(self, *args: Any) -> Any:
        raise AssertionError("zarr's sharding codec wrote a batch")


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_native_loop_takes_basic_selections(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole, partial, scalar and integer-indexed writes and reads stay in
    the native loop (zarr's sharding codec would store the same bytes)."""
    store = MemoryStore()
    with zarr.config.set(STRICT):
        array = create(store, kind, "zstd-crc32c")
        plan = array._async_array.codec_pipeline.plan
        monkeypatch.setattr(plan.writer, "fallback", _NoFallback())
        monkeypatch.setattr(plan.reader, "fallback", _NoFallback())
        value = values(kind, GEOMETRIES["2d"][0], 8)
        array[:] = value
        array[3:9, 2:13] = value[:6, :11]
        array[4] = value[0]
        array[1:3, 1:3] = FILLS[kind][1]
        expected = value.astype(array.dtype)
        expected[3:9, 2:13] = value[:6, :11]
        expected[4] = value[0]
        expected[1:3, 1:3] = FILLS[kind][1]
        assert_same_values(array[:], expected)
        assert_same_values(array[2:20:3, 7], expected[2:20:3, 7])


def test_gzip_inner_chunks_native(tmp_path: Path) -> None:
    """gzip inner chunks: zarr's values, and zarr_fused's gzip header (no
    time stamp), which only the native kernel writes."""
    stores = write_both(tmp_path, "str", "memory", compressor="gzip")
    with zarr.config.set(ZARR):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
    with zarr.config.set(STRICT):
        assert_same_values(zarr.open_array(stores["fused"], mode="r")[:], expected)
    shards = chunk_items(stores["fused"])
    assert shards.keys() == chunk_items(stores["zarr"]).keys()
    first = shards["c/0/0"]
    assert first[:2] == b"\x1f\x8b" and first[4:8] == b"\0\0\0\0"


def test_never_written_reads_fill(tmp_path: Path) -> None:
    with zarr.config.set(STRICT):
        array = create(make_store("local", tmp_path), "str", fill="nothing")
        got = array[2:9, 1:3]
    assert (got == "nothing").all()


def _first_inner_chunk(shard: bytes, n_chunks: int) -> tuple[int, int]:
    """(offset, length) of the first stored inner chunk of a shard whose
    index (with crc32c) is at its end."""
    index = shard[len(shard) - 16 * n_chunks - 4 : -4]
    entries = struct.unpack(f"<{2 * n_chunks}Q", index)
    return entries[0], entries[1]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(
            lambda frame: frame[:4] + struct.pack("<I", 1 << 30) + frame[8:], id="item-length"
        ),
        pytest.param(lambda frame: struct.pack("<I", 999) + frame[4:], id="count"),
    ],
)
def test_corrupt_inner_frame_names_the_inner_chunk(damage: Any) -> None:
    """An inner chunk whose frame lies (no compressor: the frame is stored
    as it is) raises a `CorruptChunkError` naming the inner chunk and the
    shard's key."""
    store = MemoryStore()
    with zarr.config.set(STRICT):
        array = create(store, "str", compressor="none")
        array[:] = values("str", GEOMETRIES["2d"][0], 3)
    key = "c/0/0"
    shard = bytes(store._store_dict[key].to_bytes())
    off, length = _first_inner_chunk(shard, 4)
    bad = shard[:off] + damage(shard[off : off + length]) + shard[off + length :]
    store._store_dict[key] = store._store_dict[key].from_bytes(bad)
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        with pytest.raises(CorruptChunkError, match=r"inner chunk \(0, 0\) of shard 'c/0/0'"):
            array[:]
        with pytest.raises(CorruptChunkError, match=r"inner chunk \(0, 0\) of shard 'c/0/0'"):
            array[0:3, 0:3] = "x"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    kind=st.sampled_from(["str", "bytes"]),
    compressor=st.sampled_from(["none", "zstd", "zstd-crc32c"]),
    index_location=st.sampled_from(["start", "end"]),
)
def test_sharded_vlen_property(
    data: st.DataObject, kind: str, compressor: str, index_location: str
) -> None:
    shape = GEOMETRIES["2d"][0]
    n = int(np.prod(shape))
    item = st.text(max_size=12) if kind == "str" else st.binary(max_size=12)
    items = data.draw(st.lists(item, min_size=n, max_size=n), label="items")
    value = np.empty(n, dtype=object)
    value[:] = items
    if kind == "str":
        value = value.astype(str)
    value = value.reshape(shape)
    starts = data.draw(st.tuples(st.integers(0, 22), st.integers(0, 16)), label="starts")
    region = tuple(slice(s, s + data.draw(st.integers(1, 8))) for s in starts)
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            stores[who] = MemoryStore()
            array = create(stores[who], kind, compressor, index_location=index_location)
            array[:] = value
            array[region] = value[region][::-1]
    assert_same(stores, region)


# -- a shard's selected inner chunks in one native call (`VlenRegion`) -------------


def _write_partly(
    store: Any, kind: str, geometry: str, fill: str, index_location: str, compressor: str = "zstd"
) -> Any:
    """An array written by zarr into ``store`` with a shard never written
    (read as the fill value), an inner chunk left all fill (not stored),
    empty items and non-ASCII strings; ``fill``: the kind's empty fill
    value or another."""
    shape, shard, _ = GEOMETRIES[geometry]
    fill_value = FILLS[kind][0 if fill == "empty" else 1]
    value = values(kind, shape, 11)
    value[(slice(None, None, 3),) + (slice(None),) * (len(shape) - 1)] = FILLS[kind][0]
    with zarr.config.set(ZARR):
        array = create(
            store,
            kind,
            compressor,
            geometry=geometry,
            fill=fill_value,
            index_location=index_location,
        )
        written = tuple(slice(0, n) for n in shard[:-1]) + (slice(None),)
        array[written] = value[written]
        array[tuple(slice(0, n) for n in GEOMETRIES[geometry][2])] = fill_value
    return store


@pytest.fixture(scope="module")
def partly_written(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`_write_partly` as ``(store kind, kind, geometry, fill, index
    location, compressor) -> store``, each store written once per module (LocalStore
    in a temporary directory, or MemoryStore)."""

    @functools.cache
    def build(store_kind: str, *args: str) -> Any:
        path = tmp_path_factory.mktemp("vlen")
        return _write_partly(make_store(store_kind, path), *args)

    return build


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    store_kind=st.sampled_from(["memory", "local"]),
    kind=st.sampled_from(["str", "bytes"]),
    geometry=st.sampled_from(["2d", "3d"]),
    fill=st.sampled_from(["empty", "other"]),
    index_location=st.sampled_from(["start", "end"]),
    compressor=st.sampled_from(["zstd", "zstd-crc32c", "none"]),
)
def test_basic_selections_read_like_zarr(
    partly_written: Any,
    data: st.DataObject,
    store_kind: str,
    kind: str,
    geometry: str,
    fill: str,
    index_location: str,
    compressor: str,
) -> None:
    """Slices (steps too) and integers over shards, inner chunks read in
    part, missing inner chunks and a missing shard, inner chains with and
    without crc32c: zarr's values (a LocalStore's shards read natively, a
    MemoryStore's by ranges)."""
    store = partly_written(store_kind, kind, geometry, fill, index_location, compressor)
    selection = data.draw(basic_indices(shape=GEOMETRIES[geometry][0]), label="selection")
    got, expected = read_both(store, selection)
    assert_same_read(got, expected)


@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(None), slice(None)), id="all"),
        pytest.param((slice(1, 22, 2), slice(3, 16, 3)), id="steps"),
        pytest.param((6, slice(None)), id="row"),
        pytest.param((slice(2, 19), 13), id="column"),
    ],
)
@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_read_into_a_strided_output(partly_written: Any, kind: str, selection: Any) -> None:
    """``out=`` a view with steps and negative strides: the selected items
    land in it, the elements between them are left alone."""
    store = partly_written("local", kind, "2d", "other", "end")
    _, expected = read_both(store, selection)
    # longer than NumPy keeps inside a StringDType element: each one overwritten
    # frees its own heap string
    sentinel = "untouched, " * 3 if kind == "str" else b"untouched"
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        base = np.full(tuple(2 * n for n in expected.shape), sentinel, dtype=array.dtype)
        out = base[(slice(None, None, -2),) * expected.ndim]
        array.get_basic_selection(
            selection, out=default_buffer_prototype().nd_buffer.from_ndarray_like(out)
        )
    assert_same_values(out, expected)
    between = np.ones(base.shape, dtype=bool)
    between[(slice(None, None, -2),) * expected.ndim] = False
    assert (base[between] == sentinel).all()


@pytest.mark.parametrize("kind", ["str", "bytes"])
def test_basic_reads_decode_each_shard_in_one_call(
    partly_written: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices and integers never decode inner chunk by inner chunk; integer
    arrays (an orthogonal selection) still do."""
    store = partly_written("memory", kind, "2d", "empty", "end")
    each = []
    original = VlenShardReader._decode_each

    def spy(self: VlenShardReader, projections: Any, *args: Any) -> None:
        each.append(len(projections))
        original(self, projections, *args)

    monkeypatch.setattr(VlenShardReader, "_decode_each", spy)
    for selection in [(slice(None), slice(None)), (slice(3, 20, 2), 5), (4, 7)]:
        got, expected = read_both(store, selection)
        assert_same_values(got, expected)
    assert each == []
    with zarr.config.set(STRICT):
        got = zarr.open_array(store, mode="r").oindex[[1, 12], [0, 9]]
    with zarr.config.set(ZARR):
        expected = zarr.open_array(store, mode="r").oindex[[1, 12], [0, 9]]
    assert_same_values(got, expected)
    assert each


def _frame_items(frame: bytes) -> list[tuple[int, int]]:
    """(start, length) of each item of an uncompressed vlen frame."""
    (count,) = struct.unpack_from("<I", frame)
    spans, pos = [], 4
    for _ in range(count):
        (length,) = struct.unpack_from("<I", frame, pos)
        spans.append((pos + 4, length))
        pos += 4 + length
    return spans


def _not_utf8_in_last_item(frame: bytes) -> bytes:
    start, length = [span for span in _frame_items(frame) if span[1]][-1]
    assert length
    return frame[:start] + b"\xff" + frame[start + 1 :]


@pytest.mark.parametrize(
    ("damage", "shrink", "message"),
    [
        pytest.param(None, 5, "runs past the frame's end", id="truncated"),
        pytest.param(
            lambda frame: struct.pack("<I", 19) + frame[4:], 0, "holds 19 items", id="count"
        ),
        pytest.param(
            lambda frame: frame[:4] + struct.pack("<I", 1 << 30) + frame[8:],
            0,
            "runs past the frame's end",
            id="item-length",
        ),
        pytest.param(_not_utf8_in_last_item, 0, "is not UTF-8", id="not-utf8-unselected"),
    ],
)
@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(None), slice(None)), id="all"),
        pytest.param((slice(0, 1), slice(0, 1)), id="first-item"),
        pytest.param((0, slice(1, 8, 3)), id="partial"),
    ],
)
def test_corrupt_inner_chunk_read_in_part(
    selection: Any, damage: Any, shrink: int, message: str
) -> None:
    """A corrupt inner chunk raises a `CorruptChunkError` naming it and its
    shard, also when the read selects a few of its items (its frame is
    checked whole, as zarr decodes it whole); zarr raises too."""
    store = MemoryStore()
    with zarr.config.set(ZARR):
        array = create(store, "str", compressor="none", index_crc=False)
        array[:] = values("str", GEOMETRIES["2d"][0], 3)
    key = "c/0/0"
    shard = bytes(store._store_dict[key].to_bytes())
    n = 4
    index = list(struct.unpack(f"<{2 * n}Q", shard[-16 * n :]))
    off, length = index[0], index[1]
    frame = shard[off : off + length]
    if damage is not None:
        frame = damage(frame)
    index[1] = length - shrink
    shard = shard[:off] + frame + shard[off + length : -16 * n] + struct.pack(f"<{2 * n}Q", *index)
    store._store_dict[key] = store._store_dict[key].from_bytes(shard)
    with zarr.config.set(STRICT), pytest.raises(CorruptChunkError, match=message) as info:
        zarr.open_array(store, mode="r")[selection]
    assert "inner chunk (0, 0) of shard 'c/0/0'" in str(info.value)
    with zarr.config.set(ZARR), pytest.raises((ValueError, MemoryError)):
        zarr.open_array(store, mode="r")[selection]


# -- VlenRegion on its own ------------------------------------------------------------


def _region_args(out: np.ndarray, **changes: Any) -> dict[str, Any]:
    """A two-inner-chunk shard (the second missing) of 2 x 3 bytes items,
    read whole into ``out`` (2 x 6)."""
    kernel = codec_kernels.ChainKernel()
    items = np.array([b"a", b"", b"ccc", b"dd", b"\x00", b"f"], dtype=object)
    payload = vlen_kernels.encode(kernel, items, False)
    missing = np.iinfo(np.uint64).max
    args = {
        "kernel": kernel,
        "payload": payload,
        "entries": np.array([[0, payload.size], [missing, missing]], dtype=np.uint64),
        "rows": np.array([[0, 0, 1, 2, 0], [0, 0, 1, 3, 0], [1, 0, 1, 3, 3]], dtype=np.intp),
        "dim_rows": (1, 2),
        "out_axes": (0, 1),
        "inner_shape": (2, 3),
        "grid": (1, 2),
        "out": out,
        "utf8": False,
        "fill": b"fill",
        "key": "shard",
        "describe": lambda key: f"inner chunk {key[1]} of {key[0]}",
    }
    args.update(changes)
    return args


def _decode_region(**args: Any) -> None:
    region = vlen_kernels.VlenRegion(*args.values())
    region.decode(0, region.n_tasks)


def test_region_places_items_and_fills_missing_chunks() -> None:
    out = np.full((4, 12), None, dtype=object)
    view = out[::2, ::2]
    _decode_region(**_region_args(view))
    expected = np.array(
        [[b"a", b"", b"ccc", b"fill", b"fill", b"fill"], [b"dd", b"\x00", b"f"] + [b"fill"] * 3],
        dtype=object,
    )
    assert_same_values(view, expected)
    assert (out[1::2] == None).all() and (out[:, 1::2] == None).all()


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        pytest.param(
            {"rows": np.array([[0, 0, 1, 2, 0], [0, 1, 1, 3, 0], [1, 0, 1, 3, 3]])},
            ValueError,
            "selects past the inner chunk",
            id="items-past-the-chunk",
        ),
        pytest.param(
            {"rows": np.array([[0, 0, 1, 2, 0], [0, 0, 1, 3, 0], [1, 0, 1, 3, 4]])},
            ValueError,
            "or the output",
            id="past-the-output",
        ),
        pytest.param(
            {"rows": np.array([[0, 0, 1, 2, 0], [0, 0, 1, 3, 0], [2, 0, 1, 3, 3]])},
            ValueError,
            "one of 2 inner chunks",
            id="no-such-chunk",
        ),
        pytest.param({"dim_rows": (1, 1)}, ValueError, "rows must be", id="dimension-rows"),
        pytest.param({"out_axes": (0, 2)}, ValueError, "output axis", id="no-such-axis"),
        pytest.param({"entries": np.zeros((3, 2))}, ValueError, "entries", id="entries"),
        pytest.param(
            {"out": np.empty((2, 6), dtype=np.int64)}, TypeError, "object", id="not-objects"
        ),
        pytest.param(
            {"out": np.empty((2, 6), dtype=np.dtypes.StringDType())},
            TypeError,
            "StringDType",
            id="strings-of-bytes",
        ),
        pytest.param(
            {"entries": np.array([[8, 1 << 40], [0, 4]], dtype=np.uint64)},
            CorruptShardError,
            "lies outside",
            id="entry-outside",
        ),
    ],
)
def test_region_checks_its_arguments(changes: dict[str, Any], error: type, message: str) -> None:
    """Rows, entries and outputs that would reach past memory are refused
    before any item is read or written."""
    with pytest.raises(error, match=message):
        _decode_region(**_region_args(**{"out": np.empty((2, 6), dtype=object), **changes}))


def test_region_decodes_only_its_tasks() -> None:
    out = np.full((2, 6), None, dtype=object)
    region = vlen_kernels.VlenRegion(*_region_args(out).values())
    with pytest.raises(ValueError, match="tasks"):
        region.decode(1, 3)
    region.decode(1, 2)
    assert (out[:, :3] == None).all() and (out[:, 3:] == b"fill").all()


def test_region_refuses_a_read_only_output() -> None:
    out = np.empty((2, 6), dtype=object)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _decode_region(**_region_args(out))
