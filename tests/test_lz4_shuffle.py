"""numcodecs' LZ4 compressor and byte shuffle on the native kernels.

Format 3 ``numcodecs.lz4`` (after ``bytes``) and ``numcodecs.shuffle``
(before a compressor), format 2 ``LZ4`` and a lone ``Shuffle`` filter run
natively, in strict mode. zarr's `BatchedCodecPipeline` is the oracle: the
same values, and the same stored bytes wherever `byte_identical` claims
them. Corrupt LZ4 frames raise an error naming the chunk's key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs._v2 import V2Codec
from zarr.storage import LocalStore, MemoryStore

from zarr_fused._codecs import ChainKernel
from zarr_fused._native import native_info
from zarr_fused.cli.identity import byte_identical
from zarr_fused.errors import ChunkSizeError, CorruptChunkError, DecompressionError

from helpers import BATCHED, FUSED, STRICT, assert_same_values, chunk_items, make_store

ZARR = {"codec_pipeline.path": BATCHED}

SHAPE = (37, 29)  # edge chunks on both axes
CHUNKS = (16, 12)

DTYPES = ["<f8", ">f4", ">i2", "<u4", "|u1", "|b1", "<M8[s]", ">m8[ms]", "<c8", "<U3"]

# format 3: the codecs after ``bytes``
V3_CHAINS: dict[str, Any] = {
    "lz4": lambda: [znc.LZ4()],
    "lz4-acc9": lambda: [znc.LZ4(acceleration=9)],
    "lz4-crc32c": lambda: [znc.LZ4(), Crc32cCodec()],
    "shuffle-lz4": lambda: [znc.Shuffle(), znc.LZ4()],  # element size from the dtype
    "shuffle2-zstd-crc32c": lambda: [znc.Shuffle(elementsize=2), ZstdCodec(level=1), Crc32cCodec()],
    "shuffle8-blosc": lambda: [
        znc.Shuffle(elementsize=8),
        BloscCodec(cname="zstd", clevel=1, shuffle="noshuffle"),
    ],
}

# format 2: (filters, compressor)
V2_CHAINS: dict[str, Any] = {
    "lz4": lambda: (None, numcodecs.LZ4()),
    "lz4-acc5": lambda: (None, numcodecs.LZ4(acceleration=5)),
    "shuffle8-lz4": lambda: ([numcodecs.Shuffle(elementsize=8)], numcodecs.LZ4()),
    "shuffle4-zstd": lambda: ([numcodecs.Shuffle(elementsize=4)], numcodecs.Zstd(level=1)),
    "shuffle2-blosc-auto": lambda: ([numcodecs.Shuffle(elementsize=2)], numcodecs.Blosc("lz4")),
    "shuffle1-lz4": lambda: ([numcodecs.Shuffle(elementsize=1)], numcodecs.LZ4()),
}


def values_of(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Compressible values of ``dtype`` (runs and small steps)."""
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.integers(-3, 4, size=shape), axis=-1)
    kind = np.dtype(dtype).kind
    if kind == "b":
        return (steps % 3 == 0).astype(dtype)
    if kind == "U":
        return np.array(["", "a", "bc", "xyz"])[steps % 4].astype(dtype)
    if kind == "u":
        return (steps % 200).astype(dtype)
    return steps.astype(dtype)


def fill_of(dtype: str) -> Any:
    kind = np.dtype(dtype).kind
    return {"b": True, "U": "a", "m": 3, "M": 3}.get(kind, 5)


def create(store: Any, fmt: int, chain: str, dtype: str, **kwargs: Any) -> Any:
    if fmt == 3:
        codecs = V3_CHAINS[chain]()
        if kwargs.pop("sharded", False):
            sharding = ShardingCodec(chunk_shape=(8, 6), codecs=[BytesCodec(), *codecs])
            kwargs.update(serializer=sharding, compressors=None)
        else:
            kwargs.update(compressors=codecs)
    else:
        filters, compressor = V2_CHAINS[chain]()
        kwargs.update(filters=filters, compressors=compressor)
    return zarr.create_array(
        store, shape=SHAPE, chunks=CHUNKS, dtype=dtype, zarr_format=fmt, **kwargs
    )


