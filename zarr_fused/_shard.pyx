# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The inner chunks a selection of a shard touches, as codec tasks.

`plan_selection` maps a basic selection of a shard (slices with positive
steps, integers) to a `ShardPlan`: the inner chunks it touches, each with
the part of the chunk it selects and where that part goes in the output.
`add_shard` turns a plan into decode tasks of a `DecodeBatch`, so the inner
chunks of a shard are decoded straight into the output, in nogil calls,
without a Python object per inner chunk. On the write side
`add_shard_encode` queues the encodes of the inner chunks a write covers
whole, straight from the value being written, into an `EncodeBatch`.

`fan_out` serves many regions of an array at once (`zarr_fused.regions`):
each inner chunk of a shard is decoded once into the running thread's
scratch, which stays in cache, and copied from there into every region
that overlaps it (`Destinations`), so no decoded shard is ever staged.

The index format is `_shard_index`; reading a shard from a local file and
decoding it in one nogil section is `_shard_local`.
"""

from cpython.slice cimport PySlice_GetIndicesEx
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

cimport numpy as cnp

import numpy as np

from zarr_fused._codec_batch cimport (
    ChunkLayout,
    DecodeBatch,
    EncodeBatch,
    as_selection_tuple,
    select_basic,
)
from zarr_fused._codecs cimport (
    ZF_OK,
    ChainKernel,
    DecodeTask,
    Status,
    Workspace,
    c_strides,
    status_error,
    workspace,
)
from zarr_fused._ndindex cimport next_index
from zarr_fused._scatter cimport ZF_MAX_DIMS, copy_strided, fill_strided
from zarr_fused._shard_index cimport (
    CHUNK_MISSING,
    CHUNK_OUTSIDE,
    CHUNK_PRESENT,
    ChunkPlace,
    chunk_place,
    outside_error,
)

cnp.import_array()


cdef class ShardPlan:
    """The inner chunks a basic selection of one shard touches.

    Per axis, the touched inner chunks with the first selected element in
    each, how many elements it selects and where they land in the output;
    the touched set is the product of the axes, walked in C order by an
    index ``idx`` of a position per axis (`next_index` over ``n_axis``).
    """

    cdef readonly int ndim
    cdef readonly int kept
    cdef readonly Py_ssize_t n_touched
    cdef readonly Py_ssize_t n_total
    cdef Py_ssize_t grid[ZF_MAX_DIMS]
    cdef Py_ssize_t grid_strides[ZF_MAX_DIMS]  # of the linear index
    cdef Py_ssize_t inner[ZF_MAX_DIMS]
    cdef Py_ssize_t step[ZF_MAX_DIMS]
    cdef bint dropped[ZF_MAX_DIMS]
    cdef Py_ssize_t out_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t n_axis[ZF_MAX_DIMS]  # touched inner chunks along each axis
    cdef Py_ssize_t offs[ZF_MAX_DIMS + 1]  # axis d's entries: offs[d]:offs[d + 1]
    cdef Py_ssize_t* chunk
    cdef Py_ssize_t* first
    cdef Py_ssize_t* count
    cdef Py_ssize_t* out_start

    def __cinit__(self):
        self.chunk = NULL
        self.first = NULL
        self.count = NULL
        self.out_start = NULL

    def __dealloc__(self):
        free(self.chunk)
        free(self.first)
        free(self.count)
        free(self.out_start)

    @property
    def all_touched(self):
        return self.n_touched == self.n_total

    @property
    def out_shape(self):
        return tuple(self.out_shape[i] for i in range(self.kept))

    cdef int set_grid(self, tuple shard_shape, tuple inner_shape) except -2:
        """The grid of inner chunks, and room for every axis' entries; -1
        when the shard is not a whole number of inner chunks."""
        cdef Py_ssize_t total = 0
        cdef int d
        self.ndim = len(shard_shape)
        self.n_total = 1
        for d in range(self.ndim):
            self.inner[d] = inner_shape[d]
            if self.inner[d] <= 0 or shard_shape[d] % self.inner[d]:
                return -1
            self.grid[d] = shard_shape[d] // self.inner[d]
            self.n_total *= self.grid[d]
            total += self.grid[d]
        c_strides(self.ndim, self.grid, 1, self.grid_strides)
        self.chunk = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
        self.first = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
        self.count = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
        self.out_start = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
        if self.chunk == NULL or self.first == NULL or self.count == NULL or self.out_start == NULL:
            raise MemoryError()
        return 0

    cdef Py_ssize_t slice_axis(self, int d, Py_ssize_t pos, Py_ssize_t start, Py_ssize_t step,
                               Py_ssize_t length) noexcept nogil:
        """Enter the inner chunks that ``length`` elements from ``start``,
        ``step`` apart, touch along axis ``d`` from entry ``pos`` on;
        returns the next free entry."""
        cdef Py_ssize_t cs = self.inner[d]
        cdef Py_ssize_t c, lo, hi, i0, last
        self.dropped[d] = False
        self.step[d] = step
        if length <= 0:
            return pos
        last = start + (length - 1) * step
        for c in range(start // cs, last // cs + 1):
            lo = c * cs
            hi = lo + cs
            i0 = start if start >= lo else start + ((lo - start + step - 1) // step) * step
            if i0 >= hi or i0 > last:
                continue
            self.chunk[pos] = c
            self.first[pos] = i0 - lo
            self.count[pos] = ((hi - 1 if hi - 1 < last else last) - i0) // step + 1
            self.out_start[pos] = (i0 - start) // step
            pos += 1
        return pos

    cdef Py_ssize_t index_axis(self, int d, Py_ssize_t pos, Py_ssize_t idx) noexcept nogil:
        """Enter the inner chunk that element ``idx`` of axis ``d`` (dropped
        from the output) lies in, at entry ``pos``; returns ``pos + 1``."""
        cdef Py_ssize_t cs = self.inner[d]
        self.dropped[d] = True
        self.step[d] = 1
        self.chunk[pos] = idx // cs
        self.first[pos] = idx - (idx // cs) * cs
        self.count[pos] = 1
        self.out_start[pos] = 0
        return pos + 1

    cdef Py_ssize_t linear(self, const Py_ssize_t* idx) noexcept nogil:
        """The linear (C-order) index in the shard of the touched chunk at
        ``idx``."""
        cdef Py_ssize_t lin = 0
        cdef int d
        for d in range(self.ndim):
            lin += self.chunk[self.offs[d] + idx[d]] * self.grid_strides[d]
        return lin

    cdef bint covers(self, int d, Py_ssize_t j) noexcept nogil:
        """Whether the selection along axis ``d`` takes all of entry ``j``'s
        inner chunk, in order."""
        if self.dropped[d]:
            return self.inner[d] == 1
        return self.first[j] == 0 and self.count[j] == self.inner[d] and (
            self.step[d] == 1 or self.count[j] == 1)

    def items(self):
        """Per touched inner chunk, in `touched` order: (linear index, the
        selection within the chunk, the selection within the plan's output
        block, whether the chunk is covered whole)."""
        cdef Py_ssize_t idx[ZF_MAX_DIMS]
        cdef Py_ssize_t _k, j
        cdef int d
        cdef bint whole
        result = []
        memset(idx, 0, sizeof(Py_ssize_t) * self.ndim)
        for _k in range(self.n_touched):
            inner = []
            block = []
            whole = True
            for d in range(self.ndim):
                j = self.offs[d] + idx[d]
                whole = whole and self.covers(d, j)
                if self.dropped[d]:
                    inner.append(self.first[j])
                else:
                    inner.append(slice(self.first[j],
                                       self.first[j] + (self.count[j] - 1) * self.step[d] + 1,
                                       self.step[d]))
                    block.append(slice(self.out_start[j], self.out_start[j] + self.count[j]))
            result.append((self.linear(idx), tuple(inner), tuple(block), whole))
            next_index(idx, self.n_axis, self.ndim)
        return result

    def touched(self):
        """Linear (C-order) indices of the touched inner chunks, ascending."""
        cdef Py_ssize_t idx[ZF_MAX_DIMS]
        cdef Py_ssize_t k
        cdef cnp.ndarray result = np.empty(self.n_touched, dtype=np.intp)
        cdef Py_ssize_t* rp = <Py_ssize_t*>cnp.PyArray_DATA(result)
        memset(idx, 0, sizeof(Py_ssize_t) * self.ndim)
        for k in range(self.n_touched):
            rp[k] = self.linear(idx)
            next_index(idx, self.n_axis, self.ndim)
        return result


cdef bint _basic(tuple sel):
    """Whether every selector is a slice or an integer (not a bool)."""
    for s in sel:
        if type(s) is slice:
            continue
        if not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_)):
            return False
    return True


def plan_selection(tuple shard_shape, tuple inner_shape, selection):
    """A `ShardPlan` for a basic selection of a shard, or None when the
    selection is not basic (arrays, masks, negative steps)."""
    cdef ShardPlan plan = ShardPlan()
    cdef int ndim = len(shard_shape)
    cdef int d, k = 0
    cdef Py_ssize_t start, stop, step, length, idx, size, pos = 0
    if ndim == 0 or ndim > ZF_MAX_DIMS or len(inner_shape) != ndim:
        return None
    sel = as_selection_tuple(selection)
    if len(sel) > ndim or not _basic(sel) or plan.set_grid(shard_shape, inner_shape) < 0:
        return None
    plan.n_touched = 1
    for d in range(ndim):
        size = shard_shape[d]
        plan.offs[d] = pos
        s = sel[d] if d < len(sel) else slice(None)
        if type(s) is slice:
            PySlice_GetIndicesEx(s, size, &start, &stop, &step, &length)
            if step <= 0:
                return None
            plan.out_shape[k] = length
            k += 1
            pos = plan.slice_axis(d, pos, start, step, length)
        else:
            idx = s
            if idx < 0:
                idx += size
            if idx < 0 or idx >= size:
                return None
            pos = plan.index_axis(d, pos, idx)
        plan.n_axis[d] = pos - plan.offs[d]
        plan.n_touched *= plan.n_axis[d]
    plan.offs[ndim] = pos
    plan.kept = k
    return plan


cdef int _plan_region(ShardPlan plan, cnp.ndarray arr, selection, Py_ssize_t* base,
                      Py_ssize_t* region_strides) except -2:
    """Select ``arr[selection]`` (`select_basic`: its offset added to
    ``base[0]``, its strides into ``region_strides``); its ndim, or -1 when
    it is not a basic selection of the plan's output shape."""
    cdef Py_ssize_t region_shape[ZF_MAX_DIMS]
    cdef int d, nd
    if arr.ndim > ZF_MAX_DIMS:
        return -1
    nd = select_basic(arr.ndim, <Py_ssize_t*>cnp.PyArray_DIMS(arr),
                      <Py_ssize_t*>cnp.PyArray_STRIDES(arr), selection, base, region_shape,
                      region_strides)
    if nd != plan.kept:
        return -1
    for d in range(nd):
        if region_shape[d] != plan.out_shape[d]:
            return -1
    return nd


