"""Sharded variable-length strings and bytes (``vlen-utf8`` / ``vlen-bytes``
inner chunks) on the native shard machinery.

The shard engine's batch kernels decode fixed-size items into fixed-size
slots, which variable-length items do not fit. These shards take a
per-shard loop instead, which follows zarr's sharding codec step by step
(``ShardingCodec._decode_partial_sync`` and ``_encode_partial_sync``), so
values, statuses and stored shards are zarr's:

- reads fetch as the engine does (`ShardReader`'s fetch: the whole shard
  in one get when every inner chunk is touched, else the index, then only
  the touched inner chunks' ranges, coalesced; LocalStore files natively),
  with the index checked natively. A selection of slices and integers
  (zarr's basic and plain orthogonal ones) then decodes in one native call
  per shard, or per worker's run of its inner chunks
  (`zarr_fused._vlen.VlenRegion`): each touched inner chunk decompressed
  and its frame parsed with the GIL released, only its selected items
  placed straight into the output, however strided (StringDType strings
  without the GIL, objects in one loop with it), a missing one filled.
  Other selections decode inner chunk by inner chunk through the chain
  (`VlenChain.decode_chunk`) and assign as zarr does;
- writes read the stored shard (unless they cover it whole), decode the
  inner chunks they cover in part, merge with zarr's rule, drop chunks
  left equal to the fill value (``write_empty_chunks=False``), encode the
  others with `zarr_fused._vlen`, and lay the shard out natively
  (`zarr_fused._shard_index`), deleting it when no inner chunk is left.

Many shards go one per worker; few shards spread their inner chunks over
the workers. What the loop does not take (selections other than slices and
integers on writes, outputs or values that are not NumPy arrays, chunk
specs the chain was not built for) goes to zarr's sharding codec.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
from zarr.core.chunk_grids import ChunkGrid
from zarr.core.chunk_utils import fill_value_or_default
from zarr.core.indexing import (
    BasicIndexer,
    IntDimIndexer,
    OrthogonalIndexer,
    SliceDimIndexer,
    get_indexer,
)

from zarr_fused._buffers import RawBuffer, buffers
from zarr_fused._items import MISSING, PRESENT
from zarr_fused._merge import is_empty_chunk, merge_owned
from zarr_fused._native import index_kernels, vlen_kernels
from zarr_fused._pool import partition, run_parallel
from zarr_fused._scatter_py import fill_missing
from zarr_fused._vlen_chain import lone_object
from zarr_fused._zarr_compat import inner_chunk_spec
from zarr_fused.io.local import local_files, make_parents, write_parts
from zarr_fused.io.shard_lock import shard_locks
from zarr_fused.shard.index import (
    MISSING_OFFSET,
    ShardSide,
    inner_describer,
    inner_grid,
    read_whole_shard,
    stored_payloads,
)
from zarr_fused.stats import note_parts

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from zarr.abc.codec import GetResult
    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import NDBuffer

    from zarr_fused._batch import BatchReader, HeldWriter, ReadRequest, WriteRequest
    from zarr_fused._items import ReadItem, WriteItem
    from zarr_fused._vlen import VlenRegion
    from zarr_fused._vlen_chain import VlenChain
    from zarr_fused.shard.read import ShardReader, _Shard

__all__ = ["VlenShardReader", "VlenShardWriter"]


class _Where:
    """Names one inner chunk in an error, formatted only when one is raised
    (the kernels format ``where`` into their messages)."""

    __slots__ = ("describe", "key")

    def __init__(self, describe: Callable[[Any], str], getter: Any, lin: int) -> None:
        self.describe = describe
        self.key = (getter, lin)

    def __str__(self) -> str:
        return self.describe(self.key)


def _projections(spec: ArraySpec, inner_shape: tuple[int, ...], selection: Any) -> Any:
    """zarr's indexer of ``selection`` over the inner chunks of a shard."""
    return get_indexer(
        selection, shape=spec.shape, chunk_grid=ChunkGrid.from_sizes(spec.shape, inner_shape)
    )


def _basic(selection: Any) -> bool:
    """Whether ``selection`` holds only slices and integers."""
    if not isinstance(selection, tuple):
        selection = (selection,)
    return all(
        type(s) is slice
        or (isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)))
        for s in selection
    )


def _basic_view(dst: np.ndarray, selection: Any) -> np.ndarray | None:
    """``dst[selection]`` when that is a view (slices and integers), else None."""
    if not _basic(selection):
        return None
    return dst[(*(selection if isinstance(selection, tuple) else (selection,)), Ellipsis)]


