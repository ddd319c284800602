"""Strategies and scenario model for the differential fuzz test
(`test_differential.py`): an array description, a sequence of partial writes
with a read after each, and the values they write.

Everything a scenario does is drawn by hypothesis and printed in its repr, so
a falsifying example is the whole reproduction: the array spec, and per step
the selection, the seed of the values written and the selection read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numcodecs
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as npst
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)
from zarr.testing.strategies import basic_indices, block_indices, orthogonal_indices

# -- data types and fill values -------------------------------------------------------


def _both_orders(*codes: str) -> list[str]:
    return [f"{order}{code}" for code in codes for order in "<>"]


NUMERIC_DTYPES = ["i1", "u1", *_both_orders("i2", "i4", "i8", "u2", "u4", "u8")]
FLOAT_DTYPES = _both_orders("f2", "f4", "f8", "c8", "c16")
TIME_DTYPES = _both_orders("M8", "M8[ns]", "M8[D]", "M8[s]", "m8", "m8[ms]", "m8[h]")
OTHER_DTYPES = ["?", "S1", "S4", *_both_orders("U1", "U3")]
DTYPES = NUMERIC_DTYPES + FLOAT_DTYPES + TIME_DTYPES + OTHER_DTYPES

# `fill_value` left out of create_array (zarr picks its default)
DEFAULT = "<default>"


def _time_unit(dtype: np.dtype[Any]) -> str:
    return np.datetime_data(dtype)[0]


NAT = np.iinfo(np.int64).min


def _time_scalar(dtype: np.dtype[Any], value: int) -> Any:
    """A datetime64/timedelta64 scalar of ``dtype``'s unit from its int64
    (NaT is the int64 minimum); by view, since NumPy deprecates constructing
    generic-unit values."""
    return np.array([value], dtype=np.int64).view(dtype.newbyteorder("="))[0]


def fill_value_candidates(dtype: np.dtype[Any]) -> list[Any]:
    """The fill values worth trying for ``dtype``: zarr's default, zero, a
    non-zero value, extremes and the special floats / NaT."""
    kind = dtype.kind
    values: list[Any] = [DEFAULT]
    if kind == "b":
        values += [False, True]
    elif kind in "iu":
        info = np.iinfo(dtype)
        values += [0, 7, int(info.min), int(info.max)] + ([-1] if kind == "i" else [])
    elif kind == "f":
        values += [0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, float(np.finfo(dtype).max)]
    elif kind == "c":
        values += [
            0j,
            complex(1, -2),
            complex(math.nan, 0),
            complex(0, math.nan),
            complex(math.inf, -math.inf),
        ]
    elif kind in "Mm":
        values += [_time_scalar(dtype, NAT)]
        if _time_unit(dtype) != "generic":
            # zarr rejects a generic datetime/timedelta fill other than NaT
            values += [_time_scalar(dtype, 0), _time_scalar(dtype, 7), _time_scalar(dtype, -3)]
    elif kind == "S":
        values += [b"", b"a", b"\x00b"]
    elif kind == "U":
        values += ["", "\u00e9", "ab"]
    else:  # pragma: no cover - DTYPES lists every kind above
        raise AssertionError(dtype)
    return values


# -- geometry and codecs ---------------------------------------------------------------


@st.composite
def shapes_and_chunks(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """0-d to 3-d shapes (sides 0..9, smaller in 3-d) and chunk shapes from 1
    to one past the side, so edges are uneven and chunks may exceed the array;
    now and then a larger 1-d or 2-d array whose chunks are big enough for
    compressors to compress (blosc stores small buffers as they are)."""
    if draw(st.integers(0, 7)) == 0:
        shape = tuple(draw(st.lists(st.integers(16, 64), min_size=1, max_size=2)))
        chunks = tuple(draw(st.integers(8, side)) for side in shape)
        return shape, chunks
    ndim = draw(st.integers(0, 3))
    max_side = 9 if ndim < 3 else 5
    shape = tuple(draw(st.integers(0, max_side)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, max(side, 1) + 1)) for side in shape)
    return shape, chunks


ZSTD_LEVELS = st.integers(-7, 22)
BLOSC_CNAMES = ["lz4", "lz4hc", "blosclz", "zstd", "zlib", "snappy"]


def v3_compressors() -> st.SearchStrategy[Any]:
    """One bytes -> bytes compressor of zarr v3 with its settings."""
    return st.one_of(
        st.builds(ZstdCodec, level=ZSTD_LEVELS, checksum=st.booleans()),
        st.builds(GzipCodec, level=st.integers(0, 9)),
        st.builds(
            BloscCodec,
            cname=st.sampled_from(BLOSC_CNAMES),
            clevel=st.integers(0, 9),
            shuffle=st.sampled_from([None, "noshuffle", "shuffle", "bitshuffle"]),
            typesize=st.sampled_from([None, 1, 3, 8]),
            blocksize=st.sampled_from([0, 0, 16, 256]),
        ),
    )


@st.composite
def v3_bytes_codecs(draw: st.DrawFn) -> list[Any]:
    """The bytes -> bytes part of a v3 chain: none, a compressor, crc32c, or a
    compressor with crc32c after or before it."""
    layout = draw(
        st.sampled_from(["none", "compressor", "crc", "compressor-crc", "crc-compressor"])
    )
    if layout == "none":
        return []
    if layout == "crc":
        return [Crc32cCodec()]
    compressor = draw(v3_compressors())
    return {
        "compressor": [compressor],
        "compressor-crc": [compressor, Crc32cCodec()],
        "crc-compressor": [Crc32cCodec(), compressor],
    }[layout]


def v2_compressors() -> st.SearchStrategy[Any]:
    """A zarr v2 (numcodecs) compressor, or none."""
    return st.one_of(
        st.none(),
        st.builds(numcodecs.Zstd, level=ZSTD_LEVELS, checksum=st.booleans()),
        st.builds(numcodecs.GZip, level=st.integers(0, 9)),
        st.builds(
            numcodecs.Blosc,
            cname=st.sampled_from(["lz4", "lz4hc", "blosclz", "zstd", "zlib"]),
            clevel=st.integers(0, 9),
            shuffle=st.sampled_from([-1, 0, 1, 2]),
            blocksize=st.sampled_from([0, 16, 256]),
        ),
    )


def _transposes(ndim: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.permutations(range(ndim)).map(lambda order: TransposeCodec(order=tuple(order))),
    )


def _serializers() -> st.SearchStrategy[Any]:
    return st.sampled_from([BytesCodec(endian="little"), BytesCodec(endian="big")])


@dataclass(frozen=True)
class ArraySpec:
    """Everything `zarr.create_array` is given. ``shards`` is the outer chunk
    shape when ``serializer`` is a `ShardingCodec` (``chunks`` is then the
    inner chunk shape, as in the sharding codec)."""

    zarr_format: int
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    fill_value: Any
    write_empty_chunks: bool
    shards: tuple[int, ...] | None = None
    filters: tuple[Any, ...] = ()
    serializer: Any = None
    compressors: tuple[Any, ...] = ()
    order: str = "C"

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return np.dtype(self.dtype)

    @property
    def grid(self) -> tuple[int, ...]:
        """The chunk shape of the array's grid (the shard shape when sharded)."""
        return self.shards if self.shards is not None else self.chunks

    def block_sizes(self) -> tuple[tuple[int, ...], ...]:
        """Per axis, the sizes of the grid's chunks clipped to the array."""
        return tuple(
            tuple(min(c, n - start) for start in range(0, n, c))
            for n, c in zip(self.shape, self.grid, strict=True)
        )

    def create_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "shape": self.shape,
            "chunks": self.grid,
            "dtype": self.np_dtype,
            "zarr_format": self.zarr_format,
            "config": {"write_empty_chunks": self.write_empty_chunks},
        }
        if self.fill_value is not DEFAULT:
            kwargs["fill_value"] = self.fill_value
        if self.zarr_format == 2:
            kwargs["compressors"] = self.compressors[0] if self.compressors else None
            kwargs["filters"] = None
            kwargs["order"] = self.order
        else:
            kwargs["filters"] = list(self.filters)
            kwargs["serializer"] = self.serializer
            kwargs["compressors"] = list(self.compressors)
        return kwargs

    def all_codecs(self) -> list[Any]:
        """Every codec of the array, inner chunk and shard index codecs included."""
        out: list[Any] = [*self.filters, *self.compressors]
        todo = [self.serializer] if self.serializer is not None else []
        while todo:
            codec = todo.pop()
            out.append(codec)
            if isinstance(codec, ShardingCodec):
                todo.extend(codec.codecs)
                todo.extend(codec.index_codecs)
        return out


