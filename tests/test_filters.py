"""Codec chains with array->array filters, and numcodecs' compressors.

Every test writes and reads the same array through zarr_fused and through
zarr's `BatchedCodecPipeline` (the oracle): values must agree, and stored
chunks must agree byte for byte wherever `byte_identical` claims it.

Chains with a filter that has no native kernel run as hybrid chains
(`zarr_fused._hybrid`): the filter runs zarr's code, the rest natively;
strict mode rejects them. ``numcodecs.zlib`` and ``numcodecs.gzip`` run on
the native zlib and gzip kernels, in strict mode.
"""

from __future__ import annotations

import gzip
import threading
import time
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.codecs import numcodecs as znc
from zarr.codecs._v2 import V2Codec
from zarr.codecs.scale_offset import ScaleOffset
from zarr.storage import LocalStore, MemoryStore
from zarr_fused_testing.s3 import LatencyProxy

from zarr_fused._filter_stages import NativeBitRound, NativeFixedScaleOffset, NativeQuantize
from zarr_fused._hybrid import FilteredChain, HybridChain, split_python_stages
from zarr_fused.chunks import write as chunk_write
from zarr_fused.cli.identity import byte_identical
from zarr_fused.errors import ChunkSizeError, DecompressionError, UnsupportedError

from helpers import (
    BATCHED,
    FUSED,
    STRICT,
    assert_same_values,
    chunk_items,
    grouped_chain,
    make_store,
)
from helpers.filter_data import values_of
from helpers.s3_stores import new_prefix, open_store

LENIENT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": False}

SHAPE = (37, 29)  # edge chunks on both axes
CHUNKS = (16, 12)


def _cast_value(data_type: str) -> Any:
    pytest.importorskip("cast_value_rs")
    from zarr.codecs.cast_value import CastValue

    return CastValue(data_type=data_type, out_of_range="clamp")


# Filter chains as climate, microscopy and zarr's docs write them: the
# filters, the array's dtype, how values are drawn, the compressor
FILTER_CHAINS: dict[str, dict[str, Any]] = {
    "delta-i4-zstd": {
        "filters": lambda: [znc.Delta(dtype="<i4")],
        "dtype": "<i4",
        "values": "ints",
        "fill": -1,
    },
    "delta-f8-astype-f4": {
        "filters": lambda: [znc.Delta(dtype="<f8", astype="<f4")],
        "dtype": "<f8",
        "values": "floats",
    },
    "delta-i4-astype-i2": {
        "fill": -1,
        "filters": lambda: [znc.Delta(dtype="<i4", astype="<i2")],
        "dtype": "<i4",
        "values": "ints",
    },
    # no kernel: numcodecs sums float64 differences into float32
    "delta-f4-astype-f8": {
        "filters": lambda: [znc.Delta(dtype="<f4", astype="<f8")],
        "dtype": "<f4",
        "values": "floats",
    },
    "fixedscaleoffset-f8-i2": {
        "fill": 7,
        "filters": lambda: [
            znc.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")
        ],
        "dtype": "<f8",
        "values": "temperatures",
    },
    "fixedscaleoffset-f4-u1": {
        "fill": 7,
        "filters": lambda: [znc.FixedScaleOffset(offset=0, scale=2, dtype="<f4", astype="|u1")],
        "dtype": "<f4",
        "values": "small",
    },
    "quantize-f4": {
        "filters": lambda: [znc.Quantize(digits=3, dtype="<f4")],
        "dtype": "<f4",
        "values": "floats",
    },
    "quantize-f8": {
        "filters": lambda: [znc.Quantize(digits=2, dtype="<f8")],
        "dtype": "<f8",
        "values": "floats",
    },
    "bitround-f4": {
        "filters": lambda: [znc.BitRound(keepbits=10)],
        "dtype": "<f4",
        "values": "floats",
    },
    "bitround-f8": {
        "filters": lambda: [znc.BitRound(keepbits=20)],
        "dtype": "<f8",
        "values": "floats",
    },
    "astype-f8-f4": {
        "filters": lambda: [znc.AsType(encode_dtype="<f4", decode_dtype="<f8")],
        "dtype": "<f8",
        "values": "floats",
    },
    "scale_offset-f4": {
        "filters": lambda: [ScaleOffset(offset=10, scale=4)],
        "dtype": "<f4",
        "values": "small",
    },
    "scale_offset-i2": {
        "fill": -1,
        "filters": lambda: [ScaleOffset(offset=100, scale=3)],
        "dtype": "<i2",
        "values": "ints",
    },
    "scale_offset-u8": {
        "fill": 7,
        "filters": lambda: [ScaleOffset(offset=0, scale=5)],
        "dtype": "<u8",
        "values": "ints",
    },
    "scale_offset-i8-wraps": {
        "fill": 1,
        "filters": lambda: [ScaleOffset(offset=-(2**62), scale=1)],
        "dtype": "<i8",
        "values": "ints",
    },
    "astype-i4-i2": {
        "fill": -3,
        "filters": lambda: [znc.AsType(encode_dtype="<i2", decode_dtype="<i4")],
        "dtype": "<i4",
        "values": "ints",
    },
    "astype-f8-i4": {
        "fill": 0,
        "filters": lambda: [znc.AsType(encode_dtype="<i4", decode_dtype="<f8")],
        "dtype": "<f8",
        "values": "small",
    },
    "astype-u2-f4": {
        "fill": 5,
        "filters": lambda: [znc.AsType(encode_dtype="<f4", decode_dtype="<u2")],
        "dtype": "<u2",
        "values": "ints",
    },
    "cast_value-f8-i2": {
        "fill": 7,
        "filters": lambda: [_cast_value("int16")],
        "dtype": "<f8",
        "values": "small",
    },
    "scale_offset-cast_value-f4-u2": {
        "fill": 7,
        "filters": lambda: [ScaleOffset(offset=-50, scale=100), _cast_value("uint16")],
        "dtype": "<f4",
        "values": "small",
    },
    "delta-bitround-f4": {
        "filters": lambda: [znc.BitRound(keepbits=12), znc.Delta(dtype="<f4")],
        "dtype": "<f4",
        "values": "floats",
    },
    "transpose-then-quantize": {
        "filters": lambda: [TransposeCodec(order=(1, 0)), znc.Quantize(digits=4, dtype="<f8")],
        "dtype": "<f8",
        "values": "floats",
    },
    "transpose-then-astype": {
        "filters": lambda: [
            TransposeCodec(order=(1, 0)),
            znc.AsType(encode_dtype="<f4", decode_dtype="<f8"),
        ],
        "dtype": "<f8",
        "values": "floats",
    },
    "astype-then-delta": {
        "filters": lambda: [
            znc.AsType(encode_dtype="<f4", decode_dtype="<f8"),
            znc.Delta(dtype="<f4"),
        ],
        "dtype": "<f8",
        "values": "floats",
    },
    "fixedscaleoffset-f4-i4-nan": {
        "filters": lambda: [
            znc.FixedScaleOffset(offset=-2.5, scale=1000, dtype="<f4", astype="<i4")
        ],
        "dtype": "<f4",
        "values": "small",
    },
    "bitround-f2": {
        "filters": lambda: [znc.BitRound(keepbits=4)],
        "dtype": "<f2",
        "values": "small",
    },
    "scale_offset-f8": {
        "filters": lambda: [ScaleOffset(offset=273.15, scale=0.1)],
        "dtype": "<f8",
        "values": "temperatures",
    },
    "transpose-then-delta-astype": {
        "filters": lambda: [
            TransposeCodec(order=(1, 0)),
            znc.Delta(dtype="<f4", astype="<f8"),
        ],
        "dtype": "<f4",
        "values": "floats",
    },
    "bitround-then-delta-astype": {
        "filters": lambda: [znc.BitRound(keepbits=12), znc.Delta(dtype="<f4", astype="<f8")],
        "dtype": "<f4",
        "values": "floats",
    },
}

