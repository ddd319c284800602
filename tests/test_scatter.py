"""The scatter kernels (`zarr_fused._scatter`) against their NumPy reference.

Each case runs the native kernel and `helpers.reference` on identical
inputs and compares the *whole buffer* the destination lives in byte for
byte, so NaN payloads, -0.0, the padding of strings and every element outside
the selection count. Destinations start out filled with a sentinel byte
(0xA5), so an element written by mistake cannot look untouched.

Byte-swapping copies are also checked against an independent oracle (reverse
the bytes of each swap unit), so a kernel and a reference that agreed on a
wrong answer would still fail.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarr_fused import _scatter as native

from helpers import reference
from helpers.gil import spins_during

SENTINEL = 0xA5


def _dtype_id(dtype: np.dtype) -> str:
    """``<f8`` -> ``f8-le``; ``|S5`` -> ``S5``: readable in a node id and ``-k``."""
    order = {"<": "-le", ">": "-be"}.get(dtype.str[0], "")
    return dtype.str[1:].replace("[", "").replace("]", "") + order


def _dtypes(*specs: str) -> list[Any]:
    return [pytest.param(np.dtype(s), id=_dtype_id(np.dtype(s))) for s in specs]


# Every dtype family the kernels copy, in both byte orders where there is one.
DTYPE_SPECS = (
    "?",
    "i1",
    "<u2",
    ">u2",
    "<i4",
    ">i4",
    "<i8",
    ">i8",
    "<f2",
    ">f2",
    "<f4",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    ">c8",
    "<c16",
    ">c16",
    "<M8[ns]",
    ">M8[ns]",
    "<m8[s]",
    ">m8[s]",
    "S5",
    "<U3",
    ">U3",
)
DTYPES = _dtypes(*DTYPE_SPECS)

# swap=True: every multi-byte numeric kind (long double and its complex too)
# and unicode, whose UCS4 code units swap one by one.
SWAP_SPECS = tuple(
    s for s in DTYPE_SPECS if np.dtype(s).kind in "iufcmMU" and np.dtype(s).itemsize > 1
) + ("g", "G")
SWAP_DTYPES = _dtypes(*SWAP_SPECS)

IMPLS = [pytest.param(native, id="native"), pytest.param(reference, id="reference")]


def _subset(params: list[Any], *ids: str) -> list[Any]:
    """The ``params`` with these ids, in the order given."""
    by_id = {p.id: p for p in params}
    return [by_id[i] for i in ids]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


# -- data ---------------------------------------------------------------------

# code points of every UTF-8 width: ASCII, Latin-1, BMP, astral
_TEXT = np.array([0x41, 0x7A, 0x30, 0xE9, 0x20AC, 0x1F600], dtype=np.uint32)
# NaN payloads (signalling and quiet, both signs) per float component size;
# the raw bits go in unchanged, so the copy must not canonicalise them
_PAYLOAD_NANS = {
    2: (0x7C05, 0xFE01),
    4: (0x7F800ABC, 0xFFC01234),
    8: (0x7FF0000000000ABC, 0xFFF8000000001234),
}


def random_values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A C-ordered writeable array of ``shape`` with varied bit patterns.

    Numbers are random bits (so every bit pattern is fair game) with NaN,
    -0.0, +-inf and NaN payloads planted first; strings are NUL-padded and of
    every length up to the width; booleans are 0 or 1.
    """
    count = math.prod(shape)
    if dtype.kind == "b":
        flat = rng.integers(0, 2, size=count).astype(dtype)
    elif dtype.kind in "SU":
        if dtype.kind == "S":
            width = dtype.itemsize
            units = rng.integers(1, 256, size=(count, width)).astype(np.uint8)
        else:
            width = dtype.itemsize // 4
            units = rng.choice(_TEXT, size=(count, width))
            units = units.astype(np.dtype(np.uint32).newbyteorder(dtype.byteorder))
        lengths = rng.integers(0, width + 1, size=(count, 1))
        units[np.arange(width) >= lengths] = 0
        flat = units.view(dtype).reshape(count)
    else:
        flat = np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).copy()
        if dtype.kind in "fc":
            if dtype.kind == "f":
                special: list[Any] = [np.nan, -0.0, np.inf, -np.inf]
            else:
                special = [complex(np.nan, -0.0), complex(-0.0, np.inf), complex(-np.inf, 1.5)]
            n = min(count, len(special))
            flat[:n] = special[:n]
            # then NaN payloads, as raw bits, right after those
            size = dtype.itemsize if dtype.kind == "f" else dtype.itemsize // 2
            if size in _PAYLOAD_NANS:
                parts = flat.view(np.dtype(f"u{size}").newbyteorder(dtype.byteorder))
                room = parts[n * dtype.itemsize // size :][: len(_PAYLOAD_NANS[size])]
                room[...] = _PAYLOAD_NANS[size][: len(room)]
    return flat.reshape(shape)


def make_source(
    dtype: np.dtype, shape: tuple[int, ...], layout: str, rng: np.random.Generator
) -> np.ndarray:
    """A source of ``shape`` laid out in memory as ``layout`` says.

    c: C-contiguous; transposed: Fortran order; strided: every other element
    of a bigger array, from an offset; reversed: negative strides on every
    axis; mixed: transposed, negative steps of 2 and an offset; broadcast:
    zero strides (one row repeated, read-only).
    """
    ndim = len(shape)
    if ndim == 0 or layout == "c":
        return random_values(dtype, shape, rng)
    if layout == "transposed":
        return random_values(dtype, shape[::-1], rng).T
    if layout == "strided":
        base = random_values(dtype, tuple(2 * s + 1 for s in shape), rng)
        return base[(slice(1, None, 2),) * ndim]
    if layout == "reversed":
        return random_values(dtype, shape, rng)[(slice(None, None, -1),) * ndim]
    if layout == "mixed":
        base = random_values(dtype, tuple(2 * s + 1 for s in reversed(shape)), rng)
        return base[(slice(-2, None, -2),) * ndim].T
    if layout == "broadcast":
        return np.broadcast_to(random_values(dtype, shape[-1:], rng), shape)
    raise AssertionError(layout)


def swap_unit(dtype: np.dtype) -> int:
    """Size of the byte groups that a change of byte order reverses."""
    if dtype.kind == "c":
        return dtype.itemsize // 2
    if dtype.kind == "U":
        return 4
    return dtype.itemsize


def byte_reversed(src: np.ndarray) -> bytes:
    """``src``'s C-ordered bytes with every swap unit reversed."""
    raw = np.frombuffer(src.tobytes(), dtype=np.uint8)
    return raw.reshape(-1, swap_unit(src.dtype))[:, ::-1].tobytes()


@dataclass(frozen=True)
class Into:
    """A destination: an ``out`` array and the selection of it to write.

    ``order`` is the memory order of ``out``; ``flipped`` makes ``out`` a
    negative-stride view (``base[::-1, ::-1, ...]``) of its buffer; ``layout``
    is the memory layout of the source copied there (see `make_source`).
    """

    out_shape: tuple[int, ...]
    selection: Any = None
    order: str = "C"
    flipped: bool = False
    layout: str = "c"


def select(array: np.ndarray, selection: Any) -> np.ndarray:
    """``array[selection]`` as a view, 0-d when every axis gets an integer."""
    if selection is None:
        return array
    if not isinstance(selection, tuple):
        selection = (selection,)
    if not any(s is Ellipsis for s in selection):
        selection = (*selection, Ellipsis)
    return array[selection]


def target_shape(into: Into) -> tuple[int, ...]:
    return select(np.empty(into.out_shape, dtype=np.uint8), into.selection).shape


def make_out(dtype: np.dtype, into: Into) -> tuple[np.ndarray, bytearray]:
    """``into``'s ``out`` filled with the sentinel byte, and the buffer under it."""
    buffer = bytearray(bytes([SENTINEL]) * (math.prod(into.out_shape) * dtype.itemsize))
    out = np.frombuffer(buffer, dtype=dtype).reshape(into.out_shape, order=into.order)
    if into.flipped:
        out = out[(slice(None, None, -1),) * out.ndim]
    return out, buffer


def selected_elements(into: Into) -> np.ndarray:
    """Per element of ``into``'s buffer (in buffer order): whether it is selected."""
    marks, buffer = make_out(np.dtype(np.uint8), into)
    select(marks, into.selection)[...] = 1
    return np.frombuffer(buffer, dtype=np.uint8) == 1


def assert_outside_untouched(buffer: bytearray, into: Into, itemsize: int) -> None:
    elements = np.frombuffer(buffer, dtype=np.uint8).reshape(-1, itemsize)
    outside = elements[~selected_elements(into)]
    assert (outside == SENTINEL).all(), "an element outside the selection was written"


# -- scatter: new output --------------------------------------------------------

SOURCES = [
    pytest.param((), "c", id="0d"),
    pytest.param((7,), "c", id="1d-c"),
    pytest.param((7,), "strided", id="1d-strided"),
    pytest.param((7,), "reversed", id="1d-reversed"),
    pytest.param((7,), "broadcast", id="1d-broadcast"),
    pytest.param((4, 5), "c", id="2d-c"),
    pytest.param((4, 5), "transposed", id="2d-transposed"),
    pytest.param((4, 5), "strided", id="2d-strided"),
    pytest.param((4, 5), "reversed", id="2d-reversed"),
    pytest.param((4, 5), "mixed", id="2d-mixed"),
    pytest.param((4, 5), "broadcast", id="2d-broadcast"),
    pytest.param((3, 4, 5), "c", id="3d-c"),
    pytest.param((3, 4, 5), "transposed", id="3d-transposed"),
    pytest.param((3, 4, 5), "strided", id="3d-strided"),
    pytest.param((3, 4, 5), "reversed", id="3d-reversed"),
    pytest.param((3, 4, 5), "mixed", id="3d-mixed"),
    pytest.param((2, 3, 1, 4), "c", id="4d-c"),
    pytest.param((2, 3, 1, 4), "mixed", id="4d-mixed"),
    pytest.param((1, 5, 1), "strided", id="unit-axes-strided"),
    pytest.param((0,), "c", id="len0-1d"),
    pytest.param((3, 0, 4), "c", id="len0-3d-c"),
    pytest.param((3, 0, 4), "transposed", id="len0-3d-transposed"),
    pytest.param((3, 0, 4), "strided", id="len0-3d-strided"),
]


@pytest.mark.parametrize(("shape", "layout"), SOURCES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_new_output(
    dtype: np.dtype, shape: tuple[int, ...], layout: str, rng: np.random.Generator
) -> None:
    src = make_source(dtype, shape, layout, rng)
    got = native.scatter(src)
    want = reference.scatter(src)
    assert type(got) is np.ndarray
    assert got.dtype == dtype
    assert got.shape == shape
    assert got.flags.c_contiguous
    assert got.flags.writeable
    assert not np.may_share_memory(got, src)
    assert got.tobytes() == want.tobytes() == src.tobytes()


# swapping shares the copy's loops; these cover each way through them
SWAP_SOURCES = _subset(
    SOURCES,
    "0d",
    "1d-reversed",
    "1d-broadcast",
    "2d-c",
    "2d-transposed",
    "3d-strided",
    "3d-mixed",
    "4d-mixed",
    "unit-axes-strided",
    "len0-3d-transposed",
)


@pytest.mark.parametrize(("shape", "layout"), SWAP_SOURCES)
@pytest.mark.parametrize("dtype", SWAP_DTYPES)
def test_scatter_swap_new_output(
    dtype: np.dtype, shape: tuple[int, ...], layout: str, rng: np.random.Generator
) -> None:
    src = make_source(dtype, shape, layout, rng)
    got = native.scatter(src, swap=True)
    want = reference.scatter(src, swap=True)
    assert got.dtype == dtype.newbyteorder()
    assert got.dtype.byteorder != dtype.byteorder
    assert got.shape == shape
    assert got.flags.c_contiguous
    assert got.tobytes() == want.tobytes() == byte_reversed(src)


@pytest.mark.parametrize(
    ("spec", "component"),
    [pytest.param("<c8", "f4", id="c8-le"), pytest.param(">c16", "f8", id="c16-be")],
)
def test_scatter_swap_complex_swaps_each_component(spec: str, component: str) -> None:
    # the real and imaginary parts are swapped in place, never exchanged
    src = np.array([complex(1.5, -2.25), complex(-0.0, 3.0)], dtype=spec)
    got = native.scatter(src, swap=True)
    flipped = np.dtype(spec).newbyteorder()
    part = np.dtype(component).newbyteorder(flipped.byteorder)
    assert got.tobytes() == np.array([1.5, -2.25, -0.0, 3.0], dtype=part).tobytes()
    assert got.dtype == flipped
    assert got.tolist() == src.tolist()


# -- scatter: into a preallocated output ----------------------------------------

INTO = [
    pytest.param(Into((4, 5)), id="exact-2d"),
    pytest.param(Into(()), id="exact-0d"),
    pytest.param(Into((3, 4, 5), order="F", layout="transposed"), id="exact-3d-fortran"),
    pytest.param(Into((3, 4, 5), order="F", layout="c"), id="exact-3d-c-into-fortran"),
    pytest.param(Into((3, 0, 2)), id="exact-len0"),
    pytest.param(Into((12,), slice(2, 9), layout="reversed"), id="slice-1d"),
    pytest.param(Into((20,), (slice(1, None, 3),), layout="strided"), id="step-1d"),
    pytest.param(
        Into((9, 12), (slice(1, 8, 2), slice(None, None, 3)), layout="mixed"), id="step-2d"
    ),
    pytest.param(
        Into((5, 6, 7), (slice(None, None, 2), slice(1, 5), slice(0, 7, 3)), layout="transposed"),
        id="step-3d",
    ),
    pytest.param(
        Into((2, 6, 4), (slice(None), slice(0, 6, 2), slice(None)), layout="strided"),
        id="gaps-between-rows",
    ),
    pytest.param(
        Into((6, 7), (slice(None, None, -2), slice(5, 0, -1)), layout="c"), id="negative-step-2d"
    ),
    pytest.param(Into((4, 5, 6), (2,), layout="strided"), id="int-drops-first"),
    pytest.param(
        Into((4, 5, 6), (slice(1, 3), np.int64(3)), layout="reversed"), id="int-drops-middle"
    ),
    pytest.param(Into((4, 5, 6), (1, slice(None), -1), layout="broadcast"), id="ints-drop-two"),
    pytest.param(Into((3, 4), (1, 2)), id="ints-to-0d"),
    pytest.param(Into((3, 4), (np.int32(-1), 0, Ellipsis)), id="ints-ellipsis-to-0d"),
    pytest.param(Into((3, 4, 5), (Ellipsis, slice(1, 4)), layout="mixed"), id="ellipsis-first"),
    pytest.param(
        Into((3, 4, 5), (1, Ellipsis, slice(None, None, 2)), layout="strided"),
        id="ellipsis-middle",
    ),
    pytest.param(Into((3, 4), (Ellipsis,), layout="transposed"), id="ellipsis-only"),
    pytest.param(Into((5, 6), (slice(2, 2), slice(None))), id="empty-slice"),
    pytest.param(
        Into((8, 9), (slice(1, 7, 2), slice(2, 8)), flipped=True, layout="strided"),
        id="flipped-out",
    ),
    pytest.param(
        Into((6, 7), (slice(1, 5), slice(None, None, 2)), order="F", layout="reversed"),
        id="fortran-out-step",
    ),
]


@pytest.mark.parametrize("into", INTO)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_into(dtype: np.dtype, into: Into, rng: np.random.Generator) -> None:
    src = make_source(dtype, target_shape(into), into.layout, rng)
    out, buffer = make_out(dtype, into)
    expected_out, expected = make_out(dtype, into)
    assert native.scatter(src, out, into.selection) is out
    assert reference.scatter(src, expected_out, into.selection) is expected_out
    assert bytes(buffer) == bytes(expected)
    assert select(out, into.selection).tobytes() == src.tobytes()
    assert_outside_untouched(buffer, into, dtype.itemsize)


# Blocks shaped like inner chunks inside large arrays: short rows far apart,
# more than a few of them, which is where the kernels prefetch rows ahead.
CHUNK_INTO = [
    pytest.param((slice(8, 24), slice(3, 19), slice(40, 56)), "c", id="chunk-in-cube"),
    pytest.param((slice(0, 40), slice(60, 64), slice(0, 96, 3)), "c", id="strided-rows"),
    pytest.param((slice(39, None, -1), slice(5, 13), slice(90, 96)), "c", id="planes-backwards"),
    pytest.param((slice(8, 24), slice(3, 19), slice(40, 56)), "transposed", id="strided-source"),
    pytest.param((5, slice(0, 64), slice(10, 20)), "c", id="one-plane"),
]


@pytest.mark.parametrize(("selection", "source"), CHUNK_INTO)
@pytest.mark.parametrize(
    ("spec", "swap"),
    [("<u2", False), ("<u2", True), (">f8", False), (">f8", True), ("|u1", False)],
    ids=["u2", "u2-swap", "f8be", "f8be-swap", "u1"],
)
def test_scatter_chunk_into_large_array(
    spec: str, swap: bool, selection: Any, source: str, rng: np.random.Generator
) -> None:
    dtype = np.dtype(spec)
    out = np.zeros((40, 64, 96), dtype=dtype.newbyteorder() if swap else dtype)
    target = out[selection].shape
    values = rng.integers(0, 200, size=target[::-1] if source == "transposed" else target)
    src = values.astype(dtype)
    if source == "transposed":
        src = src.T  # the same shape as the target, strided
    expected = out.copy()
    expected[selection] = src
    assert native.scatter(src, out, selection, swap=swap) is out
    assert np.array_equal(out, expected)


@pytest.mark.parametrize(("selection", "source"), CHUNK_INTO)
def test_fill_chunk_into_large_array(selection: Any, source: str) -> None:
    out = np.zeros((40, 64, 96), dtype="<u2")
    expected = out.copy()
    expected[selection] = 7
    native.fill(out, 7, selection)
    assert np.array_equal(out, expected)


SWAP_INTO = _subset(
    INTO,
    "exact-0d",
    "exact-3d-c-into-fortran",
    "step-2d",
    "gaps-between-rows",
    "negative-step-2d",
    "ints-drop-two",
    "ellipsis-middle",
    "empty-slice",
    "flipped-out",
)


@pytest.mark.parametrize("into", SWAP_INTO)
@pytest.mark.parametrize("dtype", SWAP_DTYPES)
def test_scatter_swap_into(dtype: np.dtype, into: Into, rng: np.random.Generator) -> None:
    src = make_source(dtype, target_shape(into), into.layout, rng)
    out, buffer = make_out(dtype.newbyteorder(), into)
    expected_out, expected = make_out(dtype.newbyteorder(), into)
    assert native.scatter(src, out, into.selection, swap=True) is out
    reference.scatter(src, expected_out, into.selection, swap=True)
    assert bytes(buffer) == bytes(expected)
    assert select(out, into.selection).tobytes() == byte_reversed(src)
    assert_outside_untouched(buffer, into, dtype.itemsize)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("S5", id="S5"),
        pytest.param("V8", id="V8"),
        pytest.param("?", id="b1"),
        pytest.param("i1", id="i1"),
    ],
)
def test_scatter_swap_without_byte_order_is_a_copy(spec: str, rng: np.random.Generator) -> None:
    # one-byte and byte-string types have no byte order: "the opposite order"
    # is the same dtype and a swapping copy is a plain copy
    dtype = np.dtype(spec)
    if dtype.kind == "V":
        src = make_source(np.dtype("<u8"), (3, 4), "mixed", rng).view(dtype)
    else:
        src = make_source(dtype, (3, 4), "mixed", rng)
    assert dtype.newbyteorder() == dtype
    got = native.scatter(src, swap=True)
    assert got.tobytes() == reference.scatter(src, swap=True).tobytes() == src.tobytes()


