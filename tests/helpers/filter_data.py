"""Values that look like what filter chains are used for, shared by the
filter tests (unsharded and sharded)."""

from __future__ import annotations

import numpy as np


def values_of(kind: str, dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``kind``: ``ints`` (a random walk, what delta is for; non-negative for
    unsigned types), ``temperatures`` (kelvin around 273), ``small`` (two
    decimals in [0, 100), what fixedscaleoffset is for), else wide floats."""
    rng = np.random.default_rng(seed)
    if kind == "ints":
        value = np.cumsum(rng.integers(-5, 6, size=shape), axis=-1)
        if np.dtype(dtype).kind == "u":
            value = np.abs(value)
    elif kind == "temperatures":
        value = 273.15 + 30 * rng.standard_normal(shape)
    elif kind == "small":
        value = rng.uniform(0, 100, size=shape).round(2)
    else:
        value = 1000 * rng.standard_normal(shape)
    return value.astype(dtype)
