"""Zarr format 2 filter chains on the native path: ``AsType``, ``Shuffle``
beside other filters or without a compressor, and F order.

Every test writes and reads the same array through zarr_fused (strict mode
for the native chains, so a silent fallback to zarr's code fails them) and
through zarr's `BatchedCodecPipeline` (the oracle): the same values, and the
same stored bytes wherever `byte_identical` claims them (gzip's differ by
its header's time stamp only: compared decompressed).
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs._v2 import V2Codec
from zarr.core.buffer import cpu
from zarr.storage import LocalStore, MemoryStore

from zarr_fused._v2 import V2Shuffle
from zarr_fused.cli.identity import byte_identical
from zarr_fused.errors import CorruptChunkError, UnsupportedError

from helpers import FUSED, assert_same_values, chunk_items, filter_data, grouped_chain, make_store
from helpers.filter_data import STRICT, assert_reads_as_zarr, values_of

LENIENT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": False}
SHAPE, CHUNKS = (13, 11), (4, 5)  # edge chunks on both axes

#: name -> (filters, compressor, dtype, kind of values): every filter has a
#: native stage, so each chain runs in strict mode
CHAINS: dict[str, tuple[Any, Any, str, str]] = {
    "delta-shuffle-zstd": (
        lambda: [numcodecs.Delta("<i4"), numcodecs.Shuffle(4)],
        lambda: numcodecs.Zstd(1),
        "<i4",
        "ints",
    ),
    "delta-shuffle8-blosc": (
        lambda: [numcodecs.Delta("<f8"), numcodecs.Shuffle(8)],
        lambda: numcodecs.Blosc("lz4", 5, 0),
        "<f8",
        "floats",
    ),
    "delta-blosc": (
        lambda: [numcodecs.Delta("<i4")],
        lambda: numcodecs.Blosc("lz4", 5, 1),
        "<i4",
        "ints",
    ),
    "delta-f4-blosc-bitshuffle": (
        lambda: [numcodecs.Delta("<f4")],
        lambda: numcodecs.Blosc("zstd", 3, 2),
        "<f4",
        "floats",
    ),
    "astype-blosc": (
        lambda: [numcodecs.AsType("<f4", "<f8")],
        lambda: numcodecs.Blosc("zstd", 5, 1),
        "<f8",
        "floats",
    ),
    "astype-f4-f8-zlib": (
        lambda: [numcodecs.AsType("<f8", "<f4")],
        lambda: numcodecs.Zlib(1),
        "<f4",
        "floats",
    ),
    "astype-uncompressed": (
        lambda: [numcodecs.AsType("<f4", "<f8")],
        lambda: None,
        "<f8",
        "floats",
    ),
    "astype-shuffle-lz4": (
        lambda: [numcodecs.AsType("<f4", "<f8"), numcodecs.Shuffle(4)],
        lambda: numcodecs.LZ4(),
        "<f8",
        "floats",
    ),
    "shuffle-uncompressed": (
        lambda: [numcodecs.Shuffle(4)],
        lambda: None,
        "<i4",
        "ints",
    ),
    "shuffle1-uncompressed": (
        lambda: [numcodecs.Shuffle(1)],
        lambda: None,
        "<u2",
        "ints",
    ),
    "shuffle-delta-zstd": (
        lambda: [numcodecs.Shuffle(2), numcodecs.Delta("|u1")],
        lambda: numcodecs.Zstd(3),
        "<u2",
        "ints",
    ),
    "delta-shuffle-uncompressed": (
        lambda: [numcodecs.Delta("<i8"), numcodecs.Shuffle(8)],
        lambda: None,
        "<i8",
        "ints",
    ),
    "fixedscaleoffset-shuffle-gzip": (
        lambda: [
            numcodecs.FixedScaleOffset(offset=273.15, scale=100, dtype="<f8", astype="<i2"),
            numcodecs.Shuffle(2),
        ],
        lambda: numcodecs.GZip(5),
        "<f8",
        "temperatures",
    ),
    "quantize-shuffle-blosc": (
        lambda: [numcodecs.Quantize(3, "<f4"), numcodecs.Shuffle(4)],
        lambda: numcodecs.Blosc("lz4", 5, -1),
        "<f4",
        "floats",
    ),
    "delta-bitround-astype-zstd": (
        lambda: [
            numcodecs.Delta("<f8"),
            numcodecs.BitRound(20),
            numcodecs.AsType("<f4", "<f8"),
        ],
        lambda: numcodecs.Zstd(1, checksum=True),
        "<f8",
        "floats",
    ),
}


def plan_of(array: Any) -> Any:
    return array._async_array.codec_pipeline.plan


def create_v2(
    store: Any, filters: list[Any], compressor: Any, dtype: str, order: str, **options: Any
) -> Any:
    """A format-2 array of SHAPE in CHUNKS; ``options`` go to create_array."""
    return zarr.create_array(
        store,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype=dtype,
        zarr_format=2,
        order=order,
        filters=filters,
        compressors=compressor,
        **options,
    )


def create(store: Any, name: str, order: str, fill_value: Any = 0, separator: str = ".") -> Any:
    filters, compressor, dtype, _ = CHAINS[name]
    return create_v2(
        store,
        filters(),
        compressor(),
        dtype,
        order,
        fill_value=fill_value,
        chunk_key_encoding={"name": "v2", "separator": separator},
    )


def write_both(
    tmp_path: Path, name: str, order: str, store_kind: str, fill_value: Any, separator: str = "."
) -> dict[str, Any]:
    """The same writes through zarr_fused (strict) and zarr: the whole
    array, a part across chunk edges, then a region of fill values (its
    chunks deleted); zarr_fused's chain is native."""
    value = values_of(CHAINS[name][3], CHAINS[name][2], SHAPE, 7)

    def make(who: str) -> Any:
        array = create(make_store(store_kind, tmp_path, who), name, order, fill_value, separator)
        if who == "fused":  # a lone Shuffle(1) is a plain native chain
            assert plan_of(array).chain.native, plan_of(array).fallback
        return array

    def write(array: Any) -> None:
        array[...] = value
        array[2:9, 3:8] = value[:7, :5] // 2
        array[8:12, :5] = 0 if fill_value is None else fill_value

    return filter_data.write_both(make, write)


