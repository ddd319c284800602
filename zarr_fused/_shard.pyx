# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Shards in native code: the shard index, the decode and encode tasks of a
selection's inner chunks, and shard assembly.

`parse_index` decodes a shard index (``bytes`` with an optional trailing
``crc32c``, as ``index_codecs``) and checks every entry before anything
reads through it: an entry is either missing (both fields 2**64-1) or a
byte range inside the shard that overlaps neither the index nor another
chunk. `ShardPlan` maps a basic selection of a shard (slices with positive
steps, integers) to the inner chunks it touches, each with the part of the
chunk it selects and where that part goes in the output; `add_shard` turns
a plan into decode tasks of a `DecodeBatch`, so the inner chunks of a shard
are decoded straight into the output, in nogil calls, without a Python
object per inner chunk. On the write side `add_shard_encode` queues the
encodes of the inner chunks a write covers whole, straight from the value
being written, and `assemble_shard` lays a shard out: payloads in the write
order, then (or before) the index with its crc32c.
"""

from cpython.slice cimport PySlice_GetIndicesEx
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy, memset
from posix.unistd cimport close

cimport numpy as cnp
import os

import numpy as np

from zarr_fused._codecs cimport (
    ChunkLayout,
    DecodeBatch,
    DecodeTask,
    EncodeBatch,
    EncodeTask,
    Workspace,
    as_selection_tuple,
    contiguous_run,
    select_basic,
    workspace,
)
from zarr_fused._localio cimport (
    FILE_MISSING,
    FILE_OK,
    open_regular,
    pread_full,
    read_ranges_fd,
)
from zarr_fused._scatter cimport ZF_MAX_DIMS

from zarr_fused.errors import CorruptShardError

cnp.import_array()

cdef extern from "_crc32c.h" nogil:
    void zf_crc32c_init()
    uint32_t zf_crc32c(const uint8_t* p, size_t n)

zf_crc32c_init()

cdef uint64_t MISSING = 0xFFFFFFFFFFFFFFFF

cdef struct Span:
    uint64_t start
    uint64_t end
    Py_ssize_t chunk


# Work on fewer bytes than this keeps the GIL: releasing and taking it back
# costs more than a small index takes to check, and when other threads
# wait for the GIL every release hands it over (a context switch each way).
cdef Py_ssize_t _NOGIL_MIN_BYTES = 1 << 16


cdef int _by_start(const void* a, const void* b) noexcept nogil:
    cdef const Span* x = <const Span*>a
    cdef const Span* y = <const Span*>b
    if x.start < y.start:
        return -1
    if x.start > y.start:
        return 1
    return 0


cdef inline void _sort_spans(Span* spans, Py_ssize_t m) noexcept nogil:
    """Sort by start; shards written in order are sorted already, and a
    check is cheaper than qsort's calls of the comparator."""
    cdef Py_ssize_t i
    for i in range(1, m):
        if spans[i].start < spans[i - 1].start:
            qsort(spans, <size_t>m, sizeof(Span), _by_start)
            return


cdef enum IndexProblem:
    INDEX_OK = 0
    INDEX_HALF_MISSING = 1
    INDEX_OVERFLOW = 2
    INDEX_PAST_END = 3
    INDEX_INTO_INDEX = 4
    INDEX_OVERLAP = 5
    INDEX_NOMEM = 6
    INDEX_CRC = 7


cdef int _validate(const uint64_t* entries, Py_ssize_t n, Py_ssize_t shard_len,
                   Py_ssize_t index_start, Py_ssize_t index_len,
                   Py_ssize_t* bad, Py_ssize_t* other) noexcept nogil:
    cdef Py_ssize_t i, m = 0
    cdef uint64_t off, size, end
    cdef Span* spans = <Span*>malloc(sizeof(Span) * (n if n else 1))
    if spans == NULL:
        return INDEX_NOMEM
    try:
        for i in range(n):
            off = entries[2 * i]
            size = entries[2 * i + 1]
            if off == MISSING and size == MISSING:
                continue
            bad[0] = i
            if off == MISSING or size == MISSING:
                return INDEX_HALF_MISSING
            end = off + size
            if end < off:
                return INDEX_OVERFLOW
            if shard_len >= 0:
                if end > <uint64_t>shard_len:
                    return INDEX_PAST_END
                if size and off < <uint64_t>(index_start + index_len) and end > <uint64_t>index_start:
                    return INDEX_INTO_INDEX
            if size:
                spans[m].start = off
                spans[m].end = end
                spans[m].chunk = i
                m += 1
        _sort_spans(spans, m)
        for i in range(1, m):
            if spans[i].start < spans[i - 1].end:
                bad[0] = spans[i].chunk
                other[0] = spans[i - 1].chunk
                return INDEX_OVERLAP
        return INDEX_OK
    finally:
        free(spans)