def _spread[T, R](
    fn: Callable[[T], Callable[[int], R]], items: Sequence[T], max_workers: int
) -> list[R]:
    """``fn(item)(workers)`` for each of ``items`` (shards): one shard per
    worker when there are enough shards to go round, else one shard at a
    time, its inner chunks spread over the workers (``workers``: how many
    it may use)."""
    if len(items) >= 2 * max_workers or max_workers <= 1:
        return run_parallel(lambda item: fn(item)(1), items, max_workers)
    return [fn(item)(max_workers) for item in items]


class _Split(NamedTuple):
    """A basic selection of one shard split per dimension, as
    `zarr_fused._vlen.VlenRegion` takes it."""

    #: per dimension in turn, a row per inner chunk along it: its index,
    #: first item, step, items, first index along the output's axis
    rows: list[tuple[int, int, int, int, int]]
    #: how many rows each dimension has
    dim_rows: list[int]
    #: each dimension's output axis (-1: an integer's, dropped)
    out_axes: list[int]
    #: the touched inner chunks (linear, ascending: the rows' product in C order)
    touched: np.ndarray


def _split(indexer: Any, inner_shape: tuple[int, ...], grid: tuple[int, ...]) -> _Split | None:
    """zarr's basic ``indexer`` over a shard's inner chunks as rows per
    dimension (one Python step per inner chunk along each dimension, none
    per inner chunk); None for other indexers."""
    # zarr indexes a tuple of slices orthogonally, as the basic selection it is
    basic = type(indexer) is BasicIndexer or (
        type(indexer) is OrthogonalIndexer and not indexer.is_advanced
    )
    if not basic or not indexer.dim_indexers:
        return None
    split = _Split([], [], [], np.empty(0, dtype=np.intp))
    along = []
    axis = 0
    for dim, n in zip(indexer.dim_indexers, inner_shape, strict=True):
        first = len(split.rows)
        if type(dim) is IntDimIndexer:
            split.rows.extend((p.dim_chunk_ix, cast("int", p.dim_chunk_sel), 1, 1, 0) for p in dim)
            split.out_axes.append(-1)
        elif type(dim) is SliceDimIndexer:
            for p in dim:
                start, stop, step = cast("slice", p.dim_chunk_sel).indices(n)
                count = len(range(start, stop, step))
                first_out = cast("slice", p.dim_out_sel).start
                split.rows.append((p.dim_chunk_ix, start, step, count, first_out))
            split.out_axes.append(axis)
            axis += 1
        else:
            return None
        split.dim_rows.append(len(split.rows) - first)
        along.append([row[0] for row in split.rows[first:]])
    if 0 in split.dim_rows:
        return split
    mesh = np.meshgrid(*along, indexing="ij")
    return split._replace(touched=np.ravel_multi_index(tuple(mesh), grid).ravel())


def _decode_spread(region: VlenRegion, workers: int) -> None:
    """Decode all of ``region``: in one call, or in a few runs of inner
    chunks per worker."""
    if workers <= 1:
        region.decode(0, region.n_tasks)
        return
    groups = partition(region.n_tasks, workers)
    run_parallel(lambda run: region.decode(run.start, run.stop), groups, workers)


def _linear(projections: list[Any], grid: tuple[int, ...]) -> list[int]:
    """The linear index in the shard of each projection's inner chunk."""
    return [int(np.ravel_multi_index(coords, grid)) for coords, *_ in projections]