#: chains whose every filter has a native kernel: they run in strict mode
NATIVE_CHAINS = [
    "delta-i4-zstd",
    "fixedscaleoffset-f8-i2",
    "fixedscaleoffset-f4-u1",
    "fixedscaleoffset-f4-i4-nan",
    "quantize-f4",
    "quantize-f8",
    "bitround-f4",
    "bitround-f8",
    "bitround-f2",
    "delta-bitround-f4",
    "transpose-then-quantize",
    "astype-f8-f4",
    "astype-then-delta",
    "scale_offset-f4",
    "scale_offset-f8",
    "scale_offset-i2",
    "scale_offset-u8",
    "scale_offset-i8-wraps",
    "astype-i4-i2",
    "astype-f8-i4",
    "astype-u2-f4",
    "delta-f8-astype-f4",
    "delta-i4-astype-i2",
]

COMPRESSORS: dict[str, Any] = {
    "zstd": lambda: [ZstdCodec(level=3)],
    "blosc": lambda: [BloscCodec(cname="lz4", clevel=5)],
    "zstd-crc32c": lambda: [ZstdCodec(level=1), Crc32cCodec()],
    "none": list,
}


def create(
    store: Any,
    case: dict[str, Any],
    compressors: list[Any],
    *,
    sharded: bool,
    fill_value: Any,
) -> Any:
    filters = case["filters"]()
    if sharded:
        inner = ShardingCodec(chunk_shape=(8, 6), codecs=[*filters, BytesCodec(), *compressors])
        return zarr.create_array(
            store,
            shape=SHAPE,
            chunks=CHUNKS,
            dtype=case["dtype"],
            fill_value=fill_value,
            serializer=inner,
            compressors=None,
            filters=None,
        )
    return zarr.create_array(
        store,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype=case["dtype"],
        fill_value=fill_value,
        filters=filters,
        serializer=BytesCodec(),
        compressors=compressors,
    )


