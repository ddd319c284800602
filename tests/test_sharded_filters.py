"""Sharded arrays whose inner chain has filters with native kernels.

The shard engine runs such filters inside its batch kernels
(`zarr_fused._hybrid.FilteredChain`, `zarr_fused._filters.FilterChain`):
strict mode accepts the array, and zarr's `BatchedCodecPipeline` is the
oracle for the values read and for the stored shards, byte for byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs.scale_offset import ScaleOffset
from zarr.storage import MemoryStore

from zarr_fused._hybrid import FilteredChain
from zarr_fused.errors import UnsupportedError

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store
from helpers.filter_data import astype_chain, filter_array, values_of

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}

#: filters, dtype, how values are drawn, fill value
CHAINS: dict[str, tuple[Any, str, str, Any]] = {
    "delta-i4": (lambda: [znc.Delta(dtype="<i4")], "<i4", "ints", -1),
    "delta-u2": (lambda: [znc.Delta(dtype="<u2")], "<u2", "ints", 3),
    "delta-f8": (lambda: [znc.Delta(dtype="<f8")], "<f8", "floats", np.nan),
    "fixedscaleoffset-f8-i2": (
        lambda: [znc.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2")],
        "<f8",
        "temperatures",
        7,
    ),
    "fixedscaleoffset-f4-u1": (
        lambda: [znc.FixedScaleOffset(offset=0, scale=2, dtype="<f4", astype="|u1")],
        "<f4",
        "small",
        7,
    ),
    "quantize-f4": (lambda: [znc.Quantize(digits=3, dtype="<f4")], "<f4", "floats", 0),
    "bitround-f8": (lambda: [znc.BitRound(keepbits=20)], "<f8", "floats", np.nan),
    "bitround-f2": (lambda: [znc.BitRound(keepbits=4)], "<f2", "small", 0),
    "bitround-delta-f4": (
        lambda: [znc.BitRound(keepbits=12), znc.Delta(dtype="<f4")],
        "<f4",
        "floats",
        0,
    ),
    "scale_offset-f4": (lambda: [ScaleOffset(offset=10, scale=4)], "<f4", "small", 0),
    "scale_offset-f8": (
        lambda: [ScaleOffset(offset=273.15, scale=0.1)],
        "<f8",
        "temperatures",
        np.nan,
    ),
    "astype-f8-f4": astype_chain("<f8", "<f4", "floats", 0),
    # integer scale_offset whose decoding takes every stored value (scale 1 or
    # -1 and a range that holds, or int64, which zarr wraps)
    "scale_offset-i8": (lambda: [ScaleOffset(offset=1000, scale=-1)], "<i8", "ints", 5),
    "scale_offset-i2-negate": (lambda: [ScaleOffset(offset=-1, scale=-1)], "<i2", "ints", -2),
    "astype-i4-i2": astype_chain("<i4", "<i2", "ints", -3),
    "astype-f8-i4": astype_chain("<f8", "<i4", "small", 0),
    "delta-i8-astype-i2": (
        lambda: [znc.Delta(dtype="<i8", astype="<i2")],
        "<i8",
        "ints",
        -4,
    ),
    "delta-f8-astype-f4": (
        lambda: [znc.Delta(dtype="<f8", astype="<f4")],
        "<f8",
        "floats",
        np.nan,
    ),
    "astype-delta-f8-f4": (
        lambda: [znc.AsType(encode_dtype="<f4", decode_dtype="<f8"), znc.Delta(dtype="<f4")],
        "<f8",
        "floats",
        1,
    ),
    "fixedscaleoffset-delta-f8-i4": (
        lambda: [
            znc.FixedScaleOffset(offset=0, scale=1000, dtype="<f8", astype="<i4"),
            znc.Delta(dtype="<i4"),
        ],
        "<f8",
        "small",
        0,
    ),
}

COMPRESSORS: dict[str, Any] = {
    "zstd": lambda: [ZstdCodec(level=3)],
    "zstd-crc32c": lambda: [ZstdCodec(level=1), Crc32cCodec()],
    "none": list,
}

#: array shape, shard shape, inner chunk shape (edge shards and edge inner chunks)
GEOMETRIES: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "2d": ((37, 29), (16, 12), (8, 6)),
    "2d-one-inner": ((20, 20), (10, 10), (10, 10)),
    "3d": ((9, 14, 11), (6, 8, 8), (3, 4, 4)),
}


def create(
    store: Any,
    filters: list[Any],
    dtype: str,
    fill: Any,
    compressors: list[Any],
    geometry: str = "2d",
    index_location: str = "end",
) -> Any:
    shape, shard, inner = GEOMETRIES[geometry]
    return filter_array(
        store, shape, shard, dtype, fill, filters, compressors, inner, index_location
    )


def write_both(
    tmp_path: Path,
    name: str,
    compressor: str,
    store_kind: str,
    geometry: str = "2d",
    index_location: str = "end",
) -> dict[str, Any]:
    """The same writes through zarr_fused (strict) and zarr: a whole array,
    a partial overwrite into existing shards, a region of fill value (inner
    chunks left missing)."""
    filters, dtype, kind, fill = CHAINS[name]
    shape = GEOMETRIES[geometry][0]
    value = values_of(kind, dtype, shape, 0)
    patch_region = tuple(slice(1, max(2, n // 2)) for n in shape)
    patch = values_of(kind, dtype, value[patch_region].shape, 1)
    fill_region = tuple(slice(n // 2, None) for n in shape)
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, who)
            array = create(
                store, filters(), dtype, fill, COMPRESSORS[compressor](), geometry, index_location
            )
            array[:] = value
            array[patch_region] = patch
            array[fill_region] = fill
            stores[who] = store
    return stores


def plan_of(array: Any) -> Any:
    return array._async_array.codec_pipeline.plan


def assert_same(stores: dict[str, Any], selection: Any = ...) -> None:
    """The same stored shards, and the same values read by both pipelines
    from each store (zarr_fused in strict mode)."""
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    for store in stores.values():
        with zarr.config.set({"codec_pipeline.path": BATCHED}):
            expected = zarr.open_array(store, mode="r")
            expected_all, expected_part = expected[:], expected[selection]
        with zarr.config.set(STRICT):
            array = zarr.open_array(store, mode="r")
            assert_same_values(array[:], expected_all)
            assert_same_values(array[selection], expected_part)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("compressor", list(COMPRESSORS))
@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_sharded_filters_match_zarr(
    tmp_path: Path, name: str, compressor: str, store_kind: str
) -> None:
    stores = write_both(tmp_path, name, compressor, store_kind)
    assert_same(stores, (slice(2, 30, 3), slice(5, None)))


@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("name", ["fixedscaleoffset-f8-i2", "bitround-delta-f4"])
def test_sharded_filters_geometry(
    tmp_path: Path, name: str, geometry: str, index_location: str
) -> None:
    stores = write_both(tmp_path, name, "zstd-crc32c", "local", geometry, index_location)
    selection = tuple(slice(1, None, 2) for _ in GEOMETRIES[geometry][0])
    assert_same(stores, selection)


@pytest.mark.parametrize("name", ["delta-i4", "fixedscaleoffset-f8-i2", "quantize-f4"])
def test_sharded_filters_zip_store(tmp_path: Path, name: str) -> None:
    """One write per shard (a zip file is not rewritten in place), with a
    region of fill value: its inner chunks are left out of the shards."""
    filters, dtype, kind, fill = CHAINS[name]
    value = values_of(kind, dtype, GEOMETRIES["2d"][0], 2)
    value[16:, 12:] = fill
    for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            store = make_store("zip", tmp_path, who)
            create(store, filters(), dtype, fill, [ZstdCodec()])[:] = value
            store.close()
    reopened = {
        who: zarr.storage.ZipStore(tmp_path / f"{who}.zip", mode="r") for who in ("fused", "zarr")
    }
    assert_same(reopened, (slice(3, 20), slice(None, None, 4)))


@pytest.mark.parametrize("name", ["fixedscaleoffset-f8-i2", "delta-i4", "bitround-f8"])
def test_plan_is_native_filtered(name: str) -> None:
    filters, dtype, _, fill = CHAINS[name]
    with zarr.config.set(STRICT):
        array = create(MemoryStore(), filters(), dtype, fill, [ZstdCodec()])
        plan = plan_of(array)
        assert plan.read_fallback == plan.write_fallback == ""
        assert isinstance(plan.reader.chain, FilteredChain)


def test_never_written_reads_fill(tmp_path: Path) -> None:
    filters, dtype, _, fill = CHAINS["delta-f8"]
    with zarr.config.set(STRICT):
        array = create(make_store("local", tmp_path), filters(), dtype, fill, [ZstdCodec()])
        got = array[:]
    assert np.isnan(got).all()


def test_strict_rejects_filter_without_kernel_sharded() -> None:
    filters = [znc.Delta(dtype="<f4", astype="<f8")]
    with zarr.config.set(STRICT):
        array = create(MemoryStore(), filters, "<f4", 0, [ZstdCodec()])
        with pytest.raises(UnsupportedError, match="inner chunks"):
            array[:]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("bad", [np.nan, 3e9, -np.inf], ids=["nan", "large", "-inf"])
def test_astype_unfit_inner_chunk(tmp_path: Path, bad: float) -> None:
    """An inner chunk astype cannot cast natively (a float int32 cannot
    hold) is encoded by numcodecs' code; the shard's bytes are zarr's."""
    filters, dtype, kind, fill = CHAINS["astype-f8-i4"]
    value = values_of(kind, dtype, GEOMETRIES["2d"][0], 3)
    value[9, 7] = bad
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            stores[who] = make_store("local", tmp_path, who)
            create(stores[who], filters(), dtype, fill, [ZstdCodec()])[:] = value
    assert_same(stores, (slice(5, 20), slice(3, 12)))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("bad", [np.nan, 1e9, -np.inf], ids=["nan", "large", "-inf"])
