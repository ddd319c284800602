"""NumPy data types as the kernels see them: one element's bytes (and a
fill value's), fresh arrays, and values converted to another byte order.

NumPy mishandles the byte order of ``datetime64`` / ``timedelta64`` without
a unit (``>M8``, ``>m8``): ``np.empty(shape, ">M8")`` returns a native
(little-endian) array, and assigning or casting between ``<M8`` and ``>M8``
keeps the bytes as they are instead of reversing them. Every place that
allocates an array of a chain's data type, turns a fill value into bytes or
assigns across byte orders goes through these helpers, which work in the
native byte order and swap explicitly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.chunk_utils import fill_value_or_default

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec

__all__ = ["element_bytes", "empty", "empty_rule_pattern", "fill_pattern", "in_byte_order"]

# dtype kinds whose byte order NumPy's byteswap reverses per element (per
# component for complex, per code point for unicode)
_BYTESWAP_KINDS = frozenset("biufcmMU")


def empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.empty(shape, dtype)`` that keeps ``dtype``'s byte order."""
    array = np.empty(shape, dtype=dtype)
    if array.dtype != dtype:  # relabelling uninitialised bytes is exact
        array = array.view(dtype)
    return array


def element_bytes(value: Any, dtype: np.dtype[Any]) -> bytes:
    """``value`` as one element of ``dtype``: NumPy's casting of
    ``out[...] = value`` into an array of ``dtype``, in ``dtype``'s byte
    order."""
    if dtype.isnative or dtype.kind not in _BYTESWAP_KINDS:
        element = np.empty((), dtype=dtype)
        element[()] = value
        return element.tobytes()
    native = np.empty((), dtype=dtype.newbyteorder("="))
    native[()] = value
    return native.byteswap().tobytes()


def in_byte_order(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` ready to assign into an array of ``dtype``: when the two
    differ only in byte order, the values with their bytes reversed and
    labelled ``dtype`` (NumPy's own cast skips the reversal for unit-less
    datetimes); otherwise ``values`` unchanged."""
    if values.dtype != dtype and values.dtype.kind in "mM" and values.dtype.newbyteorder() == dtype:
        return values.byteswap().view(dtype)
    return values


def fill_pattern(spec: ArraySpec, dtype: np.dtype[Any]) -> bytes:
    """The fill value of ``spec`` as one element of ``dtype`` (NumPy casting,
    exactly as ``out[...] = fill_value`` would store it)."""
    return element_bytes(fill_value_or_default(spec), dtype)


def empty_rule_pattern(spec: ArraySpec, dtype: np.dtype[Any]) -> bytes | None:
    """The fill pattern the encode kernels compare chunks of ``dtype``
    against to skip empty chunks (``write_empty_chunks=False``), or None
    when that test must stay zarr's (`chunk_is_empty`).

    The kernels scan bytes, which is exactly zarr's rule except for NaN
    fill values (zarr counts any NaN as equal) and complex ones (there
    ``0j == -0j``).
    """
    if spec.config.write_empty_chunks:
        return None
    fill = fill_value_or_default(spec)
    if fill is None:
        return None
    if dtype.kind in "biumM" or (dtype.kind == "f" and not np.isnan(fill)):
        return fill_pattern(spec, dtype)
    return None