def plan_of(array: Any) -> Any:
    return array._async_array.codec_pipeline.plan


def stored_codecs(array: Any) -> list[Any]:
    """The codecs `byte_identical` judges for ``array``."""
    metadata = array.metadata
    if metadata.zarr_format == 2:
        return [V2Codec(filters=metadata.filters, compressor=metadata.compressor)]
    return list(metadata.codecs)


def write_both(
    tmp_path: Path, store_kind: str, fmt: int, chain: str, dtype: str, **kwargs: Any
) -> dict[str, Any]:
    """The same writes through zarr_fused (strict: native) and through zarr:
    a whole write, a partial overwrite, a region back to the fill value (in
    the one whole write on a ZipStore, which cannot overwrite)."""
    value = values_of(dtype, SHAPE, 7)
    fill = kwargs.setdefault("fill_value", fill_of(dtype))
    once = store_kind == "zip"
    if once:
        value[32:, :] = fill
    stores = {}
    for label, config in (("fused", STRICT), ("zarr", ZARR)):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, label)
            array = create(store, fmt, chain, dtype, **kwargs)
            if label == "fused":
                # (a sharded plan's chain is the outer one: strict mode
                # alone says that the shard engine runs the inner chain)
                plan = plan_of(array)
                assert plan.fallback == "" and (plan.chain.native or kwargs.get("sharded"))
            array[:] = value
            if not once:
                array[2:9, 4:20] = value[:7, :16][::-1]
                array[32:, :] = fill
            stores[label] = store
    return stores


def assert_same_as_zarr(stores: dict[str, Any]) -> None:
    """Stored chunks equal where claimed (the keys always), and each store
    reads the same through zarr_fused (strict) as through zarr."""
    with zarr.config.set(ZARR):  # mode r+: a ZipStore opens read-write only
        array = zarr.open_array(stores["zarr"], mode="r+")
        expected = array[:]
        claimed = byte_identical(stored_codecs(array))
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert sorted(ours) == sorted(theirs)
    if claimed:
        assert ours == theirs
    for store in stores.values():
        with zarr.config.set(STRICT):
            got = zarr.open_array(store, mode="r+")
            assert_same_values(got[:], expected)
            assert_same_values(got[1:35:3, 5:], expected[1:35:3, 5:])


# -- arrays against zarr ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
@pytest.mark.parametrize("chain", [pytest.param(c, id=c) for c in V3_CHAINS])
def test_v3_dtypes(tmp_path: Path, chain: str, dtype: str) -> None:
    assert_same_as_zarr(write_both(tmp_path, "memory", 3, chain, dtype))


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DTYPES])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("chain", [pytest.param(c, id=c) for c in V2_CHAINS])
def test_v2_dtypes(tmp_path: Path, chain: str, order: str, dtype: str) -> None:
    stores = write_both(tmp_path, "memory", 2, chain, dtype, order=order)
    assert_same_as_zarr(stores)


@pytest.mark.parametrize("store_kind", ["local", "memory", "zip"])
@pytest.mark.parametrize(
    ("fmt", "chain"),
    [
        pytest.param(3, "lz4", id="v3-lz4"),
        pytest.param(3, "shuffle-lz4", id="v3-shuffle-lz4"),
        pytest.param(2, "lz4", id="v2-lz4"),
        pytest.param(2, "shuffle8-lz4", id="v2-shuffle-lz4"),
    ],
)
def test_stores(tmp_path: Path, fmt: int, chain: str, store_kind: str) -> None:
    assert_same_as_zarr(write_both(tmp_path, store_kind, fmt, chain, "<f8"))


@pytest.mark.parametrize("fill_value", [0, 5, np.nan])
@pytest.mark.parametrize("chain", ["lz4", "shuffle-lz4"])
def test_fill_values(tmp_path: Path, chain: str, fill_value: float) -> None:
    """Chunks left at the fill value are not stored, as zarr does; missing
    chunks read as it."""
    stores = write_both(tmp_path, "local", 3, chain, "<f4", fill_value=fill_value)
    assert_same_as_zarr(stores)


