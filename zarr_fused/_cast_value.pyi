"""Typed interface of the compiled `zarr_fused._cast_value` (see _cast_value.pyx)."""

from collections.abc import Iterable
from enum import IntEnum
from typing import Any

import numpy as np
from typing_extensions import disjoint_base

TYPE_CODES: dict[str, int]
ROUNDING_MODES: dict[str, int]
OUT_OF_RANGE_MODES: dict[str | None, int]
MAX_ENTRIES: int

class CastStatus(IntEnum):
    CAST_OK = 0
    CAST_NAN_OR_INF = 1
    CAST_OUT_OF_RANGE = 2

@disjoint_base
class CastSpec:
    src: np.dtype[Any]
    dst: np.dtype[Any]
    can_fail: bool
    def __init__(
        self,
        src: Any,
        dst: Any,
        rounding: str,
        out_of_range: str | None,
        entries: Iterable[tuple[int | float, int | float]],
    ) -> None: ...

def cast(src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], spec: CastSpec) -> CastStatus: ...
