"""Typed interface of the compiled `zarr_fused._scatter` (see _scatter.pyx)."""

from typing import Any

import numpy as np

def scatter(
    src: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any] | None = None,
    selection: Any = None,
    *,
    swap: bool = False,
) -> np.ndarray[Any, Any]: ...
def fill(out: np.ndarray[Any, Any], value: Any, selection: Any = None) -> np.ndarray[Any, Any]: ...