cdef int _decode_index(const uint8_t* raw, Py_ssize_t n_chunks, bint checksum, bint big_endian,
                       Py_ssize_t shard_len, Py_ssize_t index_start, uint64_t* entries,
                       Py_ssize_t* bad, Py_ssize_t* other, uint32_t* stored,
                       uint32_t* computed) noexcept nogil:
    """Decode the ``16 * n_chunks (+ 4)`` index bytes at ``raw`` into native
    (offset, nbytes) pairs at ``entries`` and check them (`_validate`):
    INDEX_OK or the problem, with ``bad``/``other`` (or, for INDEX_CRC, the
    ``stored``/``computed`` checksums) filled in."""
    cdef Py_ssize_t i, nbytes = 16 * n_chunks
    cdef uint64_t v
    cdef int b
    if checksum:
        computed[0] = zf_crc32c(raw, <size_t>nbytes)
        stored[0] = (<uint32_t>raw[nbytes] | (<uint32_t>raw[nbytes + 1] << 8)
                     | (<uint32_t>raw[nbytes + 2] << 16) | (<uint32_t>raw[nbytes + 3] << 24))
        if stored[0] != computed[0]:
            return INDEX_CRC
    for i in range(2 * n_chunks):
        v = 0
        if big_endian:
            for b in range(8):
                v = (v << 8) | raw[8 * i + b]
        else:
            for b in range(7, -1, -1):
                v = (v << 8) | raw[8 * i + b]
        entries[i] = v
    return _validate(entries, n_chunks, shard_len, index_start, nbytes + (4 if checksum else 0),
                     bad, other)


cdef _index_error(int problem, cnp.ndarray entries, Py_ssize_t bad, Py_ssize_t other,
                  uint32_t stored, uint32_t computed, Py_ssize_t shard_len, grid, where):
    """The exception for a `_decode_index` problem."""
    if problem == INDEX_NOMEM:
        return MemoryError()
    where = where() if callable(where) else where
    if problem == INDEX_CRC:
        return CorruptShardError(
            f"{where}: crc32c mismatch in the shard index "
            f"(stored {stored:#010x}, computed {computed:#010x})")

    def name(i):
        coords = np.unravel_index(i, grid) if grid is not None else (i,)
        return "inner chunk (" + ", ".join(str(int(c)) for c in coords) + ")"

    off, size = (int(v) for v in entries[bad])
    reason = {
        INDEX_HALF_MISSING: f"has a half-missing entry ({off:#x}, {size:#x})",
        INDEX_OVERFLOW: f"has a range that overflows ({off:#x}, {size:#x})",
        INDEX_PAST_END: f"ends at byte {off + size}, past the shard's {shard_len} bytes",
        INDEX_INTO_INDEX: f"lies in the shard index (bytes {off}..{off + size})",
        INDEX_OVERLAP: f"overlaps {name(other) if other >= 0 else 'another chunk'} "
                       f"(bytes {off}..{off + size})",
    }[problem]
    return CorruptShardError(f"{where}: {name(bad)} {reason}")


