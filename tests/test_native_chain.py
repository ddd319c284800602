"""Native codec chains inside arrays: zarr's pipeline as the oracle.

Property tests draw data type, byte order, shape, chunking and codec
settings; every case writes the same data through zarr_fused and through
zarr's BatchedCodecPipeline and checks values both ways, and stored bytes
for every chain without a compressor (compressed bytes depend on the
version of the compression library). Corrupt-input tests cover every codec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.chunk_utils import ChunkTransform, evolve_codecs

from zarr_fused._chain import build_chain
from zarr_fused.cli.identity import byte_identical
from zarr_fused.errors import ChecksumError, ChunkSizeError, CorruptChunkError, DecompressionError

from helpers import (
    BATCHED,
    FUSED,
    assert_same_values,
    chunk_items,
    chunk_spec,
    make_store,
    reference,
    with_pipeline,
)

DTYPES = [
    "bool",
    "int8",
    "uint16",
    "int32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "datetime64[ms]",
    "timedelta64[ns]",
    "<U2",
    "S3",
]


@st.composite
def compressor_chains(draw: st.DrawFn, itemsize: int) -> tuple[list[Any], bool]:
    """(bytes->bytes codecs, deterministic)."""
    kind = draw(st.sampled_from(["none", "zstd", "gzip", "blosc"]))
    codecs: list[Any] = []
    if kind == "zstd":
        codecs = [
            ZstdCodec(level=draw(st.sampled_from([-3, 0, 1, 5])), checksum=draw(st.booleans()))
        ]
    elif kind == "gzip":
        codecs = [GzipCodec(level=draw(st.integers(0, 9)))]
    elif kind == "blosc":
        codecs = [
            BloscCodec(
                cname=draw(st.sampled_from(["lz4", "lz4hc", "zstd", "zlib", "blosclz"])),
                clevel=draw(st.integers(0, 9)),
                shuffle=draw(st.sampled_from(["noshuffle", "shuffle", "bitshuffle"])),
                typesize=draw(st.sampled_from([1, itemsize])),
                blocksize=draw(st.sampled_from([0, 256])),
            )
        ]
    crc = draw(st.sampled_from(["none", "after", "before"]))
    if crc == "after" or (crc == "before" and not codecs):
        codecs = [*codecs, Crc32cCodec()]
    elif crc == "before":
        codecs = [Crc32cCodec(), *codecs]
    # stored bytes are compared only without a compressor: compressed bytes
    # depend on the compression library's version (zarr_fused links the
    # system's, numcodecs bundles its own), values never do
    return codecs, kind == "none"


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    if dtype.itemsize > 1 and dtype.kind not in "S":
        dtype = dtype.newbyteorder(draw(st.sampled_from(["<", ">"])))
    ndim = draw(st.integers(0, 3))
    chunks = tuple(draw(st.integers(1, 5)) for _ in range(ndim))
    shape = tuple(draw(st.integers(1, 3 * c)) for c in chunks)
    compressors, deterministic = draw(compressor_chains(dtype.itemsize))
    kwargs: dict[str, Any] = {"compressors": compressors or None}
    if dtype.itemsize > 1 and dtype.kind != "S":
        kwargs["serializer"] = BytesCodec(endian=draw(st.sampled_from(["little", "big"])))
    if ndim > 1 and draw(st.booleans()):
        kwargs["filters"] = [TransposeCodec(order=tuple(draw(st.permutations(range(ndim)))))]
    return {
        "dtype": dtype,
        "shape": shape,
        "chunks": chunks,
        "kwargs": kwargs,
        "deterministic": deterministic,
        "seed": draw(st.integers(0, 2**16)),
        "wec": draw(st.booleans()),
    }


def _data(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype.kind == "b":
        raw = raw & 1
    data = raw.view(dtype).reshape(shape).copy()
    if dtype.kind == "U":  # only valid code points
        data = np.array(["\u00e9x"[: s % 3] for s in rng.integers(0, 3, data.size)], dtype=dtype)
        data = data.reshape(shape)
    if data.size > 3:
        data.reshape(-1)[:3] = np.zeros((), dtype)  # some fill values
    return data


@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases())
def test_property_chains_match_zarr(tmp_path_factory: Any, case: dict[str, Any]) -> None:
    data = _data(case["dtype"], case["shape"], case["seed"])
    tmp = tmp_path_factory.mktemp("chains")
    stores = {}
    for path in (FUSED, BATCHED):
        store = make_store("memory", tmp)
        with with_pipeline(path):
            arr = zarr.create_array(
                store,
                shape=data.shape,
                chunks=case["chunks"],
                dtype=data.dtype,
                fill_value=np.zeros((), data.dtype)[()],
                config={"write_empty_chunks": case["wec"]},
                **case["kwargs"],
            )
            if path == FUSED:
                assert arr._async_array.codec_pipeline.plan.chain.native
            arr[...] = data
            if data.ndim:
                arr[tuple(slice(0, max(1, s // 2)) for s in data.shape)] = data[
                    tuple(slice(0, max(1, s // 2)) for s in data.shape)
                ][:: -1 if data.ndim == 1 else 1]
        stores[path] = store
    ours, theirs = chunk_items(stores[FUSED]), chunk_items(stores[BATCHED])
    assert sorted(ours) == sorted(theirs)
    if case["deterministic"]:
        assert ours == theirs
    for reader in (FUSED, BATCHED):
        with with_pipeline(reader):
            a = np.asarray(zarr.open_array(stores[FUSED], mode="r")[...])
            b = np.asarray(zarr.open_array(stores[BATCHED], mode="r")[...])
        assert_same_values(a, b)


# -- corrupt stored chunks, every codec ----------------------------------------------

# name: (compressors, error for truncated/empty/garbage bytes, error for bit
# flips or None where the format carries no integrity check)
CORRUPT_LAYOUTS = {
    "zstd": ([ZstdCodec(level=1)], CorruptChunkError, None),
    "zstd-checksum": ([ZstdCodec(level=1, checksum=True)], CorruptChunkError, DecompressionError),
    "gzip": ([GzipCodec(level=1)], CorruptChunkError, CorruptChunkError),
    "blosc": ([BloscCodec(cname="lz4", shuffle="shuffle")], CorruptChunkError, None),
    "crc32c": ([Crc32cCodec()], ChecksumError, ChecksumError),
    "zstd-crc32c": ([ZstdCodec(level=1), Crc32cCodec()], ChecksumError, ChecksumError),
    "raw": (None, ChunkSizeError, None),
}


def _corrupt(store: Any, key: str, how: str) -> None:
    proto = default_buffer_prototype()
    raw = bytearray(zarr.core.sync.sync(store.get(key, prototype=proto)).to_bytes())
    if how == "truncate":
        raw = raw[: len(raw) // 2]
    elif how == "flip":
        raw[len(raw) // 2] ^= 0x5A
        raw[-1] ^= 0x01
    elif how == "empty":
        raw = bytearray()
    elif how == "garbage":
        raw = bytearray(np.random.default_rng(1).bytes(len(raw)))
    zarr.core.sync.sync(store.set(key, proto.buffer.from_bytes(bytes(raw))))


@pytest.mark.parametrize("how", ["truncate", "flip", "empty", "garbage"])
@pytest.mark.parametrize("layout", [pytest.param(v, id=k) for k, v in CORRUPT_LAYOUTS.items()])
@pytest.mark.parametrize("kind", ["memory", "nosync"])
def test_corrupt_chunk_raises_naming_the_key(
    tmp_path: Path, kind: str, layout: tuple[Any, Any, Any], how: str
) -> None:
    compressors, broken, flipped = layout
    expected = flipped if how == "flip" else broken
    if how == "garbage" and compressors is None:
        expected = None  # same length: indistinguishable from data
    store = make_store(kind, tmp_path)
    data = np.arange(400, dtype="<f8").reshape(20, 20)
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store, shape=(20, 20), chunks=(10, 10), dtype="<f8", compressors=compressors
        )
        arr[...] = data
        _corrupt(store, "c/1/0", how)
        if expected is None:
            # no integrity check in the format: either an error naming the
            # key or values of the right shape, never a crash
            try:
                got = arr[...]
            except CorruptChunkError as exc:
                assert "c/1/0" in str(exc)
            else:
                assert got.shape == (20, 20)
        else:
            with pytest.raises(expected) as info:
                arr[...]
            assert "c/1/0" in str(info.value)
            assert isinstance(info.value, CorruptChunkError) and isinstance(info.value, ValueError)
        # the other chunks still read, and a full overwrite repairs the array
        assert_same_values(arr[:10, :], data[:10, :])
        arr[10:, :10] = 5.0
        data[10:, :10] = 5.0
        assert_same_values(arr[...], data)


def test_zarr_reads_what_zarr_fused_wrote_for_every_codec(tmp_path: Path) -> None:
    """Cross-read on LocalStore with every codec at once in one array set."""
    data = np.random.default_rng(3).normal(size=(33, 17)).astype(">f4")
    for name, (compressors, _, _) in CORRUPT_LAYOUTS.items():
        store = make_store("local", tmp_path, name)
        with with_pipeline(FUSED):
            zarr.create_array(
                store, shape=data.shape, chunks=(8, 8), dtype=data.dtype, compressors=compressors
            )[...] = data
        with with_pipeline(BATCHED):
            assert_same_values(zarr.open_array(store, mode="r")[...], data, byte_order=False)


# -- which chunks count as empty (write_empty_chunks=False) --------------------------

_NAN_PAYLOAD = np.array([0x7FF8000000000001], dtype="<u8").view("<f8")[0]


@pytest.mark.parametrize(
    ("dtype", "fill", "chunk_value"),
    [
        pytest.param("<f8", 0.0, 0.0, id="zero-fill-zero"),
        pytest.param("<f8", 0.0, -0.0, id="zero-fill-negzero"),
        pytest.param("<f8", -0.0, 0.0, id="negzero-fill-zero"),
        pytest.param("<f8", np.nan, np.nan, id="nan-fill-nan"),
        pytest.param("<f8", np.nan, _NAN_PAYLOAD, id="nan-fill-other-nan"),
        pytest.param(">f4", 2.5, 2.5, id="bigendian-fill"),
        pytest.param("<c16", 0j, complex(-0.0, 0.0), id="complex-negzero"),
        pytest.param("<i4", 7, 7, id="int-fill"),
        pytest.param("<M8[s]", "NaT", "NaT", id="nat-fill"),
        pytest.param("bool", True, True, id="bool-fill"),
    ],
)
@pytest.mark.parametrize("compressors", [None, ZstdCodec(level=1)], ids=["raw", "zstd"])
def test_empty_chunk_rule_matches_zarr(
    tmp_path: Path, dtype: str, fill: Any, chunk_value: Any, compressors: Any
) -> None:
    keys = {}
    for path in (FUSED, BATCHED):
        store = make_store("local", tmp_path, path)
        with with_pipeline(path):
            arr = zarr.create_array(
                store,
                shape=(8,),
                chunks=(4,),
                dtype=dtype,
                fill_value=fill,
                compressors=compressors,
            )
            value = np.full(8, np.array(chunk_value, dtype=dtype), dtype=dtype)
            value[4] = np.array(1, dtype=dtype)  # the second chunk is never empty
            arr[...] = value
        keys[path] = sorted(chunk_items(store))
    assert keys[FUSED] == keys[BATCHED]


# -- the chain against its reference twin (helpers.reference) --------------------
#
# `reference.encode_chunk` / `decode_chunk` are the pure NumPy/numcodecs
# twins of a native chain. Each case runs the native chain (`build_chain`, as
# the pipeline builds it) and the twin on the same chunk and compares bytes:
# decoded chunks bit for bit (NaN payloads and all), encoded payloads exactly
# where zarr_fused claims zarr's bytes (`byte_identical`: the twin encodes
# with zarr's own numcodecs), else by decoding each with the other. The twin
# is itself checked against zarr's ChunkTransform.

# (the array's data type, the byte order `bytes` stores): every kind, each
# multi-byte type stored in the other byte order or in its own
TWIN_DTYPES = [
    pytest.param(np.dtype(s), endian, id=f"{s}-{endian}")
    for s, endian in (
        ("bool", "little"),
        ("int8", "little"),
        ("<u2", "big"),
        (">i4", "little"),
        ("<u8", "little"),
        (">f2", "big"),
        ("<f4", "big"),
        (">f8", "little"),
        (">c8", "big"),
        ("<c16", "little"),
        ("<M8[ms]", "big"),
        (">m8[ns]", "little"),
        ("<U2", "big"),
        (">U3", "little"),
        ("S3", "little"),
    )
]
# (chunk shape, transpose orders): 0-d, 1-d, 3-d without, with one and with two transposes
TWIN_GEOMETRIES = [
    pytest.param(((), ()), id="0d"),
    pytest.param(((7,), ()), id="1d"),
    pytest.param(((3, 4, 5), ()), id="3d"),
    pytest.param(((3, 4, 5), ((2, 0, 1),)), id="3d-T201"),
    pytest.param(((2, 1, 6), ((1, 2, 0), (1, 0, 2))), id="3d-T120-T102"),
]
TWIN_TAILS = {
    "raw": [],
    "crc": [Crc32cCodec()],
    "zstd": [ZstdCodec(level=1)],
    "crc-zstd-checksum-crc": [Crc32cCodec(), ZstdCodec(level=3, checksum=True), Crc32cCodec()],
    "gzip": [GzipCodec(level=5)],
    "blosc-shuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "blosc-bitshuffle-crc": [
        BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),
        Crc32cCodec(),
    ],
}
TWIN_TAIL_PARAMS = [pytest.param(k, id=k) for k in TWIN_TAILS]


class TwinChain:
    """One chain for one chunk spec: zarr's codecs, the native chain, zarr's
    ChunkTransform."""

    def __init__(
        self,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        orders: tuple[tuple[int, ...], ...],
        endian: str,
        tail: list[Any],
    ) -> None:
        self.spec = chunk_spec(shape, dtype)
        codecs = [*(TransposeCodec(order=o) for o in orders), BytesCodec(endian=endian), *tail]
        self.codecs = evolve_codecs(codecs, self.spec)
        self.transform = ChunkTransform(codecs=self.codecs)
        self.native = build_chain(self.codecs, self.spec, self.transform)
        assert self.native.native, self.native.reason

    def native_decode(self, payload: bytes) -> np.ndarray:
        buf = default_buffer_prototype().buffer.from_bytes(payload)
        return np.asarray(self.native.decode(buf, self.spec).as_numpy_array())

    def native_encode(self, chunk: np.ndarray) -> bytes:
        encoded = self.native.encode(NDBuffer.from_numpy_array(chunk), self.spec)
        assert encoded is not None
        return encoded.to_bytes()

    def zarr_encode(self, chunk: np.ndarray) -> bytes:
        encoded = self.transform.encode_chunk(NDBuffer.from_numpy_array(chunk), self.spec)
        assert encoded is not None
        return encoded.to_bytes()

    def zarr_decode(self, payload: bytes) -> np.ndarray:
        buf = default_buffer_prototype().buffer.from_bytes(payload)
        return np.asarray(self.transform.decode_chunk(buf, self.spec).as_numpy_array())

    def bytes_claimed(self) -> bool:
        """Whether the twin's encoded bytes must equal the native ones."""
        return byte_identical(self.codecs, gzip_mtime_zero=True)


