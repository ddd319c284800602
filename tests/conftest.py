"""Shared fixtures; the helpers and constants they use live in `helpers`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zarr

from helpers import FUSED


@pytest.fixture
def fused() -> Iterator[None]:
    """Select zarr_fused for the duration of the test."""
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        yield
