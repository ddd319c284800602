"""zarr's ``cast_value`` codec on the native kernel (`zarr_fused._cast_value`).

Two oracles: cast-value-rs, zarr's backend, for the kernel on edge values
of every pair of types, rounding mode and out-of-range mode (a value it
raises on must make the kernel fail); zarr's `BatchedCodecPipeline` for
whole arrays, values and stored bytes, unsharded (a hybrid chain whose
stage is native) and sharded (the batches' `FilterChain`), in strict mode.
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
from zarr.codecs.cast_value import CastValue
from zarr.storage import MemoryStore

from zarr_fused._filter_stages import NativeCastValue, native_stage
from zarr_fused._hybrid import FilteredChain, HybridChain
from zarr_fused.errors import UnsupportedError

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, filter_data, make_store
from helpers.filter_data import STRICT, assert_reads_as_zarr, filter_array

cast_value_rs = pytest.importorskip("cast_value_rs")
cast_kernels = pytest.importorskip("zarr_fused._cast_value")

LENIENT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": False}

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float32", "float64"]
TYPES = INTS + FLOATS
ROUNDINGS = ["nearest-even", "towards-zero", "towards-positive", "towards-negative", "nearest-away"]
PAIRS = [(s, d) for s in TYPES for d in TYPES]


def _modes(dst: str) -> list[str | None]:
    return [None, "clamp", "wrap"] if dst in INTS else [None, "clamp"]


def edge_values(src: str, dst: str) -> np.ndarray:
    """Values of ``src`` around what the cast to ``dst`` decides on: zeros,
    ties, the bounds of both types and the values just past them, NaN and
    the infinities, subnormals, float32's overflow threshold."""
    values: list[Any] = [0, 1, -1, 2, 3, 127, 128, 255, 256, -128, -129]
    for name in (src, dst):
        if name in INTS:
            info = np.iinfo(name)
            values += [int(info.min), int(info.max), int(info.min) - 1, int(info.max) + 1]
            values += [int(info.max) // 2, 2**53 + 1, 2**24 + 1, -(2**24) - 1, 2**31 - 65]
    if src in INTS:
        info = np.iinfo(src)
        kept = sorted({int(v) for v in values if info.min <= int(v) <= info.max})
        return np.array(kept, dtype=src)
    values += [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, 126.5, 127.5, -128.5, 255.5]
    values += [-0.0, np.nan, np.inf, -np.inf, 5e-324, 1e-40, -1e-40, 1.0000001, 0.1]
    values += [3.4028235e38, 3.4028236e38, 3.5e38, 1e39, -1e39, 1e300, 2.0**63, 2.0**64]
    values += [2.0**31 - 0.5, 2.0**31, -(2.0**31) - 1, 16777217.0, 9007199254740993.0]
    values += [0.49999999999999994, 4503599627370495.5, -2251799813685248.5, 8388607.5, -0.5000001]
    with np.errstate(over="ignore"):
        return np.array([float(v) for v in values], dtype=np.float64).astype(src)


def reference(value: np.ndarray, dst: str, rounding: str, mode: Any, entries: Any) -> Any:
    """cast-value-rs' result for one array: its bytes, or ``"error"``."""
    try:
        out = cast_value_rs.cast_array(
            value,
            target_dtype=dst,
            rounding_mode=rounding,
            out_of_range_mode=mode,
            scalar_map_entries=dict(entries) if entries else None,
        )
    except ValueError:
        return "error"
    return out.tobytes()


def native(value: np.ndarray, dst: str, rounding: str, mode: Any, entries: Any) -> Any:
    """The kernel's result for one array: its bytes, or ``"error"`` (the
    entries as zarr hands them over: a dict's, a later equal key winning)."""
    spec = cast_kernels.CastSpec(value.dtype, dst, rounding, mode, list(dict(entries).items()))
    out = np.empty(value.shape, dtype=dst)
    status = cast_kernels.cast(value, out, spec)
    return "error" if status != cast_kernels.CastStatus.CAST_OK else out.tobytes()


def each_value(value: np.ndarray, run: Any, *args: Any) -> list[Any]:
    return [run(value[i : i + 1], *args) for i in range(value.size)]


# -- the kernel against cast-value-rs -------------------------------------------------


EDGE_CASES = [
    pytest.param(s, d, m, id=f"{s}-{d}-{m or 'unset'}") for s, d in PAIRS for m in _modes(d)
]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize(("src", "dst", "mode"), EDGE_CASES)
def test_kernel_edge_values(src: str, dst: str, mode: Any, rounding: str) -> None:
    """Each edge value cast alone (so one that fails does not hide the
    others): the same bytes as cast-value-rs, or both fail."""
    value = edge_values(src, dst)
    expected = each_value(value, reference, dst, rounding, mode, ())
    assert each_value(value, native, dst, rounding, mode, ()) == expected


@pytest.mark.parametrize("mode", [None, "clamp"])
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize(
    ("src", "dst"),
    [("float64", "uint8"), ("float64", "int32"), ("float32", "uint8"), ("float64", "float32")],
)
def test_kernel_whole_arrays(src: str, dst: str, rounding: str, mode: Any) -> None:
    """Arrays long enough for cast-value-rs' SIMD paths (these pairs), with
    a tail the vector width does not divide."""
    rng = np.random.default_rng(5)
    value = (rng.standard_normal(1003) * 300).astype(src)
    value[::7] += 0.5
    if mode is None:
        value = np.clip(value, 0, 255) if dst == "uint8" else value
    got = native(value, dst, rounding, mode, ())
    assert got == reference(value, dst, rounding, mode, ())


ENTRIES = {
    "nan-to-zero": lambda s, d: [(float("nan"), 0 if d in INTS else 0.0)],
    "zero-to-nan": lambda s, d: [(0 if s in INTS else 0.0, float("nan"))],
    "inf-and-max": lambda s, d: [(float("inf"), int(np.iinfo(d).max)), (float("-inf"), 0)],
    "int-sentinel": lambda s, d: [(-1, 7 if d in INTS else -0.0), (5, 5 if d in INTS else 0.5)],
}
ENTRY_CASES = [
    ("nan-to-zero", "float32", "int16"),
    ("nan-to-zero", "float64", "uint8"),
    ("nan-to-zero", "float64", "float32"),
    ("zero-to-nan", "int16", "float32"),
    ("zero-to-nan", "float32", "float64"),
    ("inf-and-max", "float64", "int32"),
    ("inf-and-max", "float32", "uint64"),
    ("int-sentinel", "int32", "int8"),
    ("int-sentinel", "int64", "float64"),
]


@pytest.mark.parametrize("mode", [None, "clamp"])
@pytest.mark.parametrize(("name", "src", "dst"), ENTRY_CASES)
def test_kernel_scalar_map(name: str, src: str, dst: str, mode: Any) -> None:
    entries = ENTRIES[name](src, dst)
    value = edge_values(src, dst)
    expected = each_value(value, reference, dst, "nearest-even", mode, entries)
    assert each_value(value, native, dst, "nearest-even", mode, entries) == expected


def test_kernel_scalar_map_first_match_wins() -> None:
    """Two NaN keys (distinct objects, so a dict keeps both): the first wins."""
    value = np.array([np.nan, 1.0, 2.0], dtype="float64")
    entries = [(float("nan"), 1), (float("nan"), 2), (1.0, 9)]
    assert native(value, "int8", "nearest-even", None, entries) == reference(
        value, "int8", "nearest-even", None, entries
    )


@st.composite
def cast_cases(draw: Any) -> tuple[np.ndarray, str, str, Any, list[Any]]:
    src, dst = draw(st.sampled_from(PAIRS))
    rounding = draw(st.sampled_from(ROUNDINGS))
    mode = draw(st.sampled_from(_modes(dst)))
    edges = edge_values(src, dst)
    if src in INTS:
        info = np.iinfo(src)
        drawn = st.integers(int(info.min), int(info.max))
    else:
        drawn = st.floats(width=32 if src == "float32" else 64, allow_nan=True)
    picks = draw(st.lists(st.one_of(st.sampled_from(list(edges.tolist())), drawn), max_size=40))
    with np.errstate(over="ignore"):
        value = np.array(picks, dtype=src)
    keys = st.sampled_from(list(edges.tolist()))
    targets = edge_values(dst, dst)
    targets = targets[~np.isnan(targets)] if dst in FLOATS else targets
    pairs = st.tuples(keys, st.sampled_from(targets.tolist()))
    entries = draw(st.lists(pairs, max_size=3))
    return value, dst, rounding, mode, entries


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cast_cases())
def test_kernel_matches_cast_value_rs(case: tuple[np.ndarray, str, str, Any, list[Any]]) -> None:
    value, dst, rounding, mode, entries = case
    assert native(value, dst, rounding, mode, entries) == reference(
        value, dst, rounding, mode, entries
    )


