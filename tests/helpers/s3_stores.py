"""zarr stores on the tests' moto server, and what the S3 tests check around
them (test_s3, test_s3_write, test_s3_unsharded).

The ``moto`` and ``proxy`` fixtures (``conftest.py``) start the servers once
per test module, with the bucket `zarr_fused_testing.s3.BUCKET`; each test works under its own key
prefix (`new_prefix`). Unlike `zarr_fused_testing.s3`, this module imports zarr: the
servers' child processes never load it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol

import pytest
import zarr
from zarr.abc.store import Store
from zarr.storage import FsspecStore, ObjectStore
from zarr_fused_testing.s3 import (
    ACCESS_KEY,
    BUCKET,
    REGION,
    SECRET_KEY,
    Fault,
    LatencyProxy,
    MotoServer,
    ServerUnavailable,
    obstore_s3,
)

from . import assert_same_values

_prefixes = itertools.count()
_s3fs_cache: dict[str, Any] = {}


class _Server(Protocol):
    def start(self) -> Any: ...
    def stop(self) -> None: ...


@contextlib.contextmanager
def started_or_skip[S: _Server](server: S) -> Iterator[S]:
    """``server`` (a `zarr_fused_testing.s3` server) started for the block and stopped
    after it; the test skips, saying why, when it cannot start here."""
    try:
        server.start()
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


def new_prefix() -> str:
    """A key prefix no other test of this process uses."""
    return f"t{next(_prefixes):05d}"


def open_store(kind: str, proxy: LatencyProxy, prefix: str) -> Store:
    """A store of ``kind`` (obstore, s3fs) on ``BUCKET/prefix`` through the
    proxy. Retries are few and fast, so a persistent fault fails within a
    second or two."""
    if kind == "obstore":
        s3 = obstore_s3(
            BUCKET,
            proxy.endpoint,
            prefix,
            client_options={"timeout": timedelta(seconds=30)},
            retry_config={
                "max_retries": 2,
                "backoff": {
                    "init_backoff": timedelta(milliseconds=10),
                    "max_backoff": timedelta(milliseconds=100),
                },
                "retry_timeout": timedelta(seconds=10),
            },
        )
        return ObjectStore(s3)
    if kind == "s3fs":
        import s3fs

        # one filesystem per proxy: a new one builds a botocore session and
        # client (seconds of CPU on a busy host); zarr's loop outlives it
        fs = _s3fs_cache.get(proxy.endpoint)
        if fs is None:
            fs = s3fs.S3FileSystem(
                key=ACCESS_KEY,
                secret=SECRET_KEY,
                asynchronous=True,
                skip_instance_cache=True,
                client_kwargs={"endpoint_url": proxy.endpoint, "region_name": REGION},
                config_kwargs={"retries": {"max_attempts": 3, "mode": "standard"}},
            )
            fs.retries = 2  # s3fs' own retry loop around botocore's (a class attribute)
            _s3fs_cache[proxy.endpoint] = fs
        return FsspecStore(fs, path=f"{BUCKET}/{prefix}")
    raise AssertionError(kind)


def stored(moto: MotoServer, prefix: str) -> dict[str, bytes]:
    """What is stored under ``prefix`` (read straight from moto, uncounted),
    keyed relative to it."""
    return {k[len(prefix) + 1 :]: v for k, v in moto.objects(BUCKET, prefix + "/").items()}


def zarr_loop_tasks() -> set[asyncio.Task[Any]]:
    """The tasks alive on zarr's event loop (but the one asking)."""

    async def others() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    return zarr.core.sync.sync(others())


def assert_no_task_left(before: set[asyncio.Task[Any]]) -> None:
    """No task started by the operation is still running on zarr's loop (a
    moment allowed for cancelled ones to unwind)."""
    left: set[asyncio.Task[Any]] = set()
    for _ in range(50):
        left = {t for t in zarr_loop_tasks() - before if not t.done()}
        if not left:
            return
        zarr.core.sync.sync(asyncio.sleep(0.02))
    raise AssertionError(f"tasks left running: {left}")


def under_fault(
    proxy: LatencyProxy, fault: Fault, outcome: str, op: Callable[[], Any]
) -> tuple[Any, BaseException | None]:
    """``op()`` with ``fault`` injected: its result and the exception it
    raised (one of them None). The fault must have been hit, no task of the
    operation may be left on zarr's loop, and the outcome must be the one
    expected: ``"retried"`` succeeds, ``"error"`` fails, ``"either"``."""
    before_tasks = zarr_loop_tasks()
    index = proxy.inject(fault)
    result: Any = None
    error: BaseException | None = None
    try:
        result = op()
    except Exception as exc:
        error = exc
    assert proxy.hits(index) > 0, "the fault was never triggered"
    assert_no_task_left(before_tasks)
    if outcome == "retried":
        assert error is None, error
    elif outcome == "error":
        assert error is not None, "the fault went unnoticed"
    return result, error


def assert_same_objects_and_values(
    got: tuple[dict[str, bytes], Any], expected: tuple[dict[str, bytes], Any]
) -> None:
    """Two runs of one operation, each as (stored objects, values read
    back): the same keys, the same bytes under each, the same values."""
    objects, values = got
    expected_objects, expected_values = expected
    assert sorted(objects) == sorted(expected_objects)
    for key in expected_objects:
        assert objects[key] == expected_objects[key], key
    assert_same_values(values, expected_values)