cdef void _describe_task(DecodeTask* t, ShardPlan plan, ChunkLayout layout,
                         const Py_ssize_t* idx, const Py_ssize_t* region_strides,
                         char* out_data) noexcept nogil:
    """Point decode task ``t`` at the touched chunk at ``idx``: the part of
    the chunk selected, where it lands in the region at ``out_data``."""
    cdef Py_ssize_t j
    cdef int d, k = 0
    t.dst = out_data
    t.src_offset = 0
    for d in range(plan.ndim):
        j = plan.offs[d] + idx[d]
        t.src_offset += plan.first[j] * layout.strides[d]
        if not plan.dropped[d]:
            t.shape[k] = plan.count[j]
            t.src_strides[k] = plan.step[d] * layout.strides[d]
            t.dst_strides[k] = region_strides[k]
            t.dst += plan.out_start[j] * region_strides[k]
            k += 1
    t.ndim = k
    t.nbytes = layout.nbytes
    t.chunk = plan.linear(idx)


cdef const uint64_t* _checked_entries(DecodeBatch batch, cnp.ndarray entries,
                                      ShardPlan plan) except NULL:
    """The shard's (offset, nbytes) pairs, once checked to be its index."""
    if (entries is None or entries.dtype != np.uint64 or entries.ndim != 2
            or entries.shape[0] != plan.n_total or entries.shape[1] != 2
            or not entries.flags.c_contiguous):
        raise ValueError("entries must be the shard's (n, 2) uint64 index")
    batch.refs.append(entries)
    return <const uint64_t*>cnp.PyArray_DATA(entries)