@pytest.mark.parametrize("chain", ["lz4-crc32c", "shuffle-lz4", "shuffle2-zstd-crc32c"])
@pytest.mark.parametrize("store_kind", ["local", "memory"])
def test_sharded(tmp_path: Path, chain: str, store_kind: str) -> None:
    stores = write_both(tmp_path, store_kind, 3, chain, "<i4", sharded=True)
    assert_same_as_zarr(stores)


def test_stored_bytes_claimed() -> None:
    """This host's liblz4 is one whose blocks equal numcodecs' (the claim
    the byte comparisons above rest on)."""
    assert byte_identical([BytesCodec(), znc.LZ4(acceleration=3)])
    assert byte_identical([V2Codec(filters=(numcodecs.Shuffle(4),), compressor=numcodecs.LZ4())])


def test_native_info_lists_lz4() -> None:
    info = native_info()
    assert {"numcodecs.lz4", "numcodecs.shuffle"} <= set(info["codecs"])
    libraries: Any = info["libraries"]
    assert libraries["lz4"].count(".") == 2


# -- what stays on zarr's code ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        pytest.param({"compressors": [znc.Shuffle(elementsize=4)]}, "shuffle", id="no-compressor"),
        pytest.param(
            {"compressors": [znc.Shuffle(elementsize=4), Crc32cCodec(), znc.LZ4()]},
            "no native kernel",
            id="crc32c-between",
        ),
        pytest.param(
            {"compressors": [znc.Shuffle(elementsize=3), znc.LZ4()], "chunks": (5,)},
            "not whole 3-byte elements",
            id="partial-elements",
        ),
    ],
)
def test_shuffle_forms_without_kernel(kwargs: dict[str, Any], reason: str) -> None:
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        array = zarr.create_array(
            MemoryStore(), shape=(10,), **{"chunks": (4,), "dtype": "<i2", **kwargs}
        )
        plan = plan_of(array)
    assert not plan.chain.native
    assert reason in plan.fallback


def test_v2_shuffle_without_compressor_is_native() -> None:
    """The compressor's kernel cannot take it; the format-2 Shuffle stage
    runs it (tests/test_v2_filters.py compares it with zarr)."""
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        array = zarr.create_array(
            MemoryStore(),
            shape=(10,),
            chunks=(4,),
            dtype="<i4",
            zarr_format=2,
            filters=[numcodecs.Shuffle(4)],
            compressors=None,
        )
        assert plan_of(array).chain.native


# -- corrupt frames -------------------------------------------------------------------------


def _stored(tmp_path: Path, fmt: int, chain: str) -> tuple[LocalStore, Path]:
    store = LocalStore(tmp_path / "a")
    with zarr.config.set(STRICT):
        array = create(store, fmt, chain, "<f4", fill_value=0)
        array[:] = values_of("<f4", SHAPE, 3)
    key = "c/1/2" if fmt == 3 else "1.2"
    return store, tmp_path / "a" / key


def _header_lies(data: bytes, size: int) -> bytes:
    return size.to_bytes(4, "little") + data[4:]


CHUNK_NBYTES = CHUNKS[0] * CHUNKS[1] * 4