def test_fixedscaleoffset_unfit_inner_chunk(tmp_path: Path, bad: float) -> None:
    """An inner chunk fixedscaleoffset's type cannot hold is encoded by
    numcodecs' code (its cast is platform-defined); the others natively;
    the shard's bytes are zarr's either way."""
    filters, dtype, kind, fill = CHAINS["fixedscaleoffset-f8-i2"]
    value = values_of(kind, dtype, GEOMETRIES["2d"][0], 3)
    value[9, 7] = bad
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            stores[who] = make_store("local", tmp_path, who)
            create(stores[who], filters(), dtype, fill, [ZstdCodec()])[:] = value
    assert_same(stores, (slice(5, 20), slice(3, 12)))


@st.composite
def filter_cases(draw: Any) -> tuple[list[Any], str, Any, int]:
    """A filter with drawn parameters, its dtype, a fill value, a seed."""
    kind = draw(
        st.sampled_from(
            ["delta", "fixedscaleoffset", "quantize", "bitround", "scale_offset", "astype"]
        )
    )
    if kind == "scale_offset" and draw(st.booleans()):
        # integers: the shard engine takes int64 with scale 1 or -1
        offset = draw(st.integers(-(2**63), 2**63 - 1))
        dtype, filters = "<i8", [ScaleOffset(offset=offset, scale=draw(st.sampled_from([1, -1])))]
    elif kind == "scale_offset":
        dtype = draw(st.sampled_from(["<f4", "<f8"]))
        offset = draw(st.sampled_from([0, 1.5, -20, 273.15]))
        filters = [ScaleOffset(offset=offset, scale=draw(st.sampled_from([1, 0.1, 4, 100])))]
    elif kind == "astype":
        types = ["|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"]
        dtype, encoded = draw(st.sampled_from(types)), draw(st.sampled_from(types))
        filters = [znc.AsType(encode_dtype=encoded, decode_dtype=dtype)]
    elif kind == "delta":
        dtype = draw(st.sampled_from(["<i1", "<i2", "<u4", "<i8", "<f4", "<f8"]))
        filters = [znc.Delta(dtype=dtype)]
    elif kind == "fixedscaleoffset":
        dtype = draw(st.sampled_from(["<f4", "<f8"]))
        astype = draw(st.sampled_from(["<i2", "<i4", "<u2", "|i1"]))
        offset = draw(st.sampled_from([0, -10.5, 3, 0.25]))
        scale = draw(st.sampled_from([1, 10, 0.5, 4]))
        filters = [znc.FixedScaleOffset(offset=offset, scale=scale, dtype=dtype, astype=astype)]
    elif kind == "quantize":
        dtype = draw(st.sampled_from(["<f4", "<f8"]))
        filters = [znc.Quantize(digits=draw(st.integers(0, 6)), dtype=dtype)]
    else:
        dtype = draw(st.sampled_from(["<f2", "<f4", "<f8"]))
        filters = [znc.BitRound(keepbits=draw(st.integers(0, 9)))]
    fill = draw(st.sampled_from([0, 1, 5]))
    return filters, dtype, fill, draw(st.integers(0, 2**16))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=filter_cases())
def test_sharded_filter_parameters_property(case: tuple[list[Any], str, Any, int]) -> None:
    filters, dtype, fill, seed = case
    rng = np.random.default_rng(seed)
    shape = GEOMETRIES["2d"][0]
    if np.dtype(dtype).kind in "iu":
        value = rng.integers(0, 100, size=shape).astype(dtype)
    else:
        value = rng.uniform(-50, 120, size=shape).round(1).astype(dtype)
    stores = {}
    with np.errstate(all="ignore"):
        for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
            with zarr.config.set(config):
                stores[who] = MemoryStore()
                array = create(stores[who], filters, dtype, fill, [ZstdCodec(level=1)])
                array[:] = value
                array[4:11, 2:19] = value[:7, :17][::-1]
        assert_same(stores, (slice(1, 30, 4), slice(2, 27)))
