"""Unsharded arrays on a real S3 server (moto behind the counting proxy):
zarr_fused keeps more requests in flight than zarr's ``async.concurrency``
default, respects that setting when the user has set it, and never sends
more GET/PUT/HEAD requests than zarr's own FusedCodecPipeline, on an array
with many more chunks than requests in flight (tests/test_s3.py holds the
correctness matrix and the faults, on small arrays).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr_fused_testing.s3 import LatencyProxy, Stats

from zarr_fused.io.requests import DEFAULT_ASYNC_CONCURRENCY

from helpers import BATCHED, FUSED, ZARR_FUSED, assert_same_values, with_pipeline
from helpers.s3_stores import new_prefix, open_store

pytest.importorskip("obstore.store")

SHAPE = (48, 40)  # 12 x 10 = 120 chunks: several times any limit below
CHUNKS = (4, 4)
LATENCY = 0.03  # long enough for every request of a batch to overlap


def sample() -> np.ndarray:
    return np.random.default_rng(152).normal(0, 1, SHAPE).astype("<f4")


def create(store: Store) -> zarr.Array:
    return zarr.create_array(
        store,
        shape=SHAPE,
        chunks=CHUNKS,
        dtype="<f4",
        compressors=zarr.codecs.ZstdCodec(level=1),
        fill_value=0,
    )


# name -> (array written first, the operation)
OPERATIONS: dict[str, tuple[bool, Callable[[zarr.Array], Any]]] = {
    "read-whole": (True, lambda a: a[...]),
    "write-all": (False, lambda a: a.__setitem__(Ellipsis, sample())),
}


def run(proxy: LatencyProxy, pipeline: str, operation: str, settings: dict[str, Any]) -> Stats:
    """``operation`` by ``pipeline`` under ``settings`` on a fresh array,
    with ``LATENCY`` added per request: the proxy's counts of it alone."""
    first, op = OPERATIONS[operation]
    store = open_store("obstore", proxy, new_prefix())  # each array under its own prefix
    with with_pipeline(BATCHED):
        arr = create(store)
        if first:
            arr[...] = sample()
    with with_pipeline(pipeline), zarr.config.set(settings):
        arr = zarr.open_array(store)  # a pipeline of the configured class
        proxy.reset(latency=LATENCY)
        result = op(arr)
        stats = proxy.reset(latency=0.0)
    if result is not None:
        assert_same_values(result, sample())
    return stats


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_default_keeps_more_requests_in_flight_than_zarr(
    proxy: LatencyProxy, operation: str
) -> None:
    theirs = run(proxy, ZARR_FUSED, operation, {})
    ours = run(proxy, FUSED, operation, {})
    assert theirs.max_in_flight <= 10, theirs.summary()
    assert 10 < ours.max_in_flight <= DEFAULT_ASYNC_CONCURRENCY, ours.summary()


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_async_concurrency_set_by_the_user_is_respected(
    proxy: LatencyProxy, operation: str
) -> None:
    ours = run(proxy, FUSED, operation, {"async.concurrency": 3})
    assert ours.count("GET", "PUT") >= 100
    assert ours.max_in_flight <= 3, ours.summary()


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_requests_no_more_than_zarr_many_chunks(proxy: LatencyProxy, operation: str) -> None:
    """Same operation, same counts: more requests in flight never means
    more requests (whole reads: one GET per chunk; writes: one PUT each)."""
    theirs = run(proxy, ZARR_FUSED, operation, {})
    ours = run(proxy, FUSED, operation, {})
    assert ours.count("GET", "PUT") >= 100
    for method in ("GET", "PUT", "HEAD"):
        assert ours.requests[method] <= theirs.requests[method], (
            method,
            ours.summary(),
            theirs.summary(),
        )
    assert ours.requests["PUT"] == theirs.requests["PUT"]