def parse_index(index, Py_ssize_t n_chunks, *, bint checksum, bint big_endian,
                Py_ssize_t shard_len=-1, Py_ssize_t index_start=0, grid=None,
                where="shard"):
    """Decode and check a shard index.

    Parameters
    ----------
    index : bytes-like
        The encoded index: ``16 * n_chunks`` bytes of (offset, nbytes)
        pairs, then a crc32c of them when ``checksum``.
    n_chunks : int
        Inner chunks per shard.
    checksum, big_endian : bool
        The index codecs: a trailing crc32c; the byte order of the pairs.
    shard_len, index_start : int
        The shard's length and where its index sits, when the whole shard
        is at hand (-1: unknown; ranges are then checked when fetched).
    grid : tuple of int, optional
        Inner chunks per shard along each axis, to name bad chunks.
    where : str or callable
        Names the shard in errors (a callable is called only then).

    Returns
    -------
    numpy.ndarray
        ``(n_chunks, 2)`` native uint64 (offset, nbytes); missing chunks
        hold 2**64-1 in both.
    """
    cdef const uint8_t[::1] raw = memoryview(index).cast("B")
    cdef Py_ssize_t expected = 16 * n_chunks + (4 if checksum else 0)
    cdef Py_ssize_t got = raw.shape[0]
    cdef uint32_t stored = 0, computed = 0
    cdef Py_ssize_t bad = -1, other = -1
    cdef int problem
    if got != expected:
        where = where() if callable(where) else where
        raise CorruptShardError.truncated(where, got, expected)
    cdef cnp.ndarray entries = np.empty((n_chunks, 2), dtype=np.uint64)
    cdef uint64_t* ep = <uint64_t*>cnp.PyArray_DATA(entries)
    cdef const uint8_t* rp = &raw[0] if got else <const uint8_t*>ep
    if expected >= _NOGIL_MIN_BYTES:
        with nogil:
            problem = _decode_index(rp, n_chunks, checksum, big_endian, shard_len, index_start,
                                    ep, &bad, &other, &stored, &computed)
    else:
        problem = _decode_index(rp, n_chunks, checksum, big_endian, shard_len, index_start,
                                ep, &bad, &other, &stored, &computed)
    if problem != INDEX_OK:
        raise _index_error(problem, entries, bad, other, stored, computed, shard_len, grid, where)
    return entries


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
        cdef Py_ssize_t d, k, j, lin
        cdef bint whole
        result = []
        if self.n_touched == 0:
            return result
        strides[self.ndim - 1] = 1
        for d in range(self.ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * self.grid[d + 1]
        for d in range(self.ndim):
            idx[d] = 0
        for k in range(self.n_touched):
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
    cdef Py_ssize_t d, k, j, lin, n, payload_len = 0
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
    elif entries is None or entries.dtype != np.uint64 or entries.ndim != 2 or entries.shape[0] != plan.n_total \
            or entries.shape[1] != 2 or not entries.flags.c_contiguous:
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
    for n in range(plan.n_touched):
        t = batch._next()
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
        elif ep[2 * lin] == MISSING and ep[2 * lin + 1] == MISSING:
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
    cdef Py_ssize_t d, k, j, lin, n, i
    cdef int nd
    cdef bint whole
    cdef EncodeTask* t
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
    for n in range(plan.n_touched):
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
            if batch.n >= batch.cap:
                raise IndexError("encode batch is full")
            t = &batch.tasks[batch.n]
            memset(t, 0, sizeof(EncodeTask))
            t.shape = batch.dims + 2 * batch.n * batch.max_ndim
            t.src_strides = t.shape + batch.max_ndim
            for i in range(layout.ndim):
                t.shape[i] = layout.stored_shape[i]
                t.src_strides[i] = logical[layout.perm[i]]
            t.ndim = layout.ndim
            t.src = src
            t.nbytes = layout.nbytes
            t.swap_unit = batch.kernel.swap_unit if swap else 0
            t.contiguous = contiguous_run(t.ndim, t.shape, t.src_strides, itemsize) * itemsize \
                == layout.nbytes
            t.check_fill = skip_fill
            out = np.empty(batch.kernel.encode_bound(layout.nbytes), dtype=np.uint8)
            t.dst = <uint8_t*>cnp.PyArray_DATA(out)
            t.dst_cap = out.shape[0]
            batch.outputs.append(out)
            batch.keys.append((key, lin))
            batch.n += 1
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


def shard_parts(cnp.ndarray order, list payloads, *, bint at_start, bint checksum,
                bint big_endian):
    """The pieces of a shard in file order: the index, and the present
    payloads in ``order``.

    Parameters
    ----------
    order : numpy.ndarray
        Linear indices of every inner chunk, in the order they are stored
        (the codec's ``subchunk_write_order``).
    payloads : list
        Per linear index, the chunk's bytes (a uint8 array) or None when the
        chunk is missing (empty payloads count as missing, as in zarr).
    at_start, checksum, big_endian : bool
        Index location and codecs (``bytes`` with that byte order, then an
        optional ``crc32c``).

    Returns
    -------
    list or None
        The payloads (as given) and the encoded index (bytes, first or last
        as ``at_start`` says), whose concatenation is the shard; None when
        no chunk is present (delete the shard).
    """
    cdef Py_ssize_t n = len(payloads)
    cdef Py_ssize_t index_size = 16 * n + (4 if checksum else 0)
    cdef Py_ssize_t pos, i, lin, size
    cdef cnp.ndarray entries
    cdef uint64_t* ep
    cdef Py_ssize_t* ordp
    cdef const uint8_t[::1] iview
    cdef uint32_t crc
    if order.dtype != np.intp or order.ndim != 1 or order.shape[0] != n:
        raise ValueError("order must list every inner chunk once")
    ordp = <Py_ssize_t*>cnp.PyArray_DATA(order)
    entries = np.full((n, 2), MISSING, dtype=np.uint64)
    ep = <uint64_t*>cnp.PyArray_DATA(entries)
    pos = index_size if at_start else 0
    parts = []
    for i in range(n):
        lin = ordp[i]
        if lin < 0 or lin >= n:
            raise ValueError("order must list every inner chunk once")
        p = payloads[lin]
        if p is None:
            continue
        size = len(p)
        if size == 0:
            continue
        if ep[2 * lin] != MISSING:
            raise ValueError("order must list every inner chunk once")
        ep[2 * lin] = <uint64_t>pos
        ep[2 * lin + 1] = <uint64_t>size
        pos += size
        parts.append(p)
    if not parts:
        return None
    index = entries.astype(">u8" if big_endian else "<u8", copy=False).tobytes()
    if checksum:
        iview = index
        if 16 * n >= _NOGIL_MIN_BYTES:
            with nogil:
                crc = zf_crc32c(&iview[0], <size_t>(16 * n))
        else:
            crc = zf_crc32c(&iview[0], <size_t>(16 * n))
        index += int(crc).to_bytes(4, "little")
    if at_start:
        parts.insert(0, index)
    else:
        parts.append(index)
    return parts


def assemble_shard(cnp.ndarray order, list payloads, *, bint at_start, bint checksum,
                   bint big_endian, take=None):
    """The shard's bytes in one array: the concatenation of `shard_parts`
    (same parameters); None when no chunk is present.

    The array is new, or, with ``take``, the first bytes of ``take(nbytes)``
    (a writeable uint8 buffer of at least ``nbytes``)."""
    cdef Py_ssize_t total = 0, pos = 0
    cdef const uint8_t[::1] view
    cdef uint8_t* op
    parts = shard_parts(order, payloads, at_start=at_start, checksum=checksum,
                        big_endian=big_endian)
    if parts is None:
        return None
    views = [memoryview(part).cast("B") for part in parts]
    for view in views:
        total += view.shape[0]
    if take is None:
        out = np.empty(total, dtype=np.uint8)
    else:
        buf = take(total)
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 \
                or not buf.flags.c_contiguous or not buf.flags.writeable or buf.shape[0] < total:
            raise ValueError("take() returned an unusable buffer")
        out = buf[:total]
    op = <uint8_t*>cnp.PyArray_DATA(out)
    # one GIL release for all the copies (``views`` keeps the sources alive)
    cdef Py_ssize_t n = len(views), k
    cdef const uint8_t** srcs = <const uint8_t**>malloc(sizeof(uint8_t*) * (n if n else 1))
    cdef Py_ssize_t* sizes = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (n if n else 1))
    try:
        if srcs == NULL or sizes == NULL:
            raise MemoryError()
        for k in range(n):
            view = views[k]
            sizes[k] = view.shape[0]
            srcs[k] = &view[0] if sizes[k] else NULL
        with nogil:
            for k in range(n):
                if sizes[k]:
                    memcpy(op + pos, srcs[k], <size_t>sizes[k])
                    pos += sizes[k]
    finally:
        free(srcs)
        free(sizes)
    return out