def assert_same_chunks(stores: dict[str, Any], name: str) -> None:
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    assert sorted(ours) == sorted(theirs)
    codec = V2Codec(filters=tuple(CHAINS[name][0]()), compressor=CHAINS[name][1]())
    identical = byte_identical([codec])
    for key, expected in theirs.items():
        if type(codec.compressor) is numcodecs.GZip:
            assert gzip.decompress(ours[key]) == gzip.decompress(expected), key
        elif identical:
            assert ours[key] == expected, key


def assert_reads_alike(stores: dict[str, Any], selection: Any = (slice(1, 12, 2), slice(2, None))):
    """Each store read whole and in part by zarr_fused (strict) as zarr
    reads it."""
    assert_reads_as_zarr(stores, selection)


@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in CHAINS])
def test_chain_matches_zarr(tmp_path: Path, name: str, order: str, store_kind: str) -> None:
    stores = write_both(tmp_path, name, order, store_kind, fill_value=0)
    assert_same_chunks(stores, name)
    assert_reads_alike(stores)


#: the chains with a filter before the compressor's kernel that has no
#: kernel step (a Shuffle elsewhere than last, or without a compressor)
UNFUSED = {"shuffle-uncompressed", "shuffle1-uncompressed", "shuffle-delta-zstd"}
UNFUSED |= {"delta-shuffle-uncompressed"}


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in CHAINS])
def test_filters_run_in_the_batch_kernel(tmp_path: Path, name: str, order: str) -> None:
    """A chain whose native stages all have kernel steps decodes a chunk
    in one batch kernel call, straight into the output (in order F its
    stored items scattered transposed), and reads as zarr does."""
    stores = write_both(tmp_path, name, order, "local", fill_value=0)

    def check(array: Any) -> None:
        fused = getattr(plan_of(array).chain, "fused", None)
        assert (fused is not None) == (name not in UNFUSED)
        # local chunk files: a group of them per nogil call
        assert grouped_chain(array) is fused
        if fused is not None:
            assert fused.order == ((1, 0) if order == "F" else None)

    assert_reads_as_zarr(stores, (slice(1, 12, 2), slice(2, None)), check)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("store_kind", ["memory", "local"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_batch_kernel_refused_chunk_reads_as_zarr(
    tmp_path: Path, order: str, store_kind: str
) -> None:
    """A stored chunk the batch kernel's astype refuses (NaN and a value
    int16 cannot hold, as float32) is decoded by zarr's code, whole and
    in part, beside chunks the kernel decodes (local files: in groups)."""
    store = MemoryStore() if store_kind == "memory" else LocalStore(tmp_path)
    with zarr.config.set(filter_data.ZARR):
        array = create_v2(store, [numcodecs.AsType("<f4", "<i2")], numcodecs.Zstd(1), "<i2", order)
        array[...] = values_of("ints", "<i2", SHAPE, 3)
    bad = np.full(math.prod(CHUNKS), np.nan, dtype="<f4")
    bad[1] = 1e9
    encoded = numcodecs.Zstd(1).encode(bad.tobytes())
    if store_kind == "memory":
        store._store_dict["0.1"] = cpu.Buffer.from_bytes(encoded)
    else:
        (tmp_path / "0.1").write_bytes(encoded)

    def check(array: Any) -> None:
        assert plan_of(array).chain.fused is not None

    assert_reads_as_zarr({"zarr": store}, (slice(1, 12, 2), slice(2, None)), check)


ROWS_SHAPE, ROWS_CHUNKS = (6, 8, 10), (3, 4, 5)

#: selections of a 3-D array in whole chunks: the whole array (each
#: chunk's rows strided in the output), one chunk (dense in its output),
#: rows cut (the scatter), a plane dropping an axis, a step
ROWS_SELECTIONS = [
    pytest.param((Ellipsis,), id="all"),
    pytest.param((slice(3, 6), slice(4, 8), slice(5, 10)), id="one-chunk"),
    pytest.param((slice(None), slice(1, None), slice(None)), id="cut"),
    pytest.param((3, slice(None), slice(None)), id="plane"),
    pytest.param((slice(None), slice(None), slice(None, None, 2)), id="step"),
]


@pytest.mark.parametrize("selection", ROWS_SELECTIONS)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<i2", "<u8", "<f4", "<f8"])
def test_delta_rows_into_output(tmp_path: Path, dtype: str, order: str, selection: Any) -> None:
    """Delta over blosc on local files read through the grouped batch
    kernel, where a whole C-order chunk's running sum goes straight into
    its rows of the output (rows advancing over two outer axes) and every
    other selection through the scatter: bit for bit what zarr reads,
    a chunk's leading -0.0 kept."""
    kind = "floats" if dtype[1] == "f" else "ints"
    value = values_of(kind, dtype, ROWS_SHAPE, 11)
    if kind == "floats":
        value[::3, ::4, ::5] = -0.0  # the first item of every chunk
    store = LocalStore(tmp_path)
    with zarr.config.set(filter_data.ZARR):
        array = zarr.create_array(
            store,
            shape=ROWS_SHAPE,
            chunks=ROWS_CHUNKS,
            dtype=dtype,
            zarr_format=2,
            order=order,
            filters=[numcodecs.Delta(dtype)],
            compressors=numcodecs.Blosc("lz4", 5, 1),
        )
        array[...] = value
        expected = zarr.open_array(store, mode="r")[selection]
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        plan = plan_of(array)
        assert plan.chain.fused is not None
        assert grouped_chain(array) is plan.chain.fused
        got = array[selection]
    bits = f"<u{np.dtype(dtype).itemsize}"
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.view(bits), expected.view(bits))


def test_grouped_read_of_missing_files(tmp_path: Path) -> None:
    """Chunk files missing from a local store, read in groups by the batch
    kernel, fill with the fill value (the kernel finds them missing)."""
    with zarr.config.set(STRICT):
        array = create(LocalStore(tmp_path), "delta-blosc", "C", fill_value=-4)
        array[:4, :5] = 1
        array[8:, 5:] = 2
        assert grouped_chain(array) is not None
        got = array[...]
    expected = np.full(SHAPE, -4, dtype="<i4")
    expected[:4, :5] = 1
    expected[8:, 5:] = 2
    assert_same_values(got, expected)


FILL_CASES = [
    pytest.param("astype-shuffle-lz4", None, id="astype-none"),
    pytest.param("astype-blosc", np.nan, id="astype-nan"),
    pytest.param("delta-shuffle8-blosc", np.nan, id="delta-f8-nan"),
    pytest.param("delta-shuffle8-blosc", -2.5, id="delta-f8-nonzero"),
    pytest.param("delta-shuffle-zstd", 7, id="delta-i4-nonzero"),
    pytest.param("shuffle-uncompressed", None, id="shuffle-none"),
    pytest.param("shuffle-delta-zstd", 3, id="shuffle-delta-nonzero"),
]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(("name", "fill_value"), FILL_CASES)
def test_fill_values(tmp_path: Path, name: str, fill_value: Any, order: str) -> None:
    stores = write_both(tmp_path, name, order, "memory", fill_value)
    assert_same_chunks(stores, name)
    assert_reads_alike(stores, (slice(6, 13), slice(None, None, 3)))


@pytest.mark.parametrize("separator", [".", "/"])
@pytest.mark.parametrize("name", ["delta-shuffle-zstd", "astype-blosc"])
def test_separators(tmp_path: Path, name: str, separator: str) -> None:
    stores = write_both(tmp_path, name, "F", "local", 0, separator)
    assert_same_chunks(stores, name)
    assert any(("/" in key) == (separator == "/") for key in chunk_items(stores["fused"]))
    assert_reads_alike(stores)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("name", ["delta-shuffle-zstd", "astype-shuffle-lz4"])
def test_store_without_sync_io(tmp_path: Path, name: str, order: str) -> None:
    """The async path decodes and encodes through the same chain (a
    ZipStore cannot take the overwrites and deletions of `write_both`)."""
    stores = write_both(tmp_path, name, order, "nosync", 0)
    assert_same_chunks(stores, name)
    assert_reads_alike(stores)


def test_missing_chunks_read_as_fill(tmp_path: Path) -> None:
    with zarr.config.set(STRICT):
        array = create(MemoryStore(), "delta-shuffle-zstd", "F", fill_value=5)
        array[:4, :5] = 1
        got = array[...]
    expected = np.full(SHAPE, 5, dtype="<i4")
    expected[:4, :5] = 1
    assert_same_values(got, expected)


# -- corrupt chunks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "delta-shuffle-zstd",
        "delta-blosc",
        "astype-blosc",
        "shuffle-uncompressed",
        "astype-uncompressed",
    ],
)
def test_truncated_chunk_names_key(tmp_path: Path, name: str) -> None:
    store = LocalStore(tmp_path / "a")
    with zarr.config.set(STRICT):
        create(store, name, "F")[...] = values_of(CHAINS[name][3], CHAINS[name][2], SHAPE, 2)
    path = tmp_path / "a" / "1.2"
    path.write_bytes(path.read_bytes()[:-9])
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        with pytest.raises(CorruptChunkError, match=r"1\.2"):
            array[...]