def write_both(
    tmp_path: Path,
    case: dict[str, Any],
    compressor: str,
    *,
    store_kind: str,
    sharded: bool,
    fill_value: Any,
    seed: int = 0,
    fused: dict[str, Any] = LENIENT,
) -> dict[str, Any]:
    """The same writes (a whole array, then a partial overwrite) through
    zarr_fused and zarr; the stores by pipeline name."""
    value = values_of(case["values"], case["dtype"], SHAPE, seed)
    patch = values_of(case["values"], case["dtype"], (5, 17), seed + 1)
    stores = {}
    for name, config in (("fused", fused), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, name)
            array = create(
                store, case, COMPRESSORS[compressor](), sharded=sharded, fill_value=fill_value
            )
            array[:] = value
            array[3:8, 6:23] = patch
            array[20:, :] = fill_value  # whole chunks of fill value: not stored
            stores[name] = store
    return stores


def assert_same_stores(stores: dict[str, Any], codecs: list[Any]) -> None:
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert sorted(ours) == sorted(theirs)
    if byte_identical(codecs):
        for key in theirs:
            assert ours[key] == theirs[key], key
    for store in stores.values():
        with zarr.config.set({"codec_pipeline.path": BATCHED}):
            expected = zarr.open_array(store, mode="r")
            expected_all, expected_part = expected[:], expected[2:30:3, 5:]
        with zarr.config.set(LENIENT):
            array = zarr.open_array(store, mode="r")
            assert_same_values(array[:], expected_all)
            assert_same_values(array[2:30:3, 5:], expected_part)


def case_params() -> list[Any]:
    params = []
    for name in FILTER_CHAINS:
        for compressor in ("zstd", "blosc"):
            params.append(pytest.param(name, compressor, id=f"{name}-{compressor}"))
    return params


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize(("name", "compressor"), case_params())
@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_filter_chain_matches_zarr(
    tmp_path: Path, name: str, compressor: str, store_kind: str, sharded: bool
) -> None:
    case = FILTER_CHAINS[name]
    fill = case.get("fill", np.nan)
    stores = write_both(
        tmp_path, case, compressor, store_kind=store_kind, sharded=sharded, fill_value=fill
    )
    assert_same_stores(stores, [*case["filters"](), *COMPRESSORS[compressor]()])


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n) for n in ("fixedscaleoffset-f8-i2", "quantize-f4")]
)
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_filter_chain_async_path(tmp_path: Path, name: str, sharded: bool) -> None:
    """A store without synchronous IO: zarr_fused's async path."""
    case = FILTER_CHAINS[name]
    stores = write_both(
        tmp_path, case, "zstd", store_kind="nosync", sharded=sharded, fill_value=case.get("fill", 0)
    )
    assert_same_stores(stores, [*case["filters"](), ZstdCodec(level=3)])


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_filter_chain_object_store(proxy: LatencyProxy, sharded: bool) -> None:
    """An obstore S3 store on a moto server, against zarr on a MemoryStore."""
    pytest.importorskip("obstore.store")
    case = FILTER_CHAINS["delta-i4-zstd"]
    value = values_of(case["values"], case["dtype"], SHAPE, 4)
    stores = {}
    for label, config in (("fused", LENIENT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = (
                open_store("obstore", proxy, new_prefix()) if label == "fused" else MemoryStore()
            )
            array = create(store, case, [ZstdCodec()], sharded=sharded, fill_value=-1)
            array[:] = value
            array[3:8, 6:23] = value[:5, :17] * 3
            stores[label] = store
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
    with zarr.config.set(LENIENT):
        assert_same_values(zarr.open_array(stores["fused"], mode="r")[1:30, 2:], expected[1:30, 2:])


@pytest.mark.parametrize(
    "compressor",
    [pytest.param(c, id=c) for c in ("zstd-crc32c", "none")],
)
def test_filter_chain_checksum_and_raw(tmp_path: Path, compressor: str) -> None:
    case = FILTER_CHAINS["fixedscaleoffset-f8-i2"]
    stores = write_both(tmp_path, case, compressor, store_kind="local", sharded=False, fill_value=0)
    assert_same_stores(stores, [*case["filters"](), *COMPRESSORS[compressor]()])


def plan_of(array: Any) -> Any:
    return array._async_array.codec_pipeline.plan


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, id=n) for n in ("delta-f4-astype-f8", "transpose-then-delta-astype")],
)
def test_plan_records_python_stage(name: str) -> None:
    case = FILTER_CHAINS[name]
    with zarr.config.set(LENIENT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=False, fill_value=0)
        plan = plan_of(array)
    assert isinstance(plan.chain, HybridChain)
    stage = type(case["filters"]()[-1]).__name__
    assert f"{stage} run zarr's code" in plan.read_fallback
    assert plan.read_fallback == plan.write_fallback