class VlenShardReader(ShardSide):
    """Native reads of vlen shards (see the module docstring)."""

    chain: VlenChain
    fallback: BatchReader

    def __init__(
        self, codec: ShardingCodec, chain: VlenChain, fallback: BatchReader, fetcher: ShardReader
    ) -> None:
        super().__init__(codec, chain, fallback)
        #: the engine's reader of this codec's shards, for its fetches (the
        #: plan passes it in, so that this module sits beside the engine's)
        self.fetcher = fetcher

    def read(self, batch: Sequence[ReadItem], request: ReadRequest) -> tuple[GetResult, ...]:
        _, spec, *_ = batch[0]
        dst = request.out.as_ndarray_like()
        if (
            type(dst) is not np.ndarray
            or lone_object(dst)
            or not self.chain.handles(inner_chunk_spec(self.codec, spec))
        ):
            return self.fallback.read(batch, request)
        results = _spread(
            lambda item: lambda workers: self._read_shard(item, request, workers),
            batch,
            request.max_workers,
        )
        return tuple(results)

    def _read_shard(self, item: ReadItem, request: ReadRequest, workers: int) -> GetResult:
        getter, spec, chunk_selection, out_selection, _ = item
        indexer = _projections(spec, self.inner_shape, chunk_selection)
        grid = inner_grid(spec, self.inner_shape)
        split = _split(indexer, self.inner_shape, grid)
        projections: list[Any] | None = None
        if split is not None:
            touched = split.touched
        else:
            projections = list(indexer)
            touched = np.unique(np.array(_linear(projections, grid), dtype=np.intp))
        if touched.size == 0:
            return PRESENT
        shard = self.fetcher.fetch_inner(
            getter, spec, None if len(touched) == math.prod(grid) else touched, grid
        )
        try:
            if shard.missing:
                fill_missing(request.out, out_selection, spec)
                return MISSING
            target, direct = self._target(request, out_selection, indexer, spec)
            region = None if split is None else self._region(split, shard, target, spec, getter)
            if region is not None:
                _decode_spread(region, workers)
            else:
                self._decode_each(
                    list(indexer) if projections is None else projections,
                    shard,
                    target,
                    inner_chunk_spec(self.codec, spec),
                    (getter, grid),
                    workers,
                )
        finally:
            shard.release()
        if not direct:
            self._scatter(request, out_selection, indexer, target)
        return PRESENT

    def _region(
        self, split: _Split, shard: _Shard, target: NDBuffer, spec: ArraySpec, getter: Any
    ) -> VlenRegion | None:
        """The native decode of ``split`` into ``target`` (its items placed
        straight into it), or None when the kernels do not write into that
        output (a StringDType with a missing-value object, a fill value
        that is not UTF-8)."""
        out = target.as_ndarray_like()
        chain = self.chain
        if type(out) is not np.ndarray or vlen_kernels is None or not out.flags.writeable:
            return None
        if out.dtype != object and not (chain.strings and out.dtype == chain.dtype):
            return None
        fill = fill_value_or_default(inner_chunk_spec(self.codec, spec))
        if out.dtype != object and not isinstance(fill, str):
            return None
        grid = inner_grid(spec, self.inner_shape)
        try:
            return vlen_kernels.VlenRegion(
                chain.kernel,
                shard.payload,
                shard.entries,
                split.rows,
                split.dim_rows,
                split.out_axes,
                self.inner_shape,
                grid,
                out,
                chain.utf8,
                fill,
                getter,
                inner_describer(grid),
            )
        except UnicodeEncodeError:
            return None

    def _decode_each(
        self,
        projections: list[Any],
        shard: _Shard,
        target: NDBuffer,
        inner_spec: ArraySpec,
        where: tuple[Any, tuple[int, ...]],
        workers: int,
    ) -> None:
        """Decode the inner chunks of ``projections`` one at a time (the
        selections and outputs `_region` does not take)."""
        getter, grid = where
        describe = inner_describer(grid)
        linear = _linear(projections, grid)
        entries, payload = shard.entries, shard.payload

        def decode(k: int) -> None:
            _, inner_selection, target_selection, complete = projections[k]
            lin = linear[k]
            off, size = (int(v) for v in entries[lin])
            if off == MISSING_OFFSET:
                fill_missing(target, target_selection, inner_spec)
                return
            raw = RawBuffer(payload[off : off + size])
            where = _Where(describe, getter, lin)
            if complete:
                view = _basic_view(cast("np.ndarray", target.as_ndarray_like()), target_selection)
                if (
                    view is not None
                    and view.shape == inner_spec.shape
                    and self.chain.decode_chunk_into(raw, view, where)
                ):
                    return
            chunk = self.chain.decode_chunk(raw, inner_spec, where)
            target[target_selection] = chunk[inner_selection]

        run_parallel(decode, range(len(projections)), workers)

    @staticmethod
    def _target(
        request: ReadRequest, out_selection: Any, indexer: Any, spec: ArraySpec
    ) -> tuple[NDBuffer, bool]:
        """Where the shard's selection is decoded: the output's own region
        when it is one view of the selection's shape (True), else a new
        buffer of that shape, scattered afterwards (False), as zarr does."""
        dst = request.out.as_ndarray_like()
        dtype = spec.dtype.to_native_dtype()
        if not request.drop_axes and not hasattr(indexer, "sel_shape"):
            view = _basic_view(cast("np.ndarray", dst), out_selection)
            if view is not None and view.shape == tuple(indexer.shape) and view.dtype == dtype:
                return spec.prototype.nd_buffer.from_ndarray_like(view), True
        temp = spec.prototype.nd_buffer.empty(shape=indexer.shape, dtype=dtype, order=spec.order)
        return temp, False

    @staticmethod
    def _scatter(request: ReadRequest, out_selection: Any, indexer: Any, temp: NDBuffer) -> None:
        """zarr's scatter of a shard's decoded selection into the output
        (NumPy's assignment: the scatter kernels copy no object or
        StringDType elements)."""
        if hasattr(indexer, "sel_shape"):
            temp = temp.reshape(indexer.sel_shape)
        if request.drop_axes:
            temp = temp.squeeze(axis=request.drop_axes)
        request.out[out_selection] = temp