@pytest.mark.parametrize("name", ["delta-shuffle-zstd", "delta-blosc", "astype-shuffle-lz4"])
def test_garbage_chunk_names_key(tmp_path: Path, name: str) -> None:
    store = LocalStore(tmp_path / "a")
    with zarr.config.set(STRICT):
        create(store, name, "C")[...] = values_of(CHAINS[name][3], CHAINS[name][2], SHAPE, 2)
    (tmp_path / "a" / "2.1").write_bytes(bytes(range(7, 250)))
    with zarr.config.set(STRICT):
        array = zarr.open_array(store, mode="r")
        with pytest.raises(CorruptChunkError, match=r"2\.1"):
            array[...]


# -- what still runs zarr's code ----------------------------------------------------------------

# (a big-endian Delta has no kernel: the kernels take native byte order)
ZARR_STAGES = [
    pytest.param([numcodecs.Delta(">i4"), numcodecs.Shuffle(4)], "delta, shuffle", id="last"),
    pytest.param([numcodecs.Shuffle(4), numcodecs.Delta(">i4")], "shuffle, delta", id="first"),
]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(("filters", "names"), ZARR_STAGES)
def test_filter_without_kernel(filters: list[Any], names: str, order: str) -> None:
    """A filter without a native stage: zarr's code runs the filters (the
    compressor stays native), the values are zarr's, strict mode refuses."""
    value = values_of("ints", ">i4", SHAPE, 3)

    def make(who: str) -> Any:
        array = create_v2(MemoryStore(), filters, numcodecs.Zstd(1), ">i4", order)
        if who == "fused":
            assert f"filters ({names}) run zarr's code" in plan_of(array).fallback
        return array

    def write(array: Any) -> None:
        array[...] = value

    stores = filter_data.write_both(make, write, LENIENT)
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    with zarr.config.set(LENIENT):
        assert_same_values(zarr.open_array(stores["fused"], mode="r")[...], value)
    with zarr.config.set(STRICT), pytest.raises(UnsupportedError, match="natively"):
        zarr.open_array(stores["fused"], mode="r")[...]