@pytest.mark.parametrize(
    ("name", "grouped"),
    [
        ("transpose-then-quantize", True),
        ("transpose-then-astype", True),
        ("transpose-then-delta-astype", False),  # delta's running sum follows the order
    ],
)
def test_leading_transpose_read_in_groups(tmp_path: Path, name: str, grouped: bool) -> None:
    """An unsharded local chain whose transpose comes before elementwise
    filters reads its files in groups through the batch kernels, as the
    shard engine reads such inner chunks; values as zarr's."""
    case = FILTER_CHAINS[name]
    value = values_of(case["values"], case["dtype"], SHAPE, 0)
    store = zarr.storage.LocalStore(tmp_path / "a")
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        create(store, case, [ZstdCodec(level=1)], sharded=False, fill_value=0)[:] = value
        expected = zarr.open_array(store, mode="r")[:]
    with zarr.config.set(LENIENT):
        array = zarr.open_array(store, mode="r")
        assert (grouped_chain(array) is not None) is grouped
        assert_same_values(array[:], expected)
        assert_same_values(array[2:30:3, 5:], expected[2:30:3, 5:])


def test_native_stage_not_named_as_python() -> None:
    """Delta with astype runs zarr's code, BitRound natively: only Delta is named."""
    case = FILTER_CHAINS["bitround-then-delta-astype"]
    with zarr.config.set(LENIENT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=False, fill_value=0)
        reason = plan_of(array).read_fallback
    assert "Delta run zarr's code" in reason
    assert "BitRound" not in reason


def test_strict_rejects_python_stage() -> None:
    case = FILTER_CHAINS["delta-f4-astype-f8"]
    with zarr.config.set(STRICT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=False, fill_value=0)
        with pytest.raises(UnsupportedError, match="Delta run zarr's code"):
            array[:] = 1.0
        with pytest.raises(UnsupportedError, match="Delta run zarr's code"):
            array[:]


def test_strict_rejects_python_stage_sharded() -> None:
    case = FILTER_CHAINS["delta-f4-astype-f8"]
    with zarr.config.set(STRICT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=True, fill_value=0)
        with pytest.raises(UnsupportedError, match="inner chunks"):
            array[:]


@pytest.mark.parametrize(
    ("codecs", "split"),
    [
        pytest.param([BytesCodec()], 0, id="bytes"),
        pytest.param([TransposeCodec(order=(1, 0)), BytesCodec()], 0, id="transpose"),
        pytest.param([znc.Delta(dtype="<i4"), BytesCodec()], 1, id="delta"),
        pytest.param(
            [znc.Delta(dtype="<i4"), TransposeCodec(order=(1, 0)), BytesCodec()],
            1,
            id="delta-transpose",
        ),
        pytest.param(
            [TransposeCodec(order=(1, 0)), znc.Delta(dtype="<i4"), BytesCodec()],
            2,
            id="transpose-delta",
        ),
    ],
)
def test_split_python_stages(codecs: list[Any], split: int) -> None:
    assert split_python_stages(tuple(codecs)) == split


def test_corrupt_chunk_names_key(tmp_path: Path) -> None:
    case = FILTER_CHAINS["delta-i4-zstd"]
    with zarr.config.set(LENIENT):
        store = make_store("local", tmp_path)
        array = create(store, case, [ZstdCodec()], sharded=False, fill_value=0)
        array[:] = values_of("ints", "<i4", SHAPE, 3)
        chunk = tmp_path / "data" / "c" / "1" / "0"
        chunk.write_bytes(chunk.read_bytes()[:-7])
        with pytest.raises(DecompressionError, match=r"c/1/0"):
            array[:]


# numcodecs' compressors under their format-3 names, on the native kernels


NUMCODECS_COMPRESSORS = {
    "zlib-1": lambda: znc.Zlib(level=1),
    "zlib-9": lambda: znc.Zlib(level=9),
    "zlib-default": lambda: znc.Zlib(),
    "gzip-1": lambda: znc.GZip(level=1),
    "gzip-6": lambda: znc.GZip(level=6),
}


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in NUMCODECS_COMPRESSORS])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_numcodecs_compressor_strict(tmp_path: Path, name: str, store_kind: str) -> None:
    value = values_of("floats", "<f8", SHAPE, 5)
    stores = {}
    for label, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, label)
            array = zarr.create_array(
                store,
                shape=SHAPE,
                chunks=CHUNKS,
                dtype="<f8",
                compressors=[NUMCODECS_COMPRESSORS[name]()],
            )
            array[:] = value
            array[1:4, 2:9] = -1.0
            stores[label] = store
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert sorted(ours) == sorted(theirs)
    compressor = NUMCODECS_COMPRESSORS[name]()
    for key in theirs:
        if name.startswith("gzip"):
            # zarr writes the clock into gzip's header; the payload agrees
            assert gzip.decompress(ours[key]) == gzip.decompress(theirs[key]), key
        elif byte_identical([compressor]):
            assert ours[key] == theirs[key], key
    for store in stores.values():
        with zarr.config.set({"codec_pipeline.path": BATCHED}):
            expected = zarr.open_array(store, mode="r")[:]
        with zarr.config.set(STRICT):
            assert_same_values(zarr.open_array(store, mode="r")[:], expected)


def test_numcodecs_gzip_claimed_as_zarrs_gzip() -> None:
    from zarr.codecs import GzipCodec

    for level in (1, 6, 9):
        assert byte_identical([znc.GZip(level=level)], gzip_mtime_zero=True) == byte_identical(
            [GzipCodec(level=level)], gzip_mtime_zero=True
        )


