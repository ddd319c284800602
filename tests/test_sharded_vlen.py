"""Sharded variable-length strings and bytes (`zarr_fused.shard.vlen`).

Inner chains ``vlen-utf8 | vlen-bytes -> [compressor] [-> crc32c]`` read and
write through the native shard index and layout, with each inner chunk's
frame parsed and built by `zarr_fused._vlen`. zarr's `BatchedCodecPipeline`
is the oracle for the values read and for the stored shards, byte for byte;
zarr_fused runs in strict mode, so a silent fallback fails the test.
"""

from __future__ import annotations

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
from zarr.core.dtype import VariableLengthBytes
from zarr.storage import MemoryStore

from zarr_fused._native import vlen_kernels
from zarr_fused._vlen_chain import VlenChain
from zarr_fused.errors import CorruptChunkError
from zarr_fused.shard.vlen import VlenShardReader, VlenShardWriter

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store

pytestmark = [
    pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning"),
    pytest.mark.skipif(vlen_kernels is None, reason="compiled extensions missing"),
]

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}
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
