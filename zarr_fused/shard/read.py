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

import math
import os
import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from zarr.abc.store import RangeByteRequest, Store, SuffixByteRequest
from zarr.core.chunk_grids import ChunkGrid
from zarr.core.indexing import get_indexer

from zarr_fused._batch import ReadTarget
from zarr_fused._buffers import RawBuffer, buffers
from zarr_fused._dtypes import fill_pattern
from zarr_fused._items import MISSING, PRESENT, describe_key
from zarr_fused._native import shard_kernels
from zarr_fused._pool import partition, run_parallel
from zarr_fused._scatter_py import fill_missing, scatter_array
from zarr_fused._zarr_compat import coalesce_ranges, inner_chunk_spec, store_supports_sync_io
from zarr_fused.errors import CorruptShardError
from zarr_fused.io.local import LOCAL_MAX_GAP, local_files, read_shard_part
from zarr_fused.shard.index import (
    MISSING_OFFSET,
    ShardSide,
    inner_describer,
    inner_grid,
    read_whole_shard,
)
from zarr_fused.stats import note_local, note_ranges

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.abc.codec import GetResult
    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

    from zarr_fused._batch import BatchReader, ReadRequest
    from zarr_fused._chain import NativeChain
    from zarr_fused._hybrid import FilteredChain
    from zarr_fused._items import ReadItem
    from zarr_fused.shard.pipelined import ShardIO

__all__ = ["LOCAL_MAX_GAP", "ShardReader"]


class _Shard:
    """What one shard contributes to a batch, once fetched."""

    __slots__ = ("buffer", "entries", "index", "missing", "n_ranges", "payload", "plan")

    def __init__(self, index: int, plan: Any) -> None:
        self.index = index
        self.plan = plan
        #: the inner chunks a partial fetch asked for: the most range reads it made
        self.n_ranges = 0
        self.payload: Any = None
        self.entries: Any = None
        self.buffer: np.ndarray | None = None
        self.missing = False

    def release(self) -> None:
        """Drop the fetched bytes once decoded (bounds memory to the shards
        in flight)."""
        self.payload = None
        self.entries = None
        buffers.give(self.buffer)
        self.buffer = None