def _twin_chunk(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random bits of the array's data type (valid code points for U)."""
    return _data(dtype, shape, seed)


def _bits(array: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    array = np.asarray(array)
    return array.dtype.str, array.shape, array.tobytes()


@pytest.mark.parametrize("tail", TWIN_TAIL_PARAMS)
@pytest.mark.parametrize("geometry", TWIN_GEOMETRIES)
@pytest.mark.parametrize(("dtype", "endian"), TWIN_DTYPES)
def test_native_decode_matches_reference(
    dtype: np.dtype[Any], endian: str, geometry: Any, tail: str
) -> None:
    shape, orders = geometry
    chain = TwinChain(dtype, shape, orders, endian, TWIN_TAILS[tail])
    chunk = _twin_chunk(dtype, shape, seed=11)
    payload = reference.encode_chunk(chunk, chain.codecs, chain.spec)
    expected = reference.decode_chunk(payload, chain.codecs, chain.spec)
    assert _bits(chain.native_decode(payload)) == _bits(expected)
    assert _bits(expected) == _bits(chunk)


@pytest.mark.parametrize("tail", TWIN_TAIL_PARAMS)
@pytest.mark.parametrize("geometry", TWIN_GEOMETRIES)
@pytest.mark.parametrize(("dtype", "endian"), TWIN_DTYPES)
def test_native_encode_matches_reference(
    dtype: np.dtype[Any], endian: str, geometry: Any, tail: str
) -> None:
    shape, orders = geometry
    chain = TwinChain(dtype, shape, orders, endian, TWIN_TAILS[tail])
    chunk = _twin_chunk(dtype, shape, seed=12)
    ours = chain.native_encode(chunk)
    if chain.bytes_claimed():
        assert ours == reference.encode_chunk(chunk, chain.codecs, chain.spec)
    assert _bits(reference.decode_chunk(ours, chain.codecs, chain.spec)) == _bits(chunk)


# the twin itself against zarr's ChunkTransform, both ways
TWIN_ZARR_CASES = [
    pytest.param(">f8", ((3, 4, 5), ((2, 0, 1),)), "little", "raw", id="f8-T201-raw"),
    pytest.param("<i4", ((7,), ()), "big", "crc", id="i4-1d-be-crc"),
    pytest.param(
        "<U2",
        ((2, 1, 6), ((1, 2, 0), (1, 0, 2))),
        "big",
        "crc-zstd-checksum-crc",
        id="U2-T120-T102-be-crc-zstd-crc",
    ),
    pytest.param("<c16", ((), ()), "little", "zstd", id="c16-0d-zstd"),
    pytest.param(">u2", ((3, 4, 5), ()), "little", "gzip", id="u2-3d-gzip"),
    pytest.param("<M8[ms]", ((7,), ()), "big", "blosc-shuffle", id="M8-1d-be-blosc"),
    pytest.param(
        "bool",
        ((3, 4, 5), ((2, 0, 1),)),
        "little",
        "blosc-bitshuffle-crc",
        id="bool-T201-blosc-crc",
    ),
]


@pytest.mark.parametrize(("dtype", "geometry", "endian", "tail"), TWIN_ZARR_CASES)
def test_reference_chain_matches_zarr(dtype: str, geometry: Any, endian: str, tail: str) -> None:
    shape, orders = geometry
    chain = TwinChain(np.dtype(dtype), shape, orders, endian, TWIN_TAILS[tail])
    chunk = _twin_chunk(np.dtype(dtype), shape, seed=13)
    theirs = chain.zarr_encode(chunk)
    ours = reference.encode_chunk(chunk, chain.codecs, chain.spec)
    if tail == "gzip":
        # zarr writes the current time into the gzip header (MTIME, bytes 4-7)
        theirs = theirs[:4] + bytes(4) + theirs[8:]
    assert ours == theirs
    decoded = reference.decode_chunk(theirs, chain.codecs, chain.spec)
    assert _bits(decoded) == _bits(chunk)
    assert decoded.tobytes() == chain.zarr_decode(ours).astype(decoded.dtype).tobytes()


TWIN_CORRUPT = [
    pytest.param("crc", "flip", ChecksumError, id="crc-flip"),
    pytest.param("crc", "truncate", ChecksumError, id="crc-truncate"),
    pytest.param("raw", "truncate", ChunkSizeError, id="raw-truncate"),
    pytest.param("raw", "extend", ChunkSizeError, id="raw-extend"),
    pytest.param("zstd", "garbage", CorruptChunkError, id="zstd-garbage"),
    pytest.param("gzip", "truncate", CorruptChunkError, id="gzip-truncate"),
    pytest.param("crc-zstd-checksum-crc", "flip", ChecksumError, id="crc-zstd-crc-flip"),
]


@pytest.mark.parametrize(("tail", "how", "error"), TWIN_CORRUPT)
def test_corrupt_payload_raises_like_reference(tail: str, how: str, error: type) -> None:
    chain = TwinChain(np.dtype("<f8"), (3, 4, 5), (), "little", TWIN_TAILS[tail])
    payload = bytearray(
        reference.encode_chunk(
            _twin_chunk(np.dtype("<f8"), (3, 4, 5), 14), chain.codecs, chain.spec
        )
    )
    if how == "flip":
        payload[len(payload) // 2] ^= 0x10
    elif how == "truncate":
        payload = payload[: len(payload) // 2]
    elif how == "extend":
        payload += b"\0" * 8
    else:
        payload = bytearray(np.random.default_rng(15).bytes(len(payload)))
    with pytest.raises(error):
        reference.decode_chunk(bytes(payload), chain.codecs, chain.spec)
    with pytest.raises(error):
        chain.native_decode(bytes(payload))


@st.composite
def twin_cases(draw: st.DrawFn) -> tuple[TwinChain, np.ndarray]:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    orders = tuple(
        tuple(draw(st.permutations(range(ndim))))
        for _ in range(draw(st.integers(0, 2)) if ndim > 1 else 0)
    )
    tail, _ = draw(compressor_chains(dtype.itemsize))
    endian = draw(st.sampled_from(["little", "big"]))
    chain = TwinChain(dtype, shape, orders, endian, tail)
    return chain, _twin_chunk(dtype, shape, draw(st.integers(0, 2**16)))


@pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(case=twin_cases())
def test_property_native_chain_matches_reference(case: tuple[TwinChain, np.ndarray]) -> None:
    chain, chunk = case
    payload = reference.encode_chunk(chunk, chain.codecs, chain.spec)
    assert _bits(chain.native_decode(payload)) == _bits(chunk)
    ours = chain.native_encode(chunk)
    if chain.bytes_claimed():
        assert ours == payload
    assert _bits(reference.decode_chunk(ours, chain.codecs, chain.spec)) == _bits(chunk)
