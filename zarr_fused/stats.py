"""Per-task statistics of zarr_fused's reads and writes: `stats`.

``with zarr_fused.stats() as s:`` collects, for the reads and writes the
current thread or asyncio task starts inside the block, the store requests
and bytes by store kind, the chunks (or shards) read and written, the byte
ranges asked for and the requests they were coalesced into, the time spent
in store requests and in whole calls, the time the native kernels spent
reading files, decoding, scattering, encoding and writing files (summed
over threads), the chunks and inner chunks they decoded and encoded, and
the fallbacks to zarr's code with their reasons (docs/stats.md says how to
read each one).

How a count reaches its sink
----------------------------
The active sink is a context variable, so threads and asyncio tasks started
elsewhere do not count into it, and a task started inside the block (which
copies the context) does. zarr_fused's own pool and IO threads do not see
the caller's context, so `zarr_fused.pipeline` looks the sink up once per
call and, when there is one, hands the batch's store keys over as
`CountedPath` (a `zarr.storage.StorePath` that counts its own requests)
and the sink in the request. The unsharded readers of `LocalStore` chunk
files, which read the files inside their kernels, keep zarr's keys
(wrapping each costs more than the rest of a block on a hot read of many
small chunks): they count the files from the request's sink, wrap the
first key of each group of files (its native run finds the sink from it)
and each key they make a request through (`counted_key`). The other
native local paths count each group of files from its first key
(`sink_of`). Object stores keep their keys (the
async path recognises an `ObjectStore` key by its exact type) and are
counted by `zarr_fused.io.requests`, where their requests are made.

Without an active sink nothing is allocated: the lookup is one
``ContextVar.get`` per call and the batches are not touched.

The native batches (`zarr_fused._codec_batch`) find the sink from their
keys once per run (a test of ``timed`` per run without one), time their
phases with a monotonic clock only while there is one, and hand the sums
over once per run (`Stats.phases`).

Nested blocks: an inner sink also counts into the sinks around it.

Thread safety: a sink takes its lock once per count; the native paths count
once per group of files, the other paths once per store request (each a
round trip to the store that costs far more than the lock).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Final, cast

from zarr.storage import (
    FsspecStore,
    LocalStore,
    MemoryStore,
    ObjectStore,
    StorePath,
    WrapperStore,
    ZipStore,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

__all__ = ["CountedPath", "Stats", "active", "counted_key", "sink_of", "stats", "store_kind"]

_active: Final[contextvars.ContextVar[Stats | None]] = contextvars.ContextVar(
    "zarr_fused_stats", default=None
)

#: store classes -> their kind (a subclass of one is "other": it may do
#: its own IO)
_KINDS: Final[dict[type, str]] = {
    LocalStore: "local",
    MemoryStore: "memory",
    ObjectStore: "object",
    FsspecStore: "fsspec",
    ZipStore: "zip",
}


def store_kind(store: Any) -> str:
    """``store``'s kind as the counters name it: "local", "memory",
    "object", "fsspec", "zip", "wrapper" for any `zarr.storage.WrapperStore`
    (which hides its store from zarr_fused's native IO), else "other"."""
    kind = _KINDS.get(type(store))
    if kind is not None:
        return kind
    return "wrapper" if isinstance(store, WrapperStore) else "other"


class Stats:
    """The counters of one `stats` block (see docs/stats.md).

    Every counter is a `collections.Counter`; read them after the block (or
    at any time: each read takes the lock and returns a copy).
    """

    _FIELDS: Final = (
        "requests",  # (kind, op) -> store requests
        "bytes",  # (kind, op) -> bytes moved by those requests
        "items",  # ("read"|"write", "chunks"|"shards") -> keys of the calls
        "bytes_decoded",  # "read" -> decoded bytes of the chunks found
        "ranges",  # "asked"|"requests" -> byte ranges asked for, requests made for them
        "seconds",  # "store" (requests from Python), "read"/"write" (whole calls)
        "calls",  # "read"|"write" -> batches
        "fallbacks",  # (what, reason) -> batches that went to zarr's code
        "unsized",  # (kind, op) -> requests whose bytes are not in "bytes"
        "thread_seconds",  # phase -> seconds of the native kernels, summed over threads
        "native",  # ("read"|"write", "chunks"|"inner_chunks") -> decoded or encoded natively
    )

    #: the phases of ``thread_seconds``
    PHASES: Final = ("read_io", "decode", "scatter", "encode", "write_io")

    def __init__(self, parent: Stats | None = None, *, file_sizes: bool = False) -> None:
        self._lock = threading.Lock()
        self._parent = parent
        #: stat the local files a native call reads without reporting their size
        self.file_sizes = file_sizes
        # each counter made on first use (a block often touches a few);
        # Counter[Any] holds ints to mypy, the seconds are floats
        self._counters: defaultdict[str, Any] = defaultdict(Counter)

    def add(self, name: str, key: Any, value: float = 1) -> None:
        """Add ``value`` to counter ``name`` at ``key`` (and in the sinks around)."""
        sink: Stats | None = self
        while sink is not None:
            with sink._lock:
                sink._counters[name][key] += value
            sink = sink._parent

    def request(
        self, kind: str, op: str, nbytes: int | None, seconds: float = 0.0, n: int = 1
    ) -> None:
        """``n`` store requests ``op`` on a ``kind`` store that moved
        ``nbytes`` (None: not known, counted in ``unsized``)."""
        sink: Stats | None = self
        while sink is not None:
            with sink._lock:
                counters = sink._counters
                counters["requests"][kind, op] += n
                if nbytes is None:
                    counters["unsized"][kind, op] += n
                else:
                    counters["bytes"][kind, op] += nbytes
                if seconds:
                    counters["seconds"]["store"] += seconds
            sink = sink._parent

    def call(
        self,
        what: str,
        batch: Sequence[tuple[Any, ...]],
        sharded: bool,
        seconds: float,
        fallback: str,
        results: Sequence[Any] = (),
    ) -> None:
        """One read or write batch (``what``) of ``batch``'s keys that took
        ``seconds`` (``fallback``: the plan's reason for zarr's code, or
        ""); ``results``: a read's `GetResult` per key."""
        decoded = 0
        if results:
            # the items of a batch share their dtype, and mostly their spec
            itemsize = batch[0][1].dtype.to_native_dtype().itemsize
            last_spec, size = None, 0
            for item, result in zip(batch, results, strict=False):
                if result["status"] == "present":
                    spec = item[1]
                    if spec is not last_spec:
                        last_spec, size = spec, math.prod(spec.shape) * itemsize
                    decoded += size
        unit = "shards" if sharded else "chunks"
        sink: Stats | None = self
        while sink is not None:
            with sink._lock:
                counters = sink._counters
                counters["calls"][what] += 1
                counters["items"][what, unit] += len(batch)
                counters["seconds"][what] += seconds
                if decoded:
                    counters["bytes_decoded"]["read"] += decoded
                if fallback:
                    counters["fallbacks"][what, fallback] += 1
            sink = sink._parent

    def phases(
        self,
        what: str,
        inner: bool,
        chunks: int,
        *,
        io: float = 0.0,
        decode: float = 0.0,
        scatter: float = 0.0,
        encode: float = 0.0,
        write: float = 0.0,
    ) -> None:
        """One run of a native batch of ``what`` ("read" or "write"): the
        seconds its threads spent in each phase, summed, and the ``chunks``
        (``inner``: a shard's inner chunks) its kernels decoded or encoded."""
        unit = "inner_chunks" if inner else "chunks"
        sink: Stats | None = self
        while sink is not None:
            with sink._lock:
                counters = sink._counters
                spent = counters["thread_seconds"]
                # a run of tasks has a few phases: the zero ones stay out
                if io:
                    spent["read_io"] += io
                if decode:
                    spent["decode"] += decode
                if scatter:
                    spent["scatter"] += scatter
                if encode:
                    spent["encode"] += encode
                if write:
                    spent["write_io"] += write
                if chunks:
                    counters["native"][what, unit] += chunks
            sink = sink._parent

    def _get(self, name: str) -> Counter[Any]:
        with self._lock:
            return Counter(self._counters[name])

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """Store requests by (store kind, op): op "get" (a whole key),
        "get_range" (a byte range), "set", "delete", "files" (local files
        read natively, one open each), "write_files" (written natively)."""
        return self._get("requests")

    @property
    def bytes(self) -> Counter[tuple[str, str]]:
        """Bytes those requests moved, by (store kind, op)."""
        return self._get("bytes")

    @property
    def items(self) -> Counter[tuple[str, str]]:
        """Chunks or shards (the keys) the reads and writes addressed:
        ("read", "chunks"), ("read", "shards"), ("write", ...)."""
        return self._get("items")

    @property
    def bytes_decoded(self) -> int:
        """Decoded bytes of the stored chunks or shards the reads found
        (a whole shard's, even when a read needed part of it)."""
        return int(self._get("bytes_decoded")["read"])

    @property
    def ranges(self) -> Counter[str]:
        """ "asked": byte ranges the shard paths asked a store for;
        "requests": the requests zarr coalesced them into."""
        return self._get("ranges")

    @property
    def seconds(self) -> Counter[str]:
        """ "read", "write": wall time of the calls; "store": of the store
        requests made from Python (the native file reads are in
        ``thread_seconds["read_io"]``)."""
        return self._get("seconds")

    @property
    def thread_seconds(self) -> Counter[str]:
        """Seconds the native kernels spent in each phase, summed over the
        threads that ran them (so CPU-like: two threads busy for a second
        count two): "read_io" (local files read inside native calls, and
        by the IO threads), "decode" (decompression, checksums, byte
        order), "scatter" (decoded chunks copied into the output, fills of
        missing chunks), "encode" (gathering a chunk and compressing it),
        "write_io" (files written inside native calls and by the IO
        threads). Store requests made from Python are in ``seconds["store"]``."""
        return self._get("thread_seconds")

    @property
    def native(self) -> Counter[tuple[str, str]]:
        """Chunks the native kernels decoded ("read") or encoded ("write"):
        ``(what, "chunks")`` of unsharded arrays, ``(what, "inner_chunks")``
        of sharded ones (missing chunks, filled, and chunks equal to the
        fill value, skipped, are not counted)."""
        return self._get("native")

    def inner_chunks_per_shard(self) -> float | None:
        """Inner chunks decoded natively per shard read (None: no shard
        read): how much of each shard the reads used."""
        shards = self.items["read", "shards"]
        return self.native["read", "inner_chunks"] / shards if shards else None

    @property
    def calls(self) -> Counter[str]:
        """Batches read and written (zarr hands a call over in batches)."""
        return self._get("calls")

    @property
    def unsized(self) -> Counter[tuple[str, str]]:
        """Requests in ``requests`` whose bytes are not in ``bytes``: local
        files read inside a native call that does not report their size
        (whole chunk files, unless the block was opened with
        ``file_sizes=True``; a shard's index and inner chunks read in one
        call, ``get_shard_part``)."""
        return self._get("unsized")

    @property
    def fallbacks(self) -> Counter[tuple[str, str]]:
        """Batches that ran zarr's code, by (what, reason)."""
        return self._get("fallbacks")

    def total_requests(self) -> int:
        """All store requests."""
        return sum(self.requests.values())

    def total_bytes(self) -> int:
        """All bytes the store requests moved."""
        return sum(self.bytes.values())

    def as_dict(self) -> dict[str, Any]:
        """Every counter, keys joined with ":" (for printing or JSON)."""
        out: dict[str, Any] = {}
        for name in self._FIELDS:
            counter = self._get(name)
            out[name] = {
                ":".join(key) if isinstance(key, tuple) else str(key): value
                for key, value in sorted(counter.items(), key=lambda kv: str(kv[0]))
            }
        return out

    def __repr__(self) -> str:
        return f"Stats({self.as_dict()!r})"


def stats(*, file_sizes: bool = False) -> _Block:
    """Count the reads and writes this thread or task starts in the block.

    Parameters
    ----------
    file_sizes : bool
        Also count the bytes of the whole local chunk files that zarr_fused
        reads and decodes in one native call, which does not report them:
        one ``stat`` per file (a few percent of a hot read of small chunks).
        Without it they are counted in ``unsized``.

    Returns
    -------
    context manager
        Entering it yields the `Stats` of the block; an enclosing block's
        sink counts them too.

    Examples
    --------
    >>> with zarr_fused.stats() as s:  # doctest: +SKIP
    ...     array[:]
    >>> s.requests, s.bytes  # doctest: +SKIP
    """
    return _Block(file_sizes)


class _Block:
    """The context manager `stats` returns (a class: a generator-based one
    costs several times more to enter, paid by every block around a
    small read)."""

    __slots__ = ("file_sizes", "token")

    def __init__(self, file_sizes: bool) -> None:
        self.file_sizes = file_sizes
        self.token: contextvars.Token[Stats | None] | None = None

    def __enter__(self) -> Stats:
        sink = Stats(_active.get(), file_sizes=self.file_sizes)
        self.token = _active.set(sink)
        return sink

    def __exit__(self, *exc: object) -> None:
        assert self.token is not None
        _active.reset(self.token)
        self.token = None


def active() -> Stats | None:
    """The sink of the innermost `stats` block of this context, if any."""
    return _active.get()


def sink_of(key: Any) -> Stats | None:
    """The sink a batch's key counts into (None: no `stats` block)."""
    return key.sink if type(key) is CountedPath else None


class CountedPath(StorePath):
    """A store key whose requests count into ``sink``.

    Everything else is the `StorePath`'s: the same store and path, so the
    paths that check the store (local files, shard holds) treat it alike.
    """

    __slots__ = ("kind", "sink")

    def __init__(self, key: StorePath, sink: Stats, kind: str) -> None:
        # not StorePath.__init__: ``key.path`` is normalized already, and
        # normalizing it again costs more than counting the request
        self.store = key.store
        self.path = key.path
        self.sink = sink
        self.kind = kind

    def _count(self, op: str, buf: Buffer | None, start: float) -> None:
        self.sink.request(
            self.kind, op, 0 if buf is None else len(buf), time.perf_counter() - start
        )

    def get_sync(
        self, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        start = time.perf_counter()
        buf = super().get_sync(prototype=prototype, byte_range=byte_range)
        self._count("get" if byte_range is None else "get_range", buf, start)
        return buf

    async def get(
        self, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        start = time.perf_counter()
        buf = await super().get(prototype=prototype, byte_range=byte_range)
        self._count("get" if byte_range is None else "get_range", buf, start)
        return buf

    def set_sync(self, value: Buffer) -> None:
        start = time.perf_counter()
        super().set_sync(value)
        self._count("set", value, start)

    async def set(self, value: Buffer) -> None:
        start = time.perf_counter()
        await super().set(value)
        self._count("set", value, start)

    def delete_sync(self) -> None:
        start = time.perf_counter()
        super().delete_sync()
        self._count("delete", None, start)

    async def delete(self) -> None:
        start = time.perf_counter()
        await super().delete()
        self._count("delete", None, start)


def counted[Item: tuple[Any, ...]](
    batch: list[Item], sink: Stats | None, *, local_native: bool = False
) -> list[Item]:
    """``batch`` with its keys as `CountedPath` (``batch`` itself without
    a sink, or when its keys are not plain `StorePath` or are keys of an
    `ObjectStore`, which `zarr_fused.io.requests` counts).

    With ``local_native`` (a reader that reads the files of a `LocalStore`
    in its kernels and counts them from the request's sink, wrapping the
    few keys it makes requests through with `counted_key`), a batch of
    `LocalStore` keys is not wrapped either: wrapping each key is most of
    what a block costs a hot read of many small chunks."""
    if sink is None:
        return batch
    first, *_ = batch[0]
    kind = store_kind(first.store) if type(first) is StorePath else "object"
    if kind == "object" or (local_native and kind == "local"):
        return batch
    store = first.store
    return [
        (CountedPath(item[0], sink, kind), *item[1:])  # type: ignore[misc]
        if type(item[0]) is StorePath and item[0].store is store
        else item
        for item in batch
    ]


def counted_key(key: Any, sink: Stats | None) -> Any:
    """``key`` as a `CountedPath` into ``sink`` (``key`` itself without a
    sink, or when it is not a plain `StorePath` or is the key of an
    `ObjectStore`): one key of a batch `counted` left unwrapped."""
    if sink is None or type(key) is not StorePath:
        return key
    kind = store_kind(key.store)
    return key if kind == "object" else CountedPath(key, sink, kind)


def note_ranges(key: Any, ranges: Sequence[Any], config: Any, coalesce_ranges: Any) -> None:
    """A coalescing range read of ``ranges`` (`zarr.abc.store.RangeByteRequest`)
    of ``key`` through ``Store.get_ranges_sync`` with ``config``'s
    coalescing settings: the requests and bytes its plan makes, by
    zarr's own ``coalesce_ranges`` (passed in from `zarr_fused._zarr_compat`:
    this module imports no other of the package, so every path can count)."""
    sink = sink_of(key)
    if sink is None:
        return
    groups, uncoalescable = coalesce_ranges(
        ranges,
        max_gap_bytes=config.sharding_coalesce_max_gap_bytes,
        max_coalesced_bytes=config.sharding_coalesce_max_bytes,
    )
    made = len(groups) + len(uncoalescable)
    # the shard paths ask for `RangeByteRequest`s only: each has a start and an end
    spans: list[Any] = [r for _, r in uncoalescable]
    nbytes = sum(r.end - r.start for r in spans)
    for group in groups:
        members: list[Any] = [r for _, r in group]
        nbytes += max(r.end for r in members) - members[0].start
    sink.request(key.kind, "get_range", nbytes, n=made)
    sink.add("ranges", "asked", len(ranges))
    sink.add("ranges", "requests", made)


# -- the native local paths: one count per group of files ------------------------------


def note_local(key: Any, op: str, n: int, nbytes: int | None, seconds: float = 0.0) -> None:
    """``n`` local files (``nbytes`` in all, None: not known) that a
    native call read or wrote for the batch of ``key`` in ``seconds`` (0:
    timed inside the call, or not at all)."""
    sink = sink_of(key)
    if sink is not None:
        sink.request("local", op, nbytes, n=n)
        if seconds:
            _note_io(sink, op, seconds)


def _note_io(sink: Stats, op: str, seconds: float) -> None:
    """``seconds`` of native file IO of the kind ``op`` names."""
    if op in _WRITE_OPS:
        sink.phases("write", False, 0, write=seconds)
    else:
        sink.phases("read", False, 0, io=seconds)


_WRITE_OPS: Final = frozenset({"set", "write_files"})


def note_fetched(sink: Stats | None, n: int, nbytes: int, seconds: float) -> None:
    """``n`` local chunk files (``nbytes`` stored) read natively in
    ``seconds`` for a call counted into ``sink``."""
    if sink is not None and n:
        sink.request("local", "get", nbytes, n=n)
        if seconds:
            _note_io(sink, "get", seconds)


def note_files(
    sink: Stats | None, batch: Sequence[Any], indices: Sequence[int], prefix: bytes | None
) -> None:
    """The local files of ``batch[indices]`` (under ``prefix``), read
    whole inside a native call counted into ``sink`` that does not report
    their sizes: their sizes now with ``file_sizes`` (one ``stat`` each),
    else unsized."""
    if sink is None or prefix is None or not indices:
        return
    if not sink.file_sizes:
        sink.request("local", "get", None, n=len(indices))
        return
    paths = [prefix + os.fsencode(batch[i][0].path) for i in indices]
    sink.request("local", "get", _sizes(paths), n=len(indices))


def note_encoded(
    batch: Sequence[Any], results: Sequence[tuple[int, Any, int]], encoded: Sequence[Any], path: Any
) -> None:
    """The chunk files an `EncodeBatch` wrote itself (its result None), by
    ``path(key)``; their sizes as `note_files`."""
    sink = sink_of(batch[0][0]) if batch else None
    if sink is None:
        return
    paths = [path(batch[i][0]) for i, _, at in results if at >= 0 and encoded[at] is None]
    if paths:
        sink.request("local", "set", _sizes(paths), n=len(paths))


def note_stores(key: Any, stores: Sequence[tuple[Any, ...]], seconds: float = 0.0) -> None:
    """Stores handed to the IO threads: ``(write_parts, path, parts)``
    writes a file; a delete goes through its key and counts itself."""
    sink = sink_of(key)
    if sink is None:
        return
    written = [entry[2] for entry in stores if len(entry) == 3]
    if written:
        sink.request("local", "set", sum(parts_nbytes(p) for p in written), n=len(written))
    if seconds:
        _note_io(sink, "set", seconds)


def timed_writer[Write: Callable[..., Any]](key: Any, write: Write) -> Write:
    """``write`` (a native file write an IO thread makes for the batch of
    ``key``), its time counted as write IO when the batch has a sink."""
    sink = sink_of(key)
    if sink is None:
        return write

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return write(*args)
        finally:
            _note_io(sink, "set", time.perf_counter() - start)

    return cast("Write", timed)


def parts_nbytes(parts: Sequence[Any]) -> int:
    """Bytes of the buffers ``parts``."""
    return sum(memoryview(p).nbytes for p in parts)


def _sizes(paths: Any) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
    return total


def note_parts(key: Any, parts: Sequence[Any], seconds: float = 0.0) -> None:
    """One local file written natively from the buffers ``parts`` in ``seconds``."""
    sink = sink_of(key)
    if sink is not None:
        sink.request("local", "set", parts_nbytes(parts))
        if seconds:
            _note_io(sink, "set", seconds)
