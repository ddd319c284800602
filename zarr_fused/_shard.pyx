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

The index format is `_shard_index`; reading a shard from a local file and
decoding it in one nogil section is `_shard_local`.
"""

from cpython.slice cimport PySlice_GetIndicesEx
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc

cimport numpy as cnp

import numpy as np

from zarr_fused._codec_batch cimport (
    ChunkLayout,
    DecodeBatch,
    EncodeBatch,
    as_selection_tuple,
    select_basic,
)
from zarr_fused._codecs cimport DecodeTask
from zarr_fused._scatter cimport ZF_MAX_DIMS
from zarr_fused._shard_index cimport entry_missing

from zarr_fused.errors import CorruptShardError

cnp.import_array()


cdef class ShardPlan:
    """The inner chunks a basic selection of one shard touches.

    Per axis, the touched inner chunks with the first selected element in
    each, how many elements it selects and where they land in the output;
    the touched set is the product of the axes.
    """

    cdef readonly int ndim
    cdef readonly int kept
    cdef readonly Py_ssize_t n_touched
    cdef readonly Py_ssize_t n_total
    cdef Py_ssize_t grid[ZF_MAX_DIMS]
    cdef Py_ssize_t inner[ZF_MAX_DIMS]
    cdef Py_ssize_t step[ZF_MAX_DIMS]
    cdef bint dropped[ZF_MAX_DIMS]
    cdef Py_ssize_t out_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t offs[ZF_MAX_DIMS + 1]
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

    def items(self):
        """Per touched inner chunk, in `touched` order: (linear index, the
        selection within the chunk, the selection within the plan's output
        block, whether the chunk is covered whole)."""
        cdef Py_ssize_t idx[ZF_MAX_DIMS]
        cdef Py_ssize_t strides[ZF_MAX_DIMS]
        cdef Py_ssize_t d, _k, j, lin
        cdef bint whole
        result = []
        if self.n_touched == 0:
            return result
        strides[self.ndim - 1] = 1
        for d in range(self.ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * self.grid[d + 1]
        for d in range(self.ndim):
            idx[d] = 0
        for _k in range(self.n_touched):
            lin = 0
            inner = []
            block = []
            whole = True
            for d in range(self.ndim):
                j = self.offs[d] + idx[d]
                lin += self.chunk[j] * strides[d]
                if self.dropped[d]:
                    inner.append(self.first[j])
                    whole = whole and self.inner[d] == 1
                else:
                    inner.append(slice(self.first[j],
                                       self.first[j] + (self.count[j] - 1) * self.step[d] + 1,
                                       self.step[d]))
                    block.append(slice(self.out_start[j], self.out_start[j] + self.count[j]))
                    whole = whole and self.first[j] == 0 and self.count[j] == self.inner[d] and (
                        self.step[d] == 1 or self.count[j] == 1)
            result.append((lin, tuple(inner), tuple(block), whole))
            d = self.ndim - 1
            while d >= 0:
                idx[d] += 1
                if idx[d] < self.offs[d + 1] - self.offs[d]:
                    break
                idx[d] = 0
                d -= 1
        return result

    def touched(self):
        """Linear (C-order) indices of the touched inner chunks, ascending."""
        cdef Py_ssize_t idx[ZF_MAX_DIMS]
        cdef Py_ssize_t strides[ZF_MAX_DIMS]
        cdef Py_ssize_t d, k, lin
        cdef cnp.ndarray result = np.empty(self.n_touched, dtype=np.intp)
        cdef Py_ssize_t* rp = <Py_ssize_t*>cnp.PyArray_DATA(result)
        if self.n_touched == 0:
            return result
        strides[self.ndim - 1] = 1
        for d in range(self.ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * self.grid[d + 1]
        for d in range(self.ndim):
            idx[d] = 0
        for k in range(self.n_touched):
            lin = 0
            for d in range(self.ndim):
                lin += self.chunk[self.offs[d] + idx[d]] * strides[d]
            rp[k] = lin
            d = self.ndim - 1
            while d >= 0:
                idx[d] += 1
                if idx[d] < self.offs[d + 1] - self.offs[d]:
                    break
                idx[d] = 0
                d -= 1
        return result


def plan_selection(tuple shard_shape, tuple inner_shape, selection):
    """A `ShardPlan` for a basic selection of a shard, or None when the
    selection is not basic (arrays, masks, negative steps)."""
    cdef ShardPlan plan = ShardPlan()
    cdef int ndim = len(shard_shape)
    cdef int d, k = 0
    cdef Py_ssize_t start, stop, step, length, idx, size, cs, c, lo, hi, i0, last, total = 0
    cdef Py_ssize_t pos = 0
    if ndim == 0 or ndim > ZF_MAX_DIMS or len(inner_shape) != ndim:
        return None
    sel = as_selection_tuple(selection)
    if len(sel) > ndim:
        return None
    for s in sel:
        if type(s) is slice:
            continue
        if not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_)):
            return None
    plan.ndim = ndim
    plan.n_total = 1
    for d in range(ndim):
        plan.inner[d] = inner_shape[d]
        if plan.inner[d] <= 0 or shard_shape[d] % plan.inner[d]:
            return None
        plan.grid[d] = shard_shape[d] // plan.inner[d]
        plan.n_total *= plan.grid[d]
        total += plan.grid[d]
    plan.chunk = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
    plan.first = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
    plan.count = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
    plan.out_start = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (total if total else 1))
    if plan.chunk == NULL or plan.first == NULL or plan.count == NULL or plan.out_start == NULL:
        raise MemoryError()
    plan.n_touched = 1
    for d in range(ndim):
        size = shard_shape[d]
        cs = plan.inner[d]
        plan.offs[d] = pos
        s = sel[d] if d < len(sel) else slice(None)
        if type(s) is slice:
            PySlice_GetIndicesEx(s, size, &start, &stop, &step, &length)
            if step <= 0:
                return None
            plan.dropped[d] = False
            plan.step[d] = step
            plan.out_shape[k] = length
            k += 1
            if length > 0:
                last = start + (length - 1) * step
                for c in range(start // cs, last // cs + 1):
                    lo = c * cs
                    hi = lo + cs
                    i0 = start if start >= lo else start + ((lo - start + step - 1) // step) * step
                    if i0 >= hi or i0 > last:
                        continue
                    plan.chunk[pos] = c
                    plan.first[pos] = i0 - lo
                    plan.count[pos] = ((hi - 1 if hi - 1 < last else last) - i0) // step + 1
                    plan.out_start[pos] = (i0 - start) // step
                    pos += 1
        else:
            idx = s
            if idx < 0:
                idx += size
            if idx < 0 or idx >= size:
                return None
            plan.dropped[d] = True
            plan.step[d] = 1
            plan.chunk[pos] = idx // cs
            plan.first[pos] = idx - (idx // cs) * cs
            plan.count[pos] = 1
            plan.out_start[pos] = 0
            pos += 1
        plan.n_touched *= pos - plan.offs[d]
    plan.offs[ndim] = pos
    plan.kept = k
    return plan


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
    cdef Py_ssize_t region_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t region_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t grid_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t base = 0
    cdef Py_ssize_t d, k, j, lin, _n, payload_len = 0
    cdef uint64_t off, size
    cdef int nd
    cdef DecodeTask* t
    cdef const uint8_t* data = NULL
    cdef const uint8_t[::1] view
    cdef const uint64_t* ep
    cdef char* out_data
    if layout.ndim != plan.ndim or out.ndim > ZF_MAX_DIMS or not out.flags.writeable:
        return False
    if out.dtype.itemsize != batch.kernel.itemsize:
        return False
    nd = select_basic(out.ndim, <Py_ssize_t*>cnp.PyArray_DIMS(out),
                      <Py_ssize_t*>cnp.PyArray_STRIDES(out), out_selection, &base,
                      region_shape, region_strides)
    if nd != plan.kept or nd > batch.max_ndim:
        return False
    for d in range(nd):
        if region_shape[d] != plan.out_shape[d]:
            return False
    if plan.n_touched == 0:
        return True
    if batch.n + plan.n_touched > batch.cap:
        raise IndexError("decode batch is full")
    if defer:
        if batch.fill is None:
            raise ValueError("set_fill() first")
    elif (entries is None or entries.dtype != np.uint64 or entries.ndim != 2
          or entries.shape[0] != plan.n_total or entries.shape[1] != 2
          or not entries.flags.c_contiguous):
        raise ValueError("entries must be the shard's (n, 2) uint64 index")
    if payload is not None and not defer:
        view = memoryview(payload).cast("B")
        payload_len = view.shape[0]
        data = &view[0] if payload_len else NULL
        batch.refs.append(view)
    if not defer:
        batch.refs.append(entries)
        ep = <const uint64_t*>cnp.PyArray_DATA(entries)
    out_data = <char*>cnp.PyArray_DATA(out) + base
    grid_strides[plan.ndim - 1] = 1
    for d in range(plan.ndim - 2, -1, -1):
        grid_strides[d] = grid_strides[d + 1] * plan.grid[d + 1]
    for d in range(plan.ndim):
        idx[d] = 0
    for _n in range(plan.n_touched):
        t = batch.next_task()
        lin = 0
        k = 0
        t.dst = out_data
        t.src_offset = 0
        for d in range(plan.ndim):
            j = plan.offs[d] + idx[d]
            lin += plan.chunk[j] * grid_strides[d]
            t.src_offset += plan.first[j] * layout.strides[d]
            if not plan.dropped[d]:
                t.shape[k] = plan.count[j]
                t.src_strides[k] = plan.step[d] * layout.strides[d]
                t.dst_strides[k] = region_strides[k]
                t.dst += plan.out_start[j] * region_strides[k]
                k += 1
        t.ndim = k
        t.nbytes = layout.nbytes
        t.chunk = lin
        if defer:
            pass  # src, src_len and missing are set once fetched
        elif entry_missing(ep[2 * lin], ep[2 * lin + 1]):
            if batch.fill is None:
                raise ValueError("set_fill() first")
            t.missing = True
        else:
            off = ep[2 * lin]
            size = ep[2 * lin + 1]
            if off > <uint64_t>payload_len or size > <uint64_t>payload_len - off:
                raise CorruptShardError(
                    f"{key!r}: inner chunk {lin} (bytes {off}..{off + size}) lies outside "
                    f"the {payload_len} bytes read")
            t.src = data + off
            t.src_len = <Py_ssize_t>size
        t.direct = batch.is_direct(t, layout)
        batch.keys.append((key, lin))
        batch.n += 1
        d = plan.ndim - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < plan.offs[d + 1] - plan.offs[d]:
                break
            idx[d] = 0
            d -= 1
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
    cdef Py_ssize_t region_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t region_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t logical[ZF_MAX_DIMS]
    cdef Py_ssize_t grid_strides[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t base = 0
    cdef Py_ssize_t d, k, j, lin, _n
    cdef int nd
    cdef bint whole
    cdef char* src
    cdef Py_ssize_t itemsize = batch.kernel.itemsize
    if layout.ndim != plan.ndim or value.ndim > ZF_MAX_DIMS or value.dtype.itemsize != itemsize:
        return None
    if value.dtype.hasobject:
        return None
    nd = select_basic(value.ndim, <Py_ssize_t*>cnp.PyArray_DIMS(value),
                      <Py_ssize_t*>cnp.PyArray_STRIDES(value), value_selection, &base,
                      region_shape, region_strides)
    if nd != plan.kept:
        return None
    for d in range(nd):
        if region_shape[d] != plan.out_shape[d]:
            return None
    if skip_fill and batch.fill is None:
        raise ValueError("set_fill() first")
    queued = []
    if plan.n_touched == 0:
        return np.array(queued, dtype=np.intp)
    grid_strides[plan.ndim - 1] = 1
    for d in range(plan.ndim - 2, -1, -1):
        grid_strides[d] = grid_strides[d + 1] * plan.grid[d + 1]
    for d in range(plan.ndim):
        idx[d] = 0
    for _n in range(plan.n_touched):
        lin = 0
        k = 0
        whole = True
        src = <char*>cnp.PyArray_DATA(value) + base
        for d in range(plan.ndim):
            j = plan.offs[d] + idx[d]
            lin += plan.chunk[j] * grid_strides[d]
            if plan.dropped[d]:
                whole = whole and plan.inner[d] == 1
                logical[d] = 0
            else:
                whole = whole and plan.first[j] == 0 and plan.count[j] == plan.inner[d] and (
                    plan.step[d] == 1 or plan.count[j] == 1)
                logical[d] = region_strides[k]
                src += plan.out_start[j] * region_strides[k]
                k += 1
        if whole:
            batch.queue(layout, src, logical, swap, skip_fill,
                        np.empty(batch.kernel.encode_bound(layout.nbytes), dtype=np.uint8),
                        (key, lin))
            queued.append(lin)
        d = plan.ndim - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < plan.offs[d + 1] - plan.offs[d]:
                break
            idx[d] = 0
            d -= 1
    batch.refs.append(value)
    return np.array(queued, dtype=np.intp)