@pytest.mark.parametrize(
    "impl", [pytest.param(native, id="native"), pytest.param(reference, id="reference")]
)
def test_scatter_swap_structured_raises(impl: Any) -> None:
    # per-field byte swapping is not implemented: refuse rather than reverse whole records
    dtype = np.dtype([("a", "<i4"), ("b", "<f8")])
    src = np.array([(1, 2.0), (-3, 0.5)], dtype=dtype)
    with pytest.raises(TypeError, match="structured"):
        impl.scatter(src, swap=True)


@pytest.mark.parametrize("swap", [pytest.param(False, id="copy"), pytest.param(True, id="swap")])
def test_scatter_64_dimensions(swap: bool, rng: np.random.Generator) -> None:
    # numpy's limit; unit axes coalesce away but the loops still see 64 axes
    shape = (1,) * 59 + (2, 3, 1, 2, 2)
    into = Into(shape, order="F")
    src = make_source(np.dtype("<i4"), shape, "reversed", rng)
    dtype = src.dtype.newbyteorder() if swap else src.dtype
    out, buffer = make_out(dtype, into)
    expected_out, expected = make_out(dtype, into)
    native.scatter(src, out, swap=swap)
    reference.scatter(src, expected_out, swap=swap)
    assert bytes(buffer) == bytes(expected)


