"""Sharded arrays whose inner filters may refuse a stored value.

An integer ``scale_offset`` whose scale can leave a remainder (or whose
offset can leave the range), numcodecs' ``AsType`` from stored floats to
integers and a ``cast_value`` whose decoding can fail: zarr raises (or,
for ``AsType``, casts as NumPy does) on such an inner chunk. The shard
engine decodes them in its batch kernels (`zarr_fused._filters.FilterChain`
with ``refusing``); a refused inner chunk leaves the nogil run as a status
and goes through zarr's code afterwards, which raises zarr's error named
after the shard and chunk, or decodes it. zarr's `BatchedCodecPipeline` is
the oracle for the values, the stored shards and the errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import Crc32cCodec, TransposeCodec, ZstdCodec
from zarr.codecs import numcodecs as znc
from zarr.codecs.scale_offset import ScaleOffset
from zarr.storage import MemoryStore

from zarr_fused._hybrid import FilteredChain

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, make_store
from helpers.filter_data import astype_chain, filter_array, values_of

STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}
ORACLE = {"codec_pipeline.path": BATCHED}

SHAPE, CHUNKS, INNER = (37, 29), (16, 12), (8, 6)  # edge shards and edge inner chunks


def _cast_value(data_type: str, **config: Any) -> Any:
    pytest.importorskip("cast_value_rs")
    from zarr.codecs.cast_value import CastValue

    return CastValue(data_type=data_type, **config)


#: filters, dtype, how values are drawn, fill value: each decoding may refuse
CHAINS: dict[str, tuple[Any, str, str, Any]] = {
    "scale_offset-i4-scale": (lambda: [ScaleOffset(offset=100, scale=2)], "<i4", "ints", 0),
    "scale_offset-i2-scale": (lambda: [ScaleOffset(offset=100, scale=3)], "<i2", "ints", -1),
    "scale_offset-i2-offset": (lambda: [ScaleOffset(offset=5, scale=1)], "<i2", "ints", 9),
    "scale_offset-u2-scale": (lambda: [ScaleOffset(offset=0, scale=3)], "<u2", "ints", 7),
    "scale_offset-u8-scale": (lambda: [ScaleOffset(offset=0, scale=5)], "<u8", "ints", 3),
    "astype-i2-f4": astype_chain("<i2", "<f4", "ints", 1),
    "astype-u1-f8": astype_chain("|u1", "<f8", "ints", 9),
    "cast_value-i8-f4": (
        lambda: [_cast_value("float32", rounding="towards-negative")],
        "<i8",
        "ints",
        5,
    ),
}

COMPRESSORS: dict[str, Any] = {
    "zstd": lambda: [ZstdCodec(level=1)],
    "zstd-crc32c": lambda: [ZstdCodec(level=1), Crc32cCodec()],
    "crc32c": lambda: [Crc32cCodec()],
}


def create(
    store: Any,
    filters: list[Any],
    dtype: str,
    fill: Any,
    compressors: list[Any],
    index_location: str = "end",
) -> Any:
    return filter_array(
        store, SHAPE, CHUNKS, dtype, fill, filters, compressors, INNER, index_location, True
    )


def _plan(array: Any) -> Any:
    return array._async_array.codec_pipeline.plan


def _write(array: Any, kind: str, dtype: str, fill: Any) -> None:
    """Whole, a patch into existing inner chunks, a shard of fill value."""
    array[:] = values_of(kind, dtype, SHAPE, 0)
    array[3:10, 2:20] = values_of(kind, dtype, (7, 18), 1)
    array[16:32, 12:24] = fill


def _both(tmp_path: Path, store_kind: str, name: str, compressors: str, where: str) -> Any:
    filters, dtype, kind, fill = CHAINS[name]
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            stores[who] = make_store(store_kind, tmp_path, who)
            array = create(stores[who], filters(), dtype, fill, COMPRESSORS[compressors](), where)
            _write(array, kind, dtype, fill)
    return stores


@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize("compressors", list(COMPRESSORS))
@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_refusing_chain_native_like_zarr(
    tmp_path: Path, name: str, store_kind: str, compressors: str, where: str
) -> None:
    stores = _both(tmp_path, store_kind, name, compressors, where)
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    selection = (slice(2, 35, 3), slice(1, None))
    with zarr.config.set(ORACLE):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["fused"], mode="r")
        plan = _plan(array)
        assert plan.read_fallback == plan.write_fallback == ""
        assert isinstance(plan.reader.chain, FilteredChain)
        assert plan.reader.chain.filters.may_refuse
        assert_same_values(array[:], expected)
        assert_same_values(array[selection], expected[selection])


def test_refusing_chain_zip_store(tmp_path: Path) -> None:
    filters, dtype, kind, fill = CHAINS["scale_offset-i4-scale"]
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            array = create(make_store("zip", tmp_path, who), filters(), dtype, fill, [ZstdCodec()])
            array[:] = values_of(kind, dtype, SHAPE, 0)
            array.store.close()
    stores = {
        who: zarr.storage.ZipStore(tmp_path / f"{who}.zip", mode="r") for who in ("fused", "zarr")
    }
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set(STRICT):
        assert_same_values(
            zarr.open_array(stores["fused"], mode="r")[:], values_of(kind, dtype, SHAPE, 0)
        )


# -- an inner chunk whose stored values zarr refuses -----------------------------------


def _swap_filters(store: Any, filters: list[Any], dtype: str, fill: Any, where: str) -> None:
    """Give the array in ``store`` the metadata of one with ``filters``
    (its shards as they are): how a stored value that the filters refuse
    comes about."""
    other = MemoryStore()
    create(other, filters, dtype, fill, [ZstdCodec()], where)
    store._store_dict["zarr.json"] = other._store_dict["zarr.json"]


def _bad_store(
    stored: Any, dtype: str, refusing: list[Any], where: str = "end", bad: Any = 3
) -> tuple[MemoryStore, np.ndarray]:
    """A store whose array has the ``refusing`` filters and whose stored
    values (written through ``stored``) are all even but one odd value
    ``bad`` in inner chunk (1, 2) of shard (0, 1)."""
    value = 2 * values_of("ints", dtype, SHAPE, 4).astype(dtype)
    value[9, 12 + 2 * 6 - 10] = bad  # row 9: inner row 1; column 14: inner column 2
    store = MemoryStore()
    with zarr.config.set(ORACLE):
        create(store, stored, dtype, 0, [ZstdCodec()], where)[:] = value
    _swap_filters(store, refusing, dtype, 0, where)
    return store, value


def _error(config: dict[str, Any], store: Any, selection: Any) -> BaseException:
    with zarr.config.set(config):
        array = zarr.open_array(store, mode="r")
        with pytest.raises(Exception) as info:
            array[selection]
    return info.value


@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize(
    "selection", [(slice(None), slice(None)), (slice(8, 16), slice(12, 24)), (9, 14)]
)
def test_remainder_raises_zarrs_error_naming_the_shard(where: str, selection: Any) -> None:
    store, _ = _bad_store([ScaleOffset(offset=0, scale=1)], "<i4", [ScaleOffset(scale=2)], where)
    theirs = _error(ORACLE, store, selection)
    ours = _error(STRICT, store, selection)
    assert type(ours) is type(theirs) is ValueError
    assert "non-zero remainder" in str(theirs)
    assert str(ours).endswith(str(theirs))
    assert "c/0/1" in str(ours)


def test_out_of_range_raises_zarrs_error() -> None:
    """A stored value whose decoding leaves int16's range."""
    store, _ = _bad_store(
        [ScaleOffset(offset=0, scale=1)], "<i2", [ScaleOffset(offset=30000, scale=1)], bad=9000
    )
    theirs = _error(ORACLE, store, (slice(None), slice(None)))
    ours = _error(STRICT, store, (slice(None), slice(None)))
    assert type(ours) is type(theirs) is ValueError
    assert "outside the range" in str(theirs)
    assert str(ours).endswith(str(theirs))


