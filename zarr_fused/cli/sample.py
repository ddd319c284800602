"""The generated sample array that ``demo`` and ``bench`` read and write."""

from __future__ import annotations

import numpy as np


def sample_geometry(edge: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Inner chunk and shard shape of the ``edge``-cube sample.

    Eight inner chunks along each axis, and shards of about half the edge,
    rounded down to whole inner chunks (a shard must hold whole chunks).
    """
    inner = max(1, edge // 8)
    shard = inner * max(1, edge // 2 // inner)
    return (inner,) * 3, (shard,) * 3


def sample_data(edge: int) -> np.ndarray:
    """A seeded uint16 ``edge``-cube of smooth data with noise: it compresses
    like real measurements, not like zeros."""
    rng = np.random.default_rng(42)
    z, y, x = np.meshgrid(*(np.linspace(0, 6, edge),) * 3, indexing="ij", sparse=True)
    field = 3000 + 1000 * np.sin(x) * np.cos(y) + 500 * np.sin(z)
    return (field + rng.normal(0, 20, (edge,) * 3)).astype(np.uint16)