# -- scatter: errors -------------------------------------------------------------
# Both implementations follow the same contract, and a rejected call leaves
# ``out`` as it was.


@pytest.mark.parametrize(
    ("src_shape", "out_shape", "selection"),
    [
        pytest.param((4,), (3,), None, id="out-too-small"),
        pytest.param((4,), (5,), None, id="out-too-large-without-selection"),
        pytest.param((3, 4), (4, 3), None, id="out-transposed-shape"),
        pytest.param((4,), (4, 1), None, id="out-extra-axis"),
        pytest.param((), (3,), None, id="0d-into-1d"),
        pytest.param((3,), (10,), (slice(0, 4),), id="selection-too-large"),
        pytest.param((3,), (10,), (slice(0, 10, 3),), id="step-selection-too-large"),
        pytest.param((2, 3), (4, 5), (1,), id="int-selection-wrong-shape"),
        pytest.param((0,), (4,), (slice(1, 3),), id="empty-into-nonempty"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_shape_mismatch(
    impl: ModuleType, src_shape: tuple[int, ...], out_shape: tuple[int, ...], selection: Any
) -> None:
    src = np.ones(src_shape)
    out, buffer = make_out(src.dtype, Into(out_shape))
    with pytest.raises(ValueError, match="does not match source shape"):
        impl.scatter(src, out, selection)
    assert set(buffer) <= {SENTINEL}


@pytest.mark.parametrize(
    ("src_spec", "out_spec", "swap"),
    [
        pytest.param("<f8", "<f4", False, id="narrower-float"),
        pytest.param("<i4", "<u4", False, id="signedness"),
        pytest.param("<i8", "<M8[ns]", False, id="same-size-other-kind"),
        pytest.param("<i4", ">i4", False, id="byte-order-without-swap"),
        pytest.param("<i4", "<i4", True, id="swap-into-same-order-int"),
        pytest.param(">f8", ">f8", True, id="swap-into-same-order-float"),
        pytest.param("<c8", "<c8", True, id="swap-into-same-order-complex"),
        pytest.param("<U3", "<U3", True, id="swap-into-same-order-unicode"),
        pytest.param("<f8", ">f4", True, id="swap-into-other-size"),
        pytest.param("<M8[ns]", "<M8[s]", False, id="datetime-unit"),
        pytest.param("S5", "S6", False, id="bytes-width"),
        pytest.param("<U3", "<U4", False, id="unicode-width"),
        pytest.param("<f8", "O", False, id="object-out"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_dtype_mismatch(
    impl: ModuleType, src_spec: str, out_spec: str, swap: bool
) -> None:
    src = np.zeros((2, 3), dtype=src_spec)
    out = np.zeros((2, 3), dtype=out_spec)
    before = out.copy()
    with pytest.raises(TypeError, match="destination dtype"):
        impl.scatter(src, out, swap=swap)
    assert out.tolist() == before.tolist()


@pytest.mark.parametrize("with_out", [pytest.param(False, id="new"), pytest.param(True, id="out")])
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_object_arrays(impl: ModuleType, with_out: bool) -> None:
    src = np.array([1, None, "x"], dtype=object)
    out = np.empty(3, dtype=object) if with_out else None
    with pytest.raises(TypeError, match="object arrays"):
        impl.scatter(src, out)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _read_only(np.zeros((2, 3))), id="flag-cleared"),
        pytest.param(lambda: np.broadcast_to(np.zeros(3), (2, 3)), id="broadcast-view"),
        pytest.param(lambda: np.frombuffer(bytes(48), dtype=np.float64).reshape(2, 3), id="bytes"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_read_only_out(impl: ModuleType, make: Callable[[], np.ndarray]) -> None:
    out = make()
    with pytest.raises(ValueError, match="read-only"):
        impl.scatter(np.ones((2, 3)), out)
    assert not out.any()


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@pytest.mark.parametrize(
    ("make", "swap"),
    [
        pytest.param(lambda a: (a, a, None), False, id="same-array"),
        pytest.param(lambda a: (a[::-1], a, None), False, id="reversed-self"),
        pytest.param(lambda a: (a[:5], a, slice(3, 8)), False, id="shifted-window"),
        pytest.param(lambda a: (a[2:4], a[3:], slice(0, 2)), False, id="view-into-view"),
        pytest.param(lambda a: (a, a.view(a.dtype.newbyteorder()), None), True, id="in-place-swap"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_overlap(
    impl: ModuleType, make: Callable[[np.ndarray], tuple[Any, Any, Any]], swap: bool
) -> None:
    base = np.arange(10, dtype="<i4")
    src, out, selection = make(base)
    with pytest.raises(ValueError, match="overlap"):
        impl.scatter(src, out, selection, swap=swap)
    assert base.tolist() == list(range(10))


ADVANCED_SELECTIONS = [
    pytest.param(np.array([0, 2]), id="int-array"),
    pytest.param([0, 2], id="list"),
    pytest.param(np.array([True, False, True, False]), id="bool-mask"),
    pytest.param((slice(None), np.array([1])), id="array-in-tuple"),
    pytest.param(True, id="python-true"),
    pytest.param((False,), id="python-false"),
    pytest.param(np.True_, id="numpy-true"),
    pytest.param((None,), id="newaxis"),
    pytest.param((Ellipsis, None), id="newaxis-after-ellipsis"),
    pytest.param((1.0,), id="float"),
    pytest.param(("a",), id="string"),
]


@pytest.mark.parametrize("selection", ADVANCED_SELECTIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_advanced_selection(impl: ModuleType, selection: Any) -> None:
    out = np.zeros((4, 3))
    with pytest.raises(TypeError, match="basic selections"):
        impl.scatter(np.ones((2, 3)), out, selection)
    assert not out.any()


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_selection_needs_out(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="selection needs an out array"):
        impl.scatter(np.ones(3), None, (slice(None),))


@pytest.mark.parametrize(
    ("src", "out", "match"),
    [
        pytest.param([1.0, 2.0], None, "src must be", id="list-src"),
        pytest.param(1.0, None, "src must be", id="scalar-src"),
        pytest.param(np.float64(1.0), None, "src must be", id="numpy-scalar-src"),
        pytest.param(np.ones(2), [0.0, 0.0], "out must be", id="list-out"),
        pytest.param(np.ones(2), memoryview(bytearray(16)), "out must be", id="memoryview-out"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_rejects_non_arrays(impl: ModuleType, src: Any, out: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        impl.scatter(src, out)


# -- fill ------------------------------------------------------------------------

# A zero and a non-zero, asymmetric value per dtype: the kernel has a memset
# path for all-zero patterns and one for single bytes.
FILL_VALUES: dict[str, dict[str, Any]] = {
    "b1": {"zero": False, "pattern": True},
    "i1": {"zero": 0, "pattern": -7},
    "u2": {"zero": 0, "pattern": 0xABCD},
    "i4": {"zero": 0, "pattern": -123456789},
    "i8": {"zero": 0, "pattern": -(2**40) - 3},
    "f2": {"zero": 0.0, "pattern": -1.5},
    "f4": {"zero": 0.0, "pattern": 3.25},
    "f8": {"zero": 0.0, "pattern": -0.1},
    "c8": {"zero": 0j, "pattern": 1.5 - 2.25j},
    "c16": {"zero": 0j, "pattern": -0.1 + 3j},
    "M8[ns]": {"zero": np.datetime64(0, "ns"), "pattern": np.datetime64("2021-03-04T05:06:07.1")},
    "m8[s]": {"zero": np.timedelta64(0, "s"), "pattern": np.timedelta64(-12345, "s")},
    "S5": {"zero": b"", "pattern": b"ab\x00d"},
    "U3": {"zero": "", "pattern": "é€😀"},
}

FILL_INTO = [
    pytest.param(Into((37,)), id="whole-1d-odd"),
    pytest.param(Into((1000,)), id="whole-1d-long"),
    pytest.param(Into((4, 5)), id="whole-2d"),
    pytest.param(Into(()), id="whole-0d"),
    pytest.param(Into((3, 0)), id="whole-len0"),
    pytest.param(Into((3, 4, 5), order="F"), id="fortran-3d"),
    pytest.param(Into((9, 12), (slice(1, 8, 2), slice(None, None, 3))), id="step-2d"),
    pytest.param(Into((2, 6, 4), (slice(None), slice(0, 6, 2))), id="gaps-between-rows"),
    pytest.param(Into((6, 7), (slice(None, None, -1), slice(5, 0, -2))), id="negative-step"),
    pytest.param(Into((4, 5, 6), (slice(1, 3), 3)), id="int-drops-axis"),
    pytest.param(Into((3, 4), (1, 2)), id="ints-to-0d"),
    pytest.param(Into((3, 4, 5), (Ellipsis, 1)), id="ellipsis"),
    pytest.param(Into((5, 6), (slice(2, 2),)), id="empty-slice"),
    pytest.param(Into((8, 9), (slice(2, 6),), flipped=True), id="flipped-out"),
]


# every geometry with a non-zero pattern; the all-zero pattern (a memset
# whatever the dtype) on the geometries that take each of its branches
FILL_CASES = [
    *(pytest.param(p.values[0], "pattern", id=f"{p.id}-pattern") for p in FILL_INTO),
    *(
        pytest.param(p.values[0], "zero", id=f"{p.id}-zero")
        for p in _subset(
            FILL_INTO, "whole-1d-odd", "whole-0d", "gaps-between-rows", "negative-step"
        )
    ),
]


@pytest.mark.parametrize(("into", "kind"), FILL_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fill(dtype: np.dtype, into: Into, kind: str) -> None:
    value = FILL_VALUES[dtype.str[1:]][kind]
    out, buffer = make_out(dtype, into)
    expected_out, expected = make_out(dtype, into)
    assert native.fill(out, value, into.selection) is out
    assert reference.fill(expected_out, value, into.selection) is expected_out
    assert bytes(buffer) == bytes(expected)
    element = np.array(value, dtype=dtype).tobytes()
    assert select(out, into.selection).tobytes() == element * select(out, into.selection).size
    assert_outside_untouched(buffer, into, dtype.itemsize)


def _fill_outcome(
    impl: ModuleType, out: np.ndarray, value: Any, selection: Any
) -> tuple[type[BaseException] | None, list[type[Warning]]]:
    """The exception type ``impl.fill`` raised (None if none) and its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            impl.fill(out, value, selection)
        except Exception as exc:  # compared with the other implementation's
            raised: type[BaseException] | None = type(exc)
        else:
            raised = None
    return raised, [w.category for w in caught]


def _value_param(spec: str, value: Any, name: str) -> Any:
    return pytest.param(np.dtype(spec), value, id=f"{_dtype_id(np.dtype(spec))}-{name}")


FILL_SPECIAL_VALUES = [
    *(
        _value_param(spec, value, name)
        for spec in ("<f2", ">f4", "<f8", ">f8", "<c8", ">c16")
        for value, name in ((np.nan, "nan"), (-0.0, "neg0"), (np.inf, "inf"), (-np.inf, "-inf"))
    ),
    _value_param("<c8", complex(np.nan, -0.0), "nan-neg0j"),
    _value_param(">c16", complex(-0.0, np.inf), "neg0-infj"),
    _value_param("<f2", 3, "python-int"),
    _value_param("<f2", 65504, "max"),
    _value_param("<f2", 70000, "overflow-int"),
    _value_param(">f2", 2**70, "huge-int"),
    _value_param("<f2", np.float64(1e-8), "subnormal"),
    _value_param("<f4", np.float64(1e300), "overflow-float64"),
    _value_param("u1", 255, "max"),
    _value_param("u1", 300, "python-int-300"),
    _value_param("u1", -1, "python-int-neg"),
    _value_param("u1", np.float64(300.0), "float64-300"),
    _value_param("u1", np.int64(300), "int64-300"),
    _value_param("u1", 2.9, "python-float"),
    _value_param("<i8", np.nan, "nan"),
    _value_param("<i8", 2**63, "overflow"),
    _value_param(">i8", -(2**63), "min"),
    _value_param("<i4", "7", "string"),
    _value_param("<i4", 1.7, "python-float"),
    _value_param("<u2", np.uint64(2**63), "uint64-wraps"),
    _value_param("<f4", 1j, "complex"),
    _value_param("<f4", np.complex128(1 + 1j), "numpy-complex"),
    _value_param("<f8", None, "none"),
    _value_param("<f8", "inf", "string-inf"),
    _value_param("<f8", 2**1030, "int-too-large"),
    _value_param("<f8", np.float16(-0.0), "float16-neg0"),
    _value_param("?", 2, "int-2"),
    _value_param("?", 0.0, "float-0"),
    _value_param("?", np.nan, "nan"),
    _value_param("<M8[ns]", "2020-01-01", "string"),
    _value_param(">M8[ns]", "NaT", "string-nat"),
    _value_param("<M8[ns]", np.datetime64("2020-01-01", "D"), "days"),
    _value_param("<M8[ns]", np.datetime64("NaT", "ns"), "nat"),
    _value_param("<M8[ns]", "not a date", "bad-string"),
    _value_param("<m8[s]", np.timedelta64(3, "m"), "minutes"),
    _value_param(">m8[s]", np.timedelta64(1500, "ms"), "milliseconds"),
    _value_param("<m8[s]", 5, "int"),
    _value_param("<m8[s]", "NaT", "string-nat"),
    _value_param("S5", b"hello world", "truncated"),
    _value_param("S5", "abc", "str"),
    _value_param("S5", "héllo", "non-ascii"),
    _value_param("S5", 12, "int"),
    _value_param("<U3", "abcdef", "truncated"),
    _value_param(">U3", "é€😀", "wide"),
    _value_param("<U3", b"ab", "bytes"),
    _value_param("<U3", 7, "int"),
]


@pytest.mark.parametrize(
    "into",
    [
        pytest.param(Into((6, 7), (slice(None, None, 2), slice(1, 6, 2))), id="strided"),
        pytest.param(Into((5,), order="C", flipped=True), id="flipped"),
        pytest.param(Into(()), id="0d"),
        pytest.param(Into((4, 0)), id="len0"),
    ],
)
@pytest.mark.parametrize(("dtype", "value"), FILL_SPECIAL_VALUES)
def test_fill_value_like_numpy_assignment(dtype: np.dtype, value: Any, into: Into) -> None:
    # the value is converted exactly as ``out[selection] = value`` would: same
    # bytes, same exception (or none), same warnings
    out, buffer = make_out(dtype, into)
    expected_out, expected = make_out(dtype, into)
    got = _fill_outcome(native, out, value, into.selection)
    want = _fill_outcome(reference, expected_out, value, into.selection)
    assert got == want
    assert bytes(buffer) == bytes(expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_rejects_read_only(impl: ModuleType) -> None:
    out = _read_only(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="read-only"):
        impl.fill(out, 1.0)
    assert not out.any()


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_rejects_object_arrays(impl: ModuleType) -> None:
    out = np.full(3, None, dtype=object)
    with pytest.raises(TypeError, match="object arrays"):
        impl.fill(out, 1)
    assert out.tolist() == [None, None, None]


@pytest.mark.parametrize("selection", ADVANCED_SELECTIONS)
@pytest.mark.parametrize("impl", IMPLS)
def test_fill_rejects_advanced_selection(impl: ModuleType, selection: Any) -> None:
    out = np.zeros((4, 3))
    with pytest.raises(TypeError, match="basic selections"):
        impl.fill(out, 1.0, selection)
    assert not out.any()


@pytest.mark.parametrize(
    "out",
    [
        pytest.param([0.0, 0.0], id="list"),
        pytest.param(memoryview(bytearray(16)), id="memoryview"),
        pytest.param(np.float64(0.0), id="numpy-scalar"),
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_fill_rejects_non_arrays(impl: ModuleType, out: Any) -> None:
    with pytest.raises(TypeError, match="out must be"):
        impl.fill(out, 1.0)


@pytest.mark.parametrize(
    "spec",
    [pytest.param("<i4", id="i4"), pytest.param("S5", id="S5"), pytest.param(">U3", id="U3")],
)
def test_fill_64_dimensions(spec: str) -> None:
    into = Into((1,) * 59 + (2, 3, 1, 2, 2), selection=(Ellipsis, slice(None, None, -1)), order="F")
    dtype = np.dtype(spec)
    value = FILL_VALUES[dtype.str[1:]]["pattern"]
    out, buffer = make_out(dtype, into)
    expected_out, expected = make_out(dtype, into)
    native.fill(out, value, into.selection)
    reference.fill(expected_out, value, into.selection)
    assert bytes(buffer) == bytes(expected)


# -- property tests ----------------------------------------------------------------

PROPERTY_DTYPES = tuple(np.dtype(s) for s in DTYPE_SPECS)


@st.composite
def basic_selections(draw: st.DrawFn, shape: tuple[int, ...]) -> Any:
    """None, or a basic selection of ``shape``: per axis an integer (either
    sign, sometimes a numpy integer) or a slice with a positive step, with
    maybe an Ellipsis standing in for a run of axes."""
    if draw(st.integers(0, 9)) == 0:
        return None
    parts: list[Any] = []
    for side in shape:
        if side > 0 and draw(st.booleans()):
            index = draw(st.integers(-side, side - 1))
            parts.append(np.int64(index) if draw(st.booleans()) else index)
        else:
            bound = st.none() | st.integers(-side - 1, side + 1)
            step = st.none() | st.integers(1, 3)
            parts.append(slice(draw(bound), draw(bound), draw(step)))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(parts)))
        stop = draw(st.integers(start, len(parts)))
        parts[start:stop] = [Ellipsis]
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return tuple(parts)


@dataclass(frozen=True)
class StridedSource:
    """How to lay out a source: per logical axis a step and a direction, and
    the order in which the axes lie in memory (``perm[0]`` outermost)."""

    steps: tuple[int, ...]
    flips: tuple[bool, ...]
    perm: tuple[int, ...]
    seed: int

    def build(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if not shape:
            return random_values(dtype, shape, rng)
        # one spare element per axis, so a forward view starts at an offset
        # and a reversed one ends before the last element
        sides = [n * k + 1 for n, k in zip(shape, self.steps, strict=True)]
        base = random_values(dtype, tuple(sides[p] for p in self.perm), rng)
        base = base.transpose(np.argsort(self.perm))
        return base[
            tuple(
                slice(-2, None, -k) if flip else slice(1, None, k)
                for k, flip in zip(self.steps, self.flips, strict=True)
            )
        ]


@st.composite
def strided_sources(draw: st.DrawFn, ndim: int) -> StridedSource:
    return StridedSource(
        steps=tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))),
        flips=tuple(draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))),
        perm=tuple(draw(st.permutations(range(ndim)))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def destinations(draw: st.DrawFn) -> Into:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    return Into(
        out_shape=shape,
        selection=draw(basic_selections(shape)),
        order=draw(st.sampled_from("CF")),
    )


@dataclass(frozen=True)
class ScatterCase:
    dtype: np.dtype
    into: Into
    source: StridedSource
    swap: bool


@st.composite
def scatter_cases(draw: st.DrawFn) -> ScatterCase:
    dtype = draw(st.sampled_from(PROPERTY_DTYPES))
    into = draw(destinations())
    swappable = dtype.kind in "iufcmMU" and dtype.itemsize > 1
    return ScatterCase(
        dtype=dtype,
        into=into,
        source=draw(strided_sources(len(target_shape(into)))),
        swap=swappable and draw(st.booleans()),
    )


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def check_scatter(case: ScatterCase) -> None:
    """The native scatter of ``case`` writes the bytes the reference does,
    and nothing outside the selection."""
    src = case.source.build(case.dtype, target_shape(case.into))
    dtype = case.dtype.newbyteorder() if case.swap else case.dtype
    out, buffer = make_out(dtype, case.into)
    expected_out, expected = make_out(dtype, case.into)
    native.scatter(src, out, case.into.selection, swap=case.swap)
    reference.scatter(src, expected_out, case.into.selection, swap=case.swap)
    assert bytes(buffer) == bytes(expected)
    assert_outside_untouched(buffer, case.into, dtype.itemsize)


@PROPERTY_SETTINGS
@given(case=scatter_cases())
def test_scatter_property(case: ScatterCase) -> None:
    check_scatter(case)


@dataclass(frozen=True)
class FillCase:
    dtype: np.dtype
    into: Into
    value: Any


@st.composite
def fill_cases(draw: st.DrawFn) -> FillCase:
    dtype = draw(st.sampled_from(PROPERTY_DTYPES))
    values = list(FILL_VALUES[dtype.str[1:]].values())
    if dtype.kind in "fc":
        values += [np.nan, -0.0, np.inf, -np.inf]
    return FillCase(dtype=dtype, into=draw(destinations()), value=draw(st.sampled_from(values)))


@PROPERTY_SETTINGS
@given(case=fill_cases())
def test_fill_property(case: FillCase) -> None:
    out, buffer = make_out(case.dtype, case.into)
    expected_out, expected = make_out(case.dtype, case.into)
    native.fill(out, case.value, case.into.selection)
    reference.fill(expected_out, case.value, case.into.selection)
    assert bytes(buffer) == bytes(expected)
    assert_outside_untouched(buffer, case.into, case.dtype.itemsize)


# -- transposing copies ----------------------------------------------------------------
# A source that steps far along the destination's dense rows (an F-order
# chunk into a C-order output, or the reverse) is copied in tiles of 64
# bytes square; the kernel also walks the axes by the destination's strides.
# These cases are large enough for whole and partial tiles, and the property
# test draws such copies (blocks inside a larger output, either order, any
# axis order of the source, steps, flips, swaps) against the reference.

TRANSPOSING = [
    pytest.param((64, 64), "<f4", "F", "C", id="64x64-f4-F-into-C-rows"),
    pytest.param((64, 64), "<f4", "C", "F", id="64x64-f4-C-into-F-rows"),
    pytest.param((67, 33), "i1", "F", "C", id="i1-rows"),
    pytest.param((400, 130), "i1", "F", "C", id="partial-tiles-i1"),
    pytest.param((17, 1030), ">u2", "F", "C", id="partial-tiles-u2-be"),
    pytest.param((5, 200, 120), "<f8", "F", "C", id="3d-tiles-f8"),
    pytest.param((200, 40, 5), "<c16", "F", "C", id="3d-tiles-c16"),
    pytest.param((90, 400), "<U8", "F", "C", id="U8-rows"),
    pytest.param((256, 256), "<f4", "F", "C", id="256x256-f4-tiles"),
    pytest.param((256, 256), "<f4", "C", "F", id="256x256-f4-C-into-F-tiles"),
    # whole tiles of each item size with a register transpose, and edges
    pytest.param((128, 256), "<f8", "F", "C", id="128x256-f8-tiles"),
    pytest.param((131, 261), "<i8", "F", "C", id="partial-tiles-i8"),
    pytest.param((300, 140), "<u2", "F", "C", id="partial-tiles-u2"),
    pytest.param((256, 160), "<i2", "C", "F", id="256x160-i2-C-into-F-tiles"),
    pytest.param((70, 520), "<f4", "F", "C", id="partial-tiles-f4"),
    pytest.param((4, 96, 520), "<f4", "F", "C", id="3d-tiles-f4"),
]


@pytest.mark.parametrize("swap", [pytest.param(False, id="copy"), pytest.param(True, id="swap")])
@pytest.mark.parametrize(("shape", "dtype", "src_order", "out_order"), TRANSPOSING)
def test_scatter_transposing(
    shape: tuple[int, ...],
    dtype: str,
    src_order: str,
    out_order: str,
    swap: bool,
    rng: np.random.Generator,
) -> None:
    """The block lands inside a larger output, one element in from each side."""
    src = np.asarray(random_values(np.dtype(dtype), shape, rng), order=src_order)
    want = src.dtype.newbyteorder() if swap else src.dtype
    into = Into(
        out_shape=tuple(n + 2 for n in shape),
        selection=tuple(slice(1, n + 1) for n in shape),
        order=out_order,
    )
    out, buffer = make_out(want, into)
    expected_out, expected = make_out(want, into)
    native.scatter(src, out, into.selection, swap=swap)
    reference.scatter(src, expected_out, into.selection, swap=swap)
    assert bytes(buffer) == bytes(expected)
    assert_outside_untouched(buffer, into, want.itemsize)


@st.composite
def transposing_cases(draw: st.DrawFn) -> ScatterCase:
    """Blocks of up to ~40000 elements, placed at an offset inside an output
    of either order, from a source laid out in any axis order."""
    dtype = draw(st.sampled_from(PROPERTY_DTYPES))
    ndim = draw(st.integers(1, 4))
    limit = 40000
    sides: list[int] = []
    for _ in range(ndim):
        side = draw(st.integers(1, max(1, min(300, limit))))
        sides.append(side)
        limit //= side
    starts = [draw(st.integers(0, 2)) for _ in sides]
    into = Into(
        out_shape=tuple(a + n + draw(st.integers(0, 2)) for a, n in zip(starts, sides)),
        selection=tuple(slice(a, a + n) for a, n in zip(starts, sides)),
        order=draw(st.sampled_from("CF")),
    )
    swappable = dtype.kind in "iufcmMU" and dtype.itemsize > 1
    source = StridedSource(
        steps=tuple(draw(st.sampled_from([1, 1, 1, 2])) for _ in sides),
        flips=tuple(draw(st.sampled_from([False, False, True])) for _ in sides),
        perm=tuple(draw(st.permutations(range(ndim)))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    return ScatterCase(
        dtype=dtype, into=into, source=source, swap=swappable and draw(st.booleans())
    )


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=transposing_cases())
def test_scatter_transposing_property(case: ScatterCase) -> None:
    check_scatter(case)


@st.composite
def tiled_cases(draw: st.DrawFn) -> ScatterCase:
    """Transposing copies large enough to go tile by tile (the source's
    far stride times its row over 32 KiB), item sizes 1 to 8, with whole
    and partial tiles, steps, flips and swaps."""
    dtype = draw(st.sampled_from([np.dtype(s) for s in ("u1", "<i2", ">u2", "<f4", "<f8", "<c8")]))
    ndim = draw(st.integers(2, 3))
    sides = [draw(st.integers(33, 400)) for _ in range(2)]
    if ndim == 3:
        sides.insert(draw(st.integers(0, 2)), draw(st.integers(1, 3)))
    starts = [draw(st.integers(0, 2)) for _ in sides]
    into = Into(
        out_shape=tuple(a + n + draw(st.integers(0, 2)) for a, n in zip(starts, sides)),
        selection=tuple(slice(a, a + n) for a, n in zip(starts, sides)),
        order=draw(st.sampled_from("CF")),
    )
    # the source in the order opposite to the output's, so the copy transposes
    perm = tuple(range(ndim)) if into.order == "F" else tuple(reversed(range(ndim)))
    source = StridedSource(
        steps=tuple(draw(st.sampled_from([1, 1, 1, 2])) for _ in sides),
        flips=tuple(draw(st.sampled_from([False, False, True])) for _ in sides),
        perm=perm,
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    swap = dtype.itemsize > 1 and draw(st.booleans())
    return ScatterCase(dtype=dtype, into=into, source=source, swap=swap)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=tiled_cases())
def test_scatter_tiled_property(case: ScatterCase) -> None:
    check_scatter(case)


# -- the GIL -----------------------------------------------------------------------
# The probe is `helpers.gil.spins_during` (its docstring says how it works).

_LARGE = 100 * 2**20  # bytes per array


def test_scatter_releases_the_gil() -> None:
    src = np.arange(_LARGE // 8, dtype=np.float64)
    out = np.zeros_like(src)
    assert spins_during(lambda: native.scatter(src, out), attempts=5) > 1000
    assert np.array_equal(out, src)


def test_fill_releases_the_gil() -> None:
    out = np.zeros(_LARGE // 8, dtype=np.float64)
    assert spins_during(lambda: native.fill(out, 1.5), attempts=5) > 1000
    assert (out == 1.5).all()


def test_gil_probe_sees_a_held_gil() -> None:
    # the same copy done while holding the GIL (bytes() of a contiguous array
    # is one memcpy under the GIL) lets the spinner advance not once
    src = np.arange(_LARGE // 8, dtype=np.float64)
    assert spins_during(src.tobytes, attempts=2) == 0