class VlenShardWriter(ShardSide):
    """Native writes of vlen shards (see the module docstring)."""

    chain: VlenChain
    fallback: HeldWriter

    def write(self, batch: Sequence[WriteItem], request: WriteRequest) -> None:
        locks = shard_locks(batch)
        _, spec0, *_ = batch[0]
        inner_spec = inner_chunk_spec(self.codec, spec0)
        data = request.value.as_ndarray_like()
        if type(data) is not np.ndarray or not self.chain.handles(inner_spec):
            self.fallback.write_held(batch, request, locks)
            return
        native: list[tuple[WriteItem, Any]] = []
        general: list[WriteItem] = []
        for item in batch:
            _, spec, chunk_selection, _, _ = item
            if _basic(chunk_selection):
                native.append((item, _projections(spec, self.inner_shape, chunk_selection)))
            else:
                # zarr reshapes the value of some array selections first
                general.append(item)
        if native:
            prefix = local_files(batch, write=True, shard_io=True)
            if prefix is not None:
                make_parents(prefix, batch)

            def update(job: tuple[WriteItem, Any]) -> Callable[[int], None]:
                return lambda workers: self._held(job, request, prefix, locks, workers)

            _spread(update, native, request.max_workers)
        if general:
            self.fallback.write_held(general, request, locks)

    def _held(
        self,
        job: tuple[WriteItem, Any],
        request: WriteRequest,
        prefix: bytes | None,
        locks: Any,
        workers: int,
    ) -> None:
        """`_write_shard`, holding the shard from its read to its
        replacement when the write does not cover it whole."""
        item, _ = job
        setter, *_, is_complete = item
        if locks is None or is_complete:
            self._write_shard(job, request, prefix, workers)
            return
        with locks.hold(setter):
            self._write_shard(job, request, prefix, workers)

    def _write_shard(
        self, job: tuple[WriteItem, Any], request: WriteRequest, prefix: bytes | None, workers: int
    ) -> None:
        (setter, spec, _, out_selection, _), indexer = job
        value = request.value
        if value.shape != ():
            value = value[out_selection]
        projections = list(indexer)
        grid = inner_grid(spec, self.inner_shape)
        n = math.prod(grid)
        linear = [int(np.ravel_multi_index(coords, grid)) for coords, *_ in projections]
        covers = len(set(linear)) == n and all(complete for *_, complete in projections)
        if covers:
            payloads: list[Any] = [None] * n
            buffer = None
        else:
            payloads, buffer = stored_payloads(
                read_whole_shard(setter, spec, self.fmt, grid, prefix), grid
            )
        try:
            inner_spec = inner_chunk_spec(self.codec, spec)
            describe = inner_describer(grid)

            def encode(k: int) -> None:
                _, inner_selection, value_selection, complete = projections[k]
                lin = linear[k]
                where = _Where(describe, setter, lin)
                existing = None if complete else payloads[lin]
                decoded = (
                    None
                    if existing is None
                    else self.chain.decode_chunk(RawBuffer(existing), inner_spec, where)
                )
                merged = merge_owned(
                    decoded, value, value_selection, inner_spec, inner_selection, complete, ()
                )
                if is_empty_chunk(
                    inner_spec.prototype.nd_buffer.from_ndarray_like(merged), inner_spec
                ):
                    payloads[lin] = None
                else:
                    payloads[lin] = self.chain.encode_chunk(merged, where)

            run_parallel(encode, range(len(projections)), workers)
            self._store(setter, spec, grid, payloads, prefix)
        finally:
            buffers.give(buffer)

    def _store(
        self,
        setter: Any,
        spec: ArraySpec,
        grid: tuple[int, ...],
        payloads: list[Any],
        prefix: bytes | None,
    ) -> None:
        """Store the shard laid out from ``payloads`` (delete it when none
        is left): on LocalStore straight from the payloads to the file."""
        order = self.write_order(grid)
        layout = self.fmt.layout_args()
        if prefix is not None:
            parts = index_kernels.shard_parts(order, payloads, **layout)
            if parts is None:
                setter.delete_sync()
            else:
                write_parts(prefix + os.fsencode(setter.path), parts)
                note_parts(setter, parts)
            return
        blob = index_kernels.assemble_shard(order, payloads, **layout, take=None)
        if blob is None:
            setter.delete_sync()
        else:
            setter.set_sync(spec.prototype.buffer.from_array_like(blob))