cdef struct PartialFetch:
    # inputs
    const char* path
    Py_ssize_t n_chunks
    Py_ssize_t isize
    bint checksum
    bint big_endian
    bint at_start
    const Py_ssize_t* touched
    Py_ssize_t k
    Py_ssize_t max_gap
    Py_ssize_t max_coalesced
    uint64_t* entries
    # scratch (malloc'd by _fetch_setup)
    unsigned char* raw
    Span* wanted
    Py_ssize_t* starts
    Py_ssize_t* lengths
    Py_ssize_t* offsets
    unsigned char* gap
    # state and outcome
    int fd
    Py_ssize_t size
    Py_ssize_t index_at
    Py_ssize_t m
    Py_ssize_t total
    int rc
    int ranges_rc
    int problem
    int err
    Py_ssize_t bad
    Py_ssize_t other
    uint32_t stored
    uint32_t computed
    bint fetched


cdef int _fetch_setup(PartialFetch* f, bytes path, Py_ssize_t n_chunks, cnp.ndarray touched,
                      cnp.ndarray entries, bint checksum, bint big_endian, bint at_start,
                      Py_ssize_t max_gap, Py_ssize_t max_coalesced) except -1:
    cdef Py_ssize_t i, k
    memset(f, 0, sizeof(PartialFetch))
    f.fd = -1
    f.bad = -1
    f.other = -1
    if touched.dtype != np.intp or not touched.flags.c_contiguous:
        raise TypeError("touched must be a contiguous intp array")
    f.touched = <const Py_ssize_t*>cnp.PyArray_DATA(touched)
    f.k = k = touched.shape[0]
    for i in range(k):
        if f.touched[i] < 0 or f.touched[i] >= n_chunks:
            raise IndexError("touched chunk out of range")
    f.path = path
    f.n_chunks = n_chunks
    f.isize = 16 * n_chunks + (4 if checksum else 0)
    f.checksum = checksum
    f.big_endian = big_endian
    f.at_start = at_start
    f.max_gap = max_gap
    f.max_coalesced = max_coalesced
    f.entries = <uint64_t*>cnp.PyArray_DATA(entries)
    f.raw = <unsigned char*>malloc(<size_t>(f.isize if f.isize else 1))
    f.wanted = <Span*>malloc(sizeof(Span) * (k if k else 1))
    f.starts = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (k if k else 1))
    f.lengths = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (k if k else 1))
    f.offsets = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (k if k else 1))
    if (f.raw == NULL or f.wanted == NULL or f.starts == NULL or f.lengths == NULL
            or f.offsets == NULL):
        raise MemoryError()
    return 0