CORRUPTIONS = {
    "truncated": (lambda d: d[: len(d) // 2], CorruptChunkError),
    "header-only": (lambda d: d[:4], CorruptChunkError),
    "shorter-than-header": (lambda d: d[:3], DecompressionError),
    "empty": (lambda d: b"", DecompressionError),
    "claims-more": (lambda d: _header_lies(d, CHUNK_NBYTES + 1), ChunkSizeError),
    "claims-less": (lambda d: _header_lies(d, CHUNK_NBYTES - 4), ChunkSizeError),
    "claims-4GiB": (lambda d: _header_lies(d, 2**32 - 1), ChunkSizeError),
    "claims-negative": (lambda d: _header_lies(d, 2**31), ChunkSizeError),
    "garbage-block": (lambda d: d[:4] + bytes([0xF0]) + b"\xff" * 40, DecompressionError),
    "trailing-bytes": (lambda d: d + b"\x00" * 9, CorruptChunkError),
}


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("chain", ["lz4", "shuffle8-lz4"])
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_frame(tmp_path: Path, fmt: int, chain: str, corruption: str) -> None:
    if fmt == 3 and chain == "shuffle8-lz4":
        chain = "shuffle-lz4"
    store, path = _stored(tmp_path, fmt, chain)
    corrupt, kind = CORRUPTIONS[corruption]
    path.write_bytes(corrupt(path.read_bytes()))
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        with pytest.raises(kind) as info:
            array[:]
    key = "c/1/2" if fmt == 3 else "1.2"
    assert key in str(info.value)
    with zarr.config.set(ZARR), pytest.raises((ValueError, RuntimeError)):  # zarr refuses it
        zarr.open_array(store, mode="r")[:]


# -- the kernel against numcodecs ------------------------------------------------------------


def _kernel(acceleration: int = 1, elementsize: int = 0) -> ChainKernel:
    return ChainKernel(compressor="lz4", acceleration=acceleration, byte_shuffle=elementsize)


def _numcodecs_encode(data: bytes, acceleration: int, elementsize: int) -> bytes:
    shuffled = numcodecs.Shuffle(elementsize).encode(data) if elementsize else data
    return bytes(numcodecs.LZ4(acceleration).encode(shuffled))


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(["|u1", "<i2", ">u2", "<f4", ">i4", "<f8", ">c16", "|b1", "<M8[D]"]),
    count=st.integers(1, 3000),
    elementsize=st.sampled_from([0, 1, 2, 3, 4, 5, 8, 16]),
    acceleration=st.sampled_from([-5, 0, 1, 2, 7, 100, 65537, 100000]),
    seed=st.integers(0, 2**16),
    steps=st.integers(1, 50),
)
def test_kernel_matches_numcodecs(
    dtype: str, count: int, elementsize: int, acceleration: int, seed: int, steps: int
) -> None:
    rng = np.random.default_rng(seed)
    values = np.cumsum(rng.integers(-steps, steps + 1, size=count)).astype(dtype)
    data = values.tobytes()
    if elementsize > 1 and len(data) % elementsize:
        data = data[: len(data) - len(data) % elementsize]
    if not data:
        return
    kernel = _kernel(acceleration, elementsize)
    encoded = kernel.encode(data).tobytes()
    assert encoded == _numcodecs_encode(data, acceleration, elementsize)
    assert kernel.decode(encoded, len(data)).tobytes() == data


@pytest.mark.parametrize("elementsize", [0, 4])
def test_kernel_decode_out(elementsize: int) -> None:
    """New, preallocated, larger-than-needed and too-small outputs."""
    data = np.arange(1000, dtype="<u4").tobytes()
    kernel = _kernel(1, elementsize)
    encoded = kernel.encode(data)
    assert kernel.decode(encoded, len(data)).tobytes() == data
    exact = np.zeros(len(data), np.uint8)
    assert kernel.decode(encoded, len(data), out=exact).tobytes() == data
    assert exact.tobytes() == data
    larger = np.full(len(data) + 8, 0xAA, np.uint8)
    kernel.decode(encoded, len(data), out=larger)
    assert larger[: len(data)].tobytes() == data and (larger[len(data) :] == 0xAA).all()
    with pytest.raises(ValueError, match="needed"):
        kernel.decode(encoded, len(data), out=np.zeros(len(data) - 1, np.uint8))


def test_kernel_shuffle_partial_elements() -> None:
    kernel = _kernel(1, 4)
    with pytest.raises(ChunkSizeError, match="whole number of 4-byte elements"):
        kernel.encode(b"\x01" * 10)
    encoded = _kernel().encode(b"\x01" * 10)
    with pytest.raises(ChunkSizeError, match="whole number of 4-byte elements"):
        kernel.decode(encoded, 10)


def test_kernel_shuffle_needs_a_compressor() -> None:
    with pytest.raises(ValueError, match="compressor"):
        ChainKernel(byte_shuffle=4)
    with pytest.raises(ValueError, match="compressor"):
        ChainKernel(compressor="zstd", byte_shuffle=4, inner_crcs=1)
    assert ChainKernel(byte_shuffle=1).byte_shuffle == 0  # nothing to shuffle


def test_kernel_pickles() -> None:
    import pickle

    kernel = ChainKernel(compressor="lz4", acceleration=7, byte_shuffle=8)
    again = pickle.loads(pickle.dumps(kernel))
    assert (again.compressor, again.acceleration, again.byte_shuffle) == (5, 7, 8)