# property test over filter parameters, dtypes and fill values


@st.composite
def filter_cases(draw: Any) -> tuple[list[Any], str, Any, int]:
    dtype = draw(st.sampled_from(["<f4", "<f8"]))
    kind = draw(st.sampled_from(["fixedscaleoffset", "quantize", "bitround", "delta"]))
    if kind == "fixedscaleoffset":
        astype = draw(st.sampled_from(["<i2", "<i4", "<u2"]))
        scale = draw(st.sampled_from([1, 10, 100, 0.5]))
        offset = draw(st.integers(-100, 100))
        filters = [znc.FixedScaleOffset(offset=offset, scale=scale, dtype=dtype, astype=astype)]
    elif kind == "quantize":
        filters = [znc.Quantize(digits=draw(st.integers(0, 6)), dtype=dtype)]
    elif kind == "bitround":
        most = 23 if dtype == "<f4" else 52
        filters = [znc.BitRound(keepbits=draw(st.integers(0, most)))]
    else:
        filters = [znc.Delta(dtype=dtype)]
    fill = draw(st.sampled_from([0, 1.5, np.nan, -3]))
    seed = draw(st.integers(0, 2**16))
    return filters, dtype, fill, seed


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(case=filter_cases())
def test_filter_parameters_property(case: tuple[list[Any], str, Any, int]) -> None:
    filters, dtype, fill, seed = case
    rng = np.random.default_rng(seed)
    value = rng.uniform(-50, 50, size=(21, 10)).astype(dtype)
    value[rng.random(value.shape) < 0.2] = fill
    stores = {}
    # every filter drawn has a native kernel: strict mode
    for label, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = MemoryStore()
            array = zarr.create_array(
                store,
                shape=value.shape,
                chunks=(8, 4),
                dtype=dtype,
                fill_value=fill,
                filters=filters,
                compressors=[ZstdCodec(level=1)],
            )
            array[:] = value
            stores[label] = store
            result = array[:]
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert ours == theirs
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
    assert_same_values(result, expected)


# zarr format 2 arrays with filters: the filters run zarr's code, the
# compressor runs natively


V2_CASES: dict[str, dict[str, Any]] = {
    "delta-i4-blosc-auto": {
        "filters": lambda: [numcodecs.Delta(dtype="<i4")],
        "compressor": lambda: numcodecs.Blosc("lz4", 5, -1),
        "dtype": "<i4",
        "values": "ints",
    },
    "fixedscaleoffset-f8-i2-zstd-F": {
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")
        ],
        "compressor": lambda: numcodecs.Zstd(level=3),
        "dtype": "<f8",
        "values": "temperatures",
        "order": "F",
    },
    "quantize-f4-zlib": {
        "filters": lambda: [numcodecs.Quantize(digits=3, dtype="<f4")],
        "compressor": lambda: numcodecs.Zlib(level=1),
        "dtype": "<f4",
        "values": "floats",
    },
    "bitround-f4-blosc-shuffle": {
        "filters": lambda: [numcodecs.BitRound(keepbits=10)],
        "compressor": lambda: numcodecs.Blosc("zstd", 3, 1),
        "dtype": "<f4",
        "values": "floats",
    },
    "astype-f8-f2-uncompressed": {
        "filters": lambda: [numcodecs.AsType(encode_dtype="<f2", decode_dtype="<f8")],
        "compressor": lambda: None,
        "dtype": "<f8",
        "values": "floats",
    },
    "astype-f8-f4-zstd": {
        "filters": lambda: [numcodecs.AsType(encode_dtype="<f4", decode_dtype="<f8")],
        "compressor": lambda: numcodecs.Zstd(level=1),
        "dtype": "<f8",
        "values": "floats",
    },
    "astype-i4-u1-zstd": {
        "filters": lambda: [numcodecs.AsType(encode_dtype="|u1", decode_dtype="<i4")],
        "compressor": lambda: numcodecs.Zstd(level=1),
        "dtype": "<i4",
        "values": "ints",
    },
    "delta-be-i2-zstd-F": {
        "filters": lambda: [numcodecs.Delta(dtype=">i2")],
        "compressor": lambda: numcodecs.Zstd(level=1),
        "dtype": ">i2",
        "values": "ints",
        "order": "F",
    },
    "fixedscaleoffset-f8-i2-zstd": {
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")
        ],
        "compressor": lambda: numcodecs.Zstd(level=3),
        "dtype": "<f8",
        "values": "temperatures",
    },
    "fixedscaleoffset-delta-zstd": {
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4"),
            numcodecs.Delta(dtype="<i4"),
        ],
        "compressor": lambda: numcodecs.Zstd(level=1),
        "dtype": "<f8",
        "values": "small",
    },
    "fixedscaleoffset-delta-astype-zstd": {
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4"),
            numcodecs.Delta(dtype="<i4", astype="<i2"),
        ],
        "compressor": lambda: numcodecs.Zstd(level=1),
        "dtype": "<f8",
        "values": "small",
    },
    "fixedscaleoffset-delta-gzip": {
        "filters": lambda: [
            numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i4"),
            numcodecs.Delta(dtype="<i4", astype="<i2"),
        ],
        "compressor": lambda: numcodecs.GZip(level=5),
        "dtype": "<f8",
        "values": "small",
    },
}


