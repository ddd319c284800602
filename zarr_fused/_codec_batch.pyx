# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batches of chunk codec work, run in one ``nogil`` call per pool worker.

`DecodeBatch` / `EncodeBatch` collect the chunks of a batch as C structs
(`DecodeTask`, `EncodeTask` of `_codecs`), each pointing at its payload and
at the region of the output (or of the value written) it covers, so a pool
worker decodes or encodes its whole share without the GIL and without a
Python object per chunk. `ChunkLayout` says where each element of a chunk
sits in its stored bytes; `select_basic` maps a basic selection (slices and
integers) to an offset and strides, the only selections a task describes.

Both batches run a range of their tasks with `run_range` (several threads
may run disjoint ranges of one batch at once) or all of them with `run`,
and raise for the first task that failed, naming its key.

With `set_filters`, a batch also runs array->array filters
(`zarr_fused._filters.FilterChain`) on every chunk, between its values and
the chain kernel's items, still without the GIL: the shard engine decodes
and encodes inner chains with filters this way.

While a `zarr_fused.stats` block counts the call a batch works for, the
batch times its phases (`PhaseTimes`: file reads, decode, scatter, encode,
file writes) with a monotonic clock read between them, and hands the sums
to the block's sink after each run; otherwise it reads no clock (one test
of ``timed`` per run of tasks).
"""

from cpython.slice cimport PySlice_GetIndicesEx
from libc.stdint cimport int64_t, uint8_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

cimport numpy as cnp

import numpy as np

from zarr_fused.stats import CountedPath, active

from zarr_fused._codecs cimport (
    COMP_NONE,
    ZF_ERR_IO,
    ZF_ERR_NOMEM,
    ZF_OK,
    ChainKernel,
    DecodeTask,
    EncodeTask,
    Status,
    Workspace,
    as_bytes_view,
    c_strides,
    status_error,
    workspace,
)
from zarr_fused._filters cimport FILTER_OK, FilterCarry, FilterChain
from zarr_fused._phase_times cimport PhaseTimes, now_ns
from zarr_fused._localio cimport FILE_ERROR, FILE_MISSING, read_file, write_file_atomic
from zarr_fused._scatter cimport (
    ZF_MAX_DIMS,
    copy_strided,
    equal_strided,
    fill_strided,
    rows_side_by_side,
)

cnp.import_array()

cdef extern from *:
    """
    static inline void zf_add_i64(int64_t* p, int64_t v) {
        __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
    static inline int64_t zf_take_i64(int64_t* p) {
        return __atomic_exchange_n(p, 0, __ATOMIC_RELAXED);
    }
    """
    void zf_add_i64(int64_t* p, int64_t v) nogil
    int64_t zf_take_i64(int64_t* p) nogil


# -- phase times (only while a stats block counts the call) -------------------------------


cdef void add_times(PhaseTimes* into, const PhaseTimes* t) noexcept nogil:
    """Add ``t`` into a batch's ``times``: several threads may run ranges of
    one batch at once, each adding its sums when its range is done."""
    zf_add_i64(&into.io_ns, t.io_ns)
    zf_add_i64(&into.decode_ns, t.decode_ns)
    zf_add_i64(&into.scatter_ns, t.scatter_ns)
    zf_add_i64(&into.encode_ns, t.encode_ns)
    zf_add_i64(&into.write_ns, t.write_ns)
    zf_add_i64(&into.chunks, t.chunks)


cdef void _write_timed(EncodeTask* t, const char* path, PhaseTimes* acc) noexcept nogil:
    """The file write `ChainKernel.finish_encode` makes for a task bound
    for ``path``, made here after an encode run with ``t.path`` unset, so
    that its time counts as writing, not encoding."""
    cdef int err = 0
    cdef int64_t t0 = now_ns()
    t.path = path
    if t.status.code != ZF_OK or t.was_fill:
        return
    if write_file_atomic(path, t.dst, t.out_len, &err) == FILE_ERROR:
        t.status.code = ZF_ERR_IO
        t.status.a = err
    t.dst = NULL  # the IO buffer is reused by this thread's next task
    acc.write_ns += now_ns() - t0


# -- layout and selections --------------------------------------------------------------


cdef Py_ssize_t contiguous_run(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                               Py_ssize_t itemsize) noexcept nogil:
    """Number of elements when the block is one forward C-order run, else -1."""
    cdef int i
    cdef Py_ssize_t expect = itemsize
    cdef Py_ssize_t count = 1
    for i in range(ndim - 1, -1, -1):
        if shape[i] == 0:
            return 0
        if shape[i] == 1:
            continue
        if strides[i] != expect:
            return -1
        expect *= shape[i]
        count *= shape[i]
    return count


cdef bint same_dense_layout(int ndim, const Py_ssize_t* shape, const Py_ssize_t* src_strides,
                            const Py_ssize_t* dst_strides, Py_ssize_t itemsize,
                            Py_ssize_t nbytes) noexcept nogil:
    """Whether a block of ``nbytes`` stored bytes selected from offset 0
    covers all of them and sits at the same offsets in the destination.

    A basic selection with forward strides picks distinct elements, each
    within the ``nbytes``; when it picks ``nbytes / itemsize`` of them it
    picks every one, so equal strides mean the destination region is the
    stored bytes' image, dense, byte for byte.
    """
    cdef int i
    cdef Py_ssize_t count = itemsize
    for i in range(ndim):
        if shape[i] == 0:
            return False
        if shape[i] == 1:
            continue
        if src_strides[i] <= 0 or src_strides[i] != dst_strides[i]:
            return False
        count *= shape[i]
    return count == nbytes


cdef tuple as_selection_tuple(selection):
    """A selection as a tuple of per-axis selectors (``...`` alone is ``()``)."""
    if selection is Ellipsis:
        return ()
    if isinstance(selection, tuple):
        return selection
    return (selection,)


cdef int select_basic(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                      object selection, Py_ssize_t* offset, Py_ssize_t* out_shape,
                      Py_ssize_t* out_strides) except -2:
    """Apply a basic selection (slices and integers) to a strided block.

    Returns the resulting ndim and adds the byte offset of the first
    selected element to ``offset[0]``; returns -1 when the selection is not
    basic or an index is out of range (the caller takes the general path,
    which raises NumPy's error).
    """
    cdef Py_ssize_t start, stop, step, length, idx
    cdef int i = 0
    cdef int k = 0
    sel = as_selection_tuple(selection)
    if len(sel) > ndim:
        return -1
    for s in sel:
        if type(s) is slice:
            PySlice_GetIndicesEx(s, shape[i], &start, &stop, &step, &length)
            if length > 0:
                offset[0] += start * strides[i]
            out_shape[k] = length
            out_strides[k] = step * strides[i]
            k += 1
        elif isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)):
            idx = s
            if idx < 0:
                idx += shape[i]
            if idx < 0 or idx >= shape[i]:
                return -1
            offset[0] += idx * strides[i]
        else:
            return -1
        i += 1
    while i < ndim:
        out_shape[k] = shape[i]
        out_strides[k] = strides[i]
        k += 1
        i += 1
    return k


cdef class ChunkLayout:
    """Where each element of a chunk sits in its stored (decoded) bytes.

    The stored bytes are the C-order image of the chunk transposed by
    ``order`` (the transpose codec); ``strides`` are the chunk's logical
    strides into them.
    """

    def __init__(self, tuple shape, Py_ssize_t itemsize, order=None):
        cdef Py_ssize_t stored_strides[ZF_MAX_DIMS]
        cdef int i
        self.ndim = len(shape)
        if self.ndim > ZF_MAX_DIMS:
            raise ValueError(f"chunks with {self.ndim} dimensions are not supported")
        order = tuple(range(self.ndim)) if order is None else tuple(order)
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"invalid transpose order {order} for {self.ndim} dimensions")
        self.transposed = order != tuple(range(self.ndim))
        self.nbytes = itemsize
        for i in range(self.ndim):
            if shape[i] < 0:
                raise ValueError(f"invalid chunk shape {shape}")
            self.shape[i] = shape[i]
            self.nbytes *= shape[i]
            self.perm[i] = order[i]
            self.stored_shape[i] = shape[order[i]]
        c_strides(self.ndim, self.stored_shape, itemsize, stored_strides)
        for i in range(self.ndim):
            self.strides[self.perm[i]] = stored_strides[i]

    @property
    def shape(self):
        return tuple(self.shape[i] for i in range(self.ndim))

    @property
    def strides(self):
        return tuple(self.strides[i] for i in range(self.ndim))


# -- chunks side by side ----------------------------------------------------------------
#
# Chunks whose rows are short (a 32-element row of an inner chunk) sit in a
# large array as short runs far apart, and copying them one chunk at a time
# touches every cache line of the array several times, at different times
# (an x-neighbour copies the rest of the line later). When consecutive tasks
# are neighbours along the array's last axis, a read decodes them side by
# side into one scratch (small enough to stay in L2) and scatters them
# together, each row of the output in one run; a write gathers them the
# same way before encoding each. docs/performance.md ("Design measurements") records the gain.
cdef enum:
    _SIDE_MAX = 8
    _SIDE_MAX_BYTES = 1 << 20
    _SIDE_MAX_ROW = 512


cdef bint _can_lead(const DecodeTask* t, Py_ssize_t itemsize) noexcept nogil:
    cdef int nd = t.ndim
    return (t.path == NULL and not t.missing and not t.direct and nd >= 1
            and t.src_strides[nd - 1] == itemsize and t.dst_strides[nd - 1] == itemsize
            and t.shape[nd - 1] * itemsize < _SIDE_MAX_ROW)


cdef Py_ssize_t _side_by_side(const DecodeTask* tasks, Py_ssize_t count,
                              Py_ssize_t itemsize) noexcept nogil:
    """How many of the ``count`` tasks from ``tasks[0]`` on can be decoded
    side by side: same block geometry, each one row's width after the one
    before in the output."""
    cdef const DecodeTask* t0 = &tasks[0]
    cdef const DecodeTask* t
    cdef Py_ssize_t k, row
    cdef int d
    if count < 2 or not _can_lead(t0, itemsize):
        return 1
    row = t0.shape[t0.ndim - 1] * itemsize
    k = 1
    while k < count and k < _SIDE_MAX and (k + 1) * t0.nbytes <= _SIDE_MAX_BYTES:
        t = &tasks[k]
        if (t.path != NULL or t.missing or t.direct or t.ndim != t0.ndim
                or t.nbytes != t0.nbytes or t.src_offset != t0.src_offset
                or t.dst != t0.dst + k * row):
            break
        for d in range(t0.ndim):
            if (t.shape[d] != t0.shape[d] or t.src_strides[d] != t0.src_strides[d]
                    or t.dst_strides[d] != t0.dst_strides[d]):
                return k
        k += 1
    return k


cdef Py_ssize_t _decode_side_by_side(ChainKernel kernel, Workspace ws, DecodeTask* tasks,
                                     Py_ssize_t count, PhaseTimes* acc=NULL) noexcept nogil:
    """Decode ``count`` tasks found by `_side_by_side` and scatter them
    together (timed into ``acc``, if any). Returns -1, or the position of
    the task that failed."""
    cdef const char* srcs[_SIDE_MAX]
    cdef uint8_t* slots = NULL
    cdef const uint8_t* data
    cdef DecodeTask* t0 = &tasks[0]
    cdef Py_ssize_t j
    cdef int64_t mid, start = now_ns() if acc != NULL else 0
    if kernel.compressor != COMP_NONE:
        # decoded straight into the slots (no inner checksums: see DecodeBatch.run_group)
        slots = ws.reserve(<size_t>(count * t0.nbytes))
        if slots == NULL:
            t0.status.code = ZF_ERR_NOMEM
            return 0
    for j in range(count):
        if kernel.decode_payload(ws, tasks[j].src, tasks[j].src_len, tasks[j].nbytes,
                                 slots + j * t0.nbytes if slots != NULL else NULL,
                                 &data, &tasks[j].status) < 0:
            if acc != NULL:
                acc.decode_ns += now_ns() - start
            return j
        srcs[j] = <const char*>data + t0.src_offset
    if acc != NULL:
        mid = now_ns()
        acc.decode_ns += mid - start
        acc.chunks += count
        start = mid
    rows_side_by_side(t0.dst, t0.dst_strides, <char**>srcs, t0.src_strides, <int>count,
                      t0.shape, t0.ndim, kernel.itemsize, kernel.swap_unit, True)
    if acc != NULL:
        acc.scatter_ns += now_ns() - start
    return -1


cdef Py_ssize_t _encode_side_by_side(const EncodeTask* tasks, Py_ssize_t count,
                                     ChainKernel kernel) noexcept nogil:
    """How many of the ``count`` encode tasks from ``tasks[0]`` on can be
    gathered side by side from the source (the mirror of `_side_by_side`)."""
    cdef const EncodeTask* t0 = &tasks[0]
    cdef const EncodeTask* t
    cdef Py_ssize_t k, row, slot
    cdef int d, nd = t0.ndim
    cdef Py_ssize_t itemsize = kernel.itemsize
    # uncompressed chunks are gathered straight into their outputs, which
    # file-bound tasks do not have yet (the thread's one IO buffer)
    cdef bint into_outputs = kernel.compressor == COMP_NONE
    if (count < 2 or t0.contiguous or nd < 1 or t0.src_strides[nd - 1] != itemsize
            or t0.shape[nd - 1] * itemsize >= _SIDE_MAX_ROW
            or (into_outputs and t0.path != NULL)):
        return 1
    row = t0.shape[nd - 1] * itemsize
    slot = t0.nbytes + 4 * kernel.inner_crcs
    k = 1
    while k < count and k < _SIDE_MAX and (k + 1) * slot <= _SIDE_MAX_BYTES:
        t = &tasks[k]
        if (t.contiguous or t.ndim != nd or t.nbytes != t0.nbytes
                or t.swap_unit != t0.swap_unit or t.check_fill != t0.check_fill
                or (into_outputs and t.path != NULL) or t.src != t0.src + k * row):
            break
        for d in range(nd):
            if t.shape[d] != t0.shape[d] or t.src_strides[d] != t0.src_strides[d]:
                return k
        k += 1
    return k


cdef Py_ssize_t _encode_group(ChainKernel kernel, Workspace ws, EncodeTask* tasks,
                              Py_ssize_t count, const char* fill,
                              PhaseTimes* acc=NULL) noexcept nogil:
    """Gather ``count`` tasks found by `_encode_side_by_side` in one pass
    over the source, then encode each (with ``acc``, its file writes timed
    into it). Returns -1, or the position of the task that failed."""
    cdef const char* path
    cdef char* parts[_SIDE_MAX]
    cdef Py_ssize_t cstr[ZF_MAX_DIMS]
    cdef EncodeTask* t0 = &tasks[0]
    cdef EncodeTask* t
    cdef Py_ssize_t j, slot = t0.nbytes + 4 * kernel.inner_crcs
    cdef uint8_t* slots = NULL
    if kernel.compressor == COMP_NONE:
        for j in range(count):
            if kernel.reserve_output(ws, &tasks[j]) < 0:
                return j
            parts[j] = <char*>tasks[j].dst
    else:
        slots = ws.reserve(<size_t>(count * slot))
        if slots == NULL:
            t0.status.code = ZF_ERR_NOMEM
            return 0
        for j in range(count):
            parts[j] = <char*>slots + j * slot
    c_strides(t0.ndim, t0.shape, kernel.itemsize, cstr)
    rows_side_by_side(<char*>t0.src, t0.src_strides, parts, cstr, <int>count, t0.shape, t0.ndim,
                      kernel.itemsize, t0.swap_unit, False)
    for j in range(count):
        t = &tasks[j]
        # the fill test reads the source, in its own byte order, as run_encode's
        if t.check_fill and fill != NULL and equal_strided(
            t.src, t.src_strides, t.shape, t.ndim, fill, kernel.itemsize
        ):
            t.was_fill = True
            continue
        if kernel.compressor != COMP_NONE and kernel.reserve_output(ws, t) < 0:
            return j
        if acc == NULL or t.path == NULL:
            kernel.finish_encode(ws, t, <uint8_t*>parts[j])
        else:
            path = t.path
            t.path = NULL
            kernel.finish_encode(ws, t, <uint8_t*>parts[j])
            _write_timed(t, path, acc)
        if t.status.code != ZF_OK:
            return j
    return -1


# -- batches ----------------------------------------------------------------------------


# A task's rows decode straight into the output (`_decode_rows`) instead of
# into a scratch that is then scattered: one pass over the chunk's values
# fewer. Rows of a part of a chunk shorter than this go the scratch way,
# where one copy call moves them all (a call per short row costs more); a
# whole chunk's short rows still go in place, its one decode pass saved
# outweighing the calls.
cdef enum:
    MIN_FILTERED_ROW = 256


cdef bint _whole_rows(const DecodeTask* t, Py_ssize_t count, Py_ssize_t itemsize) noexcept nogil:
    """The task takes its whole chunk of ``count`` items in C order, into
    rows of the output whose items are adjacent."""
    cdef Py_ssize_t expect = itemsize
    cdef int d
    if t.src_offset != 0 or t.ndim < 1 or t.dst_strides[t.ndim - 1] != itemsize:
        return False
    for d in range(t.ndim - 1, -1, -1):
        if t.shape[d] != 1 and t.src_strides[d] != expect:
            return False
        expect *= t.shape[d]
    return expect == count * itemsize


cdef int _row_axes(const DecodeTask* t, Py_ssize_t count, Py_ssize_t itemsize,
                   FilterChain filters, Py_ssize_t* row) noexcept nogil:
    """How `_decode_rows` walks task ``t`` (a chunk of ``count`` items):
    the number of outer axes it steps over, each step a row of ``row[0]``
    items contiguous on both sides (trailing axes merged where both sides
    run on), or -1 for the scratch way: the chain has no `row_step`, the
    rows are not contiguous or land unaligned, or the task takes a part of
    its chunk and its rows are shorter than `MIN_FILTERED_ROW` bytes or go
    in order (delta's running sum)."""
    cdef int k, last = t.ndim - 1
    cdef Py_ssize_t n
    cdef bint whole
    if filters.row_step < 0 or last < 0:
        return -1
    if t.src_strides[last] != itemsize or t.dst_strides[last] != itemsize:
        return -1
    if <uintptr_t>t.dst % <uintptr_t>itemsize:
        return -1
    whole = _whole_rows(t, count, itemsize)
    if filters.rows_in_order and not whole:
        return -1
    for k in range(last):
        if t.src_strides[k] % itemsize or t.dst_strides[k] % itemsize:
            return -1
    n = t.shape[last]
    while last > 0 and (t.shape[last - 1] == 1 or (t.src_strides[last - 1] == n * itemsize
                                                   and t.dst_strides[last - 1] == n * itemsize)):
        last -= 1
        n *= t.shape[last]
    if n * itemsize < MIN_FILTERED_ROW and not whole:
        return -1
    row[0] = n
    return last


cdef int _decode_rows(FilterChain filters, const char* items, const DecodeTask* t,
                      Py_ssize_t itemsize, int outer, Py_ssize_t row) noexcept nogil:
    """Decode task ``t``'s selected rows (``outer`` axes of rows of ``row``
    items, as `_row_axes` said) from its chunk's ``items`` as `decode_head`
    left them into its region of the output, in C order, with the chain's
    `row_step`; the items sit where the values would, scaled by the item
    sizes. The rows along the last outer axis go to the chain in one call
    (`FilterChain.decode_rows`). `FILTER_OK`, or what the step said of the
    first row it refused."""
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t src_strides[ZF_MAX_DIMS]  # in bytes of the items
    cdef FilterCarry carry
    cdef Py_ssize_t encoded = filters.steps[filters.row_step].encoded_itemsize
    cdef const char* src = items + t.src_offset // itemsize * encoded
    cdef char* dst = t.dst
    cdef Py_ssize_t rows = 1, src_step = 0, dst_step = 0
    cdef int k, rc
    for k in range(outer):
        if t.shape[k] == 0:
            return FILTER_OK
        idx[k] = 0
        src_strides[k] = t.src_strides[k] // itemsize * encoded
    if outer > 0:
        rows = t.shape[outer - 1]
        src_step = src_strides[outer - 1]
        dst_step = t.dst_strides[outer - 1]
    memset(&carry, 0, sizeof(carry))
    while True:
        rc = filters.decode_rows(src, src_step, dst, dst_step, rows, row, &carry)
        if rc != FILTER_OK:
            return rc
        k = outer - 2
        while k >= 0:
            idx[k] += 1
            src += src_strides[k]
            dst += t.dst_strides[k]
            if idx[k] < t.shape[k]:
                break
            src -= t.shape[k] * src_strides[k]
            dst -= t.shape[k] * t.dst_strides[k]
            idx[k] = 0
            k -= 1
        if k < 0:
            return FILTER_OK


def read_again(bytes path):
    """A refused file task's payload for zarr's code, read again (the batch
    read it into a buffer that the next task reused), or None when the file
    went in between: zarr's code reads that chunk as missing. A module
    function (not a cdef one) so that a test can delete the file first."""
    try:
        with open(path, "rb", buffering=0) as file:
            return file.readall()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


cdef object _payload_again(const DecodeTask* t):
    """A task's payload for zarr's code (`read_again` for a file task), or
    None for a file gone since the run read it."""
    if t.path == NULL:
        return (<const char*>t.src)[:t.src_len] if t.src_len else b""
    return read_again(<bytes>t.path)


cdef class TaskBatch:
    """What `DecodeBatch` and `EncodeBatch` share: a fixed number of task
    slots allocated up front, each with room for ``max_ndim`` entries of
    its ``dims_per_task`` shape and stride arrays; the keys naming the
    tasks in errors; the fill pattern; the Python objects that keep the
    tasks' memory alive (``refs``)."""

    def __cinit__(self, *args, **kwargs):
        if type(self) is TaskBatch:
            raise TypeError("TaskBatch is the base of DecodeBatch and EncodeBatch")

    def __dealloc__(self):
        free(self.task_memory)
        free(self.dims)
        free(self.refused)

    def __len__(self):
        return self.n

    cdef int allocate(self, ChainKernel kernel, Py_ssize_t capacity, int max_ndim, describe,
                      size_t task_size, int dims_per_task) except -1:
        cdef size_t slots = <size_t>(capacity if capacity else 1)
        if capacity < 0 or max_ndim < 0 or max_ndim > ZF_MAX_DIMS:
            raise ValueError("invalid batch size")
        self.kernel = kernel
        self.itemsize = kernel.itemsize
        self.cap = capacity
        self.max_ndim = max_ndim
        self.dims_per_task = dims_per_task
        self.n = 0
        self.task_memory = malloc(task_size * slots)
        self.dims = <Py_ssize_t*>malloc(
            sizeof(Py_ssize_t) * dims_per_task * slots * (max_ndim if max_ndim else 1))
        if self.task_memory == NULL or self.dims == NULL:
            raise MemoryError()
        self.refs = []
        self.keys = []
        self.fill = None
        self.describe = describe
        return 0

    cdef Py_ssize_t* task_dims(self, Py_ssize_t i) noexcept nogil:
        """The shape and stride arrays of task ``i``, back to back."""
        return self.dims + self.dims_per_task * i * self.max_ndim

    def set_fill(self, bytes pattern):
        """The fill value: one element, in the byte order of the in-memory
        arrays (the output a decode writes, the value an encode reads)."""
        if len(pattern) != self.itemsize:
            raise ValueError("fill pattern must be one element")
        self.fill = pattern

    def set_filters(self, FilterChain filters, refuse=None):
        """Run ``filters`` on every chunk, between the values (``itemsize``
        bytes an item, the batch's ``itemsize`` from now on) and the chain
        kernel's items. An encode the filters refuse (a value
        fixedscaleoffset's type cannot hold) is handed to ``refuse``: it
        gets the chunk's values in C order (uint8) and returns its encoded
        bytes (uint8), or None to store nothing. A decode the filters refuse
        (``filters.may_refuse``: a remainder of an integer scale_offset...)
        is handed to ``refuse`` too, after the run: it gets the chunk's
        payload (uint8) and the chunk's description and returns the decoded
        chunk's values in C order (uint8), or raises zarr's error for them.
        Before any task and fill."""
        if self.n or self.fill is not None:
            raise ValueError("set_filters() before adding tasks and setting the fill")
        if filters.encoded_itemsize != self.kernel.itemsize:
            raise ValueError("the filters' encoded items are not the chain kernel's")
        if self.refused == NULL:
            self.refused = <uint8_t*>calloc(<size_t>(self.cap if self.cap else 1), 1)
            if self.refused == NULL:
                raise MemoryError()
        self.filters = filters
        self.itemsize = filters.itemsize
        self.refuse = refuse

    cdef Py_ssize_t encoded_nbytes(self, Py_ssize_t nbytes) noexcept nogil:
        """The chain kernel's bytes for a chunk of ``nbytes`` value bytes."""
        if self.filters is None:
            return nbytes
        return nbytes // self.itemsize * self.kernel.itemsize

    cdef Py_ssize_t task_nbytes(self, Py_ssize_t i) noexcept nogil:
        return 0

    cdef int run_filtered(self, Workspace ws, Py_ssize_t i, const char* fill, uint8_t* a,
                          uint8_t* b) noexcept nogil:
        return -1

    cdef Py_ssize_t run_filtered_range(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                                       const char* fill) noexcept nogil:
        """`run_tasks` with filters: one task at a time, through two scratch
        buffers for the filtered items, allocated once for the range (several
        threads may run ranges of one batch at once, each with its own)."""
        cdef Py_ssize_t i, count, most = 0, failed = -1
        cdef size_t half
        cdef uint8_t* scratch
        for i in range(start, stop):
            count = self.task_nbytes(i) // self.itemsize
            if count > most:
                most = count
        # each half 64-byte aligned: the kernels read them as 8-byte items
        half = (<size_t>(most * self.filters.max_itemsize) + 63) & ~(<size_t>63)
        scratch = <uint8_t*>malloc(2 * half if half else 64)
        if scratch == NULL:
            self.status_of(start).code = ZF_ERR_NOMEM
            return start
        try:
            for i in range(start, stop):
                if self.run_filtered(ws, i, fill, scratch, scratch + half) < 0:
                    failed = i
                    break
        finally:
            free(scratch)
        return failed

    cdef const char* fill_ptr(self) noexcept:
        return <const char*>self.fill if self.fill is not None else NULL

    cdef object fail(self, Status* status, Py_ssize_t failed):
        raise status_error(status, self.describe(self.keys[failed]))

    cdef Status* status_of(self, Py_ssize_t i) noexcept nogil:
        """Where task ``i`` leaves its status (each batch has its own tasks)."""
        return NULL

    cdef object raise_failed(self, Py_ssize_t failed):
        self.fail(self.status_of(failed), failed)

    cdef Py_ssize_t run_group(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop, const char* fill,
                              Py_ssize_t* size) noexcept nogil:
        """Run the tasks from ``i`` on (before ``stop``) that go together,
        their count into ``size[0]``: -1, or the position in the group of
        the task that failed. Each batch runs its own kind of task."""
        size[0] = 1
        return 0

    cdef Py_ssize_t run_tasks(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                              const char* fill) noexcept nogil:
        """Run tasks ``start:stop`` (a valid range) group by group, with
        ``fill`` as the fill pattern; the first failed task's position, or -1."""
        cdef Py_ssize_t size, bad, i = start
        if self.timed:
            return self.run_tasks_timed(ws, start, stop, fill)
        if self.filters is not None:
            return self.run_filtered_range(ws, start, stop, fill)
        while i < stop:
            bad = self.run_group(ws, i, stop, fill, &size)
            if bad >= 0:
                return i + bad
            i += size
        return -1

    cdef Py_ssize_t run_tasks_timed(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                                    const char* fill) noexcept nogil:
        """`run_tasks` with its phases timed, the sums added to ``times``.
        With filters, one figure per task: decode (or encode), the scatter
        (or gather) and the filters in it."""
        cdef PhaseTimes acc
        cdef Py_ssize_t size, i, bad = -1, end = stop
        cdef int64_t began
        memset(&acc, 0, sizeof(PhaseTimes))
        if self.filters is not None:
            began = now_ns()
            bad = self.run_filtered_range(ws, start, stop, fill)
            if self.encodes:
                acc.encode_ns = now_ns() - began
            else:
                acc.decode_ns = now_ns() - began
            end = stop if bad < 0 else bad
            for i in range(start, end):
                acc.chunks += self.task_nbytes(i) > 0
        else:
            i = start
            while i < stop:
                bad = self.run_group_timed(ws, i, stop, fill, &size, &acc)
                if bad >= 0:
                    bad += i
                    break
                i += size
        add_times(&self.times, &acc)
        return bad

    cdef Py_ssize_t run_group_timed(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop,
                                    const char* fill, Py_ssize_t* size,
                                    PhaseTimes* acc) noexcept nogil:
        """`run_group`, its phases timed into ``acc``."""
        return self.run_group(ws, i, stop, fill, size)

    cdef object start_timing(self):
        """The sink of the `zarr_fused.stats` block counting the batch's
        call (None: none), ``timed`` set while there is one. The keys say
        it: a block's call hands over counted keys (a shard's inner chunk
        is keyed (shard key, index)); where it cannot (object stores), a
        compute thread that copied the caller's context finds the block
        active, and a pool thread none."""
        sink = None
        if self.n:
            key = self.keys[0]
            if type(key) is tuple:
                key = key[0]
            sink = key.sink if type(key) is CountedPath else active()
        self.timed = sink is not None
        return sink

    cdef object flush_times(self, sink):
        """Hand the phase times summed so far to ``sink`` (a `Stats`)."""
        cdef PhaseTimes t
        t.io_ns = zf_take_i64(&self.times.io_ns)
        t.decode_ns = zf_take_i64(&self.times.decode_ns)
        t.scatter_ns = zf_take_i64(&self.times.scatter_ns)
        t.encode_ns = zf_take_i64(&self.times.encode_ns)
        t.write_ns = zf_take_i64(&self.times.write_ns)
        t.chunks = zf_take_i64(&self.times.chunks)
        sink.phases(
            "write" if self.encodes else "read",
            bool(self.n) and type(self.keys[0]) is tuple,
            t.chunks,
            io=t.io_ns * 1e-9,
            decode=t.decode_ns * 1e-9,
            scatter=t.scatter_ns * 1e-9,
            encode=t.encode_ns * 1e-9,
            write=t.write_ns * 1e-9,
        )

    cdef Py_ssize_t run_clamped(self, Py_ssize_t start, Py_ssize_t stop) except -1:
        """`run_tasks` over ``start:stop`` clamped to the batch (to its end
        when ``stop`` is negative) with the GIL released; raise for the first
        task that failed. Returns the clamped stop."""
        cdef Workspace ws = workspace()
        cdef const char* fill = self.fill_ptr()
        cdef Py_ssize_t failed
        if stop < 0 or stop > self.n:
            stop = self.n
        if start < 0:
            start = 0
        sink = self.start_timing()
        with nogil:
            failed = self.run_tasks(ws, start, stop, fill)
        if sink is not None:
            self.flush_times(sink)
        if failed >= 0:
            self.raise_failed(failed)
        return stop


cdef class DecodeBatch(TaskBatch):
    """The decode work of a group of chunks, as C tasks, run in one nogil call.

    ``add`` describes one chunk (payload, where its selection lands in
    ``out``); ``add_missing`` a chunk to fill. Both return False when the
    selection is not a basic one (the caller decodes that chunk another way).
    ``run`` executes the tasks in order and stops at the first one that
    fails, raising for it (the tasks before it have been applied);
    ``run_range`` does the same for a range of them.
    """

    def __cinit__(self, ChainKernel kernel, Py_ssize_t capacity, int max_ndim, describe=repr):
        self.allocate(kernel, capacity, max_ndim, describe, sizeof(DecodeTask), 3)
        self.tasks = <DecodeTask*>self.task_memory

    cdef DecodeTask* next_task(self) except NULL:
        cdef DecodeTask* t
        if self.n >= self.cap:
            raise IndexError("decode batch is full")
        t = &self.tasks[self.n]
        memset(t, 0, sizeof(DecodeTask))
        t.shape = self.task_dims(self.n)
        t.src_strides = t.shape + self.max_ndim
        t.dst_strides = t.src_strides + self.max_ndim
        return t

    cdef int _target(self, DecodeTask* t, cnp.ndarray out, object out_selection,
                     Py_ssize_t* shape) except -2:
        """Point ``t.dst`` at ``out[out_selection]``; returns its ndim or -1.

        ``shape`` (ZF_MAX_DIMS entries) receives the target's shape. The
        strides are selected into a local array first: ``t.dst_strides`` has
        room for ``max_ndim`` entries only, and a target with more
        dimensions (declined here) must not write past them.
        """
        cdef Py_ssize_t offset = 0
        cdef Py_ssize_t strides[ZF_MAX_DIMS]
        cdef int nd, i
        if out.ndim > ZF_MAX_DIMS or not out.flags.writeable:
            return -1
        nd = select_basic(out.ndim, <Py_ssize_t*>cnp.PyArray_DIMS(out),
                          <Py_ssize_t*>cnp.PyArray_STRIDES(out), out_selection, &offset,
                          shape, strides)
        if nd < 0 or nd > self.max_ndim:
            return -1
        for i in range(nd):
            t.dst_strides[i] = strides[i]
        t.dst = <char*>cnp.PyArray_DATA(out) + offset
        # the task writes through a raw pointer into ``out``: the batch
        # keeps it alive, whatever its caller keeps
        self.refs.append(out)
        return nd

    cdef bint is_direct(self, DecodeTask* t, ChunkLayout layout) noexcept:
        """Whole chunk, no swap, the destination laid out as the stored
        bytes: the decompressor can write into the output itself. That
        covers a C-order chunk in a C-order region and an F-order (format 2,
        or transposed) chunk in an F-order region."""
        return (
            self.filters is None
            and self.kernel.swap_unit == 0
            and t.src_offset == 0
            and same_dense_layout(t.ndim, t.shape, t.src_strides, t.dst_strides,
                                  self.kernel.itemsize, layout.nbytes)
        )

    def add(self, payload, ChunkLayout layout, chunk_selection, cnp.ndarray out, out_selection,
            tuple drop_axes, key):
        """Queue the decode of ``payload`` (a chunk laid out as ``layout``)
        into ``out[out_selection] = chunk[chunk_selection]``."""
        return self._add(payload, None, layout, chunk_selection, out, out_selection, drop_axes, key)

    def add_file(self, bytes path, ChunkLayout layout, chunk_selection, cnp.ndarray out,
                 out_selection, tuple drop_axes, key):
        """Like `add`, reading the payload from the file at ``path`` (with
        the GIL released, in `run`); a missing file fills the region and is
        reported by `run`."""
        if self.fill is None:
            raise ValueError("set_fill() first")
        return self._add(None, path, layout, chunk_selection, out, out_selection, drop_axes, key)

    cdef object _add(self, payload, bytes path, ChunkLayout layout, chunk_selection,
                     cnp.ndarray out, out_selection, tuple drop_axes, key):
        cdef DecodeTask* t = self.next_task()
        cdef Py_ssize_t src_shape[ZF_MAX_DIMS]
        cdef Py_ssize_t src_strides[ZF_MAX_DIMS]
        cdef Py_ssize_t dst_shape[ZF_MAX_DIMS]
        cdef Py_ssize_t offset = 0
        cdef int nd_src, nd_dst, i, k
        cdef const uint8_t[::1] view
        if out.dtype.itemsize != self.itemsize:
            return False
        nd_dst = self._target(t, out, out_selection, dst_shape)
        if nd_dst < 0:
            return False
        nd_src = select_basic(layout.ndim, layout.shape, layout.strides, chunk_selection, &offset,
                              src_shape, src_strides)
        if nd_src < 0:
            return False
        if drop_axes:
            k = 0
            for i in range(nd_src):
                if i in drop_axes:
                    if src_shape[i] != 1:
                        return False
                    continue
                src_shape[k] = src_shape[i]
                src_strides[k] = src_strides[i]
                k += 1
            nd_src = k
        if nd_src != nd_dst:
            return False
        for i in range(nd_dst):
            if src_shape[i] != dst_shape[i]:
                return False
            t.shape[i] = dst_shape[i]
            t.src_strides[i] = src_strides[i]
        if path is not None:
            t.path = path
            self.refs.append(path)
        else:
            view = as_bytes_view(payload)
            t.src = &view[0] if view.shape[0] else <const uint8_t*>b""
            t.src_len = view.shape[0]
            self.refs.append(view)
        t.nbytes = layout.nbytes
        t.src_offset = offset
        t.ndim = nd_dst
        t.direct = self.is_direct(t, layout)
        self.keys.append(key)
        self.n += 1
        return True

    def add_missing(self, cnp.ndarray out, out_selection, key):
        """Queue a fill of ``out[out_selection]`` with the fill pattern."""
        cdef DecodeTask* t = self.next_task()
        cdef Py_ssize_t shape[ZF_MAX_DIMS]
        cdef int nd, i
        if self.fill is None:
            raise ValueError("set_fill() first")
        if out.dtype.itemsize != self.itemsize:
            return False
        nd = self._target(t, out, out_selection, shape)
        if nd < 0:
            return False
        for i in range(nd):
            t.shape[i] = shape[i]
        t.ndim = nd
        t.missing = True
        self.keys.append(key)
        self.n += 1
        return True

    def run_range(self, Py_ssize_t start=0, Py_ssize_t stop=-1):
        """Decode the queued chunks ``start:stop`` (to the end when ``stop``
        is negative) with the GIL released; raise for the first one that
        failed. Several threads may run disjoint ranges of one batch at once.

        Returns
        -------
        list of int
            Positions (in order of adding) of the chunks in the range whose
            file was missing (`add_file`); their regions hold the fill value.
        """
        stop = self.run_clamped(start, stop)
        self.finish_refused(start, stop)
        return [i for i in range(max(start, 0), stop) if self.tasks[i].was_missing]

    def run(self):
        """Decode every queued chunk (`run_range` over the whole batch)."""
        return self.run_range(0, self.n)

    cdef Status* status_of(self, Py_ssize_t i) noexcept nogil:
        return &self.tasks[i].status

    cdef object finish_refused(self, Py_ssize_t start, Py_ssize_t stop):
        """Hand the chunks ``start:stop`` (a run range) whose decoding the
        filters refused to ``refuse`` (zarr's code), in order: the first
        that zarr refuses too raises its error; the values of one it
        decodes go where the task's selection goes; one whose file went
        since the run read it is filled and reported missing, as zarr reads
        it."""
        cdef DecodeTask* t
        cdef cnp.ndarray values
        cdef Py_ssize_t i
        if self.refused == NULL or self.filters is None or not self.filters.may_refuse:
            return None
        for i in range(max(start, 0), min(stop, self.n)):
            if not self.refused[i]:
                continue
            self.refused[i] = 0
            t = &self.tasks[i]
            where = self.describe(self.keys[i])
            if self.refuse is None:
                raise ValueError(
                    f"{where}: the filters refused the chunk's values and the batch has no "
                    "refuse hook")
            stored = _payload_again(t)
            if stored is None:
                fill_strided(t.dst, t.dst_strides, t.shape, t.ndim, self.fill_ptr(),
                             self.itemsize)
                t.was_missing = True
                continue
            payload = np.frombuffer(stored, dtype=np.uint8)
            values = np.ascontiguousarray(self.refuse(payload, where)).view(np.uint8).reshape(-1)
            # the hook's bytes are checked before the copy reads them
            if values.shape[0] != t.nbytes:
                raise ValueError(
                    f"{where}: the refused chunk decoded to {values.shape[0]} bytes, "
                    f"not {t.nbytes}")
            copy_strided(<const char*>cnp.PyArray_DATA(values) + t.src_offset, t.src_strides,
                         t.dst, t.dst_strides, t.shape, t.ndim, self.itemsize, 0)
        return None

    cdef Py_ssize_t task_nbytes(self, Py_ssize_t i) noexcept nogil:
        return 0 if self.tasks[i].missing else self.tasks[i].nbytes

    cdef int run_filtered(self, Workspace ws, Py_ssize_t i, const char* fill, uint8_t* a,
                          uint8_t* b) noexcept nogil:
        """Task ``i`` with filters: read its file (a file task), decompress
        (and check), byte-swap into ``a``, undo the filters, scatter the
        selected values (the filters' `row_step` writes long enough rows in
        place, see `_row_axes`)."""
        cdef DecodeTask* t = &self.tasks[i]
        cdef Py_ssize_t ki = self.kernel.itemsize
        cdef Py_ssize_t count, row
        cdef int outer
        cdef const uint8_t* src = t.src
        cdef Py_ssize_t src_len = t.src_len
        cdef const uint8_t* data
        cdef const void* values
        cdef int rc, err = 0
        if t.path != NULL and not t.missing:
            rc = read_file(t.path, &ws.io_buf, &ws.io_cap, &src_len, &err)
            if rc == FILE_MISSING:
                t.was_missing = True
            elif rc == FILE_ERROR:
                t.status.code = ZF_ERR_IO
                t.status.a = err
                return -1
            src = ws.io_buf
        if t.missing or t.was_missing:
            fill_strided(t.dst, t.dst_strides, t.shape, t.ndim, fill, self.itemsize)
            return 0
        count = t.nbytes // self.itemsize
        if self.kernel.decode_payload(ws, src, src_len, count * ki, NULL, &data,
                                      &t.status) < 0:
            return -1
        if count == 0:
            return 0
        if self.kernel.swap_unit:
            copy_strided(<const char*>data, &ki, <char*>a, &ki, &count, 1, ki,
                         self.kernel.swap_unit)
            data = a
        elif <uintptr_t>data % <uintptr_t>ki:
            # an uncompressed payload at an odd offset of its shard
            memcpy(a, data, <size_t>(count * ki))
            data = a
        outer = _row_axes(t, count, self.itemsize, self.filters, &row)
        if outer >= 0:
            if (self.filters.decode_head(data, a, b, count, &values) != FILTER_OK
                    or _decode_rows(self.filters, <const char*>values, t, self.itemsize, outer,
                                    row) != FILTER_OK):
                self.refused[i] = 1  # zarr's code decodes it, or raises, after the run
            return 0
        if not self.filters.may_refuse:
            values = self.filters.decode(data, a, b, count)
        elif self.filters.decode_checked(data, a, b, count, &values) != FILTER_OK:
            self.refused[i] = 1  # zarr's code decodes it, or raises, after the run
            return 0
        copy_strided(<const char*>values + t.src_offset, t.src_strides, t.dst, t.dst_strides,
                     t.shape, t.ndim, self.itemsize, 0)
        return 0

    cdef Py_ssize_t run_group(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop, const char* fill,
                              Py_ssize_t* size) noexcept nogil:
        """One task, or the tasks from ``i`` on decoded side by side:
        not with inner checksums (decoded through the shared scratch), so
        that every payload decodes into its own slot."""
        cdef bint side = (self.kernel.compressor == COMP_NONE or self.kernel.inner_crcs == 0)
        size[0] = _side_by_side(&self.tasks[i], stop - i, self.kernel.itemsize) if side else 1
        if size[0] > 1:
            return _decode_side_by_side(self.kernel, ws, &self.tasks[i], size[0])
        self.kernel.run_decode(ws, &self.tasks[i], fill, NULL)
        return -1 if self.tasks[i].status.code == ZF_OK else 0

    cdef Py_ssize_t run_group_timed(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop,
                                    const char* fill, Py_ssize_t* size,
                                    PhaseTimes* acc) noexcept nogil:
        """`run_group` with its reads, decodes and scatters timed."""
        cdef bint side = (self.kernel.compressor == COMP_NONE or self.kernel.inner_crcs == 0)
        size[0] = _side_by_side(&self.tasks[i], stop - i, self.kernel.itemsize) if side else 1
        if size[0] > 1:
            return _decode_side_by_side(self.kernel, ws, &self.tasks[i], size[0], acc)
        self.kernel.run_decode(ws, &self.tasks[i], fill, acc)
        return -1 if self.tasks[i].status.code == ZF_OK else 0


cdef class EncodeBatch(TaskBatch):
    """The encode work of a group of chunks, run in one nogil call.

    With a fill pattern set (`set_fill`), chunks added with ``skip_fill``
    are first scanned: one whose every element equals the fill value is
    neither encoded nor written (`run` reports it as False).

    Where the encoded chunks go: chunks added with a ``path`` are encoded
    into the running thread's reused IO buffer and written from there.
    Others get a slice of ``arena`` (a uint8 buffer the caller owns and may
    reuse once done with the results, which are then views into it) while
    it has room, else a fresh array each. Reusing memory matters: fresh
    multi-megabyte allocations are returned to the system when freed and
    fault in every page again on the next batch.
    """

    def __cinit__(self, ChainKernel kernel, Py_ssize_t capacity, int max_ndim, describe=repr,
                  arena=None):
        if arena is not None and (
            not isinstance(arena, np.ndarray) or arena.dtype != np.uint8 or arena.ndim != 1
            or not arena.flags.c_contiguous or not arena.flags.writeable
        ):
            raise TypeError("arena must be a writeable contiguous 1-d uint8 array")
        self.allocate(kernel, capacity, max_ndim, describe, sizeof(EncodeTask), 2)
        self.tasks = <EncodeTask*>self.task_memory
        self.encodes = True
        self.arena = arena
        self.arena_used = 0
        self.outputs = []

    cdef EncodeTask* queue(self, ChunkLayout layout, const char* src,
                           const Py_ssize_t* strides, bint swap, bint skip_fill,
                           cnp.ndarray out, key) except NULL:
        """Queue the encode of the chunk at ``src`` (``layout.shape``, byte
        ``strides`` per logical axis) into ``out`` (None: the caller points
        the task at its file). ``layout.ndim`` must fit ``max_ndim``."""
        cdef EncodeTask* t
        cdef Py_ssize_t itemsize = self.kernel.itemsize
        cdef int i
        if self.n >= self.cap:
            raise IndexError("encode batch is full")
        if layout.ndim > self.max_ndim:
            raise ValueError("the chunk has more dimensions than the batch has room for")
        t = &self.tasks[self.n]
        memset(t, 0, sizeof(EncodeTask))
        t.shape = self.task_dims(self.n)
        t.src_strides = t.shape + self.max_ndim
        for i in range(layout.ndim):
            t.shape[i] = layout.stored_shape[i]
            t.src_strides[i] = strides[layout.perm[i]]
        t.ndim = layout.ndim
        t.src = src
        t.nbytes = layout.nbytes
        t.swap_unit = self.kernel.swap_unit if swap else 0
        t.contiguous = (
            contiguous_run(t.ndim, t.shape, t.src_strides, itemsize) * itemsize == layout.nbytes
        )
        t.check_fill = skip_fill
        t.dst_cap = self.encoded_bound(layout.nbytes)
        if out is not None:
            t.dst = <uint8_t*>cnp.PyArray_DATA(out)
        self.outputs.append(out)
        self.keys.append(key)
        self.n += 1
        return t

    def add(self, cnp.ndarray chunk, ChunkLayout layout, bint swap, key, bytes path=None,
            bint skip_fill=False):
        """Queue the encode of ``chunk`` (shape ``layout.shape``); ``swap``
        reverses the byte order on the way (stored order differs). With
        ``path``, `run` also writes the result to that file (atomically).
        With ``skip_fill``, a chunk equal to the fill value throughout is
        skipped (see the class docstring)."""
        cdef EncodeTask* t
        cdef int i
        if skip_fill and self.fill is None:
            raise ValueError("set_fill() first")
        if self.n >= self.cap:
            raise IndexError("encode batch is full")
        if chunk.ndim != layout.ndim or chunk.ndim > self.max_ndim:
            raise ValueError("chunk does not match its layout")
        if path is not None and self.filters is not None:
            raise ValueError("a batch with filters encodes into memory only")
        if chunk.dtype.itemsize != self.itemsize or chunk.dtype.hasobject:
            raise TypeError(f"cannot encode {chunk.dtype} with this chain")
        for i in range(layout.ndim):
            if cnp.PyArray_DIMS(chunk)[i] != layout.shape[i]:
                raise ValueError("chunk does not match its layout")
        bound = self.encoded_bound(layout.nbytes)
        if path is not None:  # encoded into the running thread's IO buffer
            out = None
        elif self.arena is not None and self.arena_used + bound <= self.arena.shape[0]:
            out = self.arena[self.arena_used:self.arena_used + bound]
            self.arena_used += bound
        else:
            out = np.empty(bound, dtype=np.uint8)
        t = self.queue(layout, <const char*>cnp.PyArray_DATA(chunk),
                       <Py_ssize_t*>cnp.PyArray_STRIDES(chunk), swap, skip_fill, out, key)
        if path is not None:
            t.path = path
            self.refs.append(path)
        self.refs.append(chunk)
        return self.n - 1

    def run_range(self, Py_ssize_t start=0, Py_ssize_t stop=-1):
        """Encode the queued chunks ``start:stop`` (to the end when ``stop``
        is negative) with the GIL released; raise for the first that failed.
        Several threads may run disjoint ranges of one batch at once; the
        outcomes are read with `results` once all have run."""
        self.run_clamped(start, stop)

    cdef Status* status_of(self, Py_ssize_t i) noexcept nogil:
        return &self.tasks[i].status

    cpdef Py_ssize_t encoded_bound(self, Py_ssize_t nbytes):
        """The most bytes a chunk of ``nbytes`` value bytes encodes to."""
        return self.kernel.encode_bound(self.encoded_nbytes(nbytes))

    cdef Py_ssize_t task_nbytes(self, Py_ssize_t i) noexcept nogil:
        return self.tasks[i].nbytes

    cdef int run_filtered(self, Workspace ws, Py_ssize_t i, const char* fill, uint8_t* a,
                          uint8_t* b) noexcept nogil:
        """Task ``i`` with filters: skip it when all fill, gather its values
        into ``a`` in C order, filter, then byte-swap, compress and checksum
        them as the chain kernel does a chunk of its own items. A chunk the
        filters refuse is marked and encoded by ``refuse`` in `results`."""
        cdef EncodeTask* t = &self.tasks[i]
        cdef EncodeTask sub
        cdef Py_ssize_t cstr[ZF_MAX_DIMS]
        cdef Py_ssize_t ki = self.kernel.itemsize
        cdef Py_ssize_t count = t.nbytes // self.itemsize
        cdef const void* encoded = a
        if t.check_fill and fill != NULL and equal_strided(
            t.src, t.src_strides, t.shape, t.ndim, fill, self.itemsize
        ):
            t.was_fill = True
            return 0
        c_strides(t.ndim, t.shape, self.itemsize, cstr)
        copy_strided(t.src, t.src_strides, <char*>a, cstr, t.shape, t.ndim, self.itemsize, 0)
        if count and self.filters.encode(a, b, count, &encoded) != FILTER_OK:
            self.refused[i] = 1
            return 0
        sub = t[0]
        sub.src = <const char*>encoded
        sub.shape = &count
        sub.src_strides = &ki
        sub.ndim = 1
        sub.nbytes = count * ki
        sub.swap_unit = self.kernel.swap_unit
        sub.contiguous = True
        sub.check_fill = False
        self.kernel.run_encode(ws, &sub, NULL)
        t.dst = sub.dst
        t.out_len = sub.out_len
        t.status = sub.status
        return -1 if t.status.code != ZF_OK else 0

    cdef Py_ssize_t run_group(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop, const char* fill,
                              Py_ssize_t* size) noexcept nogil:
        """One task, skipped when it equals ``fill`` throughout, or the
        tasks from ``i`` on gathered side by side."""
        size[0] = _encode_side_by_side(&self.tasks[i], stop - i, self.kernel)
        if size[0] > 1:
            return _encode_group(self.kernel, ws, &self.tasks[i], size[0], fill)
        self.kernel.run_encode(ws, &self.tasks[i], fill)
        return -1 if self.tasks[i].status.code == ZF_OK else 0

    cdef Py_ssize_t run_group_timed(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop,
                                    const char* fill, Py_ssize_t* size,
                                    PhaseTimes* acc) noexcept nogil:
        """`run_group` with its encodes and file writes timed apart."""
        cdef EncodeTask* t = &self.tasks[i]
        cdef const char* path = t.path
        cdef int64_t began = now_ns(), written = acc.write_ns
        cdef Py_ssize_t j, bad
        size[0] = _encode_side_by_side(t, stop - i, self.kernel)
        if size[0] > 1:
            bad = _encode_group(self.kernel, ws, t, size[0], fill, acc)
        else:
            t.path = NULL
            self.kernel.run_encode(ws, t, fill)
            if path != NULL:
                _write_timed(t, path, acc)
            bad = -1 if t.status.code == ZF_OK else 0
        acc.encode_ns += now_ns() - began - (acc.write_ns - written)
        for j in range(i, i + (size[0] if bad < 0 else bad)):
            acc.chunks += not self.tasks[j].was_fill
        return bad

    def results(self):
        """The outcome of every task, once all have run (see `run`)."""
        cdef Py_ssize_t i
        result = []
        for i in range(self.n):
            if self.tasks[i].was_fill:
                result.append(False)  # all fill value: store nothing
                continue
            if self.refused != NULL and self.refused[i]:
                if self.refuse is None:
                    raise ValueError(
                        f"{self.describe(self.keys[i])}: the filters refused the chunk's "
                        "values and the batch has no refuse hook")
                encoded = self.refuse(self._values(i))
                result.append(False if encoded is None else encoded)
                continue
            if self.tasks[i].path != NULL:
                result.append(None)  # written to its file
                continue
            out = self.outputs[i]
            length = self.tasks[i].out_len
            # keep a view when little is wasted or the caller owns the arena
            # (and its lifetime), else copy to the exact size
            result.append(out[:length] if self.arena is not None or 4 * length >= 3 * out.shape[0]
                          else out[:length].copy())
        return result

    cdef object _values(self, Py_ssize_t i):
        """Task ``i``'s values in C order, as bytes (uint8)."""
        cdef EncodeTask* t = &self.tasks[i]
        cdef Py_ssize_t cstr[ZF_MAX_DIMS]
        cdef cnp.ndarray values = np.empty(t.nbytes, dtype=np.uint8)
        c_strides(t.ndim, t.shape, self.itemsize, cstr)
        copy_strided(t.src, t.src_strides, <char*>cnp.PyArray_DATA(values), cstr, t.shape,
                     t.ndim, self.itemsize, 0)
        return values

    def run(self):
        """Encode every queued chunk with the GIL released.

        Returns
        -------
        list of numpy.ndarray, None or False
            The encoded payloads (uint8), in the order they were added;
            None for those written to their file; False for chunks skipped
            because they hold only the fill value.
        """
        self.run_range(0, self.n)
        return self.results()