cdef void _fetch_free(PartialFetch* f) noexcept:
    if f.fd >= 0:
        close(f.fd)
        f.fd = -1
    free(f.raw)
    free(f.wanted)
    free(f.starts)
    free(f.lengths)
    free(f.offsets)
    free(f.gap)
    f.raw = f.gap = NULL
    f.wanted = NULL
    f.starts = f.lengths = f.offsets = NULL


cdef void _fetch_index(PartialFetch* f) noexcept nogil:
    """Open the file, read and check its index, and lay out the touched
    present chunks: ``f.m`` ranges of ``f.total`` bytes (``f.rc`` 0 and
    ``f.problem`` INDEX_OK when all went well)."""
    cdef Py_ssize_t i, lin, biggest_gap = 0
    cdef uint64_t* ep = f.entries
    f.rc = open_regular(f.path, &f.fd, &f.size, &f.err)
    if f.rc != FILE_OK:
        return
    if f.size < f.isize:
        f.rc = 2
        return
    f.index_at = 0 if f.at_start else f.size - f.isize
    f.rc = pread_full(f.fd, f.raw, f.isize, f.index_at, &f.err)
    if f.rc == 1:
        f.rc = 2
    if f.rc != 0:
        return
    f.problem = _decode_index(f.raw, f.n_chunks, f.checksum, f.big_endian, f.size, f.index_at,
                              ep, &f.bad, &f.other, &f.stored, &f.computed)
    if f.problem != INDEX_OK:
        return
    for i in range(f.k):
        lin = f.touched[i]
        if ep[2 * lin] == MISSING or ep[2 * lin + 1] == 0:
            continue
        f.wanted[f.m].start = ep[2 * lin]
        f.wanted[f.m].end = ep[2 * lin] + ep[2 * lin + 1]
        f.wanted[f.m].chunk = lin
        f.m += 1
    _sort_spans(f.wanted, f.m)
    for i in range(f.m):
        f.starts[i] = <Py_ssize_t>f.wanted[i].start
        f.lengths[i] = <Py_ssize_t>(f.wanted[i].end - f.wanted[i].start)
        f.offsets[i] = f.total
        f.total += f.lengths[i]
        if i and <Py_ssize_t>(f.wanted[i].start - f.wanted[i - 1].end) > biggest_gap:
            biggest_gap = <Py_ssize_t>(f.wanted[i].start - f.wanted[i - 1].end)
    if biggest_gap > f.max_gap:
        biggest_gap = f.max_gap
    f.gap = <unsigned char*>malloc(<size_t>(biggest_gap if biggest_gap else 1))
    if f.gap == NULL:
        f.problem = INDEX_NOMEM


