"""Typed interface of the compiled `zarr_fused._filters` (see _filters.pyx)."""

from enum import IntEnum
from typing import Any

import numpy as np

def delta(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], encode: bool
) -> np.ndarray[Any, Any]: ...

class FilterStatus(IntEnum):
    FILTER_OK = 0
    FILTER_OUT_OF_RANGE = 1

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
