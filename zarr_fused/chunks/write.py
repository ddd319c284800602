"""The synchronous write path: fetch existing, merge, encode, store.

Like the read path, each item of a batch runs its whole life in one pool
worker. The merge and empty-chunk rules are zarr's own
(`zarr.core.chunk_utils`), so ``write_empty_chunks`` behaves exactly as
with zarr's pipelines.

`NativeChunkWriter` serves the chains the batch kernels run (a native
chain, or filters that all have a kernel over one) group by group: fetch
the stored bytes of the chunks the write covers only partly, decode them in
one nogil call, merge with NumPy, encode the group in one nogil call,
store. A scalar
written over whole chunks (``a[...] = 5``) is merged and encoded once per
chunk shape, not once per chunk.

On a `zarr.storage.LocalStore` with IO threads (``io_concurrency`` > 1),
each group is encoded into a pooled arena and its files are written (or,
left empty, deleted) by the IO threads as one `zarr_fused.io.engine.Parcel`,
while the compute thread encodes the next group: a rename that blocks on
the filesystem no longer holds up encoding. Otherwise, and while the files
were found fast to store (`FAST_STORE`: a hot tmpfs or local disk, where
the hand-off costs more than it saves), the encode kernel writes each file
itself, inside its nogil call (a batch with filters encodes into memory,
since a chunk the filters refuse is zarr's code to encode; the compute
thread then stores the group's files as the IO threads would: each written
natively and atomically, the chunks left all fill value deleted).

Which of the two a write takes is measured, not guessed
(`zarr_fused.io.probe`): with no recent measurement (a new array handle,
or none for `zarr_fused.io.probe.PROBE_INTERVAL` seconds) a write first
stores a few files per compute thread itself (`PROBE_FILES`) and times
them; only if they were slow does the rest go to the IO threads, whose own
timing then decides the next writes. Handing a write that is
fast to store to the IO threads costs more CPU than it saves (on one CPU,
every file wakes an IO thread and then the compute thread waiting for its
parcel; docs/performance.md), so the first write of an array handle must
not pay it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.codecs.sharding import ShardingCodec

from zarr_fused._buffers import buffers
from zarr_fused._dtypes import empty, empty_rule_pattern
from zarr_fused._merge import is_empty_chunk, merge_and_encode, merge_owned
from zarr_fused._native import io_kernels
from zarr_fused._pool import partition, run_parallel
from zarr_fused._zarr_compat import encode_partial_sync
from zarr_fused.io.engine import Writes, resolve_io_concurrency, write_window
from zarr_fused.io.local import local_files, make_parents, write_parts
from zarr_fused.io.probe import FAST_STORE, PROBE_FILES, LatencyProbe
from zarr_fused.io.shard_lock import ShardLocks, shard_locks
from zarr_fused.stats import note_encoded, note_stores, timed_writer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer

    from zarr_fused._batch import WriteRequest
    from zarr_fused._batch_chain import BatchChain
    from zarr_fused._chain import Chain
    from zarr_fused._items import WriteItem

__all__ = ["ChunkWriter", "NativeChunkWriter", "PartialEncodeWriter"]

#: most chunks one group encodes before handing its files to the IO threads
#: (the IO threads start on a group's files while the next one encodes)
WRITE_GROUP = 32
#: most chunk files one IO request writes
MAX_FILES_PER_STORE = 16


def files_per_store(n: int, window: int) -> int:
    """Chunk files per IO request for a write of ``n`` files with ``window``
    requests in flight (`zarr_fused.io.engine.write_window`): about four
    requests per place in the window, so a slow filesystem still has every
    place busy, and several files per request where there are many, so a
    hot page cache does not pay a hand-off between threads for every file."""
    return max(1, min(MAX_FILES_PER_STORE, -(-n // (4 * window))))


class ChunkWriter:
    """Whole-chunk writes through a chain.

    When each chunk is a shard (zarr's sharding codec behind other codecs,
    so it has no partial encode), a chunk the write covers only in part is
    held from its read to its replacement, like any partial shard update
    (`zarr_fused.io.shard_lock`)."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        transform = getattr(chain, "transform", None)
        self.shards = isinstance(getattr(transform, "_ab_codec", None), ShardingCodec)

    def write(self, batch: Sequence[WriteItem], request: WriteRequest) -> None:
        chain, value, drop_axes = self.chain, request.value, request.drop_axes

        def update(item: WriteItem) -> None:
            setter, spec, _, _, is_complete = item
            existing = None if is_complete else setter.get_sync(prototype=spec.prototype)
            encoded = merge_and_encode(chain, existing, value, item, drop_axes)
            if encoded is None:
                setter.delete_sync()
            else:
                setter.set_sync(encoded)

        locks = shard_locks(batch) if self.shards else None
        _update_held(update, batch, request.max_workers, locks)