def create_v2(store: Any, case: dict[str, Any]) -> Any:
    return zarr.create_array(
        store,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype=case["dtype"],
        zarr_format=2,
        order=case.get("order", "C"),
        filters=case["filters"](),
        compressors=case["compressor"](),
        fill_value=0,
    )


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in V2_CASES])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_v2_filters_match_zarr(tmp_path: Path, name: str, store_kind: str) -> None:
    case = V2_CASES[name]
    value = values_of(case["values"], case["dtype"], SHAPE, 11)
    stores = {}
    for label, config in (("fused", LENIENT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, label)
            array = create_v2(store, case)
            if label == "fused":
                assert type(plan_of(array).chain).__name__ == "V2HybridChain"
            array[:] = value
            array[2:9, 4:20] = value[:7, :16] * 2
            array[32:, :] = 0
            stores[label] = store
    codec = V2Codec(filters=tuple(case["filters"]()), compressor=case["compressor"]())
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        if type(codec.compressor) is numcodecs.GZip:
            assert gzip.decompress(ours[key]) == gzip.decompress(theirs[key]), key
        elif byte_identical([codec]):
            assert ours[key] == theirs[key], key
    for store in stores.values():
        with zarr.config.set({"codec_pipeline.path": BATCHED}):
            expected = zarr.open_array(store, mode="r")[:]
        with zarr.config.set(LENIENT):
            actual = zarr.open_array(store, mode="r")[1:35:2, :]
        assert_same_values(actual, expected[1:35:2, :])


@pytest.mark.parametrize(
    ("name", "filters"),
    [
        pytest.param("delta-be-i2-zstd-F", "delta", id="no-kernel"),
        pytest.param("astype-f8-f2-uncompressed", "astype", id="astype-f2"),
    ],
)
def test_v2_filters_strict_rejected(name: str, filters: str) -> None:
    with zarr.config.set(STRICT):
        array = create_v2(MemoryStore(), V2_CASES[name])
        with pytest.raises(UnsupportedError, match=rf"filters \({filters}\) run zarr's code"):
            array[:]


#: format-2 filter chains whose every filter has a native kernel
V2_NATIVE = [
    "delta-i4-blosc-auto",
    "quantize-f4-zlib",
    "bitround-f4-blosc-shuffle",
    "fixedscaleoffset-f8-i2-zstd",
    "fixedscaleoffset-delta-zstd",
    "fixedscaleoffset-f8-i2-zstd-F",
    "fixedscaleoffset-delta-astype-zstd",
    "astype-f8-f4-zstd",
    "astype-i4-u1-zstd",
]


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in V2_NATIVE])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_v2_native_filters_strict(tmp_path: Path, name: str, store_kind: str) -> None:
    case = V2_CASES[name]
    value = values_of(case["values"], case["dtype"], SHAPE, 12)
    stores = {}
    for label, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, label)
            array = create_v2(store, case)
            array[:] = value
            array[2:9, 4:20] = value[:7, :16] * 2
            array[32:, :] = 0
            stores[label] = store
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["fused"], mode="r")
        assert plan_of(array).chain.native
        got = array[1:35:2, 3:]
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = zarr.open_array(stores["zarr"], mode="r")[1:35:2, 3:]
    assert_same_values(got, expected)


def test_v2_object_filter_stays_on_zarr() -> None:
    with zarr.config.set(LENIENT):
        array = zarr.create_array(
            MemoryStore(),
            shape=(4,),
            chunks=(2,),
            dtype=str,
            zarr_format=2,
            # with a compressor that has a kernel, a vlen chain is native
            compressors=numcodecs.BZ2(level=1),
        )
        plan = plan_of(array)
    assert not isinstance(plan.chain, HybridChain)
    assert plan.read_fallback


# numcodecs.delta on the native kernel: the whole chain is native, in strict mode

DELTA_DTYPES = ["|i1", "|u1", "<i2", "<u4", "<i8", "<f4", "<f8"]


def assert_strict_native(tmp_path: Path, case: dict[str, Any], store_kind: str, fill: Any) -> None:
    """``case`` written through zarr_fused in strict mode (a native chain, no
    fallback) and through zarr: the same stored chunks and the same values."""
    stores = write_both(
        tmp_path, case, "zstd", store_kind=store_kind, sharded=False, fill_value=fill, fused=STRICT
    )
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["fused"], mode="r")
        plan = plan_of(array)
        assert isinstance(plan.chain, HybridChain) and plan.chain.native
        assert plan.read_fallback == plan.write_fallback == ""
        got = array[1:33:2, 3:]
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = zarr.open_array(stores["zarr"], mode="r")[1:33:2, 3:]
    assert_same_values(got, expected)


