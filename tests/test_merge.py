"""`zarr_fused._merge.is_empty_chunk` against zarr's `chunk_is_empty`, its
oracle: the same answer for every chunk, whatever the early exit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_utils import chunk_is_empty
from zarr.core.dtype import VariableLengthBytes, get_data_type_from_native_dtype

from zarr_fused._merge import is_empty_chunk

#: dtype -> (fill value, another value)
KINDS: dict[str, tuple[Any, Any]] = {
    "str": ("", "x"),
    "str-fill": ("fill", "fil"),
    "bytes-object": (b"", b"\x00"),
    "float64-nan": (np.nan, 0.0),
    "float64-zero": (0.0, -0.0),
    "int32": (7, 8),
    "fixed-bytes": (b"ab", b"a"),
    "unicode": ("ab", "ac"),
}


def _dtype(kind: str) -> Any:
    return {
        "str": np.dtypes.StringDType(),
        "str-fill": np.dtypes.StringDType(),
        "bytes-object": np.dtype(object),
        "float64-nan": np.dtype("<f8"),
        "float64-zero": np.dtype("<f8"),
        "int32": np.dtype("<i4"),
        "fixed-bytes": np.dtype("S2"),
        "unicode": np.dtype("<U2"),
    }[kind]


def _spec(shape: tuple[int, ...], dtype: Any, fill: Any, write_empty: bool) -> ArraySpec:
    zdtype = (
        VariableLengthBytes()
        if dtype == np.dtype(object)
        else get_data_type_from_native_dtype(dtype)
    )
    fill_value = fill if dtype == np.dtype(object) else np.array(fill, dtype=dtype)[()]
    return ArraySpec(
        shape=shape,
        dtype=zdtype,
        fill_value=fill_value,
        config=ArrayConfig(order="C", write_empty_chunks=write_empty),
        prototype=default_buffer_prototype(),
    )


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(list(KINDS)),
    shape=st.sampled_from([(1,), (5,), (3, 4), (2, 3, 4), (0, 3), (40, 500)]),
    others=st.sets(st.integers(min_value=0, max_value=19999), max_size=3),
    write_empty=st.booleans(),
    strided=st.booleans(),
)
def test_is_empty_chunk_answers_as_zarr(
    kind: str, shape: tuple[int, ...], others: set[int], write_empty: bool, strided: bool
) -> None:
    fill, other = KINDS[kind]
    dtype = _dtype(kind)
    base_shape = (shape[0] * 2, *shape[1:]) if strided and shape else shape
    data = np.full(base_shape, fill, dtype=dtype)
    if strided and shape:
        data = data[::2]
    size = data.size
    for flat in others:
        if size:
            data[np.unravel_index(flat % size, data.shape)] = other
    spec = _spec(data.shape, dtype, fill, write_empty)
    chunk = default_buffer_prototype().nd_buffer.from_ndarray_like(data)
    assert is_empty_chunk(chunk, spec) is chunk_is_empty(chunk, spec)


@pytest.mark.parametrize("where", [pytest.param(0, id="first"), pytest.param(-1, id="last"), None])
@pytest.mark.parametrize("kind", ["str", "bytes-object"])
def test_is_empty_chunk_of_strings(kind: str, where: int | None) -> None:
    """A chunk of the fill value is empty; one other item anywhere (the
    first, which the early exit sees, or the last) makes it not."""
    fill, other = KINDS[kind]
    dtype = _dtype(kind)
    data = np.full((128, 256), fill, dtype=dtype)
    if where is not None:
        data.flat[where] = other
    spec = _spec(data.shape, dtype, fill, write_empty=False)
    chunk = default_buffer_prototype().nd_buffer.from_ndarray_like(data)
    assert is_empty_chunk(chunk, spec) is (where is None)