cdef int _bind_task(DecodeBatch batch, DecodeTask* t, const uint64_t* ep, const uint8_t* data,
                    Py_ssize_t total, key) except -1:
    """Point task ``t`` at its chunk among the ``total`` bytes at ``data``
    (``ep``: the shard's index), or mark it missing."""
    cdef uint64_t off, size
    cdef ChunkPlace place = chunk_place(ep, t.chunk, total, &off, &size)
    if place == CHUNK_OUTSIDE:
        raise outside_error(key, t.chunk, off, size, total)
    if place == CHUNK_MISSING:
        if batch.fill is None:
            raise ValueError("set_fill() first")
        t.missing = True
    else:
        t.src = data + off
        t.src_len = <Py_ssize_t>size
    return 0


def add_shard(DecodeBatch batch, payload, cnp.ndarray entries, ShardPlan plan,
              ChunkLayout layout, cnp.ndarray out, out_selection, key, *, bint defer=False):
    """Queue the touched inner chunks of one shard for decoding into
    ``out[out_selection]``.

    ``entries`` are the shard's checked (offset, nbytes) pairs, relative to
    ``payload`` (the shard, or the fetched part of it); ``key`` names the
    shard in errors. Returns False, queueing nothing, when ``out_selection``
    is not a basic selection of the plan's output shape.

    ``defer``: the shard is not fetched yet (``payload`` and ``entries`` are
    ignored); `read_shard_local` fetches it and points the tasks at their
    chunks before decoding them.
    """
    cdef Py_ssize_t region_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t base = 0, _n, payload_len = 0
    cdef int nd
    cdef DecodeTask* t
    cdef const uint8_t* data = NULL
    cdef const uint8_t[::1] view
    cdef const uint64_t* ep = NULL
    cdef char* out_data
    if (layout.ndim != plan.ndim or not out.flags.writeable
            or out.dtype.itemsize != batch.itemsize):
        return False
    nd = _plan_region(plan, out, out_selection, &base, region_strides)
    if nd < 0 or nd > batch.max_ndim:
        return False
    if plan.n_touched == 0:
        return True
    if batch.n + plan.n_touched > batch.cap:
        raise IndexError("decode batch is full")
    if defer and batch.fill is None:
        raise ValueError("set_fill() first")
    if not defer:
        ep = _checked_entries(batch, entries, plan)
        if payload is not None:
            view = memoryview(payload).cast("B")
            payload_len = view.shape[0]
            data = &view[0] if payload_len else NULL
            batch.refs.append(view)
    out_data = <char*>cnp.PyArray_DATA(out) + base
    memset(idx, 0, sizeof(Py_ssize_t) * plan.ndim)
    for _n in range(plan.n_touched):
        t = batch.next_task()
        _describe_task(t, plan, layout, idx, region_strides, out_data)
        if not defer:  # deferred: src, src_len and missing are set once fetched
            _bind_task(batch, t, ep, data, payload_len, key)
        t.direct = batch.is_direct(t, layout)
        batch.keys.append((key, t.chunk))
        batch.n += 1
        next_index(idx, plan.n_axis, plan.ndim)
    return True