def test_kernel_checks_arrays() -> None:
    spec = cast_kernels.CastSpec("float32", "int16", "nearest-even", "clamp", [])
    with pytest.raises(TypeError):
        cast_kernels.cast(np.zeros(3, "float64"), np.zeros(3, "int16"), spec)
    with pytest.raises(ValueError, match="same size"):
        cast_kernels.cast(np.zeros(3, "float32"), np.zeros(4, "int16"), spec)
    with pytest.raises(ValueError, match="C-contiguous"):
        cast_kernels.cast(np.zeros((4, 4), "float32").T, np.zeros((4, 4), "int16"), spec)
    with pytest.raises(TypeError, match="target type"):
        cast_kernels.CastSpec("float32", "float16", "nearest-even", None, [])
    with pytest.raises(ValueError, match="rounding"):
        cast_kernels.CastSpec("float32", "int16", "up", None, [])
    with pytest.raises(TypeError, match="scalar_map"):
        cast_kernels.CastSpec("float32", "int8", "nearest-even", None, [(1.0, 300)])


@pytest.mark.parametrize(
    ("src", "dst", "mode", "entries", "can_fail"),
    [
        pytest.param("int16", "float32", None, [], False, id="int-to-float"),
        pytest.param("float32", "float64", None, [], False, id="widen"),
        pytest.param("float64", "float32", None, [], True, id="narrow"),
        pytest.param("float64", "float32", "clamp", [], False, id="narrow-clamp"),
        pytest.param("float32", "int16", "clamp", [], True, id="nan-to-int"),
        pytest.param("float32", "int16", "clamp", [(float("nan"), 0)], True, id="nan-mapped"),
        pytest.param(
            "float32",
            "int16",
            "clamp",
            [(float("nan"), 0), (float("inf"), 1), (float("-inf"), 2)],
            False,
            id="nan-inf-mapped",
        ),
        pytest.param("int16", "int32", None, [], False, id="int-widen"),
        pytest.param("int32", "int16", None, [], True, id="int-narrow"),
        pytest.param("int32", "int16", "wrap", [], False, id="int-wrap"),
    ],
)
def test_can_fail(src: str, dst: str, mode: Any, entries: Any, can_fail: bool) -> None:
    assert cast_kernels.CastSpec(src, dst, "nearest-even", mode, entries).can_fail is can_fail