@pytest.mark.parametrize("order", ["C", "F"])
def test_bitround_before_flattening(order: str) -> None:
    """numcodecs' BitRound returns a C-order copy of an F-order chunk, whose
    items zarr stores in C order and reads back as F order (scrambled):
    in order F zarr's code runs the filters, and zarr_fused reads and
    writes what zarr does; in order C the chain is native."""
    value = values_of("floats", "<f8", SHAPE, 5)
    plans, reads = [], []  # fused, then zarr (write_both's order)

    def make(who: str) -> Any:
        filters = [numcodecs.BitRound(12), numcodecs.Shuffle(8)]
        array = create_v2(MemoryStore(), filters, numcodecs.Zstd(1), "<f8", order)
        if who == "fused":
            plans.append(plan_of(array))
        return array

    def write(array: Any) -> None:
        array[...] = value
        array[1:6, 2:9] = value[1:6, 2:9] * 3
        reads.append(array[...])

    stores = filter_data.write_both(make, write, LENIENT)
    (plan,) = plans
    assert plan.chain.native == (order == "C"), plan.fallback
    assert chunk_items(stores["fused"]) == chunk_items(stores["zarr"])
    assert_same_values(*reads)
    if order == "F":
        assert "bitround stores an order-F chunk in C order" in plan.fallback
        with zarr.config.set(STRICT), pytest.raises(UnsupportedError, match="natively"):
            zarr.open_array(stores["fused"], mode="r")[...]


