"""Shared fixtures; the helpers and constants they use live in `helpers`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import zarr
from zarr_fused_testing.s3 import BUCKET, LatencyProxy, MotoServer

import zarr_fused

from helpers import FUSED
from helpers.s3_stores import started_or_skip


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under `ZARR_FUSED_EXPECT_BUILD` (tests/fuzz/test_asan.sh sets it to
    the sanitizer build), refuse to run on any other build of zarr_fused, in
    the main process and in every xdist worker."""
    expected = os.environ.get("ZARR_FUSED_EXPECT_BUILD")
    if expected and not zarr_fused.__file__.startswith(os.path.join(expected, "")):
        raise pytest.UsageError(f"zarr_fused comes from {zarr_fused.__file__}, not {expected}")


@pytest.fixture
def fused() -> Iterator[None]:
    """Select zarr_fused for the duration of the test."""
    with zarr.config.set({"codec_pipeline.path": FUSED}):
        yield


# -- the S3 tests' servers (helpers.s3_stores opens stores on them) -----------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    """moto's S3 server with the bucket `zarr_fused_testing.s3.BUCKET`, once per test
    module (a module's S3 tests skip when it cannot start)."""
    with started_or_skip(MotoServer()) as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture(scope="module")
def proxy_server(moto: MotoServer) -> Iterator[LatencyProxy]:
    """The counting, fault-injecting proxy in front of `moto`, once per test
    module; tests take it as `proxy`."""
    with started_or_skip(LatencyProxy(moto.endpoint)) as p:
        yield p


@pytest.fixture
def proxy(proxy_server: LatencyProxy) -> Iterator[LatencyProxy]:
    """The module's proxy, with counters and faults empty and no latency at
    the start of the test, and cleared again after it."""
    proxy_server.reset(latency=0.0)
    yield proxy_server
    proxy_server.reset()