class PartialEncodeWriter:
    """Writes through the array->bytes codec's synchronous partial encode,
    which reads the existing shard, merges and rewrites it.

    A shard the write does not cover whole is held exclusively from that
    read to its replacement (`zarr_fused.io.shard_lock`), each on the one
    thread that updates it, unless ``codec_pipeline.shard_write_lock`` is
    off."""

    def __init__(self, codec: ArrayBytesCodec) -> None:
        self.codec = codec

    def write(self, batch: Sequence[WriteItem], request: WriteRequest) -> None:
        self.write_held(batch, request, shard_locks(batch))

    def write_held(
        self, batch: Sequence[WriteItem], request: WriteRequest, locks: ShardLocks | None
    ) -> None:
        """`write` with the holds given (None: none taken, as when the
        caller holds the shard already)."""
        encode_partial = encode_partial_sync(self.codec)
        value = request.value
        scalar = len(value.shape) == 0

        def update(item: WriteItem) -> None:
            setter, spec, chunk_selection, out_selection, _ = item
            chunk_value = value if scalar else value[out_selection]
            encode_partial(setter, chunk_value, chunk_selection, spec)

        _update_held(update, batch, request.max_workers, locks)


def _update_held(
    update: Callable[[WriteItem], None],
    batch: Sequence[WriteItem],
    max_workers: int,
    locks: ShardLocks | None,
) -> None:
    """``update`` each item of ``batch`` on the compute threads; an item the
    write covers only in part runs under its shard's hold, from its read to
    its replacement (``locks`` None: no holds, the caller's or none needed)."""

    def update_one(item: WriteItem) -> None:
        setter, _, _, _, is_complete = item
        if locks is None or is_complete:
            update(item)
            return
        with locks.hold(setter):
            update(item)

    run_parallel(update_one, batch, max_workers)


def _is_complete(item: WriteItem) -> bool:
    _, _, _, _, is_complete = item
    return is_complete


def _hashable(key: Any) -> bool:
    """Whether ``key`` can key a dict (a selection may hold arrays)."""
    try:
        hash(key)
    except TypeError:
        return False
    return True


class NativeChunkWriter:
    """Whole-chunk writes through the batch kernels (a native chain, or
    filters that all have a kernel over one), one nogil call per group for
    decoding the existing chunks and one for encoding; what they do not
    take (another value type, a chunk spec of another array) through
    ``generic`` (a `ChunkWriter` of the same chain, or of the plan's hybrid
    chain for filters)."""

    def __init__(self, chain: BatchChain, generic: ChunkWriter) -> None:
        self.chain = chain
        self.generic = generic
        #: the fastest a chunk file was stored, per file, by the IO threads
        #: or by a probe on the compute threads, and when
        self.probe = LatencyProbe(FAST_STORE)

    def _behind(self) -> bool | None:
        """Whether the IO threads store this write's files (see the module
        docstring): True while they were recently found slow, False while
        fast, None when there is no recent measurement (probe first)."""
        fast = self.probe.verdict()
        return None if fast is None else not fast

    def _probe(self, job: _ChunkWrite, max_workers: int) -> int:
        """Store the first `PROBE_FILES` files per compute thread from the
        compute threads, timed (encode included: an upper bound of the
        store's cost) into `probe`; returns how many items that covered."""
        n = min(len(job.batch), PROBE_FILES * max(1, max_workers))
        groups = partition(n, max_workers, max_group=PROBE_FILES)
        began = time.perf_counter()
        run_parallel(job.write_group, groups, max_workers)
        threads = max(1, min(max_workers, len(groups)))
        self.probe.measured((time.perf_counter() - began) * threads / n)
        return n

    def write(self, batch: Sequence[WriteItem], request: WriteRequest) -> None:
        _, spec0, *_ = batch[0]
        if not self.chain.handles(spec0) or type(request.value.as_ndarray_like()) is not np.ndarray:
            self.generic.write(batch, request)
            return
        max_workers = request.max_workers
        job = _ChunkWrite(self.chain, batch, request)
        io_concurrency = resolve_io_concurrency() if job.prefix is not None else 1
        behind = self._behind() if io_concurrency > 1 and io_kernels is not None else False
        start = 0
        if behind is None:
            start = self._probe(job, max_workers)
            behind = not self.probe.seen_fast()
        rest = len(batch) - start
        if not behind:
            groups = _shifted(partition(rest, max_workers), start)
            run_parallel(job.write_group, groups, max_workers)
            return
        groups = _shifted(partition(rest, max_workers, max_group=WRITE_GROUP), start)
        with Writes(io_concurrency) as writes:
            job.writes = writes
            job.files_per_store = files_per_store(rest, write_window(io_concurrency))
            run_parallel(job.write_group, groups, max_workers)
        if job.fastest != float("inf"):
            self.probe.measured(job.fastest)