@st.composite
def array_specs(draw: st.DrawFn, *, zarr_format: int, sharded: bool = False) -> ArraySpec:
    """An array of any data type, fill value, shape and codec chain of
    ``zarr_format``; with ``sharded``, a v3 sharding codec (inner chain,
    index codecs and location, write order; rarely behind an outer transpose)."""
    dtype = draw(st.sampled_from(DTYPES))
    fill_value = draw(st.sampled_from(fill_value_candidates(np.dtype(dtype))))
    shape, chunks = draw(shapes_and_chunks())
    write_empty_chunks = draw(st.booleans())
    common = {
        "zarr_format": zarr_format,
        "dtype": dtype,
        "shape": shape,
        "chunks": chunks,
        "fill_value": fill_value,
        "write_empty_chunks": write_empty_chunks,
    }
    ndim = len(shape)
    if zarr_format == 2:
        compressor = draw(v2_compressors())
        return ArraySpec(
            **common,
            compressors=(compressor,) if compressor is not None else (),
            order=draw(st.sampled_from("CF")),
        )
    if not sharded:
        transpose = draw(_transposes(ndim))
        return ArraySpec(
            **common,
            filters=(transpose,) if transpose is not None else (),
            serializer=draw(_serializers()),
            compressors=tuple(draw(v3_bytes_codecs())),
        )
    shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    inner_transpose = draw(_transposes(ndim))
    inner = [
        *([inner_transpose] if inner_transpose is not None else []),
        draw(_serializers()),
        *draw(v3_bytes_codecs()),
    ]
    index_codecs = [draw(_serializers())]
    if draw(st.booleans()):
        index_codecs.append(Crc32cCodec())
    # sharding behind an outer codec is a fallback path of its own; keep it rare
    outer = draw(st.sampled_from(["none"] * 6 + ["transpose", "compressor"]))
    filters: tuple[Any, ...] = ()
    compressors: tuple[Any, ...] = ()
    inner_chunks = chunks
    if outer == "transpose" and ndim > 0:
        filters = (TransposeCodec(order=tuple(reversed(range(ndim)))),)
        # The sharding codec sees the transposed shard, so its inner chunks
        # are given in that order; zarr checks them against the untransposed
        # shard, though, so when that check would fail keep the array-order
        # chunks (accepted by zarr, and they tile the transposed shard only
        # where the shapes happen to agree; see `known_bug` in the test).
        transposed = tuple(reversed(chunks))
        if all(s % c == 0 for s, c in zip(shards, transposed, strict=True)):
            inner_chunks = transposed
    elif outer == "compressor":
        compressors = (ZstdCodec(level=1),)
    sharding = ShardingCodec(
        chunk_shape=inner_chunks,
        codecs=inner,
        index_codecs=index_codecs,
        index_location=draw(st.sampled_from(["start", "end"])),
        subchunk_write_order=draw(
            st.sampled_from(["morton", "lexicographic", "colexicographic", "unordered"])
        ),
    )
    return ArraySpec(
        **common, shards=shards, filters=filters, serializer=sharding, compressors=compressors
    )