def add_shard_encode(EncodeBatch batch, cnp.ndarray value, value_selection, ShardPlan plan,
                     ChunkLayout layout, key, bint swap, bint skip_fill):
    """Queue the encodes of the touched inner chunks that the write covers
    whole, reading them straight from ``value[value_selection]`` (the
    plan's output block).

    Returns
    -------
    numpy.ndarray
        The linear indices of the queued chunks, in queue order; None when
        ``value_selection`` is not a basic selection of the plan's shape.
    """
    cdef Py_ssize_t region_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t logical[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t base = 0, j, lin, _n
    cdef int d, k
    cdef bint whole
    cdef char* src
    if (layout.ndim != plan.ndim or value.dtype.itemsize != batch.itemsize
            or value.dtype.hasobject):
        return None
    if _plan_region(plan, value, value_selection, &base, region_strides) < 0:
        return None
    if skip_fill and batch.fill is None:
        raise ValueError("set_fill() first")
    queued = []
    if plan.n_touched == 0:
        return np.array(queued, dtype=np.intp)
    memset(idx, 0, sizeof(Py_ssize_t) * plan.ndim)
    for _n in range(plan.n_touched):
        k = 0
        whole = True
        src = <char*>cnp.PyArray_DATA(value) + base
        for d in range(plan.ndim):
            j = plan.offs[d] + idx[d]
            whole = whole and plan.covers(d, j)
            logical[d] = 0
            if not plan.dropped[d]:
                logical[d] = region_strides[k]
                src += plan.out_start[j] * region_strides[k]
                k += 1
        if whole:
            lin = plan.linear(idx)
            batch.queue(layout, src, logical, swap, skip_fill,
                        np.empty(batch.encoded_bound(layout.nbytes), dtype=np.uint8),
                        (key, lin))
            queued.append(lin)
        next_index(idx, plan.n_axis, plan.ndim)
    batch.refs.append(value)
    return np.array(queued, dtype=np.intp)


# -- many regions: one decode, many copies ------------------------------------------------


cdef class Destinations:
    """The arrays `fan_out` writes into (the results of a `read_regions`
    call, each with every axis of the array): their data pointers, shapes
    and byte strides, read once, and the arrays themselves, kept alive."""

    cdef readonly int ndim
    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t itemsize
    cdef char** data
    cdef Py_ssize_t* shapes  # n rows of ndim
    cdef Py_ssize_t* strides  # n rows of ndim
    cdef list arrays

    def __cinit__(self, list arrays, int ndim, Py_ssize_t itemsize):
        cdef Py_ssize_t i, rows = len(arrays)
        cdef int d
        cdef cnp.ndarray a
        self.data = NULL
        self.shapes = NULL
        self.strides = NULL
        if ndim < 1 or ndim > ZF_MAX_DIMS or itemsize < 1:
            raise ValueError("invalid destinations")
        self.ndim = ndim
        self.itemsize = itemsize
        self.data = <char**>malloc(sizeof(char*) * (rows if rows else 1))
        self.shapes = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * ndim * (rows if rows else 1))
        self.strides = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * ndim * (rows if rows else 1))
        if self.data == NULL or self.shapes == NULL or self.strides == NULL:
            raise MemoryError()
        for i in range(rows):
            a = arrays[i]
            if a.ndim != ndim or a.dtype.itemsize != itemsize or not a.flags.writeable:
                raise ValueError(f"destination {i} does not fit: {a.dtype}, {a.ndim} axes")
            self.data[i] = <char*>cnp.PyArray_DATA(a)
            for d in range(ndim):
                self.shapes[i * ndim + d] = cnp.PyArray_DIMS(a)[d]
                self.strides[i * ndim + d] = cnp.PyArray_STRIDES(a)[d]
        self.n = rows
        self.arrays = arrays

    def __dealloc__(self):
        free(self.data)
        free(self.shapes)
        free(self.strides)