def _shifted(groups: list[range], start: int) -> list[range]:
    """``groups`` (ranges from 0) moved to begin at ``start``."""
    return [range(g.start + start, g.stop + start) for g in groups] if start else groups


#: what one chunk of a write comes to before the encode kernel runs: bytes
#: to store now (None: delete the chunk), or an array to queue for the kernel
_Merged = tuple["Buffer | None", "np.ndarray | None"]


class _ChunkWrite:
    """One `NativeChunkWriter.write` call, group by group: decode the chunks
    written in part, merge, encode the group in one nogil call, store."""

    def __init__(
        self, chain: BatchChain, batch: Sequence[WriteItem], request: WriteRequest
    ) -> None:
        self.chain = chain
        self.batch = batch
        self.value = request.value
        self.drop_axes = request.drop_axes
        self.scalar = request.value.shape == ()
        _, spec0, *_ = batch[0]
        self.ndim = max(len(spec0.shape), 1)
        # the fill pattern when the encode kernel runs zarr's empty-chunk
        # test itself (see `empty_rule_pattern`), else None
        self.empty_pattern = empty_rule_pattern(spec0, chain.dtype)
        # complete chunks of a scalar write: one outcome per chunk shape and selection
        self._shared: dict[Any, Buffer | None] = {}
        self._shared_lock = threading.Lock()
        self.prefix = local_files(batch, write=True)
        if self.prefix is not None:
            make_parents(self.prefix, batch)
        #: the IO threads' stores of this write, when they do the file IO
        self.writes: Writes | None = None
        self.files_per_store = 1
        #: the fastest IO request of this write, in seconds per file
        self.fastest = float("inf")

    def _path(self, key: Any) -> bytes | None:
        return None if self.prefix is None else self.prefix + os.fsencode(key.path)

    def _merged(self, merged: np.ndarray, spec: ArraySpec, *, queued: bool = False) -> _Merged:
        """What to do with a merged chunk; with ``queued``, the kernel's
        empty-chunk test replaces zarr's where it can run it."""
        kernel_checks = (
            queued and self.empty_pattern is not None and merged.dtype == self.chain.dtype
        )
        if not kernel_checks and is_empty_chunk(
            spec.prototype.nd_buffer.from_ndarray_like(merged), spec
        ):
            return None, None
        if self.chain.encode_swap(merged) is None:
            return self.chain.fallback.encode(
                spec.prototype.nd_buffer.from_ndarray_like(merged), spec
            ), None
        return None, merged

    def _scalar_chunk(self, item: WriteItem) -> Buffer | None:
        """The bytes of a complete chunk of a scalar write (None: empty)."""
        setter, spec, chunk_selection, out_selection, _ = item
        # "complete" edge chunks cover only their in-bounds part, so the
        # outcome depends on the chunk selection as well as the shape
        memo_key = (spec.shape, chunk_selection)
        memo = _hashable(memo_key)
        with self._shared_lock:
            if memo and memo_key in self._shared:
                return self._shared[memo_key]
            merged = merge_owned(
                None, self.value, out_selection, spec, chunk_selection, True, self.drop_axes
            )
            ready, array = self._merged(merged, spec)
            if array is not None:
                ready = self.chain.encode(
                    spec.prototype.nd_buffer.from_ndarray_like(array), spec, setter
                )
            if memo:
                self._shared[memo_key] = ready
        return ready

    def _decode_existing(self, indices: range) -> dict[int, np.ndarray]:
        """The stored chunks of the items the write covers in part, decoded
        in one nogil call (missing ones are left out)."""
        chain = self.chain
        partial = [i for i in indices if not _is_complete(self.batch[i])]
        existing: dict[int, np.ndarray] = {}
        if not partial:
            return existing
        decoding = chain.kernel_batch(len(partial), self.ndim)
        decoding.set_fill(b"\0" * chain.dtype.itemsize)
        decoded_items = []
        for i in partial:
            setter, spec, _, _, _ = self.batch[i]
            array = empty(spec.shape, chain.dtype)
            layout = chain.layout(spec.shape)
            path = self._path(setter)
            if path is not None:
                decoding.add_file(path, layout, (), array, (), (), setter)
            else:
                raw = setter.get_sync(prototype=spec.prototype)
                if raw is None:
                    continue
                decoding.add(raw.as_numpy_array(), layout, (), array, (), (), setter)
            decoded_items.append(i)
            existing[i] = array
        for position in decoding.run():  # the files that were missing
            del existing[decoded_items[position]]
        return existing

    def _arena(self, indices: range) -> np.ndarray | None:
        """The pooled buffer a group is encoded into when the IO threads
        write it (room for every chunk's encoded size bound), else None."""
        if self.writes is None:
            return None
        chain = self.chain
        size = 0
        for i in indices:
            _, spec, *_ = self.batch[i]
            size += chain.encode_bound(chain.layout(spec.shape).nbytes)
        return buffers.take(size)

    def write_group(self, indices: range) -> None:
        chain = self.chain
        existing = self._decode_existing(indices)
        arena = self._arena(indices)
        encoding = chain.encode_batch(len(indices), self.ndim, arena=arena)
        if self.empty_pattern is not None:
            encoding.set_fill(self.empty_pattern)
        # per item: bytes to store now, or (-1 if none) its place in `encoding`
        results: list[tuple[int, Buffer | None, int]] = []
        for i in indices:
            setter, spec, chunk_selection, out_selection, is_complete = self.batch[i]
            if self.scalar and is_complete:
                results.append((i, self._scalar_chunk(self.batch[i]), -1))
                continue
            merged = merge_owned(
                existing.get(i),
                self.value,
                out_selection,
                spec,
                chunk_selection,
                is_complete,
                self.drop_axes,
            )
            ready, array = self._merged(merged, spec, queued=True)
            position = -1
            if array is not None:
                position = encoding.add(
                    array,
                    chain.layout(spec.shape),
                    chain.encode_swap(array),
                    setter,
                    None if arena is not None or not chain.encodes_to_files else self._path(setter),
                    self.empty_pattern is not None and array.dtype == chain.dtype,
                )
            results.append((i, ready, position))
        encoded = encoding.run() if len(encoding) else []
        note_encoded(self.batch, results, encoded, self._path)
        if arena is None:
            self._store(results, encoded)
        else:
            self._hand_over(results, encoded, arena)

    def _store(self, results: list[tuple[int, Buffer | None, int]], encoded: list[Any]) -> None:
        """Store the group's chunks from the compute thread: on a
        LocalStore as the IO threads' parcel does (`_file_stores`: each
        file written natively, atomically), else through each key."""
        if self.prefix is not None and io_kernels is not None:
            stores = self._file_stores(results, encoded)
            note_stores(self.batch[0][0], stores)
            for fn, *args in stores:
                fn(*args)
            return
        for i, ready, position in results:
            setter, spec, _, _, _ = self.batch[i]
            if position >= 0:
                result = encoded[position]
                if result is None:  # written to its file
                    continue
                # False: all fill value
                ready = None if result is False else spec.prototype.buffer.from_array_like(result)
            if ready is None:
                setter.delete_sync()
            else:
                setter.set_sync(ready)

    def _file_stores(
        self, results: list[tuple[int, Buffer | None, int]], encoded: list[Any]
    ) -> list[tuple[Any, ...]]:
        """The group's stores on a LocalStore, one per chunk not written by
        the encode kernel itself: ``(delete,)`` for a chunk left all fill
        value, ``(write_parts, path, [bytes])`` otherwise (timed into the
        batch's sink, if any)."""
        stores: list[tuple[Any, ...]] = []
        write = timed_writer(self.batch[0][0], write_parts)
        for i, ready, position in results:
            setter, *_ = self.batch[i]
            stored: Any = ready
            if position >= 0:
                result = encoded[position]
                if result is None:  # written to its file by the encode kernel
                    continue
                stored = None if result is False else result  # False: all fill value
            elif ready is not None:
                stored = ready.as_numpy_array()
            if stored is None:
                stores.append((setter.delete_sync,))
            else:
                stores.append((write, self._path(setter), [stored]))
        return stores

    def _hand_over(
        self, results: list[tuple[int, Buffer | None, int]], encoded: list[Any], arena: np.ndarray
    ) -> None:
        """Give the group's stores to the IO threads, as one parcel that
        pins ``arena`` (its encoded chunks are views into it) until the last
        file is written; `files_per_store` files go to one IO request."""
        assert self.writes is not None
        stores = self._file_stores(results, encoded)
        note_stores(self.batch[0][0], stores)
        step = self.files_per_store
        with self.writes.parcel(arena.nbytes, lambda: buffers.give(arena)) as parcel:
            for start in range(0, len(stores), step):
                parcel.store(self._run_stores, stores[start : start + step])

    def _run_stores(self, stores: list[tuple[Any, ...]]) -> None:
        """Several stores, one after another, in one IO request (timed)."""
        began = time.perf_counter()
        for fn, *args in stores:
            fn(*args)
        # a lost update between two IO threads only loses one sample
        self.fastest = min(self.fastest, (time.perf_counter() - began) / len(stores))