class ShardReader(ShardSide):
    """Native reads of shards through their index (see the module docstring)."""

    chain: NativeChain | FilteredChain
    fallback: BatchReader

    def __init__(
        self,
        codec: ShardingCodec,
        chain: NativeChain | FilteredChain,
        fallback: BatchReader,
        io: ShardIO | None = None,
    ) -> None:
        super().__init__(codec, chain, fallback)
        self._fill_cache: tuple[Any, bytes] | None = None
        #: the largest whole shard read so far (see `read_whole_shard`)
        self._whole_hint = 0
        #: whether LocalStore batches go through the IO threads; the plan
        #: passes it in (`zarr_fused.shard.pipelined`), so this module sits
        #: below the IO engine; None: always the direct path
        self.io = io

    def _fill(self, spec: ArraySpec, dtype: np.dtype[Any]) -> bytes:
        key = (spec.fill_value, dtype)
        cached = self._fill_cache
        if cached is None or cached[0] != key:
            cached = (key, fill_pattern(spec, dtype))
            self._fill_cache = cached
        return cached[1]

    # -- fetching ----------------------------------------------------------------------

    def _fetch(
        self,
        getter: Any,
        spec: ArraySpec,
        touched: np.ndarray | None,
        grid: tuple[int, ...],
        shard: _Shard,
        prefetch: bool = False,
    ) -> None:
        """Fill in ``shard`` (payload and index), or mark it missing.

        ``touched`` None means every inner chunk (one get for the shard);
        ``prefetch``: see `_shard_part_settings`.
        """
        prefix = local_files([(getter,)], shard_io=True)
        shard.n_ranges = 0 if touched is None else len(touched)
        if touched is None:
            whole = read_whole_shard(getter, spec, self.fmt, grid, prefix, self._whole_hint)
            if whole is None:
                shard.missing = True
            else:
                # shards of an array are about alike: the next is read into a
                # buffer that holds this one, with a single open
                self._whole_hint = max(self._whole_hint, len(whole.data))
                shard.payload, shard.entries, shard.buffer = whole.data, whole.entries, whole.buffer
        elif prefix is not None:
            start = time.perf_counter()
            fetched = read_shard_part(
                prefix + os.fsencode(getter.path),
                math.prod(grid),
                np.ascontiguousarray(touched, dtype=np.intp),
                buffers.take,
                buffers.give,
                self._shard_part_settings(getter, spec, grid, len(touched), prefetch),
            )
            note_local(getter, "get_shard_part", 1, None, time.perf_counter() - start)
            if fetched is None:
                shard.missing = True
            else:
                shard.entries, shard.payload, shard.buffer = fetched
        else:
            self._fetch_ranges(getter, spec, touched, grid, shard)

    def fetch_inner(
        self, getter: Any, spec: ArraySpec, touched: np.ndarray | None, grid: tuple[int, ...]
    ) -> _Shard:
        """`_fetch` into a new shard record, for readers that decode its
        inner chunks themselves (`zarr_fused.shard.vlen`): its ``entries``
        locate each fetched inner chunk in its ``payload``; ``release`` it
        once decoded."""
        shard = _Shard(0, None)
        self._fetch(getter, spec, touched, grid, shard)
        return shard

    def _fetch_ranges(
        self,
        getter: Any,
        spec: ArraySpec,
        touched: np.ndarray,
        grid: tuple[int, ...],
        shard: _Shard,
    ) -> None:
        """`_fetch` of some inner chunks from any store: the index, then the
        touched chunks' byte ranges, coalesced as zarr's settings say."""
        n = math.prod(grid)
        size = self.fmt.size(n)
        request = RangeByteRequest(0, size) if self.fmt.at_start else SuffixByteRequest(size)
        index = getter.get_sync(prototype=spec.prototype, byte_range=request)
        if index is None:
            shard.missing = True
            return
        entries = self.fmt.parse(index.as_numpy_array(), n, grid, getter)
        present = touched[entries[touched, 0] != MISSING_OFFSET]
        shard.entries = entries.copy()
        if present.size == 0:
            shard.payload = np.empty(0, dtype=np.uint8)
            return
        starts = entries[present, 0]
        lengths = entries[present, 1]
        ranges = [RangeByteRequest(int(s), int(s + n_)) for s, n_ in zip(starts, lengths)]
        fetched = self._get_ranges(getter, spec, ranges)
        if fetched is None:  # the shard vanished after its index was read
            shard.missing = True
            return
        # The lengths come from the stored index: check them against the bytes
        # that arrived before sizing anything from them.
        for i, data in enumerate(fetched):
            if len(data) != int(lengths[i]):
                raise CorruptShardError(
                    f"{describe_key(getter)}: inner chunk {int(present[i])} should hold "
                    f"{int(lengths[i])} bytes from byte {int(starts[i])}, the shard has "
                    f"{len(data)} there (truncated shard)"
                )
        shard.entries[present, 0], shard.payload = _pack(fetched, lengths)

    def _shard_part_settings(
        self,
        getter: Any,
        spec: ArraySpec,
        grid: tuple[int, ...],
        n_touched: int,
        prefetch: bool = False,
    ) -> dict[str, Any]:
        """The settings of `read_shard_part` for a shard of this codec;
        ``prefetch`` asks the kernel for all touched ranges before reading
        them (the pipelined path, which runs while files answer slowly)."""
        # what the touched chunks hold when each encodes to about its raw
        # size (the codecs' worst case), so that one buffer usually fits them
        inner_nbytes = math.prod(self.inner_shape) * spec.dtype.to_native_dtype().itemsize
        return {
            "checksum": self.fmt.checksum,
            "big_endian": self.fmt.big_endian,
            "at_start": self.fmt.at_start,
            "max_gap": min(spec.config.sharding_coalesce_max_gap_bytes, LOCAL_MAX_GAP),
            "max_coalesced": spec.config.sharding_coalesce_max_bytes,
            "size_hint": n_touched * (inner_nbytes + inner_nbytes // 16 + 1024),
            "grid": grid,
            "where": lambda: describe_key(getter),
            "prefetch": prefetch,
        }

    def _get_ranges(
        self, getter: Any, spec: ArraySpec, ranges: list[RangeByteRequest]
    ) -> list[np.ndarray] | None:
        """The bytes of ``ranges`` of the key, None when it is missing."""
        store = getattr(getter, "store", None)
        if isinstance(store, Store) and store_supports_sync_io(store):
            results: list[Any] = [None] * len(ranges)
            try:
                for i, buf in store.get_ranges_sync(
                    getter.path,
                    ranges,
                    prototype=spec.prototype,
                    max_gap_bytes=spec.config.sharding_coalesce_max_gap_bytes,
                    max_coalesced_bytes=spec.config.sharding_coalesce_max_bytes,
                ):
                    results[i] = buf
                note_ranges(getter, ranges, spec.config, coalesce_ranges)
            except BaseExceptionGroup as group:
                _, rest = group.split(FileNotFoundError)
                if rest is not None:
                    raise rest from None
                return None
            if any(r is None for r in results):
                return None
            return [buf.as_numpy_array() for buf in results]
        out = []
        for request in ranges:
            buf = getter.get_sync(prototype=spec.prototype, byte_range=request)
            if buf is None:
                return None
            out.append(buf.as_numpy_array())
        return out

    def read_touched(
        self,
        spec: ArraySpec,
        shards: Sequence[tuple[Any, np.ndarray]],
        consume: Callable[[int, _Shard], None],
        max_workers: int,
    ) -> None:
        """Fetch the index and the touched inner chunks of every shard in
        ``shards`` (its getter, and the touched chunks' linear indices,
        ascending), as a read of them would (one get when every chunk is
        touched), and hand each to ``consume(i, shard)`` on a compute
        thread: it reads the shard's ``missing``, ``payload`` and
        ``entries``, whose bytes are released when it returns.

        The IO goes as the batches of `read` go: on a LocalStore whose
        files answer slowly (a network filesystem, a cold page cache), up
        to ``io_concurrency`` shards are fetched at once on the IO threads
        and each is consumed as soon as it is in
        (`zarr_fused.shard.pipelined.ShardIO`); otherwise each compute
        thread fetches, then consumes, its shards.
        """
        read = _TouchedBatch(self, spec, shards, consume)
        io = self.io
        if io is None or not shards:
            read.run(max_workers)
            return
        root = local_files([(getter,) for getter, _ in shards], shard_io=True)
        io_concurrency = io.applies(len(shards), max_workers, root)
        if io_concurrency:
            io.run(read, io_concurrency, max_workers)
            return
        start = time.perf_counter()
        read.run(max_workers)
        io.note_direct(time.perf_counter() - start)

    # -- the batch ----------------------------------------------------------------------

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        # inner chunks share the shard spec's dtype and prototype, all that
        # `writes_into` looks at (the one method of the chain `native` calls,
        # which a `FilteredChain` has as well)
        target = ReadTarget.native(
            cast("NativeChain", self.chain), batch, request, self.inner_shape, PRESENT, self._fill
        )
        if target is None:
            return self.fallback.read(batch, request)
        read = _ReadBatch(self, batch, target)
        max_workers = request.max_workers
        io = self.io
        if io is not None:
            root = local_files(batch, shard_io=True)
            io_concurrency = io.applies(len(batch), max_workers, root)
            if io_concurrency:
                io.run(read, io_concurrency, max_workers)
                return tuple(read.statuses)
            start = time.perf_counter()
            statuses = read.run(max_workers)
            io.note_direct(time.perf_counter() - start)
            return statuses
        return read.run(max_workers)

    # -- selections the planner does not cover -------------------------------------------

    def _fetch_general(
        self,
        getter: Any,
        spec: ArraySpec,
        chunk_selection: Any,
        grid: tuple[int, ...],
        shard: _Shard,
    ) -> None:
        indexer = get_indexer(
            chunk_selection,
            shape=spec.shape,
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
        self._fetch(
            getter, spec, None if len(linear) == int(np.prod(grid)) else linear, grid, inner
        )
        shard.missing = inner.missing
        shard.entries = (inner.entries, inner.payload)
        shard.buffer, inner.buffer = inner.buffer, None

    def _decode_general(self, item: ReadItem, shard: _Shard, target: ReadTarget) -> None:
        getter, spec, _, out_selection, _ = item
        indexer, items = shard.payload
        temp = spec.prototype.nd_buffer.empty(
            shape=indexer.shape, dtype=spec.dtype.to_native_dtype(), order=spec.order
        )
        # a CPU buffer (the chain handles spec), so a NumPy array
        array = cast("np.ndarray", temp.as_ndarray_like())
        if items:
            self._decode_general_items(getter, spec, items, shard, temp, target.pattern)
        if hasattr(indexer, "sel_shape"):
            array = array.reshape(indexer.sel_shape)
        scatter_array(target.out, out_selection, array, target.drop_axes)

    def _decode_general_items(
        self,
        getter: Any,
        spec: ArraySpec,
        items: list[Any],
        shard: _Shard,
        temp: NDBuffer,
        pattern: bytes,
    ) -> None:
        """Decode the inner chunks an indexer ``items`` names into ``temp``:
        natively where the kernels take the selection, else with NumPy."""
        chain = self.chain
        array = temp.as_ndarray_like()
        grid = inner_grid(spec, self.inner_shape)
        layout = chain.layout(self.inner_shape)
        entries, payload = shard.entries
        group = chain.kernel_batch(len(items), max(array.ndim, len(grid)), inner_describer(grid))
        group.set_fill(pattern)
        general = []
        for coords, inner_selection, temp_selection, _ in items:
            lin = int(np.ravel_multi_index(coords, grid))
            off, size = (int(v) for v in entries[lin])
            if off == MISSING_OFFSET:
                queued = group.add_missing(array, temp_selection, (getter, lin))
                raw = None
            else:
                raw = payload[off : off + size]
                queued = group.add(
                    raw, layout, inner_selection, array, temp_selection, (), (getter, lin)
                )
            if not queued:
                general.append((lin, raw, inner_selection, temp_selection))
        group.run()
        inner_spec = inner_chunk_spec(self.codec, spec)
        for lin, raw, inner_selection, temp_selection in general:
            if raw is None:
                fill_missing(temp, temp_selection, inner_spec)
            else:
                chunk = chain.decode_array(RawBuffer(raw), inner_spec, (getter, lin))
                scatter_array(temp, temp_selection, np.asarray(chunk[inner_selection]), ())


class _ReadBatch:
    """One `ShardReader.read` call: its shards and the steps that fetch and
    decode them (see the module docstring for shard-by-shard vs waves)."""

    def __init__(self, reader: ShardReader, batch: Sequence[ReadItem], target: ReadTarget) -> None:
        self.reader = reader
        self.chain = reader.chain
        self.batch = batch
        self.target = target
        self.out = target.out
        self.dst = target.dst
        self.drop_axes = target.drop_axes
        self.pattern = target.pattern
        self.statuses = target.statuses
        self.ndim = target.ndim
        _, spec0, *_ = batch[0]
        inner_shape = reader.inner_shape
        self.layout = self.chain.layout(inner_shape)
        self.describe = inner_describer(inner_grid(spec0, inner_shape))
        #: whether fetches ask the kernel for a shard's ranges up front
        #: (set by the pipelined path, `zarr_fused.shard.pipelined`)
        self.prefetch = False
        plan_selection = shard_kernels.plan_selection
        drop_axes = target.drop_axes
        self.shards = [
            _Shard(
                i, None if drop_axes else plan_selection(spec.shape, inner_shape, chunk_selection)
            )
            for i, (_, spec, chunk_selection, _, _) in enumerate(batch)
        ]

    def run(self, max_workers: int) -> tuple[GetResult, ...]:
        shards = self.shards
        # Shard by shard when there are enough shards to go round, or nothing
        # to spread (one inner chunk in all: a point or small-box read);
        # else in waves, the inner chunks of a wave's shards spread over the
        # workers.
        if (
            len(shards) >= 2 * max_workers
            or max_workers <= 1
            or (len(shards) == 1 and shards[0].plan is not None and shards[0].plan.n_touched <= 1)
        ):
            run_parallel(self.one_shard, shards, max_workers)
        else:
            for start in range(0, len(shards), max_workers):
                self.wave(shards[start : start + max_workers], max_workers)
        return tuple(self.statuses)

    def _group(self, capacity: int) -> Any:
        group = self.chain.kernel_batch(capacity, self.ndim, self.describe)
        group.set_fill(self.pattern)
        return group

    def _missing(self, shard: _Shard) -> None:
        _, spec, _, out_selection, _ = self.batch[shard.index]
        self.statuses[shard.index] = MISSING
        fill_missing(self.out, out_selection, spec)

    def fetch(self, shard: _Shard) -> _Shard:
        getter, spec, chunk_selection, _, _ = self.batch[shard.index]
        reader = self.reader
        grid = inner_grid(spec, reader.inner_shape)
        plan = shard.plan
        if plan is None:
            reader._fetch_general(getter, spec, chunk_selection, grid, shard)
        elif plan.n_touched:
            touched = None if plan.all_touched else plan.touched()
            reader._fetch(getter, spec, touched, grid, shard, self.prefetch)
        else:
            shard.payload = np.empty(0, np.uint8)
        return shard

    def queue(self, group: Any, shard: _Shard) -> bool:
        """Queue a fetched shard's planned decodes into ``group``; False for
        a shard the planner does not cover (see `finish_general`)."""
        if shard.missing:
            self._missing(shard)
            return True
        if shard.plan is None:
            return False
        getter, _, _, out_selection, _ = self.batch[shard.index]
        return shard_kernels.add_shard(
            group,
            shard.payload,
            shard.entries,
            shard.plan,
            self.layout,
            self.dst,
            out_selection,
            getter,
        )

    def finish_general(self, shard: _Shard) -> None:
        if not shard.missing:
            self.reader._decode_general(self.batch[shard.index], shard, self.target)

    def read_shard_part(self, shard: _Shard) -> bool:
        """Fetch and decode a partly touched local shard in one native call
        (one release of the GIL); False where that does not apply."""
        plan = shard.plan
        if plan is None or plan.all_touched or not plan.n_touched:
            return False
        getter, spec, _, out_selection, _ = self.batch[shard.index]
        prefix = local_files([(getter,)], shard_io=True)
        if prefix is None:
            return False
        group = self._group(plan.n_touched)
        if not shard_kernels.add_shard(
            group, None, None, plan, self.layout, self.dst, out_selection, getter, defer=True
        ):
            return False
        grid = inner_grid(spec, self.reader.inner_shape)
        touched = np.ascontiguousarray(plan.touched(), dtype=np.intp)
        found = read_shard_part(
            prefix + os.fsencode(getter.path),
            math.prod(grid),
            touched,
            buffers.take,
            buffers.give,
            self.reader._shard_part_settings(getter, spec, grid, len(touched)),
            decode_into=group,
        )
        note_local(getter, "get_shard_part", 1, None)
        if not found:
            self._missing(shard)
        return True

    def one_shard(self, shard: _Shard) -> None:
        if self.read_shard_part(shard):
            return
        self.fetch(shard)
        self.decode_fetched(shard)

    def decode_fetched(self, shard: _Shard) -> None:
        """Decode a fetched shard into the output and release its bytes."""
        group = self._group(shard.plan.n_touched if shard.plan is not None else 0)
        if self.queue(group, shard):
            group.run()
        else:
            self.finish_general(shard)
        shard.release()

    def deferred_group(self, shard: _Shard) -> Any:
        """A decode batch with the tasks of a planned, partly touched shard
        queued, in `touched` order, for a fetch to come (`add_shard` with
        ``defer``); None where the kernels do not take its selection."""
        plan = shard.plan
        if plan is None or plan.all_touched or not plan.n_touched:
            return None
        getter, _, _, out_selection, _ = self.batch[shard.index]
        group = self._group(plan.n_touched)
        if not shard_kernels.add_shard(
            group, None, None, plan, self.layout, self.dst, out_selection, getter, defer=True
        ):
            return None
        return group

    def mark_missing(self, shard: _Shard) -> None:
        """Report ``shard`` missing (its output region already holds the fill)."""
        self.statuses[shard.index] = MISSING

    def fetch_part(self, shard: _Shard, touched: np.ndarray) -> _Shard:
        """Fetch the index and the ``touched`` inner chunks of a planned
        shard into a new `_Shard` (part of ``shard``)."""
        getter, spec, *_ = self.batch[shard.index]
        part = _Shard(shard.index, shard.plan)
        grid = inner_grid(spec, self.reader.inner_shape)
        self.reader._fetch(getter, spec, touched, grid, part, self.prefetch)
        return part

    def cost(self, shard: _Shard) -> int:
        """The most bytes the fetch of ``shard`` should hold (the bound on
        bytes in flight of the pipelined read): its touched inner chunks
        at about their raw size, which the codecs' worst case is, and the
        index."""
        getter, spec, *_ = self.batch[shard.index]
        grid = inner_grid(spec, self.reader.inner_shape)
        n = math.prod(grid)
        plan = shard.plan
        touched = n if plan is None or plan.all_touched else plan.n_touched
        settings = self.reader._shard_part_settings(getter, spec, grid, touched)
        return int(settings["size_hint"]) + self.reader.fmt.size(n)

    def fetched_io(self, shard: _Shard) -> tuple[int, int]:
        """About the file calls the fetch of ``shard`` made (open, index,
        ranges; 0 when it read no file) and the bytes it holds. Each
        touched inner chunk counts as one range read: neighbours are
        coalesced, but a slab's chunks lie apart (Morton order), and
        counting too few calls would take a hot cache for latency."""
        plan = shard.plan
        if shard.missing:
            return 1, 0
        if (plan is not None and not plan.n_touched) or (plan is None and shard.entries is None):
            return 0, 0
        payload = shard.payload
        if shard.plan is None and shard.entries is not None:
            payload = shard.entries[1]
        nbytes = getattr(payload, "nbytes", 0)
        return 2 + shard.n_ranges, int(nbytes)

    def wave(self, shards: list[_Shard], max_workers: int) -> None:
        """Fetch ``shards`` in parallel, then spread all their inner chunks
        over the workers."""
        wave = run_parallel(self.fetch, shards, max_workers)
        group = self._group(sum(s.plan.n_touched for s in wave if s.plan is not None))
        general = [s for s in wave if not self.queue(group, s)]
        n = len(group)
        if n:
            parts = partition(n, max_workers, max_group=max(1, -(-n // (2 * max_workers))))
            run_parallel(lambda r: group.run_range(r.start, r.stop), parts, max_workers)
        run_parallel(self.finish_general, general, max_workers)
        group = None  # its views into the shards go before the shards do
        for shard in wave:
            shard.release()


class _TouchedBatch:
    """The shards of one `ShardReader.read_touched` call, as the pipelined
    read takes a batch (`zarr_fused.shard.pipelined.ShardBatch`): one IO
    request per shard (none has a plan, so none is split), consumed by the
    caller's function."""

    def __init__(
        self,
        reader: ShardReader,
        spec: ArraySpec,
        parts: Sequence[tuple[Any, np.ndarray]],
        consume: Callable[[int, _Shard], None],
    ) -> None:
        self.reader = reader
        self.spec = spec
        self.parts = parts
        self.consume = consume
        self.grid = inner_grid(spec, reader.inner_shape)
        self.n_chunks = math.prod(self.grid)
        self.shards = [_Shard(i, None) for i in range(len(parts))]
        #: whether fetches ask the kernel for a shard's ranges up front
        #: (set by the pipelined path)
        self.prefetch = False

    def _touched(self, shard: _Shard) -> np.ndarray | None:
        """The touched chunks of ``shard``, None when that is all of them."""
        touched = self.parts[shard.index][1]
        return None if len(touched) == self.n_chunks else touched

    def run(self, max_workers: int) -> None:
        """The direct path: each compute thread fetches, then consumes, a
        shard at a time."""
        run_parallel(self.one_shard, self.shards, max_workers)

    def one_shard(self, shard: _Shard) -> None:
        self.decode_fetched(self.fetch(shard))

    def fetch(self, shard: _Shard) -> _Shard:
        getter = self.parts[shard.index][0]
        self.reader._fetch(getter, self.spec, self._touched(shard), self.grid, shard, self.prefetch)
        return shard

    def decode_fetched(self, shard: _Shard) -> None:
        try:
            self.consume(shard.index, shard)
        finally:
            shard.release()

    def cost(self, shard: _Shard) -> int:
        """The most bytes the fetch of ``shard`` should hold (see
        `_ReadBatch.cost`)."""
        touched = self._touched(shard)
        n_touched = self.n_chunks if touched is None else len(touched)
        getter = self.parts[shard.index][0]
        settings = self.reader._shard_part_settings(getter, self.spec, self.grid, n_touched)
        return int(settings["size_hint"]) + self.reader.fmt.size(self.n_chunks)

    def fetched_io(self, shard: _Shard) -> tuple[int, int]:
        """About the file calls the fetch made and the bytes it holds (see
        `_ReadBatch.fetched_io`)."""
        if shard.missing:
            return 1, 0
        return 2 + shard.n_ranges, int(getattr(shard.payload, "nbytes", 0))

    def fetch_part(self, shard: _Shard, touched: np.ndarray) -> _Shard:
        raise AssertionError("a shard without a plan is never split")

    def deferred_group(self, shard: _Shard) -> None:
        return None

    def mark_missing(self, shard: _Shard) -> None:
        """Nothing to do: ``consume`` saw the shard missing."""


def _pack(fetched: list[np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fetched chunks packed into one buffer, and their offsets in it."""
    offsets = np.zeros(len(fetched), dtype=np.uint64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    payload = np.empty(sum(len(data) for data in fetched), dtype=np.uint8)
    for offset, data in zip(offsets, fetched):
        payload[int(offset) : int(offset) + len(data)] = data
    return offsets, payload