cdef Py_ssize_t _bad_target(const Py_ssize_t[:, ::1] targets, Destinations dst,
                            ChunkLayout layout) noexcept nogil:
    """The first target that does not lie within its chunk and its
    destination, or -1. A target row: destination, then per axis the first
    element in the chunk, the first in the destination, the count."""
    cdef Py_ssize_t k, r, n
    cdef int d, nd = layout.ndim
    for k in range(targets.shape[0]):
        r = targets[k, 0]
        if r < 0 or r >= dst.n:
            return k
        for d in range(nd):
            n = targets[k, 1 + 2 * nd + d]
            if (n < 0 or targets[k, 1 + d] < 0 or targets[k, 1 + nd + d] < 0
                    or targets[k, 1 + d] > layout.shape[d] - n
                    or targets[k, 1 + nd + d] > dst.shapes[r * nd + d] - n):
                return k
    return -1


cdef void _copy_targets(const Py_ssize_t[:, ::1] targets, Py_ssize_t start, Py_ssize_t stop,
                        Destinations dst, ChunkLayout layout, const char* chunk,
                        const char* fill, Py_ssize_t swap_unit) noexcept nogil:
    """Copy the decoded ``chunk`` into targets ``start:stop`` (checked by
    `_bad_target`), or fill them when ``chunk`` is NULL."""
    cdef Py_ssize_t k, r
    cdef int d, nd = layout.ndim
    cdef const char* src
    cdef char* out
    cdef const Py_ssize_t* shape
    for k in range(start, stop):
        r = targets[k, 0]
        shape = &targets[k, 1 + 2 * nd]
        out = dst.data[r]
        src = chunk
        for d in range(nd):
            out += targets[k, 1 + nd + d] * dst.strides[r * nd + d]
            if chunk != NULL:
                src += targets[k, 1 + d] * layout.strides[d]
        if chunk == NULL:
            fill_strided(out, &dst.strides[r * nd], shape, nd, fill, dst.itemsize)
        else:
            copy_strided(src, layout.strides, out, &dst.strides[r * nd], shape, nd,
                         dst.itemsize, swap_unit)


