"""Many regions of one array read as one planned batch: `read_regions`.

A loader that reads hundreds of small patches pays, per ``array[sel]``,
zarr's front end (an indexer, a store path per chunk, an event-loop hop),
and no two calls share what they fetch: a shard index is read again by
every patch in that shard, a chunk is decoded again by every patch that
overlaps it. `read_regions` plans all the regions together instead:

1. each region, a basic selection (integers and slices of step 1), becomes
   a box of the array (`_Region`); a selection with one sorted integer
   array becomes one box per run of its indices in the same decode units;
2. the decode units it overlaps (inner chunks of a sharded array, chunks
   otherwise) are gathered per stored key: for every chunk or shard, the
   bounding box of the units any region touches is one *block*;
3. the blocks, stacked along the first axis of one staging array, go to
   the array's own pipeline as **one** read batch (`FusedCodecPipeline.read`,
   the same entry point zarr's ``Array`` calls), so each shard index is read
   once, the ranges of a shard are coalesced, and every unit is fetched and
   decoded once, on the pool and the IO threads, however many regions
   overlap it (a block is a box: units inside it that no region touches,
   between regions far apart in one shard, are decoded too);
4. each region is copied out of the staging array, block by block, on the
   pool (the copy kernel, GIL released).

Where the array's pipeline reads shards natively with a native inner chain
(`zarr_fused.shard.read.ShardReader`) from a store with synchronous IO, steps
3 and 4 become one (`_FanOut`): every region is cut into *targets*, its
parts within one inner chunk; each shard's touched inner chunks are fetched
as a read of them would fetch them, and each is decoded once into the
running thread's scratch (one 32^3 uint16 chunk is 64 KiB: it stays in
cache) and copied from there into every target it holds
(`zarr_fused._shard.fan_out`), one shard per task on the pool. No staging
array exists, and the copies that fault in new results' pages run in
parallel. Unsharded arrays, inner chains with filters and reads inside a
`zarr_fused.stats` block (whose counters follow the pipeline's reads) keep
the staging design.

The staging array holds at most `STAGING_BYTES` at a time; more blocks go in
waves of that size. Missing chunks and shards read as the fill value, as
with ``array[sel]`` (and raise `zarr.errors.ChunkNotFoundError` when the
array's ``read_missing_chunks`` is off).

What this plan does not cover reads one ``array[sel]`` per region, so the
values are always zarr's: arrays whose pipeline is not zarr_fused's, chunk
grids that are not regular, zero-dimensional arrays, object and
variable-length string dtypes, and selections other than integers, slices
of step 1 and one sorted 1-d integer array (unsorted or several integer
arrays, lists, masks, steps, ``None``; an out-of-bounds integer raises
zarr's own ``IndexError`` that way).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr import Array
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.errors import ChunkNotFoundError

from zarr_fused._chain import NativeChain
from zarr_fused._cpus import resolve_max_workers
from zarr_fused._dtypes import fill_pattern
from zarr_fused._native import shard_kernels
from zarr_fused._plan import PipelinePlan
from zarr_fused._pool import run_parallel
from zarr_fused._scatter_py import copy_into
from zarr_fused._zarr_compat import array_chunk_grid, inner_chunk_spec, store_supports_sync_io
from zarr_fused.io.stores import with_local_files
from zarr_fused.shard.index import inner_describer, inner_grid
from zarr_fused.shard.read import ShardReader
from zarr_fused.stats import active

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from zarr.abc.codec import CodecPipeline
    from zarr.core.buffer import NDBuffer

__all__ = ["STAGING_BYTES", "read_regions"]

#: the most bytes of decoded blocks one wave of a `read_regions` call holds
STAGING_BYTES = 64 << 20

#: the new results of one call are cut from shared allocations of at most
#: this many bytes: one large allocation is backed by huge pages (NumPy asks
#: for them from 4 MiB), so writing thousands of small results faults in a
#: few 2 MiB pages instead of tens of thousands of 4 KiB ones, which two
#: threads fault in no faster than one (4096 32^3 uint16 results: 0.47-0.52 s
#: a call with one allocation each, 0.32-0.36 s cut from one). A result kept
#: alone keeps at most this much memory alive.
RESULT_BLOCK_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class _Picks:
    """An integer-array selection on one axis: the indices it takes there,
    sorted (repeats allowed) and within the array."""

    axis: int
    index: np.ndarray


@dataclass(frozen=True, slots=True)
class _Region:
    """One selection as a box ``[lo, hi)`` of the array; ``dropped`` are
    the axes an integer selected (the result has no such axis); ``picks``,
    when an integer array selects along one axis (the box then spans its
    smallest to its largest index there)."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    dropped: tuple[int, ...]
    #: the result's shape with every axis kept
    full_shape: tuple[int, ...]
    picks: _Picks | None = None

    @property
    def size(self) -> int:
        """The result's number of elements."""
        return math.prod(self.full_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """The result's shape (without the dropped axes)."""
        if not self.dropped:
            return self.full_shape
        return tuple(n for d, n in enumerate(self.full_shape) if d not in self.dropped)

    def boxes(self, inner: tuple[int, ...]) -> list[_Box]:
        """The parts of the array the plan reads for this region: the box
        itself, or with ``picks`` one box per run of indices in the same
        decode units along its axis (so a stored key that holds none of the
        indices is not read, however far apart they are); none when the
        result is empty."""
        if 0 in self.full_shape:
            return []
        if self.picks is None:
            return [_Box(self, self.lo, self.hi, None)]
        axis, index = self.picks.axis, self.picks.index
        cuts = np.flatnonzero(np.diff(index // inner[axis])) + 1
        boxes = []
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(index)], strict=True):
            lo, hi = list(self.lo), list(self.hi)
            lo[axis], hi[axis] = int(index[a]), int(index[b - 1]) + 1
            boxes.append(_Box(self, tuple(lo), tuple(hi), slice(a, b)))
        return boxes


@dataclass(frozen=True, slots=True)
class _Box:
    """A box ``[lo, hi)`` of the array that one region reads; ``picked``,
    for a region with picks, the positions in its index that fall inside."""

    region: _Region
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    picked: slice | None


def _axis(item: Any, size: int) -> tuple[int, int, bool] | None:
    """``(lo, hi, dropped)`` of one axis' selection, None when the plan does
    not take it (zarr's indexing then decides what it means)."""
    if isinstance(item, slice):
        try:
            start, stop, step = item.indices(size)
        except (TypeError, ValueError):
            return None
        if step != 1:
            return None
        return start, max(start, stop), False
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        index = int(item)
        if index < 0:
            index += size
        if not 0 <= index < size:
            return None
        return index, index + 1, True
    return None


def _picks(item: Any, size: int) -> np.ndarray | None:
    """The indices of a 1-d integer array item (negative ones counted from
    the end), None unless every index is within the axis and they are
    sorted. A list is left to zarr, whose indexing reads it differently by
    where it stands."""
    if not isinstance(item, np.ndarray) or item.ndim != 1 or item.dtype.kind not in "iu":
        return None
    index = item.astype(np.int64)
    index = np.where(index < 0, index + size, index)
    if len(index) and (index.min() < 0 or index.max() >= size or (np.diff(index) < 0).any()):
        return None
    return index


def _items(selection: Any, ndim: int) -> tuple[Any, ...] | None:
    """``selection`` as one item per axis (``Ellipsis`` expanded, missing
    trailing axes whole), None when it has too many."""
    items = selection if isinstance(selection, tuple) else (selection,)
    ellipses = sum(1 for item in items if item is Ellipsis)
    if ellipses > 1:
        return None
    if ellipses:
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        fill = (slice(None),) * (ndim - len(items) + 1)
        items = items[:at] + fill + items[at + 1 :]
    if len(items) > ndim:
        return None
    return items + (slice(None),) * (ndim - len(items))


def _slice_box(selection: Any, shape: tuple[int, ...]) -> _Region | None:
    """The region of what a loader passes: a tuple of one slice per axis,
    with integer bounds inside the axis and no step; None for anything else
    (`_region` then reads it item by item). Thousands of selections a call
    make the general path's per-item calls a large part of the planning."""
    if type(selection) is not tuple or len(selection) != len(shape):
        return None
    lo, hi = [], []
    for item, size in zip(selection, shape, strict=True):
        if type(item) is not slice or item.step is not None:
            return None
        start, stop = item.start, item.stop
        if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= size:
            return None
        lo.append(start)
        hi.append(stop)
    return _Region(tuple(lo), tuple(hi), (), tuple(b - a for a, b in zip(lo, hi, strict=True)))


def _region(selection: Any, shape: tuple[int, ...]) -> _Region | None:
    """The box ``selection`` picks from an array of ``shape``, None when it
    is not integers and step-1 slices with at most one sorted integer array
    (which ``array[sel]`` reads as an orthogonal selection; with integers
    only beside it, as a coordinate selection of the same values)."""
    region = _slice_box(selection, shape)
    if region is not None:
        return region
    items = _items(selection, len(shape))
    if items is None:
        return None
    lo, hi, dropped, full = [], [], [], []
    picks = None
    for d, (item, size) in enumerate(zip(items, shape, strict=True)):
        axis = _axis(item, size)
        if axis is None:
            index = None if picks is not None else _picks(item, size)
            if index is None:
                return None
            picks = _Picks(d, index)
            axis = (int(index[0]), int(index[-1]) + 1, False) if len(index) else (0, 0, False)
        lo.append(axis[0])
        hi.append(axis[1])
        full.append(axis[1] - axis[0] if picks is None or picks.axis != d else len(picks.index))
        if axis[2]:
            dropped.append(d)
    return _Region(tuple(lo), tuple(hi), tuple(dropped), tuple(full), picks)


@dataclass(frozen=True, slots=True)
class _Geometry:
    """What the plan needs of an array whose reads it can batch."""

    array: Array[Any]
    pipeline: CodecPipeline
    #: the pipeline's plan (its readers)
    plan: PipelinePlan
    shape: tuple[int, ...]
    #: the chunk shape of the stored keys (shards of a sharded array)
    outer: tuple[int, ...]
    #: the decode units (inner chunks of a sharded array, else chunks)
    inner: tuple[int, ...]
    dtype: np.dtype[Any]
    order: Any
    #: the spec of every stored key, as zarr's ``Array`` builds it
    spec: ArraySpec
    read_missing: bool

    @classmethod
    def of(cls, array: Any) -> _Geometry | None:
        """The geometry of ``array``, None when the plan does not cover it."""
        if not isinstance(array, Array):
            return None
        pipeline = array.async_array.codec_pipeline
        grid = array_chunk_grid(array)
        # zarr_fused's pipeline, evolved for this array (it carries a plan)
        plan = getattr(pipeline, "plan", None)
        if not isinstance(plan, PipelinePlan) or not grid.is_regular:
            return None
        metadata = array.metadata
        dtype = metadata.dtype.to_native_dtype()
        if array.ndim == 0 or dtype.hasobject or dtype.kind not in "biufcmMSUV":
            return None
        config = array.async_array.config
        order = metadata.order if metadata.zarr_format == 2 else config.order
        if metadata.zarr_format == 2:
            config = _with_order(config, order)
        outer = tuple(grid.chunk_shape)
        inner = tuple(array.chunks) if array.shards is not None else outer
        spec = ArraySpec(
            shape=outer,
            dtype=metadata.dtype,
            fill_value=metadata.fill_value,
            config=config,
            prototype=default_buffer_prototype(),
        )
        read_missing = bool(getattr(config, "read_missing_chunks", True))
        return cls(
            array, pipeline, plan, array.shape, outer, inner, dtype, order, spec, read_missing
        )


def _with_order(config: Any, order: Any) -> Any:
    """``config`` with its memory order replaced (format 2 keeps it in the
    metadata, as zarr's own read does)."""
    return replace(config, order=order)


@dataclass(slots=True)
class _Block:
    """The bounding box ``[lo, hi)`` of the touched units of one stored key
    at grid position ``coords``; ``row`` is where it starts along the first
    axis of the staging array; ``boxes`` the boxes (by their place in the
    list `_blocks` was given) that overlap it."""

    coords: tuple[int, ...]
    lo: list[int]
    hi: list[int]
    boxes: list[int]
    row: int = 0


def _pairs(lo: np.ndarray, hi: np.ndarray, outer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (box, stored key) overlap: the box's row in ``lo``/``hi`` and
    the key's grid position. Boxes over at most two keys per axis
    (the usual small patch) are enumerated together, by offset from their
    first key; larger ones one by one."""
    first = lo // outer
    span = (hi - 1) // outer - first + 1
    small = (span <= 2).all(axis=1)
    rows: list[np.ndarray] = []
    coords: list[np.ndarray] = []
    if small.any():
        idx = np.flatnonzero(small)
        for offset in itertools.product(*(range(int(m)) for m in span[idx].max(axis=0))):
            step = np.array(offset, dtype=np.int64)
            hit = idx[(step < span[idx]).all(axis=1)]
            rows.append(hit)
            coords.append(first[hit] + step)
    for r in np.flatnonzero(~small):
        grid = np.indices(tuple(span[r])).reshape(len(outer), -1).T
        rows.append(np.full(len(grid), r, dtype=np.intp))
        coords.append(first[r] + grid)
    return np.concatenate(rows), np.concatenate(coords)


def _blocks(geometry: _Geometry, boxes: Sequence[_Box]) -> list[_Block]:
    """One block per stored key any box overlaps: the box, aligned to the
    decode units and clipped to the array, that holds every unit of that
    key a box touches; in store order."""
    outer, inner = np.array(geometry.outer), np.array(geometry.inner)
    shape = np.array(geometry.shape)
    lo = np.array([b.lo for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
    hi = np.array([b.hi for b in boxes], dtype=np.int64).reshape(len(boxes), -1)
    rows, coords = _pairs(lo, hi, outer)
    part_lo = np.maximum(lo[rows], coords * outer) // inner * inner
    part_hi = np.minimum(-(-np.minimum(hi[rows], (coords + 1) * outer) // inner) * inner, shape)
    grid = tuple(int(g) for g in -(-shape // outer))
    keys, first, which = np.unique(
        np.ravel_multi_index(tuple(coords.T), grid), return_index=True, return_inverse=True
    )
    block_lo = np.full((len(keys), len(grid)), np.iinfo(np.int64).max, dtype=np.int64)
    block_hi = np.zeros((len(keys), len(grid)), dtype=np.int64)
    np.minimum.at(block_lo, which, part_lo)
    np.maximum.at(block_hi, which, part_hi)
    order = np.argsort(which, kind="stable")
    overlaps = np.split(rows[order], np.cumsum(np.bincount(which, minlength=len(keys)))[:-1])
    return [
        _Block(tuple(c), b_lo, b_hi, r.tolist())
        for c, b_lo, b_hi, r in zip(
            coords[first].tolist(), block_lo.tolist(), block_hi.tolist(), overlaps, strict=True
        )
    ]


def _waves(blocks: Sequence[_Block], width: tuple[int, ...], itemsize: int) -> list[list[_Block]]:
    """``blocks`` cut into waves whose staging arrays hold
    at most `STAGING_BYTES` (a block larger than that is a wave alone); each
    block's ``row`` set within its wave."""
    row_bytes = int(np.prod(width, dtype=np.int64)) * itemsize
    waves: list[list[_Block]] = [[]]
    rows = 0
    for block in blocks:
        height = block.hi[0] - block.lo[0]
        if waves[-1] and (rows + height) * row_bytes > STAGING_BYTES:
            waves.append([])
            rows = 0
        block.row = rows
        rows += height
        waves[-1].append(block)
    return waves


@dataclass(slots=True)
class _Wave:
    """One read batch of blocks and the staging array it decodes into (the
    first rows of ``buffer``, which every wave of a call reuses: pages the
    kernel has already faulted in once, not 64 MiB of new ones per wave)."""

    geometry: _Geometry
    blocks: list[_Block]
    buffer: np.ndarray
    staging: np.ndarray = field(init=False)

    def items(self) -> list[tuple[Any, ArraySpec, tuple[slice, ...], tuple[slice, ...], bool]]:
        """The read batch: one item per block, in zarr's batch layout."""
        geometry = self.geometry
        store_path = geometry.array.store_path
        encode = geometry.array.metadata.encode_chunk_key
        items = []
        for block in self.blocks:
            origin = [c * o for c, o in zip(block.coords, geometry.outer, strict=True)]
            chunk_selection = tuple(
                slice(lo - o, hi - o) for lo, hi, o in zip(block.lo, block.hi, origin, strict=True)
            )
            out_selection = (
                slice(block.row, block.row + block.hi[0] - block.lo[0]),
                *(slice(0, hi - lo) for lo, hi in zip(block.lo[1:], block.hi[1:], strict=True)),
            )
            complete = all(
                lo == o and hi >= min(o + c, n)
                for lo, hi, o, c, n in zip(
                    block.lo, block.hi, origin, geometry.outer, geometry.shape, strict=True
                )
            )
            items.append(
                (
                    store_path / encode(block.coords),
                    geometry.spec,
                    chunk_selection,
                    out_selection,
                    complete,
                )
            )
        return items

    def read(self) -> None:
        """Decode every block into the staging array, as one batch."""
        geometry = self.geometry
        rows = sum(b.hi[0] - b.lo[0] for b in self.blocks)
        self.staging = self.buffer[:rows]
        items = self.items()
        out: NDBuffer = geometry.spec.prototype.nd_buffer.from_ndarray_like(self.staging)
        results = sync(geometry.pipeline.read(items, out, drop_axes=()))
        if not geometry.read_missing:
            _raise_missing(
                geometry,
                [
                    b.coords
                    for b, r in zip(self.blocks, results, strict=True)
                    if r["status"] == "missing"
                ],
            )

    def copy(self, box: _Box, block: _Block, dst: np.ndarray) -> None:
        """Copy the part of ``box`` that ``block`` holds into ``dst`` (the
        result of the box's region with every axis kept)."""
        region = box.region
        lo = [max(a, b) for a, b in zip(box.lo, block.lo, strict=True)]
        hi = [min(a, b) for a, b in zip(box.hi, block.hi, strict=True)]
        # the staging array holds the block from row ``block.row``
        start = [block.row - block.lo[0], *(-b for b in block.lo[1:])]
        src = [slice(a + o, c + o) for a, c, o in zip(lo, hi, start, strict=True)]
        part = [slice(a - r, c - r) for a, c, r in zip(lo, hi, region.lo, strict=True)]
        if box.picked is not None and region.picks is not None:
            axis = region.picks.axis
            index = region.picks.index[box.picked]
            first, last = (int(i) for i in np.searchsorted(index, (lo[axis], hi[axis])))
            if first == last:
                return
            rows = index[first:last]
            part[axis] = slice(box.picked.start + first, box.picked.start + last)
            if len(rows) > 1 and (np.diff(rows) != 1).any():
                # indices with gaps or repeats: NumPy's fancy indexing
                fancy: list[Any] = [*src]
                fancy[axis] = rows + start[axis]
                dst[tuple(part)] = self.staging[tuple(fancy)]
                return
            src[axis] = slice(int(rows[0]) + start[axis], int(rows[-1]) + 1 + start[axis])
        copy_into(dst[tuple(part)], self.staging[tuple(src)])


def _raise_missing(geometry: _Geometry, coords: list[tuple[int, ...]]) -> None:
    """zarr's error for the missing chunks at ``coords`` (if any), when
    ``read_missing_chunks`` is off."""
    encode = geometry.array.metadata.encode_chunk_key
    missing = [f"  chunk '{encode(c)}' (grid position {c})" for c in coords]
    if missing:
        raise ChunkNotFoundError(
            f"{len(missing)} chunk(s) not found in store '{geometry.array.store_path}'.\n"
            "Set the 'array.read_missing_chunks' config to True to fill "
            "missing chunks with the fill value.\nMissing chunks:\n" + "\n".join(missing)
        )


def _check_out(out: Sequence[Any], n: int) -> list[np.ndarray]:
    """``out`` as a list of ``n`` writable NumPy arrays."""
    buffers = list(out)
    if len(buffers) != n:
        raise ValueError(f"out has {len(buffers)} buffers for {n} selections")
    for i, buf in enumerate(buffers):
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"out[{i}] must be a numpy.ndarray, not {type(buf).__name__}")
        if not buf.flags.writeable:
            raise ValueError(f"out[{i}] is read-only")
    return buffers


def _check_buffer(buf: np.ndarray, i: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if buf.shape != shape:
        raise ValueError(f"out[{i}] has shape {buf.shape}, the selection {shape}")
    if buf.dtype != dtype:
        raise ValueError(f"out[{i}] has dtype {buf.dtype}, the array {dtype}")


def _one_by_one(array: Any, selections: Sequence[Any], out: list[np.ndarray] | None) -> list[Any]:
    """The fallback: one ``array[sel]`` per region."""
    results = []
    for i, selection in enumerate(selections):
        value = array[selection]
        if out is None:
            results.append(value)
            continue
        result = np.asarray(value)
        _check_buffer(out[i], i, result.shape, result.dtype)
        out[i][...] = result
        results.append(out[i])
    return results


def read_regions(
    array: Any, selections: Iterable[Any], out: Sequence[np.ndarray] | None = None
) -> list[Any]:
    """Read many regions of ``array`` as one planned batch.

    Parameters
    ----------
    array : zarr.Array
        The array to read. Planned as one batch when it uses
        ``zarr_fused.FusedCodecPipeline``; otherwise (and for what the
        module docstring lists) each region is read with ``array[sel]``.
    selections : iterable
        Selections, as ``array[sel]`` takes them: tuples of integers and
        slices (step 1), ``Ellipsis``, a lone integer or slice, and at most
        one sorted 1-d NumPy integer array (repeats and negative indices
        allowed; read as ``array[sel]`` reads it: an orthogonal selection).
        Regions may overlap, lie on edge chunks or select nothing.
    out : sequence of numpy.ndarray, optional
        One buffer per selection, of the shape ``array[sel]`` has and the
        array's dtype, written in place.

    Returns
    -------
    list
        One result per selection, in order: what ``array[sel]`` returns
        (a NumPy array, zero-dimensional when every axis is an integer), or
        the buffers of ``out``.
    """
    selections = list(selections)
    buffers = None if out is None else _check_out(out, len(selections))
    geometry = _Geometry.of(array)
    if geometry is None:
        return _one_by_one(array, selections, buffers)
    regions = [_region(selection, geometry.shape) for selection in selections]
    results = _targets(geometry, regions, buffers)
    _read_regions(geometry, regions, results)
    rest = [i for i, region in enumerate(regions) if region is None]
    if rest:
        values = _one_by_one(
            array,
            [selections[i] for i in rest],
            None if buffers is None else [buffers[i] for i in rest],
        )
        for i, value in zip(rest, values, strict=True):
            results[i] = value
    return results


def _read_regions(geometry: _Geometry, regions: list[_Region | None], results: list[Any]) -> None:
    """Read the planned regions (not None) into their results: by the
    fan-out read where it applies, else through a staging array."""
    planned = [
        (region, np.expand_dims(result, region.dropped) if region.dropped else result)
        for region, result in zip(regions, results, strict=True)
        if region is not None
    ]
    fan_out = _FanOut.of(geometry)
    if fan_out is not None:
        fan_out.read([r for r, _ in planned], [d for _, d in planned])
        return
    boxes: list[_Box] = []
    dsts: list[np.ndarray] = []
    for region, dst in planned:
        for box in region.boxes(geometry.inner):
            boxes.append(box)
            dsts.append(dst)
    _read_planned(geometry, boxes, dsts)


def _targets(
    geometry: _Geometry, regions: list[_Region | None], buffers: list[np.ndarray] | None
) -> list[Any]:
    """The arrays the planned regions are read into (None for the others):
    the caller's buffers, checked, or new arrays (`_new_results`)."""
    if buffers is not None:
        for i, (region, buf) in enumerate(zip(regions, buffers, strict=True)):
            if region is not None:
                _check_buffer(buf, i, region.shape, geometry.dtype)
        return [
            None if region is None else buf for region, buf in zip(regions, buffers, strict=True)
        ]
    shapes = [region.shape for region in regions if region is not None]
    new = iter(_new_results(shapes, geometry.dtype, geometry.order))
    return [None if region is None else next(new) for region in regions]


def _new_results(
    shapes: list[tuple[int, ...]], dtype: np.dtype[Any], order: Any
) -> list[np.ndarray]:
    """New arrays of ``shapes``, cut in order from shared allocations of at
    most `RESULT_BLOCK_BYTES` (see there); a larger result is allocated on
    its own. Each starts on a 64-byte boundary of its allocation."""
    align = max(1, 64 // dtype.itemsize)
    sizes = [math.prod(shape) for shape in shapes]
    cap = RESULT_BLOCK_BYTES // dtype.itemsize
    results: list[np.ndarray] = []
    start = 0
    while start < len(shapes):
        # the results that fit one allocation, from ``start``
        stop, total = start, 0
        while stop < len(shapes) and (stop == start or total + sizes[stop] <= cap):
            total += -(-sizes[stop] // align) * align
            stop += 1
        flat = np.empty(total, dtype=dtype)
        offset = 0
        for shape, size in zip(shapes[start:stop], sizes[start:stop], strict=True):
            results.append(flat[offset : offset + size].reshape(shape, order=order))
            offset += -(-size // align) * align
        start = stop
    return results


def _read_planned(geometry: _Geometry, boxes: list[_Box], dsts: list[np.ndarray]) -> None:
    """Read every box into its ``dsts`` view (the result of its region), in
    waves of blocks (see the module docstring)."""
    if not boxes:
        return
    blocks = _blocks(geometry, boxes)
    width = tuple(max(b.hi[d] - b.lo[d] for b in blocks) for d in range(1, len(geometry.shape)))
    max_workers = resolve_max_workers()
    waves = _waves(blocks, width, geometry.dtype.itemsize)
    rows = max(sum(b.hi[0] - b.lo[0] for b in wave) for wave in waves)
    buffer = np.empty((rows, *width), dtype=geometry.dtype)
    for wave_blocks in waves:
        wave = _Wave(geometry, wave_blocks, buffer)
        wave.read()
        pairs = [(block, r) for block in wave_blocks for r in block.boxes]
        n_parts = min(len(pairs), 4 * max_workers)
        parts = [pairs[k::n_parts] for k in range(n_parts)]
        run_parallel(partial(_copy_part, wave, boxes, dsts), parts, max_workers)


def _copy_part(
    wave: _Wave,
    boxes: list[_Box],
    dsts: list[np.ndarray],
    pairs: list[tuple[_Block, int]],
) -> None:
    """Copy ``pairs`` (a block and a box overlapping it) out of ``wave``."""
    for block, r in pairs:
        wave.copy(boxes[r], block, dsts[r])


# -- the fan-out read ---------------------------------------------------------------------


def _segments(
    regions: Sequence[_Region], inner: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The regions as boxes of the array each copied in one piece per
    inner chunk: ``(lo, hi, at, dest)``, rows of ``[lo, hi)``, where the box
    starts in its destination and which destination (the region's place in
    ``regions``). A region with picks is one box per run of consecutive
    indices (a repeat or a gap starts a new one)."""
    ndim = len(inner)
    plain = [r for r, region in enumerate(regions) if region.picks is None and region.size]
    lo = [regions[r].lo for r in plain]
    hi = [regions[r].hi for r in plain]
    at = [(0,) * ndim] * len(plain)
    dest = plain
    for r, region in enumerate(regions):
        if region.picks is None:
            continue
        axis = region.picks.axis
        for box in region.boxes(inner):
            assert box.picked is not None  # a region with picks has them in every box
            index = region.picks.index[box.picked]
            cuts = (np.flatnonzero(np.diff(index) != 1) + 1).tolist()
            for a, b in zip([0, *cuts], [*cuts, len(index)], strict=True):
                b_lo, b_hi, b_at = list(box.lo), list(box.hi), [0] * ndim
                b_lo[axis], b_hi[axis] = int(index[a]), int(index[b - 1]) + 1
                b_at[axis] = box.picked.start + a
                lo.append(tuple(b_lo))
                hi.append(tuple(b_hi))
                at.append(tuple(b_at))
                dest.append(r)
    return (
        np.array(lo, dtype=np.int64).reshape(-1, ndim),
        np.array(hi, dtype=np.int64).reshape(-1, ndim),
        np.array(at, dtype=np.int64).reshape(-1, ndim),
        np.array(dest, dtype=np.intp),
    )


@dataclass(frozen=True, slots=True)
class _ShardJob:
    """The fan-out of one shard: the inner chunks any region touches
    (linear indices, ascending) and the targets of each, ``targets[
    starts[u]:starts[u + 1]]`` for ``units[u]`` (see `zarr_fused._shard.fan_out`)."""

    coords: tuple[int, ...]
    getter: Any
    units: np.ndarray
    starts: np.ndarray
    targets: np.ndarray


@dataclass(frozen=True, slots=True)
class _FanOut:
    """The fan-out read of a sharded array (see the module docstring)."""

    geometry: _Geometry
    reader: ShardReader
    kernel: Any
    layout: Any
    fill: bytes
    describe: Any

    @classmethod
    def of(cls, geometry: _Geometry) -> _FanOut | None:
        """The fan-out read of ``geometry``'s array, None when it keeps
        the staging design."""
        reader = geometry.plan.reader
        if (
            active() is not None
            or shard_kernels is None
            or not isinstance(reader, ShardReader)
            or type(reader.chain) is not NativeChain
        ):
            return None
        chain = reader.chain
        spec = geometry.spec
        if not chain.writes_into(np.empty(0, geometry.dtype), inner_chunk_spec(reader.codec, spec)):
            return None
        store = geometry.array.store_path.store
        if not store_supports_sync_io(store):
            return None
        return cls(
            geometry,
            reader,
            chain.kernel,
            chain.layout(reader.inner_shape),
            fill_pattern(spec, geometry.dtype),
            inner_describer(inner_grid(spec, reader.inner_shape)),
        )

    def jobs(self, regions: Sequence[_Region]) -> list[_ShardJob]:
        """One job per shard any region touches, in store order."""
        geometry = self.geometry
        inner = np.array(geometry.inner, dtype=np.int64)
        per_shard = np.array(geometry.outer, dtype=np.int64) // inner
        lo, hi, at, dest = _segments(regions, geometry.inner)
        if not len(lo):
            return []
        rows, coords = _pairs(lo, hi, inner)
        c_lo = np.maximum(lo[rows], coords * inner)
        c_hi = np.minimum(hi[rows], (coords + 1) * inner)
        grid = tuple(int(g) for g in -(-np.array(geometry.shape) // np.array(geometry.outer)))
        shard = np.ravel_multi_index(tuple((coords // per_shard).T), grid)
        lin = np.ravel_multi_index(tuple((coords % per_shard).T), tuple(per_shard.tolist()))
        order = np.lexsort((lin, shard))
        targets = np.ascontiguousarray(
            np.concatenate(
                [
                    dest[rows][:, None],
                    c_lo - coords * inner,
                    at[rows] + c_lo - lo[rows],
                    c_hi - c_lo,
                ],
                axis=1,
            )[order],
            dtype=np.intp,
        )
        shard, lin = shard[order], lin[order]
        unit_key = shard * int(per_shard.prod()) + lin
        unit_start = np.flatnonzero(np.diff(unit_key, prepend=-1))
        unit_shard = shard[unit_start]
        shard_start = np.flatnonzero(np.diff(unit_shard, prepend=-1))
        bounds = [*shard_start.tolist(), len(unit_start)]
        starts = np.append(unit_start, len(targets)).astype(np.intp)
        keys = [tuple(np.unravel_index(int(unit_shard[u]), grid)) for u in shard_start.tolist()]
        store_path = geometry.array.store_path
        encode = geometry.array.metadata.encode_chunk_key
        items = with_local_files(
            [(store_path / encode(tuple(int(c) for c in key)),) for key in keys]
        )
        jobs = []
        for (getter,), key, u0, u1 in zip(items, keys, bounds[:-1], bounds[1:], strict=True):
            t0, t1 = int(starts[u0]), int(starts[u1])
            jobs.append(
                _ShardJob(
                    tuple(int(c) for c in key),
                    getter,
                    np.ascontiguousarray(lin[unit_start[u0:u1]], dtype=np.intp),
                    starts[u0 : u1 + 1] - t0,
                    targets[t0:t1],
                )
            )
        return jobs

    def read(self, regions: Sequence[_Region], dsts: list[np.ndarray]) -> None:
        """Read every region into its destination (the region's result with
        every axis kept)."""
        geometry = self.geometry
        jobs = self.jobs(regions)
        if not jobs:
            return
        destinations = shard_kernels.Destinations(
            dsts, len(geometry.shape), geometry.dtype.itemsize
        )
        found = [True] * len(jobs)
        self.reader.read_touched(
            geometry.spec,
            [(job.getter, job.units) for job in jobs],
            partial(self.one_shard, destinations, jobs, found),
            resolve_max_workers(),
        )
        if not geometry.read_missing:
            _raise_missing(
                geometry, [j.coords for j, ok in zip(jobs, found, strict=True) if not ok]
            )

    def one_shard(
        self, destinations: Any, jobs: list[_ShardJob], found: list[bool], i: int, shard: Any
    ) -> None:
        """Fan out ``jobs[i]``'s fetched shard (its bytes released by the
        caller); a missing one marks ``found[i]`` False, its targets then
        hold the fill value. The shards are fetched by the reader's IO
        (`zarr_fused.shard.read.ShardReader.read_touched`): on slow files
        many at once, each fanned out as soon as it is in."""
        job = jobs[i]
        found[i] = not shard.missing
        shard_kernels.fan_out(
            self.kernel,
            self.layout,
            None if shard.missing else shard.payload,
            None if shard.missing else shard.entries,
            job.units,
            job.starts,
            job.targets,
            destinations,
            self.fill,
            job.getter,
            self.describe,
        )