@pytest.mark.parametrize(
    "selection",
    [(slice(0, 8), slice(12, 24)), (slice(8, 16), slice(18, 24)), (slice(16, 37),)],
    ids=["rows-above", "columns-beside", "other-shards"],
)
def test_good_inner_chunks_around_a_bad_one_read(selection: Any) -> None:
    """Selections that do not touch the refused inner chunk read zarr's
    values, in the refused chunk's own shard too."""
    store, value = _bad_store([ScaleOffset(offset=0, scale=1)], "<i4", [ScaleOffset(scale=2)])
    with zarr.config.set(ORACLE):
        expected = zarr.open_array(store, mode="r")[selection]
    with zarr.config.set(STRICT):
        got = zarr.open_array(store, mode="r")[selection]
    assert_same_values(got, expected)
    assert_same_values(got, value[selection] // 2)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("bad", [np.nan, 1e6, -np.inf], ids=["nan", "large", "-inf"])
def test_float_astype_refused_decodes_like_numcodecs(bad: float) -> None:
    """A stored float int16 cannot hold: numcodecs casts it as NumPy does
    (no error); the kernel refuses the chunk and zarr's code decodes it,
    so the values are zarr's, the other chunks decoded natively."""
    value = values_of("ints", "<f4", SHAPE, 2)
    value[20, 7] = bad
    store = MemoryStore()
    with zarr.config.set(ORACLE):
        create(store, [], "<f4", 0, [ZstdCodec()])[:] = value
    _swap_filters(store, [znc.AsType(encode_dtype="<f4", decode_dtype="<i2")], "<i2", 0, "end")
    with zarr.config.set(ORACLE):
        expected = zarr.open_array(store, mode="r")[:]
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        assert isinstance(_plan(array).reader.chain, FilteredChain)
        assert_same_values(array[:], expected)
        assert_same_values(array[18:25, 5:9], expected[18:25, 5:9])


def test_cast_value_refused_raises_zarrs_error() -> None:
    """A stored float32 NaN read as int64 by cast_value (no NaN mapping):
    zarr's backend raises; so does the shard engine, naming the shard."""
    value = values_of("ints", "<f4", SHAPE, 2)
    value[3, 3] = np.nan
    store = MemoryStore()
    with zarr.config.set(ORACLE):
        create(store, [], "<f4", 0, [ZstdCodec()])[:] = value
    _swap_filters(store, [_cast_value("float32")], "<i8", 0, "end")
    theirs = _error(ORACLE, store, (slice(None), slice(None)))
    ours = _error(STRICT, store, (slice(None), slice(None)))
    assert type(ours) is type(theirs)
    assert str(ours).endswith(str(theirs))
    assert "c/0/0" in str(ours)


# -- writes: zarr's checks on encoding -------------------------------------------------


@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_encode_out_of_range_raises_and_keeps_the_shard(tmp_path: Path, store_kind: str) -> None:
    """A value whose encoding leaves int16's range: zarr raises; so does
    zarr_fused, with zarr's type and message, and the shard written before
    still reads as it was (whole-shard and partial writes)."""
    filters = [ScaleOffset(offset=-100, scale=3)]
    good = values_of("ints", "<i2", SHAPE, 6)
    errors = {}
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            store = make_store(store_kind, tmp_path, who)
            array = create(store, filters, "<i2", 0, [ZstdCodec()])
            array[:] = good
            for selection in [(slice(0, 16), slice(0, 12)), (slice(2, 5), slice(3, 4))]:
                with pytest.raises(ValueError) as info:
                    array[selection] = 20000
                errors[who, selection[1].start] = info.value
            assert_same_values(array[:], good)
    for start in (0, 3):
        ours, theirs = errors["fused", start], errors["zarr", start]
        assert type(ours) is type(theirs)
        assert str(theirs) in str(ours)


# -- hypothesis: scale, offset, dtype ---------------------------------------------------


@st.composite
def _scale_offset_cases(draw: Any) -> tuple[str, int, int, int]:
    dtype = draw(st.sampled_from(["|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]))
    info = np.iinfo(dtype)
    # zarr checks that the default fill value (0) encodes: -offset * scale in range
    limit = 0 if info.min == 0 else min(1000, int(info.max) // 7)
    offset = draw(st.integers(-limit, limit))
    scale = draw(st.integers(-7, 7).filter(bool))
    if info.min == 0:  # zarr parses offset and scale by the data type
        scale = abs(scale)
    return dtype, offset, scale, draw(st.integers(0, 2**32 - 1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scale_offset_cases())
def test_scale_offset_parameters_property(case: tuple[str, int, int, int]) -> None:
    """Any integer type, offset and scale: the write raises zarr's error
    when zarr raises, else stores zarr's bytes; the read gives zarr's
    values (or its error)."""
    dtype, offset, scale, seed = case
    value = np.random.default_rng(seed).integers(-40, 40, size=SHAPE)
    if np.dtype(dtype).kind == "u":
        value = np.abs(value)
    value = value.astype(dtype)
    outcome: dict[str, Any] = {}
    stores: dict[str, MemoryStore] = {}
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            stores[who] = MemoryStore()
            # the fill value is encoded too: the offset encodes to 0
            array = create(
                stores[who], [ScaleOffset(offset=offset, scale=scale)], dtype, offset, []
            )
            try:
                array[:] = value
                outcome[who] = array[:]
            except ValueError as exc:
                outcome[who] = exc
    stored = {who: chunk_items(store) for who, store in stores.items()}
    if isinstance(outcome["zarr"], Exception):
        assert type(outcome["fused"]) is type(outcome["zarr"])
        assert str(outcome["zarr"]) in str(outcome["fused"])
        # which other shards a failed write stored depends on when zarr's
        # concurrent shard writes finish; those both stored are zarr's bytes
        both = stored["fused"].keys() & stored["zarr"].keys()
        assert {k: stored["fused"][k] for k in both} == {k: stored["zarr"][k] for k in both}
    else:
        assert_same_values(outcome["fused"], outcome["zarr"])
        assert stored["fused"] == stored["zarr"]


# -- a transpose among the inner filters -----------------------------------------------

#: inner array->array codecs with a transpose: the elementwise filters run in
#: the batch kernels over the stored (transposed) items
TRANSPOSED: dict[str, tuple[Any, str, str, Any]] = {
    "transpose-quantize-f8": (
        lambda: [TransposeCodec(order=(1, 0)), znc.Quantize(digits=4, dtype="<f8")],
        "<f8",
        "floats",
        0,
    ),
    "quantize-transpose-f4": (
        lambda: [znc.Quantize(digits=2, dtype="<f4"), TransposeCodec(order=(1, 0))],
        "<f4",
        "floats",
        np.nan,
    ),
    "transpose-scale_offset-i4": (
        lambda: [TransposeCodec(order=(1, 0)), ScaleOffset(offset=100, scale=2)],
        "<i4",
        "ints",
        0,
    ),
    "transpose-fixedscaleoffset-f8-i2": (
        lambda: [
            TransposeCodec(order=(1, 0)),
            znc.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2"),
        ],
        "<f8",
        "temperatures",
        7,
    ),
    # (a transpose after a numcodecs filter, which flattens the chunk, fails
    # in zarr's own code: zarr's scale_offset keeps the shape)
    "transpose-scale_offset-transpose-i2": (
        lambda: [
            TransposeCodec(order=(1, 0)),
            ScaleOffset(offset=5, scale=3),
            TransposeCodec(order=(1, 0)),
        ],
        "<i2",
        "ints",
        5,
    ),
    "transpose-astype-f8-i4": (
        lambda: [
            TransposeCodec(order=(1, 0)),
            znc.AsType(encode_dtype="<i4", decode_dtype="<f8"),
        ],
        "<f8",
        "small",
        0,
    ),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("name", list(TRANSPOSED))
def test_transpose_and_filters_native_like_zarr(
    tmp_path: Path, name: str, store_kind: str, where: str
) -> None:
    filters, dtype, kind, fill = TRANSPOSED[name]
    stores = {}
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            stores[who] = make_store(store_kind, tmp_path, who)
            array = create(stores[who], filters(), dtype, fill, [ZstdCodec(), Crc32cCodec()], where)
            _write(array, kind, dtype, fill)
            if dtype == "<f8" and kind == "small":
                array[20, 3] = np.nan  # astype's kernel refuses it: numcodecs' code encodes it
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set(ORACLE):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["fused"], mode="r")
        chain = _plan(array).reader.chain
        assert isinstance(chain, FilteredChain) and chain.order is not None
        assert_same_values(array[:], expected)
        assert_same_values(array[5:30:2, 3:27], expected[5:30:2, 3:27])


def test_transposed_remainder_raises_zarrs_error() -> None:
    """The refused inner chunk of a transposed chain: zarr's error."""
    store, _ = _bad_store(
        [TransposeCodec(order=(1, 0)), ScaleOffset(offset=0, scale=1)],
        "<i4",
        [TransposeCodec(order=(1, 0)), ScaleOffset(scale=2)],
    )
    theirs = _error(ORACLE, store, (slice(None), slice(None)))
    ours = _error(STRICT, store, (slice(None), slice(None)))
    assert type(ours) is type(theirs) is ValueError
    assert str(ours).endswith(str(theirs))


def test_transpose_with_delta_declined() -> None:
    """delta's running sum follows the items' order, which a transpose
    changes: not for the batch kernels; zarr's code stores zarr's bytes."""
    value = values_of("ints", "<i4", SHAPE, 8)
    stores = {}
    lenient = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": False}
    for who, config in (("fused", lenient), ("zarr", ORACLE)):
        with zarr.config.set(config):
            stores[who] = MemoryStore()
            filters = [TransposeCodec(order=(1, 0)), znc.Delta(dtype="<i4")]
            array = create(stores[who], filters, "<i4", 0, [ZstdCodec()])
            array[:] = value
            if who == "fused":
                assert "inner chunks" in _plan(array).read_fallback
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