# -- selections ------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A selection of one kind; ``result_shape`` is the shape NumPy gives the
    equivalent selection (the shape of a value written through it)."""

    kind: str
    selection: Any
    result_shape: tuple[int, ...] = field(repr=False)


@st.composite
def selections(draw: st.DrawFn, spec: ArraySpec) -> Selection:
    """A basic, orthogonal, coordinate (vindex), block or mask selection of
    an array of ``spec``'s shape, from zarr's strategies where they exist."""
    shape = spec.shape
    probe = np.empty(shape, dtype=np.uint8)
    kinds = ["basic"]
    if shape:
        kinds += ["orthogonal", "mask"]
        if probe.size:
            kinds += ["coordinate", "block"]
    kind = draw(st.sampled_from(kinds))
    if kind == "basic":
        selection = draw(basic_indices(shape=shape))
        return Selection(kind, selection, probe[selection].shape)
    if kind == "orthogonal":
        selection, equivalent = draw(orthogonal_indices(shape=shape))
        return Selection(kind, selection, probe[equivalent].shape)
    if kind == "coordinate":
        selection = draw(
            npst.integer_array_indices(
                shape=shape, result_shape=npst.array_shapes(min_dims=1, max_dims=2, max_side=6)
            )
        )
        return Selection(kind, selection, probe[selection].shape)
    if kind == "block":
        selection, equivalent = draw(block_indices(chunk_sizes=spec.block_sizes()))
        return Selection(kind, selection, probe[equivalent].shape)
    mask = draw(npst.arrays(np.bool_, shape))
    return Selection(kind, mask, probe[mask].shape)


def read(array: Any, sel: Selection) -> Any:
    return getattr(array, f"get_{sel.kind}_selection")(sel.selection)


def write(array: Any, sel: Selection, value: Any) -> None:
    getattr(array, f"set_{sel.kind}_selection")(sel.selection, value)


# -- values written ----------------------------------------------------------------------

# random values; all the fill value (empty chunks); half and half; NaN
# payloads, -0.0, NaT and extremes; four distinct values (compressible)
VALUE_MODES = ("random", "fill", "mixed", "special", "repetitive")


def _specials(dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Values at the edges of ``dtype`` (NaN payloads, -0.0, NaT, extremes)."""
    native = dtype.newbyteorder("=")
    kind = dtype.kind
    if kind == "b":
        return np.array([False, True])
    if kind in "iu":
        info = np.iinfo(native)
        return np.array([info.min, info.max, 0, 1] + ([-1] if kind == "i" else []), dtype=native)
    if kind == "f":
        info = np.finfo(native)
        bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[native.itemsize]
        all_ones = np.array([np.iinfo(bits).max], dtype=bits).view(native)  # a NaN with payload
        return np.concatenate(
            [
                np.array(
                    [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, info.max, info.tiny], dtype=native
                ),
                all_ones,
            ]
        )
    if kind == "c":
        parts = [np.nan, np.inf, -np.inf, -0.0, 1.0]
        return np.array([complex(a, b) for a in parts for b in parts], dtype=native)
    if kind in "Mm":
        ints = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -1], dtype=np.int64)
        return ints.view(native)
    if kind == "S":
        return np.array([b"", b"\x00", b"\xff" * dtype.itemsize, b"z"], dtype=native)
    if kind == "U":
        return np.array(["", "\x00", "\U0001f600" * (dtype.itemsize // 4), "z"], dtype=native)
    raise AssertionError(dtype)  # pragma: no cover


def _random(rng: np.random.Generator, dtype: np.dtype[Any], n: int) -> np.ndarray[Any, Any]:
    native = dtype.newbyteorder("=")
    kind = dtype.kind
    if kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if kind in "iu":
        info = np.iinfo(native)
        return rng.integers(info.min, info.max, n, dtype=native, endpoint=True)
    if kind == "f":
        return (rng.standard_normal(n) * 100).astype(native)
    if kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(native)
    if kind in "Mm":
        return rng.integers(-(2**40), 2**40, n, dtype=np.int64).view(native)
    width = dtype.itemsize // (4 if kind == "U" else 1)
    if kind == "S":
        codes = rng.choice(np.frombuffer(b"ab\x00\xff", dtype=np.uint8), (n, width))
        return codes.view(f"S{width}").reshape(n)
    codes = rng.choice(np.array([0x61, 0xE9, 0x20AC, 0x1F600, 0], dtype=np.uint32), (n, width))
    return codes.view(f"=U{width}").reshape(n)


@dataclass(frozen=True)
class Value:
    """How to make the value of a write: a seeded draw of ``mode`` values (see
    `VALUE_MODES`) in the array's byte order or (``swapped``) the opposite one,
    written as ``form``: an array of the selection's shape, its first element
    (a NumPy scalar) or the array as nested Python lists."""

    seed: int
    mode: str
    form: str
    swapped: bool

    def make(self, dtype: np.dtype[Any], fill_value: Any, shape: tuple[int, ...]) -> Any:
        rng = np.random.default_rng(self.seed)
        n = max(math.prod(shape), 1)
        native = dtype.newbyteorder("=")
        fill = np.zeros(1, native) if fill_value is None else np.array([fill_value], native)
        if self.mode == "fill":
            flat = np.repeat(fill, n)
        elif self.mode == "special":
            flat = rng.choice(_specials(dtype), n)
        elif self.mode == "repetitive":  # compressible: four distinct values
            flat = rng.choice(_random(rng, dtype, 4), n)
        else:
            flat = _random(rng, dtype, n)
            if self.mode == "mixed":
                flat[rng.random(n) < 0.5] = fill[0]
        flat = in_byte_order(flat, dtype.newbyteorder() if self.swapped else dtype)
        if self.form == "scalar":
            return flat[0]
        array = flat[: math.prod(shape)].reshape(shape)
        return array.tolist() if self.form == "list" else array


def in_byte_order(array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """``array`` as ``dtype``, which differs from its dtype at most in byte
    order. By byteswap and view: NumPy's astype between byte orders of a
    generic-unit datetime64/timedelta64 copies the bytes unswapped."""
    if array.dtype == dtype:
        return array
    assert array.dtype.newbyteorder("=") == dtype.newbyteorder("="), (array.dtype, dtype)
    return array.byteswap().view(dtype)


def values() -> st.SearchStrategy[Value]:
    return st.builds(
        Value,
        seed=st.integers(0, 2**16),
        mode=st.sampled_from(VALUE_MODES),
        form=st.sampled_from(["array", "array", "scalar", "list"]),
        swapped=st.booleans(),
    )


# -- scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """Write ``value`` through ``write_at``, then compare everything and read
    ``read_at`` through every pipeline."""

    write_at: Selection
    value: Value
    read_at: Selection


@dataclass(frozen=True)
class Scenario:
    spec: ArraySpec
    steps: tuple[Step, ...]


@st.composite
def scenarios(
    draw: st.DrawFn, *, zarr_format: int, sharded: bool = False, max_steps: int = 3
) -> Scenario:
    spec = draw(array_specs(zarr_format=zarr_format, sharded=sharded))
    steps = draw(
        st.lists(
            st.builds(Step, write_at=selections(spec), value=values(), read_at=selections(spec)),
            min_size=1,
            max_size=max_steps,
        )
    )
    return Scenario(spec, tuple(steps))
