"""The store requests and the started work of one batch on the async path.

Every async reader and writer (`zarr_fused.chunks.async_read`,
`zarr_fused.chunks.async_write`, `zarr_fused.shard.async_read`,
`zarr_fused.shard.async_write`) runs a batch inside `open_batch` (opened
by `zarr_fused._async_path`), which gives it a `BatchIO`:

- `Requests`: every store request of the batch (GET, PUT, DELETE, a
  conditional read-modify-write) holds one of `request_limit` slots while
  it is in flight, and only then: decoding and encoding never hold a slot.
  A store error that does not name its key is re-raised as an `OSError`
  that does, the original as its ``__cause__``;
- `Tracker`: every task and pool job the batch starts. When anything
  fails, every fetch, decode, encode and write still pending is cancelled
  and every one already running is awaited before the error propagates:
  nothing keeps running unobserved.

With ``codec_pipeline.max_workers`` = 1 there is no pool and `Tracker`
runs the compute inline, as in zarr's own pipeline.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from zarr.core.config import config as zarr_config

from zarr_fused._items import describe_key
from zarr_fused._pool import ElasticPool, get_pool
from zarr_fused._zarr_compat import OBJECT_ABSENT
from zarr_fused.config import ASYNC_CONCURRENCY_KEY, int_setting, shard_write_lock
from zarr_fused.errors import WriteConflictError, ZarrFusedError
from zarr_fused.io import object_cas
from zarr_fused.io.object_cas import NOTHING, Outcome
from zarr_fused.stats import CountedPath, active, store_kind

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from concurrent.futures import Future

    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer

    #: merges a write into the stored object: the new object, None to
    #: delete it, `NOTHING` to leave it alone
    type Merge = Callable[[Buffer | None], Awaitable[Buffer | None | Literal[Outcome.NOTHING]]]

__all__ = [
    "ASYNC_CONCURRENCY_CAP",
    "DEFAULT_ASYNC_CONCURRENCY",
    "BatchIO",
    "Requests",
    "Tracker",
    "open_batch",
    "request_limit",
]

#: Store requests in flight per batch unless the user has set a limit.
#:
#: On an object store every request is a round trip (tens of ms to S3) that
#: costs the client almost nothing while it waits: by Little's law a batch
#: of small objects moves ``limit / latency`` objects a second, so zarr's
#: ``async.concurrency`` default of 10 leaves a 20 ms store serving 500
#: objects a second. Against a server that keeps up (S3 serves thousands of
#: GETs a second per prefix) more in flight reads faster (docs/tuning.md
#: has the measurements); more than this would mostly queue at a throttling
#: server (S3 answers 503 SlowDown per prefix) and hold more connections.
#: A single small server (one MinIO or moto process) wants less.
DEFAULT_ASYNC_CONCURRENCY: Final = 64
ASYNC_CONCURRENCY_CAP: Final = 1024

# zarr's key and its environment variable: a limit set there is the user's
_ZARR_KEY: Final = "async.concurrency"
_ZARR_ENV: Final = "ZARR_ASYNC__CONCURRENCY"


def request_limit() -> int | None:
    """Store requests one batch keeps in flight; None for no limit.

    ``codec_pipeline.async_concurrency`` when it is an integer; else zarr's
    ``async.concurrency`` when the user has set it (a value other than
    zarr's default, or ``ZARR_ASYNC__CONCURRENCY`` in the environment; None
    lifts the limit, as in zarr's pipelines); else
    `DEFAULT_ASYNC_CONCURRENCY`. donfig keeps no record of who set a value,
    so a user who sets exactly zarr's default 10 is indistinguishable from
    the default: `zarr_fused.config` documents setting our key instead.
    Never raises: an invalid value warns and follows the default rule.
    """
    ours = int_setting(
        ASYNC_CONCURRENCY_KEY, cap=ASYNC_CONCURRENCY_CAP, default=lambda: None, stacklevel=2
    )
    if ours is not None:
        return ours
    theirs = zarr_config.get(_ZARR_KEY, default=None)
    if theirs != _zarr_default() or _ZARR_ENV in zarr_config.env:
        return None if theirs is None else max(1, int(theirs))
    return DEFAULT_ASYNC_CONCURRENCY


def _zarr_default() -> Any:
    """zarr's default ``async.concurrency`` (10), from the defaults zarr
    registered with its configuration (the last layer that names it)."""
    value = None
    for layer in zarr_config.defaults:
        value = layer.get("async", {}).get("concurrency", value)
    return value


class Tracker:
    """Everything one batch has started, so it can all be cancelled and
    awaited when the batch fails."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ElasticPool | None = get_pool(workers) if workers > 1 else None
        #: whether the pool runs the batch's work in the caller's context:
        #: inside a `zarr_fused.stats` block, so that the native batches
        #: find its sink (keys of object stores cannot carry it)
        self.in_context = active() is not None
        self.tasks: list[asyncio.Future[Any]] = []
        self.threads: list[Future[Any]] = []

    def task(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        fut = asyncio.ensure_future(coro)
        self.tasks.append(fut)
        return fut

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Start ``fn(*args)`` in the pool (there is one), in the caller's
        context inside a stats block; the batch waits for it."""
        assert self.pool is not None
        if self.in_context:
            cf = self.pool.submit(contextvars.copy_context().run, fn, *args)
        else:
            cf = self.pool.submit(fn, *args)
        self.threads.append(cf)
        return cf

    def compute(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in the pool, or inline without one."""
        if self.pool is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            try:
                fut.set_result(fn(*args))
            except Exception as exc:
                fut.set_exception(exc)
            self.tasks.append(fut)
            return fut
        cf = self.submit(fn, *args)
        fut = asyncio.wrap_future(cf)
        self.tasks.append(fut)
        return fut

    async def drain(self) -> None:
        # Pool work cannot be interrupted once running: cancel what has not
        # started, then wait for the rest so it cannot outlive the batch.
        for cf in self.threads:
            cf.cancel()
        # only work still running needs a wrapper: wrapping a finished one
        # costs a cross-thread wake-up of the loop per chunk, for nothing
        running = [asyncio.wrap_future(cf) for cf in self.threads if not cf.done()]
        pending = [t for t in self.tasks if not t.done()]
        for t in pending:
            t.cancel()
        waiting = [*running, *pending]
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)
        # mark every outcome as retrieved (no "exception never retrieved")
        for t in self.tasks:
            if t.done() and not t.cancelled():
                t.exception()


class Requests:
    """The store requests of one batch: at most `request_limit` in flight
    (any number when it is None), and a store error that does not name the
    key wrapped in one that does (the original as its ``__cause__``)."""

    def __init__(self) -> None:
        limit = request_limit()
        self.limit = None if limit is None else max(1, int(limit))
        self.limiter: AbstractAsyncContextManager[Any] = (
            nullcontext() if self.limit is None else asyncio.Semaphore(self.limit)
        )
        #: partial updates are conditional writes (``codec_pipeline.shard_write_lock``)
        self.protect = shard_write_lock()
        #: the caller's `zarr_fused.stats` sink (the batch opens in its task)
        self.sink = active()

    def _count(self, key: Any, op: str, data: Any, start: float) -> None:
        """Count a request into the sink, unless ``key`` counts its own."""
        if self.sink is not None and type(key) is not CountedPath:
            nbytes = 0 if data is None else len(data)
            kind = store_kind(getattr(key, "store", None))
            self.sink.request(kind, op, nbytes, time.perf_counter() - start)

    async def get(
        self, getter: Any, prototype: Any, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        async with self.limiter:
            with _naming(getter, "reading"):
                start = time.perf_counter()
                buf: Buffer | None = await getter.get(prototype=prototype, byte_range=byte_range)
                self._count(getter, "get" if byte_range is None else "get_range", buf, start)
                return buf

    async def get_object(self, store: Any, getter: Any) -> Any:
        """What ``ObjectStore.get`` fetches for a whole object, below its
        wrapper: the same two obstore calls on the same key, obstore's
        ``Bytes`` (None when absent, as zarr reads a missing key) instead of a
        zarr ``Buffer``. Holds no slot: the caller keeps at most `limit` of
        these in flight (`zarr_fused.chunks.async_read`)."""
        import obstore

        with _naming(getter, "reading"):
            start = time.perf_counter()
            try:
                response = await obstore.get_async(store, getter.path)
                data = await response.bytes_async()
            except OBJECT_ABSENT:
                data = None
            self._count(getter, "get", data, start)
            return data

    async def set(self, setter: Any, value: Buffer | None) -> None:
        """Store ``value`` at ``setter`` (delete it when None)."""
        async with self.limiter:
            # Let the loop read what has arrived before this request is
            # prepared: a client that builds each request on the loop (s3fs
            # hashes and signs the body there) otherwise answers the earlier
            # requests' responses late (docs/performance.md measures it).
            await asyncio.sleep(0)
            with _naming(setter, "writing"):
                start = time.perf_counter()
                if value is None:
                    await setter.delete()
                else:
                    await setter.set(value)
                self._count(setter, "set" if value is not None else "delete", value, start)

    async def update(self, setter: Any, prototype: Any, merge: Merge) -> None:
        """Read ``setter``'s object, ``merge`` it with this write's part and
        store the result (delete the object when it is None; nothing when
        `NOTHING`). With protection on and a store that takes conditional
        writes, the store is conditional on the object being the one read,
        and a conflict starts over from the read after a pause
        (`zarr_fused.io.object_cas`); other stores get
        `object_cas.unprotected` (strict mode's error, or one warning). A
        slot is held for each request, none while merging."""
        store = object_cas.conditional_store(setter)
        what = f"a partial write of {describe_key(setter)}"
        if store is None or not self.protect:
            if self.protect:
                object_cas.unprotected(setter, what)
            merged = await merge(await self.get(setter, prototype))
            if merged is not NOTHING:
                await self.set(setter, merged)
            return
        backoff = object_cas.Backoff(describe_key(setter))
        while True:
            async with self.limiter:
                with _naming(setter, "reading"):
                    start = time.perf_counter()
                    seen = await object_cas.get_versioned(store, setter.path)
                    self._count(setter, "get", seen.data, start)
            existing = None if seen.data is None else prototype.buffer.from_bytes(seen.data)
            if not seen.conditional:  # the server gave the object no ETag
                object_cas.unprotected(setter, what + " (the object has no ETag)")
            merged = await merge(existing)
            if merged is NOTHING:
                return
            if not seen.conditional:
                await self.set(setter, merged)
                return
            try:
                await self._put_if_unchanged(store, setter, merged, seen)
                return
            except WriteConflictError as conflict:
                await backoff.after(conflict)

    async def _put_if_unchanged(
        self, store: Any, setter: Any, value: Buffer | None, seen: object_cas.Versioned
    ) -> None:
        """`object_cas.put_if_unchanged` in a slot, the key named in errors;
        a DELETE (``value`` None) is unconditional: obstore has none other."""
        async with self.limiter:
            await asyncio.sleep(0)  # as in `set`
            with _naming(setter, "writing"):
                start = time.perf_counter()
                if value is None:
                    await setter.delete()
                else:
                    await object_cas.put_if_unchanged(
                        store, setter.path, value.as_buffer_like(), seen
                    )
                self._count(setter, "set" if value is not None else "delete", value, start)


@dataclass(frozen=True, slots=True)
class BatchIO:
    """One batch on the async path: its store requests and everything it
    has started (what a reader or writer gets from `open_batch`)."""

    requests: Requests
    tracker: Tracker


@asynccontextmanager
async def open_batch(workers: int) -> AsyncIterator[BatchIO]:
    """The requests and the tracker (computing on ``workers`` threads) of
    one batch; on the way out, whether the batch succeeded or failed,
    everything it started is finished."""
    tracker = Tracker(workers)
    try:
        yield BatchIO(Requests(), tracker)
    finally:
        await tracker.drain()


@contextmanager
def _naming(key: Any, doing: str) -> Iterator[None]:
    """Re-raise a store error that does not name ``key`` as an `OSError`
    that does."""
    try:
        yield
    except Exception as exc:
        path = getattr(key, "path", None)
        # NotImplementedError is a store's answer about its API (ZipStore
        # cannot delete), not an IO failure: zarr's callers expect it as is
        if (
            path is None
            or path in str(exc)
            or isinstance(exc, (ZarrFusedError, NotImplementedError))
        ):
            raise
        raise OSError(f"{doing} {describe_key(key)}: {type(exc).__name__}: {exc}") from exc