@pytest.mark.parametrize("dtype", [pytest.param(d, id=d) for d in DELTA_DTYPES])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_native_delta_strict(tmp_path: Path, dtype: str, store_kind: str) -> None:
    kind = "floats" if dtype[1] == "f" else "ints"
    case = {"filters": lambda: [znc.Delta(dtype=dtype)], "dtype": dtype, "values": kind}
    fill = np.nan if kind == "floats" else 3
    assert_strict_native(tmp_path, case, store_kind, fill)


@pytest.mark.parametrize(
    "filters",
    [
        pytest.param(lambda: [znc.Delta(dtype="<f4", astype="<f8")], id="astype-widening-float"),
        pytest.param(lambda: [znc.Delta(dtype="<u8", astype="<i2")], id="astype-u8-signed"),
        pytest.param(lambda: [znc.Delta(dtype=">i4")], id="big-endian"),
        pytest.param(lambda: [znc.Delta(dtype="<f2")], id="float16"),
    ],
)
def test_delta_without_kernel_runs_zarrs_code(filters: Any) -> None:
    dtype = filters()[0].codec_config["dtype"]
    case = {"filters": filters, "dtype": dtype.replace(">", "<"), "values": "floats"}
    with zarr.config.set(LENIENT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=False, fill_value=0)
        assert "Delta run zarr's code" in plan_of(array).read_fallback


# numcodecs fixedscaleoffset, quantize and bitround on native kernels: a chain
# whose filters all have one is native and runs in strict mode (unsharded)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in NATIVE_CHAINS])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_native_filters_strict(tmp_path: Path, name: str, store_kind: str) -> None:
    case = FILTER_CHAINS[name]
    fill = case.get("fill", np.nan)
    assert_strict_native(tmp_path, case, store_kind, fill)


@pytest.mark.parametrize(
    ("name", "stage"),
    [
        pytest.param("fixedscaleoffset-f8-i2", NativeFixedScaleOffset, id="fixedscaleoffset"),
        pytest.param("quantize-f4", NativeQuantize, id="quantize"),
        pytest.param("bitround-f8", NativeBitRound, id="bitround"),
    ],
)
def test_native_filter_stage_chosen(name: str, stage: type) -> None:
    with zarr.config.set(STRICT):
        array = create(
            MemoryStore(), FILTER_CHAINS[name], [ZstdCodec()], sharded=False, fill_value=0
        )
        chain = plan_of(array).chain
    assert [type(s) for s in chain.stages] == [stage]


@pytest.mark.parametrize(
    "filters",
    [
        pytest.param(
            lambda: [znc.FixedScaleOffset(offset=0, scale=10, dtype="<i4", astype="<i2")],
            id="fso-integer-data",
        ),
        pytest.param(
            lambda: [znc.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<f4")],
            id="fso-float-astype",
        ),
        pytest.param(
            lambda: [znc.FixedScaleOffset(offset=0, scale=0, dtype="<f8", astype="<i4")],
            id="fso-zero-scale",
        ),
        pytest.param(
            lambda: [znc.Quantize(digits=2, dtype="<f8", astype="<f4")], id="quantize-astype"
        ),
    ],
)
def test_filter_without_kernel_runs_zarrs_code(filters: Any) -> None:
    config = filters()[0].codec_config
    case = {"filters": filters, "dtype": config["dtype"], "values": "small"}
    with zarr.config.set(LENIENT):
        array = create(MemoryStore(), case, [ZstdCodec()], sharded=False, fill_value=0)
        assert "run zarr's code" in plan_of(array).read_fallback


@pytest.mark.parametrize("bad", [pytest.param(np.nan, id="nan"), pytest.param(1e6, id="range")])
def test_fixedscaleoffset_unfit_chunk_runs_numcodecs(tmp_path: Path, bad: float) -> None:
    """A chunk with a value the integer type cannot hold is encoded by
    numcodecs (NumPy's cast of it is platform-defined): same bytes as zarr."""
    case = dict(FILTER_CHAINS["fixedscaleoffset-f8-i2"])
    value = values_of("temperatures", "<f8", SHAPE, 21)
    value[5, 7] = bad
    stores = {}
    for label, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config), np.errstate(invalid="ignore"):
            store = make_store("local", tmp_path, label)
            array = create(store, case, [ZstdCodec()], sharded=False, fill_value=7)
            array[:] = value
            stores[label] = store
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])