cdef void _fetch_ranges(PartialFetch* f, unsigned char* bp) noexcept nogil:
    """Read the laid-out chunks into ``bp`` (``f.total`` bytes) and point
    their index entries at them."""
    cdef Py_ssize_t i
    f.ranges_rc = read_ranges_fd(f.fd, f.m, f.starts, f.lengths, bp, f.offsets, f.max_gap,
                                 f.max_coalesced, f.gap, &f.err, &f.bad)
    f.fetched = True
    if f.ranges_rc == 0:
        for i in range(f.m):
            f.entries[2 * f.wanted[i].chunk] = <uint64_t>f.offsets[i]


cdef int _fetch_check(PartialFetch* f, bytes path, cnp.ndarray entries, grid, where) except -1:
    """Raise for a failed `_fetch_index` / `_fetch_ranges`; 1 when the
    shard is missing, else 0."""
    if f.rc == FILE_MISSING:
        return 1
    if f.rc == -1 or f.ranges_rc == -1:
        raise OSError(f.err, os.strerror(f.err), os.fsdecode(path))
    if f.rc == 2:
        w = where() if callable(where) else where
        raise CorruptShardError.truncated(w, None, f.isize)
    if f.problem != INDEX_OK:
        raise _index_error(f.problem, entries, f.bad, f.other, f.stored, f.computed, f.size,
                           grid, where)
    if f.ranges_rc == 1:  # cannot happen for ranges checked against the size, unless it shrank
        w = where() if callable(where) else where
        raise CorruptShardError(f"{w}: the shard changed size while it was read")
    return 0


def fetch_partial_local(bytes path, Py_ssize_t n_chunks, cnp.ndarray touched, take, *,
                        bint checksum, bint big_endian, bint at_start,
                        Py_ssize_t max_gap=1 << 20, Py_ssize_t max_coalesced=16 << 20,
                        Py_ssize_t size_hint=0, give=None, grid=None, where="shard",
                        DecodeBatch decode=None, Py_ssize_t first=0):
    """A partial read of a shard in a local file: its index, then the touched
    chunks (coalesced like `zarr_fused._localio.read_ranges`), from one open
    file, with the index checked against the file's size.

    ``take(nbytes)`` returns a writeable uint8 buffer of at least ``nbytes``;
    ``give(buffer)``, if given, takes back one that turned out too small.
    ``size_hint``, the bytes the touched chunks likely hold, sizes the buffer
    taken up front: when they fit, the index and the chunks are read, and
    the index checked, in one release of the GIL (a busy multi-threaded
    reader pays a hand-over of the GIL for each release); else the chunks
    are read in a second one. With ``decode``, that batch's tasks ``first:``
    are decoded from the fetched chunks in the same release (see
    `read_shard_local`).

    Returns
    -------
    tuple or None
        ``(entries, payload, buffer)``: the index with the touched present
        chunks' offsets pointing into ``payload`` (the first bytes of
        ``buffer``); None when the shard is missing.
    """
    cdef PartialFetch f
    cdef cnp.ndarray entries = np.empty((n_chunks, 2), dtype=np.uint64)
    cdef cnp.ndarray buf = None
    try:
        _fetch_setup(&f, path, n_chunks, touched, entries, checksum, big_endian, at_start,
                     max_gap, max_coalesced)
        buf = _fetch(&f, path, entries, take, give, size_hint, grid, where, decode, first)
        if buf is None:
            return None
        return entries, buf[:f.total], buf
    finally:
        _fetch_free(&f)


