"""The sharded read path: native shard index, planned inner-chunk decodes.

For every shard in a batch, `ShardReader` works out from the selection
which inner chunks it touches (`zarr_fused._shard.plan_selection`), then
fetches with zarr's IO pattern: the whole shard in one get when the
selection touches every inner chunk, else the index, then only the needed
inner chunks, coalesced through ``Store.get_ranges_sync`` with zarr's
``sharding_coalesce_*`` settings. The index is decoded and checked natively,
and the touched inner chunks become decode tasks that write straight into
the output.

Batches with many shards give each worker whole shards (fetch, then decode,
per shard). Batches with few shards go in waves of one shard per worker:
the wave is fetched in parallel, then all its inner chunks are decoded by
all workers, so one big shard still uses every core. Either way at most
one shard per worker is in memory at a time.

Selections the planner does not cover (integer arrays, masks, coordinate
selections) decode the touched inner chunks natively into a temporary of
the selection's shape, exactly as zarr's sharding codec assembles it, and
scatter that.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest, _store_supports_sync_io
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.crc32c_ import Crc32cCodec
from zarr.codecs.sharding import ShardingCodec
from zarr.core.chunk_grids import ChunkGrid
from zarr.core.chunk_utils import evolve_codecs
from zarr.core.indexing import get_indexer

from zarr_fused._chain import NativeChain, native_chain_params
from zarr_fused._native import index_kernels, io_kernels, shard_kernels, shard_local_kernels
from zarr_fused._output import fill_missing, scatter_array
from zarr_fused._pool import partition, run_parallel
from zarr_fused._read import MISSING, PRESENT, describe_key, fill_pattern, local_files
from zarr_fused.errors import CorruptShardError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

    from zarr_fused._read import PartialDecodeReader, ReadItem

__all__ = ["ShardReader", "shard_reader_reason"]

_MISSING = np.uint64(2**64 - 1)

#: Within a local file, a coalesced read never spans a gap wider than this.
#: zarr's ``sharding_coalesce_max_gap_bytes`` (1 MiB by default) is tuned for
#: object stores, where a request costs milliseconds; a pread from the page
#: cache costs about as much as copying 10-20 KiB, so reading a wider gap
#: only to throw it away is slower than a second pread. (A thin slab of a
#: shard written in zarr's default Morton order read twice the bytes it
#: needed at 1 MiB.)
LOCAL_MAX_GAP = 16 << 10


def _index_format(codec: ShardingCodec) -> tuple[bool, bool] | None:
    """(crc32c, big-endian) of the index codecs, None when not native."""
    codecs = codec.index_codecs
    if not codecs or type(codecs[0]) is not BytesCodec:
        return None
    if len(codecs) == 2 and type(codecs[1]) is not Crc32cCodec or len(codecs) > 2:
        return None
    return len(codecs) == 2, codecs[0].endian == "big"


def shard_reader_reason(codec: Any, spec: ArraySpec) -> tuple[str, NativeChain | None]:
    """("", inner chain) when `ShardReader` can read ``codec``'s shards,
    else (why not, None)."""
    if shard_kernels is None:
        return "the compiled extensions are missing", None
    if type(codec) is not ShardingCodec:
        return f"{type(codec).__name__} reads with zarr's code", None
    if _index_format(codec) is None:
        names = " -> ".join(type(c).__name__ for c in codec.index_codecs)
        return f"no native reader for the shard index codecs {names}", None
    inner_spec = codec._get_chunk_spec(spec)
    inner_codecs = evolve_codecs(codec.codecs, inner_spec)
    reason, params = native_chain_params(inner_codecs, inner_spec)
    if reason:
        return f"inner chunks: {reason}", None
    from zarr.core.chunk_utils import ChunkTransform

    from zarr_fused._chain import TransformChain

    fallback = TransformChain(ChunkTransform(codecs=inner_codecs), "")
    return "", NativeChain(inner_spec, params, fallback)


class _Buffers:
    """Shard-sized byte buffers, reused across reads.

    A fresh multi-megabyte allocation faults in every page on first touch,
    which costs as much as reading the shard; a few buffers kept between
    reads (and the writes' encode arenas) avoid that. While idle, at most
    ``keep`` buffers and ``max_bytes`` bytes are held, so huge shards do not
    leave gigabytes behind.
    """

    def __init__(self, keep: int = 4, max_bytes: int = 256 << 20) -> None:
        self.keep = keep
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> np.ndarray:
        with self._lock:
            best = -1
            for i, b in enumerate(self._free):
                if b.nbytes >= size and (best < 0 or b.nbytes < self._free[best].nbytes):
                    best = i
            if best >= 0:
                return self._free.pop(best)
        return np.empty(max(size, 1 << 16), dtype=np.uint8)

    def give(self, buf: np.ndarray | None) -> None:
        if buf is None:
            return
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                smallest = min(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                self._free.pop(smallest)
            held = sum(b.nbytes for b in self._free)
            while held > self.max_bytes:
                largest = max(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                held -= self._free.pop(largest).nbytes


_buffers = _Buffers()

if hasattr(os, "register_at_fork"):  # the lock may be held by a thread the child lacks
    os.register_at_fork(after_in_child=lambda: setattr(_buffers, "_lock", threading.Lock()))


class _Shard:
    """What one shard contributes to a batch, once fetched."""

    __slots__ = ("buffer", "entries", "index", "missing", "payload", "plan")

    def __init__(self, index: int, plan: Any) -> None:
        self.index = index
        self.plan = plan
        self.payload: Any = None
        self.entries: Any = None
        self.buffer: np.ndarray | None = None
        self.missing = False

    def release(self) -> None:
        """Drop the fetched bytes once decoded (bounds memory to the shards
        in flight)."""
        self.payload = None
        self.entries = None
        _buffers.give(self.buffer)
        self.buffer = None


class ShardReader:
    """Native reads of shards through their index (see the module docstring)."""

    def __init__(self, codec: ShardingCodec, chain: NativeChain, fallback: PartialDecodeReader) -> None:
        self.codec = codec
        self.chain = chain
        self.fallback = fallback
        self.inner_shape = tuple(codec.chunk_shape)
        self.checksum, self.big_endian = _index_format(codec)  # type: ignore[misc]
        self._fill_cache: tuple[Any, bytes] | None = None

    def _fill(self, spec: ArraySpec, dtype: np.dtype[Any]) -> bytes:
        key = (spec.fill_value, dtype)
        cached = self._fill_cache
        if cached is None or cached[0] != key:
            cached = (key, fill_pattern(spec, dtype))
            self._fill_cache = cached
        return cached[1]

    # -- fetching ----------------------------------------------------------------------

    def _index_size(self, n_chunks: int) -> int:
        return 16 * n_chunks + (4 if self.checksum else 0)

    def _parse(self, raw: Any, n: int, grid: tuple[int, ...], key: Any,
               shard_len: int = -1, index_start: int = 0) -> np.ndarray:
        return index_kernels.parse_index(  # type: ignore[union-attr]
            raw, n, checksum=self.checksum, big_endian=self.big_endian, shard_len=shard_len,
            index_start=index_start, grid=grid, where=lambda: describe_key(key),
        )

    def _fetch(self, getter: Any, spec: ArraySpec, touched: np.ndarray | None,
               grid: tuple[int, ...], shard: _Shard) -> None:
        """Fill in ``shard`` (payload and index), or mark it missing.

        ``touched`` None means every inner chunk (one get for the shard).
        """
        n = math.prod(grid)
        size = self._index_size(n)
        at_start = self.codec.index_location == "start"
        prefix = local_files([(getter,)]) if io_kernels is not None else None
        if prefix is not None:
            self._fetch_local(prefix + os.fsencode(getter.path), getter, spec, touched, grid, shard)
            return
        if touched is None:
            raw = getter.get_sync(prototype=spec.prototype)
            if raw is None:
                shard.missing = True
                return
            data = raw.as_numpy_array()
            if len(data) < size:
                raise CorruptShardError.truncated(describe_key(getter), len(data), size)
            index = data[:size] if at_start else data[len(data) - size:]
            shard.entries = self._parse(index, n, grid, getter, len(data),
                                        0 if at_start else len(data) - size)
            shard.payload = data
            return
        request = RangeByteRequest(0, size) if at_start else SuffixByteRequest(size)
        index = getter.get_sync(prototype=spec.prototype, byte_range=request)
        if index is None:
            shard.missing = True
            return
        entries = self._parse(index.as_numpy_array(), n, grid, getter)
        present = touched[entries[touched, 0] != _MISSING]
        shard.entries = entries.copy()
        if present.size == 0:
            shard.payload = np.empty(0, dtype=np.uint8)
            return
        starts = entries[present, 0]
        lengths = entries[present, 1]
        ranges = [RangeByteRequest(int(s), int(s + n_)) for s, n_ in zip(starts, lengths)]
        buffers = self._get_ranges(getter, spec, ranges)
        if buffers is None:  # the shard vanished after its index was read
            shard.missing = True
            return
        # The lengths come from the stored index: check them against the bytes
        # that arrived before sizing anything from them.
        fetched = [buf.as_numpy_array() for buf in buffers]
        for i, data in enumerate(fetched):
            if len(data) != int(lengths[i]):
                raise CorruptShardError(
                    f"{describe_key(getter)}: inner chunk {int(present[i])} should hold "
                    f"{int(lengths[i])} bytes from byte {int(starts[i])}, the shard has "
                    f"{len(data)} there (truncated shard)")
        # pack the fetched chunks into one buffer, the index pointing into it
        offsets = np.zeros(len(present), dtype=np.uint64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        payload = np.empty(sum(len(data) for data in fetched), dtype=np.uint8)
        for i, data in enumerate(fetched):
            payload[int(offsets[i]):int(offsets[i]) + len(data)] = data
        shard.entries[present, 0] = offsets
        shard.payload = payload

    def _fetch_local(self, path: bytes, getter: Any, spec: ArraySpec, touched: np.ndarray | None,
                     grid: tuple[int, ...], shard: _Shard) -> None:
        """`_fetch` for zarr's LocalStore: the same reads, done natively
        into reused buffers (preadv for coalesced ranges)."""
        n = math.prod(grid)
        size = self._index_size(n)
        at_start = self.codec.index_location == "start"
        if touched is None:
            buf = _buffers.take(4 * size)
            length = io_kernels.read_into(path, buf)  # type: ignore[union-attr]
            while length is not None and length > len(buf):  # the buffer is too small
                _buffers.give(buf)
                buf = _buffers.take(length)
                length = io_kernels.read_into(path, buf)  # type: ignore[union-attr]
            shard.buffer = buf
            if length is None:
                shard.missing = True
                return
            if length < size:
                raise CorruptShardError.truncated(describe_key(getter), length, size)
            data = buf[:length]
            index = data[:size] if at_start else data[length - size:]
            shard.entries = self._parse(index, n, grid, getter, length, 0 if at_start else length - size)
            shard.payload = data
            return
        fetched = shard_local_kernels.fetch_partial_local(  # type: ignore[union-attr]
            path, n, np.ascontiguousarray(touched, dtype=np.intp), _buffers.take,
            give=_buffers.give, **self._partial_local_args(getter, spec, grid, len(touched)),
        )
        if fetched is None:
            shard.missing = True
            return
        shard.entries, shard.payload, shard.buffer = fetched

    def _partial_local_args(self, getter: Any, spec: ArraySpec, grid: tuple[int, ...],
                            n_touched: int) -> dict[str, Any]:
        """The settings of a native partial read of a local shard."""
        # what the touched chunks hold when each encodes to about its raw
        # size (the codecs' worst case), so that one buffer usually fits them
        inner_nbytes = math.prod(self.inner_shape) * spec.dtype.to_native_dtype().itemsize
        return dict(
            checksum=self.checksum, big_endian=self.big_endian,
            at_start=self.codec.index_location == "start",
            max_gap=min(spec.config.sharding_coalesce_max_gap_bytes, LOCAL_MAX_GAP),
            max_coalesced=spec.config.sharding_coalesce_max_bytes,
            size_hint=n_touched * (inner_nbytes + inner_nbytes // 16 + 1024),
            grid=grid, where=lambda: describe_key(getter),
        )

    def _get_ranges(self, getter: Any, spec: ArraySpec, ranges: list[RangeByteRequest]) -> list[Any] | None:
        store = getattr(getter, "store", None)
        if isinstance(store, Store) and _store_supports_sync_io(store):
            results: list[Any] = [None] * len(ranges)
            try:
                for i, buf in store.get_ranges_sync(
                    getter.path, ranges, prototype=spec.prototype,
                    max_gap_bytes=spec.config.sharding_coalesce_max_gap_bytes,
                    max_coalesced_bytes=spec.config.sharding_coalesce_max_bytes,
                ):
                    results[i] = buf
            except BaseExceptionGroup as group:
                _, rest = group.split(FileNotFoundError)
                if rest is not None:
                    raise rest from None
                return None
            if any(r is None for r in results):
                return None
            return results
        out = []
        for request in ranges:
            buf = getter.get_sync(prototype=spec.prototype, byte_range=request)
            if buf is None:
                return None
            out.append(buf)
        return out

    # -- the batch ----------------------------------------------------------------------

    def read(
        self,
        batch: Sequence[ReadItem],
        out: NDBuffer,
        drop_axes: tuple[int, ...],
        max_workers: int,
    ) -> tuple[Any, ...]:
        chain = self.chain
        dst = out.as_ndarray_like()
        spec0 = batch[0][1]
        # inner chunks share the shard spec's dtype and prototype, all that
        # `writes_into` looks at
        if not chain.writes_into(dst, spec0):
            return self.fallback.read(batch, out, drop_axes, max_workers)
        pattern = self._fill(spec0, dst.dtype)
        statuses: list[Any] = [PRESENT] * len(batch)
        plan_selection = shard_kernels.plan_selection  # type: ignore[union-attr]
        shards = []
        for i, (_, spec, chunk_selection, _, _) in enumerate(batch):
            plan = None if drop_axes else plan_selection(spec.shape, self.inner_shape, chunk_selection)
            shards.append(_Shard(i, plan))

        def fetch(shard: _Shard) -> _Shard:
            getter, spec, chunk_selection, out_selection, _ = batch[shard.index]
            grid = tuple(s // c for s, c in zip(spec.shape, self.inner_shape))
            if shard.plan is not None:
                touched = None if shard.plan.all_touched else shard.plan.touched()
                if shard.plan.n_touched:
                    self._fetch(getter, spec, touched, grid, shard)
                else:
                    shard.payload = np.empty(0, np.uint8)
            else:
                self._fetch_general(getter, spec, chunk_selection, grid, shard)
            return shard

        def queue(group: Any, shard: _Shard) -> bool:
            """Queue a fetched shard's planned decodes into ``group``."""
            getter, spec, _, out_selection, _ = batch[shard.index]
            if shard.missing:
                statuses[shard.index] = MISSING
                fill_missing(out, out_selection, spec)
                return True
            if shard.plan is None:
                return False
            return shard_kernels.add_shard(  # type: ignore[union-attr]
                group, shard.payload, shard.entries, shard.plan,
                chain.layout(self.inner_shape), dst, out_selection, getter,
            )

        def finish_general(shard: _Shard) -> None:
            if not shard.missing:
                self._decode_general(batch[shard.index], shard, out, drop_axes, pattern)

        ndim = max(dst.ndim, len(self.inner_shape))
        describe = _inner_describer(tuple(s // c for s, c in zip(spec0.shape, self.inner_shape)))

        def read_local_partial(shard: _Shard) -> bool:
            """Fetch and decode a partly touched local shard in one native
            call (one release of the GIL); False where that does not apply."""
            plan = shard.plan
            if plan is None or plan.all_touched or not plan.n_touched or io_kernels is None:
                return False
            getter, spec, _, out_selection, _ = batch[shard.index]
            prefix = local_files([(getter,)])
            if prefix is None:
                return False
            group = chain.kernel_batch(plan.n_touched, ndim, describe)
            group.set_fill(pattern)
            if not shard_kernels.add_shard(  # type: ignore[union-attr]
                    group, None, None, plan, chain.layout(self.inner_shape), dst, out_selection,
                    getter, defer=True):
                return False
            grid = tuple(s // c for s, c in zip(spec.shape, self.inner_shape))
            touched = np.ascontiguousarray(plan.touched(), dtype=np.intp)
            found = shard_local_kernels.read_shard_local(  # type: ignore[union-attr]
                group, 0, prefix + os.fsencode(getter.path), math.prod(grid), touched,
                _buffers.take, _buffers.give,
                **self._partial_local_args(getter, spec, grid, len(touched)),
            )
            if not found:
                statuses[shard.index] = MISSING
                fill_missing(out, out_selection, spec)
            return True

        def one_shard(shard: _Shard) -> None:
            if read_local_partial(shard):
                return
            fetch(shard)
            count = shard.plan.n_touched if shard.plan is not None else 0
            group = chain.kernel_batch(count, ndim, describe)
            group.set_fill(pattern)
            if queue(group, shard):
                group.run()
            else:
                finish_general(shard)
            shard.release()

        # Shard by shard when there are enough shards to go round, or nothing
        # to spread (one inner chunk in all: a point or small-box read);
        # else in waves, the inner chunks of a wave's shards spread over the
        # workers.
        if (len(shards) >= 2 * max_workers or max_workers <= 1
                or (len(shards) == 1 and shards[0].plan is not None
                    and shards[0].plan.n_touched <= 1)):
            run_parallel(one_shard, shards, max_workers)
            return tuple(statuses)

        for start in range(0, len(shards), max_workers):
            wave = run_parallel(fetch, shards[start:start + max_workers], max_workers)
            capacity = sum(s.plan.n_touched for s in wave if s.plan is not None)
            group = chain.kernel_batch(capacity, ndim, describe)
            group.set_fill(pattern)
            general = [s for s in wave if not queue(group, s)]
            n = len(group)
            if n:
                parts = partition(n, max_workers, max_group=max(1, -(-n // (2 * max_workers))))
                run_parallel(lambda r: group.run_range(r.start, r.stop), parts, max_workers)
            run_parallel(finish_general, general, max_workers)
            del group
            for shard in wave:
                shard.release()
        return tuple(statuses)

    # -- selections the planner does not cover -------------------------------------------

    def _fetch_general(self, getter: Any, spec: ArraySpec, chunk_selection: Any,
                       grid: tuple[int, ...], shard: _Shard) -> None:
        indexer = get_indexer(
            chunk_selection, shape=spec.shape,
            chunk_grid=ChunkGrid.from_sizes(spec.shape, self.inner_shape),
        )
        items = list(indexer)
        shard.plan = None
        shard.payload = (indexer, items)
        coords = {c for c, *_ in items}
        if not coords:
            shard.entries = None
            return
        linear = np.unique(np.ravel_multi_index(tuple(np.array(sorted(coords)).T), grid))
        inner = _Shard(shard.index, None)
        self._fetch(getter, spec, None if len(linear) == int(np.prod(grid)) else linear, grid, inner)
        shard.missing = inner.missing
        shard.entries = (inner.entries, inner.payload)
        shard.buffer, inner.buffer = inner.buffer, None

    def _decode_general(self, item: ReadItem, shard: _Shard, out: NDBuffer,
                        drop_axes: tuple[int, ...], pattern: bytes) -> None:
        getter, spec, _, out_selection, _ = item
        indexer, items = shard.payload
        chain = self.chain
        temp = spec.prototype.nd_buffer.empty(
            shape=indexer.shape, dtype=spec.dtype.to_native_dtype(), order=spec.order
        )
        array = temp.as_ndarray_like()
        grid = tuple(s // c for s, c in zip(spec.shape, self.inner_shape))
        inner_spec = self.codec._get_chunk_spec(spec)
        layout = chain.layout(self.inner_shape)
        if items:
            entries, payload = shard.entries
            group = chain.kernel_batch(len(items), max(array.ndim, len(grid)), _inner_describer(grid))
            group.set_fill(pattern)
            general = []
            for coords, inner_selection, temp_selection, _ in items:
                lin = int(np.ravel_multi_index(coords, grid))
                off, size = (int(v) for v in entries[lin])
                if off == 2**64 - 1:
                    queued = group.add_missing(array, temp_selection, (getter, lin))
                    raw = None
                else:
                    raw = payload[off:off + size]
                    queued = group.add(raw, layout, inner_selection, array, temp_selection, (),
                                       (getter, lin))
                if not queued:
                    general.append((lin, raw, inner_selection, temp_selection))
            group.run()
            for lin, raw, inner_selection, temp_selection in general:
                if raw is None:
                    fill_missing(temp, temp_selection, inner_spec)
                else:
                    chunk = chain.decode_array(_RawBuffer(raw), inner_spec, (getter, lin))
                    scatter_array(temp, temp_selection, np.asarray(chunk[inner_selection]), ())
        if hasattr(indexer, "sel_shape"):
            array = array.reshape(indexer.sel_shape)
        scatter_array(out, out_selection, array, drop_axes)


class _RawBuffer:
    """The one Buffer method `NativeChain.decode_array` uses, over a view."""

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def as_numpy_array(self) -> np.ndarray:
        return self.data


@functools.lru_cache(maxsize=64)
def _inner_describer(grid: tuple[int, ...]) -> Any:
    """Names ``(shard getter, linear inner chunk index)`` keys in errors."""

    def describe(key: Any) -> str:
        if isinstance(key, tuple) and len(key) == 2:
            getter, lin = key
            coords = tuple(int(c) for c in np.unravel_index(lin, grid))
            return f"inner chunk {coords} of shard {describe_key(getter)}"
        return f"chunk {describe_key(key)}"

    return describe