@pytest.mark.parametrize("io", ["direct", "io-threads"])
@pytest.mark.parametrize("name", ["delta-i4-zstd", "fixedscaleoffset-f8-i2"])
def test_unsharded_filters_write_in_groups_as_zarr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, io: str
) -> None:
    """Unsharded chunks of filters that all have a kernel are encoded in
    groups by the batch kernels and stored by the compute threads, or by
    the IO threads once the files were found slow to store (a network
    filesystem), each file written natively either way (`write_parts`):
    zarr's bytes either way, a whole write, a partial overwrite merged into
    the stored chunks, a chunk of fill values left out, a stored chunk
    overwritten with fill values deleted, and a chunk the kernel refuses (a
    value int16 cannot hold) encoded by zarr's code."""
    case = FILTER_CHAINS[name]
    value = values_of(case["values"], case["dtype"], SHAPE, 4)
    if name.startswith("fixedscaleoffset"):
        value[20, 3] = 1e6
    value[32:, 24:] = case["fill"]  # the edge chunk c/2/2: not stored
    threads: list[str] = []
    write_parts = chunk_write.write_parts

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return write_parts(*args)

    monkeypatch.setattr(chunk_write, "write_parts", spy)
    set_keys: list[str] = []
    set_sync = LocalStore.set_sync

    def set_spy(store: LocalStore, key: str, value: Any) -> None:
        set_keys.append(key)
        set_sync(store, key, value)

    monkeypatch.setattr(LocalStore, "set_sync", set_spy)
    stores = {}
    for label, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set({**config, "codec_pipeline.max_workers": 2}):
            store = make_store("local", tmp_path, label)
            array = create(store, case, [ZstdCodec()], sharded=False, fill_value=case["fill"])
            if label == "fused":
                writer = plan_of(array).writer
                assert type(writer) is chunk_write.NativeChunkWriter
                assert isinstance(writer.chain, FilteredChain)
                if io == "io-threads":  # as if the IO threads had just found them slow
                    writer.probe.latency = float("inf")
                    writer.probe.probed = time.monotonic()
                else:  # as if the compute threads had just stored them fast
                    writer.probe.measured(chunk_write.FAST_STORE / 2)
            with np.errstate(invalid="ignore"):
                array[:] = value
                array[3:30, 5:20] = value[3:30, 5:20][::-1]
                array[16:32, 12:24] = case["fill"]  # c/1/1, stored before
            stores[label] = store
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    assert "c/2/2" not in chunk_items(stores["zarr"])
    assert "c/1/1" not in chunk_items(stores["zarr"])
    # every file written natively; by the IO threads until their own timing
    # finds the files fast, then by the compute threads
    fileio = [n.startswith("zarr_fused-fileio") for n in threads]
    assert threads
    assert any(fileio) if io == "io-threads" else not any(fileio), threads
    assert not [k for k in set_keys if k.startswith("c/")], set_keys


# what zarr itself refuses: the same error from zarr_fused


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_scale_offset_int_overflow_raises_as_zarr(sharded: bool) -> None:
    """A value whose encoding leaves int16 is refused by the kernel; zarr's
    code then raises its ValueError, as zarr's pipeline does."""
    case = {"filters": lambda: [ScaleOffset(offset=0, scale=300)], "dtype": "<i2"}
    value = np.ones(SHAPE, "<i2")
    value[3, 4] = 200
    for config in (LENIENT, {"codec_pipeline.path": BATCHED}):
        with zarr.config.set(config):
            array = create(MemoryStore(), case, [ZstdCodec()], sharded=sharded, fill_value=0)
            with pytest.raises(ValueError, match="outside the range of dtype int16"):
                array[:] = value


@pytest.mark.parametrize("config", [LENIENT, STRICT], ids=["lenient", "strict"])
def test_scale_offset_int_remainder_raises_as_zarr(config: dict[str, Any]) -> None:
    """Stored values the scale does not divide (written with another
    scale): zarr's error on read, strict mode included (the kernel runs,
    refuses the chunk, and zarr's code raises)."""
    store = MemoryStore()
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        written = zarr.create_array(
            store, name="a", shape=(8,), chunks=(8,), dtype="<i4", filters=[ScaleOffset(scale=1)]
        )
        written[:] = np.arange(8, dtype="<i4")
        zarr.create_array(
            store, name="b", shape=(8,), chunks=(8,), dtype="<i4", filters=[ScaleOffset(scale=3)]
        )
    store._store_dict["b/c/0"] = store._store_dict["a/c/0"]
    for pipeline in (config, {"codec_pipeline.path": BATCHED}):
        with zarr.config.set(pipeline), pytest.raises(ValueError, match="non-zero remainder"):
            zarr.open_array(store, path="b", mode="r")[:]


@pytest.mark.parametrize(("dtype", "astype"), [("<f8", "<f4"), ("<f4", "<f8")])
def test_quantize_astype_fails_as_zarr(dtype: str, astype: str) -> None:
    """zarr 3.4.2 writes numcodecs' quantize with another astype but cannot
    read it back (its wrapper keeps the array's type for the stored
    chunks): NumPy's ValueError. zarr_fused stores the same bytes (zarr's
    code encodes) and raises a ValueError too, its `ChunkSizeError` naming
    the key: the native decompression finds the stored chunk's size wrong
    for the array's type before zarr's code would."""
    case = {"filters": lambda: [znc.Quantize(digits=3, dtype=dtype, astype=astype)], "dtype": dtype}
    stores = {}
    for name, config, error in (
        ("fused", LENIENT, ChunkSizeError),
        ("zarr", {"codec_pipeline.path": BATCHED}, ValueError),
    ):
        with zarr.config.set(config):
            stores[name] = MemoryStore()
            array = create(stores[name], case, [ZstdCodec()], sharded=False, fill_value=0)
            array[:] = values_of("small", dtype, SHAPE, 2)
            with pytest.raises(error):
                array[:]
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
