"""Typed interface of the compiled `zarr_fused._region_plan` (see _region_plan.pyx)."""

from typing import Any

import numpy as np

def plain_boxes(
    selections: list[Any], shape: tuple[int, ...]
) -> (
    tuple[
        np.ndarray[Any, np.dtype[np.int64]],
        np.ndarray[Any, np.dtype[np.int64]],
        np.ndarray[Any, np.dtype[np.bool_]],
    ]
    | None
): ...
def fan_out_targets(
    lo: np.ndarray[Any, np.dtype[np.int64]],
    hi: np.ndarray[Any, np.dtype[np.int64]],
    at: np.ndarray[Any, np.dtype[np.int64]] | None,
    dest: np.ndarray[Any, np.dtype[np.intp]] | None,
    shape: tuple[int, ...],
    outer: tuple[int, ...],
    inner: tuple[int, ...],
) -> tuple[
    np.ndarray[Any, np.dtype[np.intp]],
    np.ndarray[Any, np.dtype[np.intp]],
    np.ndarray[Any, np.dtype[np.intp]],
    np.ndarray[Any, np.dtype[np.int64]],
    np.ndarray[Any, np.dtype[np.intp]],
]: ...