# -- whole arrays against zarr's pipeline ----------------------------------------------

#: array dtype, the codec, how values are drawn, fill value
CHAINS: dict[str, tuple[str, Any, str, Any]] = {
    "f4-i2-nan-map": (
        "float32",
        lambda: CastValue(
            data_type="int16",
            out_of_range="clamp",
            scalar_map={
                "encode": [("NaN", -32768), ("Infinity", 32767), ("-Infinity", -32767)],
                "decode": [(-32768, "NaN")],
            },
        ),
        "wide-nan",
        np.nan,
    ),
    "f8-u1-towards-zero": (
        "float64",
        lambda: CastValue(data_type="uint8", rounding="towards-zero", out_of_range="clamp"),
        "wide",
        7,
    ),
    "f8-f4-nearest-away": (
        "float64",
        lambda: CastValue(data_type="float32", rounding="nearest-away", out_of_range="clamp"),
        "wide-nan",
        np.nan,
    ),
    "i4-i2-wrap": ("int32", lambda: CastValue(data_type="int16", out_of_range="wrap"), "ints", -1),
    "u2-u1-clamp": (
        "uint16",
        lambda: CastValue(data_type="uint8", out_of_range="clamp"),
        "ints",
        3,
    ),
    "i8-f4-towards-negative": (
        "int64",
        lambda: CastValue(data_type="float32", rounding="towards-negative"),
        "ints",
        5,
    ),
}
SHARDED_CHAINS = list(CHAINS)

SHAPE, CHUNKS, INNER = (37, 29), (16, 12), (8, 6)  # edge chunks on both axes