# -- the Shuffle stage against numcodecs --------------------------------------------------------


@pytest.mark.parametrize("elementsize", [0, 1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("nbytes", [0, 48, 96])
def test_shuffle_stage_is_numcodecs(elementsize: int, nbytes: int) -> None:
    data = np.random.default_rng(elementsize + nbytes).integers(0, 256, nbytes, dtype="u1")
    codec, stage = numcodecs.Shuffle(elementsize), V2Shuffle(elementsize)
    encoded = stage.encode_flat(data)
    assert encoded is not None
    assert encoded.tobytes() == bytes(codec.encode(data))
    decoded = stage.decode_flat(encoded)
    assert decoded is not None
    assert decoded.tobytes() == bytes(codec.decode(encoded)) == data.tobytes()


def test_shuffle_stage_refuses_partial_elements() -> None:
    """numcodecs raises for these; the stage hands them to zarr's code."""
    data = np.arange(10, dtype="u1")
    assert V2Shuffle(4).encode_flat(data) is None
    assert V2Shuffle(4).decode_flat(data) is None
    with pytest.raises(ValueError, match="multiple of elementsize"):
        numcodecs.Shuffle(4).encode(data)


# -- filter stacks, drawn ------------------------------------------------------------------------

COMPRESSOR_CHOICES = [
    lambda: None,
    lambda: numcodecs.Zstd(1),
    lambda: numcodecs.Blosc("lz4", 5, -1),
    lambda: numcodecs.LZ4(),
    lambda: numcodecs.Zlib(1),
]


@st.composite
def filter_stacks(draw: st.DrawFn) -> tuple[list[Any], str]:
    """Up to three filters with native stages, each valid for the items the
    one before it hands on (a Shuffle hands on bytes)."""
    dtype = draw(st.sampled_from(["<i2", "<u4", "<i8", "<f4", "<f8"]))
    items, filters = np.dtype(dtype), []
    for _ in range(draw(st.integers(1, 3))):
        choices = ["delta", "shuffle"]
        if items.kind == "f":
            choices += ["astype", "bitround", "quantize"]
        kind = draw(st.sampled_from(choices))
        if kind == "delta":
            filters.append(numcodecs.Delta(items.str))
        elif kind == "shuffle":
            filters.append(numcodecs.Shuffle(draw(st.sampled_from([1, 2, 4, 8]))))
            items = np.dtype("|u1")
        elif kind == "astype":
            encoded = "<f4" if items.itemsize == 8 else "<f8"
            filters.append(numcodecs.AsType(encoded, items.str))
            items = np.dtype(encoded)
        elif kind == "bitround":
            filters.append(numcodecs.BitRound(draw(st.integers(0, 22))))
        else:
            filters.append(numcodecs.Quantize(draw(st.integers(0, 5)), items.str))
    return filters, dtype


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    stack=filter_stacks(),
    compressor=st.sampled_from(COMPRESSOR_CHOICES),
    order=st.sampled_from(["C", "F"]),
    fill=st.sampled_from([None, 0, 3]),
    seed=st.integers(0, 2**16),
)
def test_filter_stacks(
    stack: tuple[list[Any], str], compressor: Any, order: str, fill: Any, seed: int
) -> None:
    filters, dtype = stack
    kind = "floats" if dtype[1] == "f" else "ints"
    value = values_of(kind, dtype, SHAPE, seed)
    reads = []  # fused, then zarr (write_both's order)

    def make(_: str) -> Any:
        return create_v2(MemoryStore(), filters, compressor(), dtype, order, fill_value=fill)

    def write(array: Any) -> None:
        array[...] = value
        array[3:7, 2:9] = value[3:7, 2:9][::-1]
        reads.append(array[1:, ::2])

    stores = filter_data.write_both(make, write)
    ours, theirs = chunk_items(stores["fused"]), chunk_items(stores["zarr"])
    if byte_identical([V2Codec(filters=tuple(filters), compressor=compressor())]):
        assert ours == theirs
    assert sorted(ours) == sorted(theirs)
    assert_same_values(*reads)
