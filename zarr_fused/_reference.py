"""Pure-NumPy implementations of zarr_fused's kernels.

For testing and reference, not production: every native kernel is checked
against the function of the same name here (and the pipeline as a whole
against zarr's own pipelines). Signatures and errors match the kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fill", "scatter"]


def _view(out: np.ndarray, selection: Any) -> np.ndarray:
    if selection is None:
        return out
    if not isinstance(selection, tuple):
        selection = (selection,)
    for s in selection:
        # a Python bool is an int, but numpy takes it as a mask (a copy)
        if isinstance(s, bool) or not (isinstance(s, (slice, int, np.integer)) or s is Ellipsis):
            raise TypeError(
                f"scatter/fill take basic selections (slices and integers), got {type(s).__name__}"
            )
    if Ellipsis not in selection:
        selection = (*selection, Ellipsis)
    return out[selection]


def scatter(
    src: np.ndarray, out: np.ndarray | None = None, selection: Any = None, *, swap: bool = False
) -> np.ndarray:
    """Reference of `zarr_fused._scatter.scatter`."""
    if not isinstance(src, np.ndarray):
        raise TypeError(f"src must be a numpy.ndarray, got {type(src).__name__}")
    if src.dtype.hasobject:
        raise TypeError("scatter cannot copy object arrays")
    if swap and src.dtype.fields is not None:
        raise TypeError("scatter cannot swap the byte order of structured elements")
    want = src.dtype.newbyteorder() if swap else src.dtype
    if out is None:
        if selection is not None:
            raise ValueError("selection needs an out array")
        out = np.empty(src.shape, dtype=want)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    view = _view(out, selection)
    if view.shape != src.shape:
        raise ValueError(f"destination shape {view.shape} does not match source shape {src.shape}")
    if view.dtype != want:
        raise TypeError(f"destination dtype {view.dtype} does not match {want} (swap={swap})")
    if np.may_share_memory(src, view):
        raise ValueError("src and out overlap")
    # with swap, ``want`` is src's dtype in the opposite byte order, so the
    # value-preserving assignment is exactly a per-element byte reversal
    view[...] = src
    return out


def fill(out: np.ndarray, value: Any, selection: Any = None) -> np.ndarray:
    """Reference of `zarr_fused._scatter.fill`."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype.hasobject:
        raise TypeError("fill cannot write object arrays")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    _view(out, selection)[...] = value
    return out