cdef cnp.ndarray _fetch(PartialFetch* f, bytes path, cnp.ndarray entries, take, give,
                        Py_ssize_t size_hint, grid, where, DecodeBatch batch, Py_ssize_t first):
    """Fetch what ``f`` describes into a buffer from ``take`` and, with a
    ``batch``, decode its tasks ``first:`` (`add_shard` ``defer=True``) in the
    same release of the GIL, when the chunks fit a buffer of ``size_hint``
    bytes; else in a second one with a bigger buffer (the small one going
    back through ``give``). Returns the buffer, None when the shard is
    missing; raises for IO errors, a bad shard or a failed decode."""
    cdef cnp.ndarray buf = _usable(take(max(size_hint, 1)), 0)
    cdef unsigned char* bp = <unsigned char*>cnp.PyArray_DATA(buf)
    cdef bint decode = batch is not None
    cdef Workspace ws = workspace() if decode else None
    cdef const char* fill = batch.fill_ptr() if decode else NULL
    cdef Py_ssize_t stop = batch.n if decode else 0, failed = -1, outside = -1
    if decode and (first < 0 or first > stop):
        raise IndexError("no such task")
    if decode and fill == NULL and stop > first:
        raise ValueError("set_fill() first")
    with nogil:
        _fetch_index(f)
        if f.rc == 0 and f.problem == INDEX_OK and f.total <= buf.shape[0]:
            _fetch_ranges(f, bp)
            if decode and f.ranges_rc == 0:
                outside = _bind(batch, first, stop, f.entries, bp, f.total)
                if outside < 0:
                    failed = batch.run_range(ws, first, stop, fill)
    if _fetch_check(f, path, entries, grid, where):
        give_back(give, buf)
        return None
    if not f.fetched:  # the chunks outgrew the hint: a bigger buffer
        give_back(give, buf)
        buf = _usable(take(f.total), f.total)
        bp = <unsigned char*>cnp.PyArray_DATA(buf)
        with nogil:
            _fetch_ranges(f, bp)
            if decode and f.ranges_rc == 0:
                outside = _bind(batch, first, stop, f.entries, bp, f.total)
                if outside < 0:
                    failed = batch.run_range(ws, first, stop, fill)
        _fetch_check(f, path, entries, grid, where)
    if outside >= 0:
        lin = batch.tasks[outside].chunk
        off, size = (int(v) for v in entries[lin])
        raise CorruptShardError(
            f"{batch.keys[outside][0]!r}: inner chunk {lin} (bytes {off}..{off + size}) "
            f"lies outside the {f.total} bytes read")
    if failed >= 0:
        batch.raise_failed(failed)
    return buf


cdef inline void give_back(give, buf):
    if give is not None:
        give(buf)


def read_shard_local(DecodeBatch batch, Py_ssize_t first, bytes path, Py_ssize_t n_chunks,
                     cnp.ndarray touched, take, give, *, bint checksum, bint big_endian,
                     bint at_start, Py_ssize_t max_gap=1 << 20,
                     Py_ssize_t max_coalesced=16 << 20, Py_ssize_t size_hint=0, grid=None,
                     where="shard"):
    """`fetch_partial_local`, then decode the batch's tasks ``first:`` (queued
    by `add_shard` with ``defer=True`` for this shard), in the same release
    of the GIL when the chunks fit the hinted buffer: a single-chunk read
    from several threads hands the GIL over once, not twice. The buffer goes
    back through ``give`` once decoded.

    Returns False when the shard is missing (nothing decoded), else True.
    """
    fetched = fetch_partial_local(
        path, n_chunks, touched, take, checksum=checksum, big_endian=big_endian,
        at_start=at_start, max_gap=max_gap, max_coalesced=max_coalesced, size_hint=size_hint,
        give=give, grid=grid, where=where, decode=batch, first=first)
    if fetched is None:
        return False
    give(fetched[2])
    return True


cdef Py_ssize_t _bind(DecodeBatch batch, Py_ssize_t first, Py_ssize_t stop,
                      const uint64_t* ep, const unsigned char* data,
                      Py_ssize_t total) noexcept nogil:
    """Point deferred tasks ``first:stop`` at their fetched chunks (or mark
    them missing); the first task whose chunk lies outside the ``total``
    bytes read, or -1."""
    cdef Py_ssize_t i, lin
    cdef uint64_t off, size
    cdef DecodeTask* t
    for i in range(first, stop):
        t = &batch.tasks[i]
        lin = t.chunk
        off = ep[2 * lin]
        size = ep[2 * lin + 1]
        if off == MISSING and size == MISSING:
            t.missing = True
            continue
        if off > <uint64_t>total or size > <uint64_t>total - off:
            return i
        t.src = data + off
        t.src_len = <Py_ssize_t>size
    return -1


cdef cnp.ndarray _usable(buf, Py_ssize_t nbytes):
    """``buf`` if it is a writeable C-contiguous uint8 array of at least
    ``nbytes`` bytes, else ValueError."""
    if (not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or not buf.flags.c_contiguous
            or not buf.flags.writeable or buf.shape[0] < nbytes):
        raise ValueError("take() returned an unusable buffer")
    return buf