cdef int _check_fan_out(ChainKernel kernel, ChunkLayout layout, cnp.ndarray entries,
                        const Py_ssize_t[::1] units, const Py_ssize_t[::1] starts,
                        const Py_ssize_t[:, ::1] targets, Destinations dst,
                        bytes fill) except -1:
    """Check `fan_out`'s arguments against each other: every unit an inner
    chunk of the shard, every target within its chunk and destination."""
    cdef Py_ssize_t u, bad, n_units = units.shape[0]
    cdef int nd = layout.ndim
    if (dst.ndim != nd or dst.itemsize != kernel.itemsize or fill is None
            or len(fill) != kernel.itemsize):
        raise ValueError("destinations, layout, kernel and fill do not agree")
    if (starts.shape[0] != n_units + 1 or targets.shape[1] != 1 + 3 * nd
            or (n_units and (starts[0] != 0 or starts[n_units] != targets.shape[0]))):
        raise ValueError("starts must cut targets into one run per unit")
    for u in range(n_units):
        if starts[u] > starts[u + 1]:
            raise ValueError("starts must cut targets into one run per unit")
    if entries is not None and (
        entries.dtype != np.uint64 or entries.ndim != 2 or entries.shape[1] != 2
        or not entries.flags.c_contiguous
    ):
        raise ValueError("entries must be the shard's (n, 2) uint64 index")
    for u in range(n_units):
        if units[u] < 0 or (entries is not None and units[u] >= entries.shape[0]):
            raise ValueError(f"unit {u} names no inner chunk of the shard")
    with nogil:
        bad = _bad_target(targets, dst, layout)
    if bad >= 0:
        raise ValueError(f"target {bad} lies outside its chunk or destination")
    return 0


def fan_out(ChainKernel kernel, ChunkLayout layout, payload, cnp.ndarray entries,
            const Py_ssize_t[::1] units, const Py_ssize_t[::1] starts,
            const Py_ssize_t[:, ::1] targets, Destinations dst, bytes fill, key, describe):
    """Decode inner chunks ``units`` (linear indices) of one shard, each
    once, into this thread's scratch, and copy each into all its targets,
    ``targets[starts[u]:starts[u + 1]]`` for unit ``u``, with the GIL
    released.

    A target row is the destination (its position in ``dst``), then per
    axis the first element in the chunk, the first in the destination and
    the count. ``entries`` are the shard's checked (offset, nbytes) pairs,
    relative to ``payload``; None when the shard is missing (every target
    then gets the ``fill`` element, as a missing inner chunk's do).
    ``describe`` names ``(key, linear index)`` in errors.
    """
    cdef Workspace ws = workspace()
    cdef Py_ssize_t n_units = units.shape[0]
    cdef Py_ssize_t u, lin, payload_len = 0, failed = -1
    cdef const uint8_t* data = <const uint8_t*>b""
    cdef const uint8_t[::1] view
    cdef const uint64_t* ep = NULL
    cdef const uint8_t* chunk
    cdef uint64_t off = 0, size = 0
    cdef ChunkPlace place = CHUNK_MISSING
    cdef Status st
    cdef const char* fill_c
    _check_fan_out(kernel, layout, entries, units, starts, targets, dst, fill)
    if entries is not None:
        ep = <const uint64_t*>cnp.PyArray_DATA(entries)
        view = memoryview(payload).cast("B")
        payload_len = view.shape[0]
        if payload_len:
            data = &view[0]
    fill_c = fill
    memset(&st, 0, sizeof(Status))
    with nogil:
        for u in range(n_units):
            lin = units[u]
            chunk = NULL
            if ep != NULL:
                place = chunk_place(ep, lin, payload_len, &off, &size)
                if place == CHUNK_OUTSIDE:
                    failed = u
                    break
                if place == CHUNK_PRESENT and kernel.decode_payload(
                    ws, data + off, <Py_ssize_t>size, layout.nbytes, NULL, &chunk, &st
                ) < 0:
                    failed = u
                    break
            _copy_targets(targets, starts[u], starts[u + 1], dst, layout,
                          <const char*>chunk, fill_c, kernel.swap_unit)
    if failed >= 0:
        lin = units[failed]
        if st.code == ZF_OK:
            raise outside_error(key, lin, off, size, payload_len)
        raise status_error(&st, describe((key, lin)))
