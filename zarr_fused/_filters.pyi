"""Typed interface of the compiled `zarr_fused._filters` (see _filters.pyx)."""

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import numpy as np
from typing_extensions import disjoint_base

class FilterStatus(IntEnum):
    FILTER_OK = 0
    FILTER_OUT_OF_RANGE = 1

def delta(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], encode: bool) -> FilterStatus: ...
def fixedscaleoffset_encode(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], offset: float, scale: float
) -> FilterStatus: ...
def fixedscaleoffset_decode(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], offset: float, scale: float
) -> np.ndarray[Any, Any]: ...
def bitround(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], maskbits: int
) -> np.ndarray[Any, Any]: ...
def quantize(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], scale: float
) -> np.ndarray[Any, Any]: ...

@disjoint_base
class FilterChain:
    n: int
    itemsize: int
    encoded_itemsize: int
    max_itemsize: int
    may_refuse: bool
    elementwise_step: int
    row_step: int
    rows_in_order: bool
    def __init__(self, steps: Sequence[tuple[Any, ...]], *, refusing: bool = False) -> None: ...

def scale_offset(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], offset: float, scale: float, encode: bool
) -> FilterStatus: ...
def astype(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> FilterStatus: ...
