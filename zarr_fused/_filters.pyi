"""Typed interface of the compiled `zarr_fused._filters` (see _filters.pyx)."""

from typing import Any

import numpy as np

def delta(
    src: np.ndarray[Any, Any], out: np.ndarray[Any, Any], encode: bool
) -> np.ndarray[Any, Any]: ...