def values_of(kind: str, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ints":
        info = np.iinfo(dtype)
        value = rng.integers(max(info.min, -70000), min(info.max, 70000), SHAPE, endpoint=True)
        return value.astype(dtype)
    value = rng.standard_normal(SHAPE) * 200
    value.flat[::13] += 0.5
    if kind == "wide-nan":
        value.flat[::17] = np.nan
        value[0, :3] = [np.inf, -np.inf, -0.0]
    return value.astype(dtype)


def create(store: Any, name: str, sharded: bool, compressors: list[Any]) -> Any:
    dtype, codec, _, fill = CHAINS[name]
    inner = INNER if sharded else None
    return filter_array(store, SHAPE, CHUNKS, dtype, fill, [codec()], compressors, inner)


def write_both(tmp_path: Path, name: str, store_kind: str, sharded: bool) -> dict[str, Any]:
    """The same writes through zarr_fused (strict) and zarr: the whole
    array, a patch into existing chunks, a region of fill value."""
    dtype, _, kind, fill = CHAINS[name]
    value, patch = values_of(kind, dtype, 0), values_of(kind, dtype, 1)[3:10, 2:20]

    def make(who: str) -> Any:
        store = make_store(store_kind, tmp_path, who)
        return create(store, name, sharded, [ZstdCodec(level=1), Crc32cCodec()])

    def write(array: Any) -> None:
        array[:] = value
        array[3:10, 2:20] = patch
        array[20:, 14:] = fill

    return filter_data.write_both(make, write)


def assert_same(stores: dict[str, Any], sharded: bool) -> None:
    def native(array: Any) -> None:
        plan = array._async_array.codec_pipeline.plan
        assert plan.read_fallback == plan.write_fallback == ""
        if sharded:
            assert isinstance(plan.reader.chain, FilteredChain)
        else:
            assert isinstance(plan.chain, HybridChain) and plan.chain.native

    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    assert_reads_as_zarr(stores, (slice(2, 30, 3), slice(5, None)), native)


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_unsharded_matches_zarr(tmp_path: Path, name: str, store_kind: str) -> None:
    assert_same(write_both(tmp_path, name, store_kind, sharded=False), sharded=False)


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("name", SHARDED_CHAINS)
def test_sharded_matches_zarr(tmp_path: Path, name: str, store_kind: str) -> None:
    assert_same(write_both(tmp_path, name, store_kind, sharded=True), sharded=True)


@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_unset_out_of_range_raises_zarrs_error(sharded: bool) -> None:
    """A value the target cannot hold, no out_of_range mode: zarr raises a
    ValueError from its backend; so does zarr_fused (zarr's code on that
    chunk), and nothing of that chunk is stored."""
    codec = CastValue(data_type="int8")
    value = np.zeros(SHAPE, dtype="float32")
    value[20, 20] = 300.0
    errors = {}
    for who, config in (("fused", STRICT), ("zarr", {"codec_pipeline.path": BATCHED})):
        with zarr.config.set(config):
            compressors = [] if sharded else [ZstdCodec()]
            inner = INNER if sharded else None
            array = filter_array(
                MemoryStore(), SHAPE, CHUNKS, "float32", 0, [codec], compressors, inner
            )
            with pytest.raises(ValueError, match="out of range") as caught:
                array[:] = value
            errors[who] = type(caught.value)
    assert errors["fused"] is errors["zarr"]


def test_nan_without_map_raises_zarrs_error() -> None:
    with zarr.config.set(STRICT):
        array = zarr.create_array(
            MemoryStore(),
            shape=(10,),
            chunks=(5,),
            dtype="float64",
            fill_value=0,
            filters=[CastValue(data_type="uint8", out_of_range="clamp")],
        )
        with pytest.raises(ValueError, match="NaN"):
            array[:] = np.array([1.0] * 9 + [np.nan])
        array[:5] = 1.0  # the other chunk still writes
        assert_same_values(array[:5], np.ones(5))


@pytest.mark.parametrize(
    ("dtype", "target"),
    [("float16", "int8"), ("float32", "float16"), ("float16", "float64")],
)
def test_types_without_kernel_run_zarrs_code(dtype: str, target: str) -> None:
    codec = CastValue(data_type=target, out_of_range="clamp")
    assert native_stage(codec) is not None  # the codec has a stage ...
    with zarr.config.set(LENIENT):
        array = zarr.create_array(
            MemoryStore(), shape=(6,), chunks=(4,), dtype=dtype, fill_value=0, filters=[codec]
        )
        reason = array._async_array.codec_pipeline.plan.read_fallback
    assert "CastValue run zarr's code" in reason  # ... but not for these types
    with zarr.config.set(STRICT):
        array = zarr.open_array(array.store, mode="r+")
        with pytest.raises(UnsupportedError, match="CastValue"):
            array[:] = 1


def test_many_scalar_map_entries_run_zarrs_code() -> None:
    entries = [(i, i + 1) for i in range(cast_kernels.MAX_ENTRIES + 1)]
    stage = native_stage(CastValue(data_type="int16", scalar_map={"encode": entries}))
    assert isinstance(stage, NativeCastValue)
    assert not stage.takes_dtype(np.dtype("int32"))


def test_corrupt_chunk_names_key(tmp_path: Path) -> None:
    """A stored chunk of another size than its items need: an error that
    names the chunk's key."""
    with zarr.config.set(STRICT):
        store = make_store("local", tmp_path)
        array = create(store, "f8-u1-towards-zero", False, [])
        array[:] = values_of("wide", "float64", 2)
        chunk = tmp_path / "data" / "c" / "1" / "0"
        chunk.write_bytes(chunk.read_bytes()[:-5])
        with pytest.raises(Exception, match=r"c/1/0"):
            array[:]


def test_never_written_reads_fill(tmp_path: Path) -> None:
    with zarr.config.set(STRICT):
        array = create(make_store("local", tmp_path), "f4-i2-nan-map", True, [ZstdCodec()])
        assert np.isnan(array[:]).all()
