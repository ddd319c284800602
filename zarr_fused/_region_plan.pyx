# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The plan of a `read_regions` fan-out read, in native code.

`zarr_fused.regions` reads thousands of small regions per call; planning
them one Python object at a time cost as much as a third of the read. Two
steps run here instead:

`plain_boxes` turns selections that are a tuple of one slice (step 1) or
integer per axis, what a loader passes, into ``lo``/``hi`` arrays (Python's
own slice arithmetic, `PySlice_Unpack` and `PySlice_AdjustIndices`); any
other selection ends the fast path and the caller plans all of them item
by item.

`fan_out_targets` cuts boxes into *targets*, their parts within one inner
chunk, sorted by shard and by inner chunk within it, in the layout
`zarr_fused._shard.fan_out` reads (a row: destination, then per axis the
first element in the chunk, the first in the destination, the count),
with the GIL released while it walks the arrays.
"""

from cpython.ref cimport PyObject
from libc.stdint cimport int64_t

cimport numpy as cnp

import numpy as np

cnp.import_array()

cdef extern from "Python.h":
    int PySlice_Unpack(object slice, Py_ssize_t* start, Py_ssize_t* stop,
                       Py_ssize_t* step)
    Py_ssize_t PySlice_AdjustIndices(Py_ssize_t length, Py_ssize_t* start,
                                     Py_ssize_t* stop, Py_ssize_t step) noexcept
    bint PySlice_Check(object o)
    bint PyLong_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    Py_ssize_t PyNumber_AsSsize_t(object o, PyObject* exc) except? -1
    void PyErr_Clear()

#: above this many sort keys per target, targets are sorted by comparison
#: (``numpy.argsort``) instead of counted into place: the counts array
#: would outweigh the targets
cdef Py_ssize_t COUNT_SORT_SLACK = 8
cdef Py_ssize_t COUNT_SORT_MIN = 1 << 16

_integer = np.integer


cdef int _axis(object item, Py_ssize_t size, int64_t* lo, int64_t* hi,
               char* dropped) except -2:
    """One axis' box of ``item``: 0 when it is a slice of step 1 or an
    integer within the axis, 1 when the plan leaves it to the general path."""
    cdef Py_ssize_t start, stop, step, index
    if PySlice_Check(item):
        if PySlice_Unpack(item, &start, &stop, &step) < 0:
            PyErr_Clear()
            return 1
        if step != 1:
            return 1
        PySlice_AdjustIndices(size, &start, &stop, step)
        lo[0] = start
        hi[0] = stop if stop > start else start
        dropped[0] = 0
        return 0
    if PyLong_CheckExact(item) or isinstance(item, _integer):
        # clipped, not raised, past the Py_ssize_t range: outside the axis
        index = PyNumber_AsSsize_t(item, NULL)
        if index < 0:
            index += size
        if index < 0 or index >= size:
            return 1
        lo[0] = index
        hi[0] = index + 1
        dropped[0] = 1
        return 0
    return 1


def plain_boxes(list selections, tuple shape):
    """The boxes of ``selections`` when every one is a tuple of one slice
    of step 1 or one integer within the axis per axis of ``shape``:
    ``(lo, hi, dropped)``, (n, ndim) arrays, int64 twice and bool (the
    axes an integer selected); None as soon as one is not."""
    cdef Py_ssize_t n = len(selections), nd = len(shape), i, d
    cdef object sel
    cdef Py_ssize_t[32] sizes
    if nd < 1 or nd > 32:
        return None
    for d in range(nd):
        sizes[d] = shape[d]
    lo = np.empty((n, nd), dtype=np.int64)
    hi = np.empty((n, nd), dtype=np.int64)
    dropped = np.empty((n, nd), dtype=np.bool_)
    cdef int64_t[:, ::1] lo_v = lo
    cdef int64_t[:, ::1] hi_v = hi
    cdef char* drop_p = <char*>cnp.PyArray_DATA(dropped)
    for i in range(n):
        sel = selections[i]
        if not PyTuple_CheckExact(sel) or len(<tuple>sel) != nd:
            return None
        for d in range(nd):
            if _axis((<tuple>sel)[d], sizes[d], &lo_v[i, d], &hi_v[i, d],
                     &drop_p[i * nd + d]):
                return None
    return lo, hi, dropped


cdef struct Grid:
    # the array's decode units: per axis the inner chunk, the inner chunks
    # per shard and the shards of the array; ``per_shard`` inner chunks a
    # shard in all
    int nd
    int64_t inner[32]
    int64_t per_axis[32]
    int64_t shards[32]
    int64_t per_shard


cdef Py_ssize_t _count(const int64_t* lo, const int64_t* hi, Py_ssize_t n,
                       const Grid* g) noexcept nogil:
    """How many targets the boxes make: the inner chunks each overlaps."""
    cdef Py_ssize_t i, m = 0, k
    cdef int d
    for i in range(n):
        k = 1
        for d in range(g.nd):
            if hi[i * g.nd + d] <= lo[i * g.nd + d]:
                k = 0
                break
            k *= (hi[i * g.nd + d] - 1) // g.inner[d] - lo[i * g.nd + d] // g.inner[d] + 1
        m += k
    return m


cdef void _target(const int64_t* lo, const int64_t* hi, const int64_t* at, Py_ssize_t dest,
                  const int64_t* c, const Grid* g, Py_ssize_t* row,
                  int64_t* key) noexcept nogil:
    """The target of one box (``lo``, ``hi``, ``at``: its row) in inner
    chunk ``c`` (grid coordinates) and its sort key (shard, then inner
    chunk within the shard, both row-major)."""
    cdef int d, nd = g.nd
    cdef int64_t origin, a, b, shard = 0, lin = 0
    row[0] = dest
    for d in range(nd):
        origin = c[d] * g.inner[d]
        a = lo[d] if lo[d] > origin else origin
        b = hi[d] if hi[d] < origin + g.inner[d] else origin + g.inner[d]
        row[1 + d] = a - origin
        row[1 + nd + d] = a - lo[d] + (at[d] if at != NULL else 0)
        row[1 + 2 * nd + d] = b - a
        shard = shard * g.shards[d] + c[d] // g.per_axis[d]
        lin = lin * g.per_axis[d] + c[d] % g.per_axis[d]
    key[0] = shard * g.per_shard + lin


cdef void _fill(const int64_t* lo, const int64_t* hi, const int64_t* at,
                const Py_ssize_t* dest, Py_ssize_t n, const Grid* g,
                Py_ssize_t* rows, int64_t* keys) noexcept nogil:
    """Every target of the boxes, box by box, and its sort key."""
    cdef Py_ssize_t i, m = 0, w = 1 + 3 * g.nd
    cdef int d, nd = g.nd
    cdef int64_t first[32]
    cdef int64_t last[32]
    cdef int64_t c[32]
    for i in range(n):
        for d in range(nd):
            if hi[i * nd + d] <= lo[i * nd + d]:
                break
            first[d] = lo[i * nd + d] // g.inner[d]
            last[d] = (hi[i * nd + d] - 1) // g.inner[d]
            c[d] = first[d]
        else:
            while True:
                _target(&lo[i * nd], &hi[i * nd], &at[i * nd] if at != NULL else NULL,
                        dest[i] if dest != NULL else i, c, g, &rows[m * w], &keys[m])
                m += 1
                d = nd - 1
                while d >= 0 and c[d] == last[d]:
                    c[d] = first[d]
                    d -= 1
                if d < 0:
                    break
                c[d] += 1


cdef void _count_sort(const int64_t* keys, Py_ssize_t m, Py_ssize_t* counts,
                      int64_t n_keys, Py_ssize_t* order) noexcept nogil:
    """``order``: the targets by key, stable (``counts``, ``n_keys``
    zeros, is the scratch)."""
    cdef Py_ssize_t j, total = 0, c
    cdef int64_t k
    for j in range(m):
        counts[keys[j]] += 1
    for k in range(n_keys):
        c = counts[k]
        counts[k] = total
        total += c
    for j in range(m):
        order[counts[keys[j]]] = j
        counts[keys[j]] += 1


cdef void _gather(const Py_ssize_t* rows, const Py_ssize_t* order, Py_ssize_t m,
                  Py_ssize_t w, Py_ssize_t* out) noexcept nogil:
    cdef Py_ssize_t j, k
    for j in range(m):
        for k in range(w):
            out[j * w + k] = rows[order[j] * w + k]


cdef void _cut(const int64_t* keys, const Py_ssize_t* order, Py_ssize_t m,
               int64_t per_shard, Py_ssize_t* units, Py_ssize_t* starts,
               int64_t* shards, Py_ssize_t* shard_units, Py_ssize_t* counts) noexcept nogil:
    """The sorted targets cut into runs of one inner chunk (``units``,
    their linear index in the shard, ``starts``) and those into runs of one
    shard (``shards``, the shard's linear index in the grid,
    ``shard_units``); ``counts``: the number of each."""
    cdef Py_ssize_t j, u = 0, s = 0
    cdef int64_t key, prev = -1, shard, prev_shard = -1
    for j in range(m):
        key = keys[order[j]]
        if key == prev:
            continue
        prev = key
        shard = key // per_shard
        if shard != prev_shard:
            prev_shard = shard
            shards[s] = shard
            shard_units[s] = u
            s += 1
        units[u] = key % per_shard
        starts[u] = j
        u += 1
    starts[u] = m
    shard_units[s] = u
    counts[0] = u
    counts[1] = s


cdef int _grid(Grid* g, tuple shape, tuple outer, tuple inner) except -1:
    """``g`` for an array of ``shape`` in shards ``outer`` of inner
    chunks ``inner``, checked."""
    cdef int d, nd = len(shape)
    if nd < 1 or nd > 32 or len(outer) != nd or len(inner) != nd:
        raise ValueError("shape, shards and inner chunks must have one length, 1 to 32")
    g.nd = nd
    g.per_shard = 1
    total = 1
    for d in range(nd):
        if inner[d] < 1 or outer[d] < 1 or outer[d] % inner[d] or shape[d] < 0:
            raise ValueError(f"inner chunks {inner} do not tile shards {outer}")
        g.inner[d] = inner[d]
        g.per_axis[d] = outer[d] // inner[d]
        g.shards[d] = max(1, -(-shape[d] // outer[d]))
        g.per_shard *= g.per_axis[d]
        total *= g.per_axis[d] * g.shards[d]
    if total >= 1 << 62:
        raise ValueError(f"an array of shape {shape} has too many inner chunks to plan")
    return 0


cdef int _check_boxes(cnp.ndarray lo, cnp.ndarray hi, cnp.ndarray at, cnp.ndarray dest,
                      tuple shape) except -1:
    """Every box a part of the array (``at`` its start in the destination,
    not negative), one row each in every array."""
    cdef Py_ssize_t n = lo.shape[0]
    cdef int nd = len(shape)
    if lo.ndim != 2 or lo.shape[1] != nd or hi.ndim != 2 or hi.shape[0] != n \
            or hi.shape[1] != nd:
        raise ValueError("lo and hi must be (n, ndim) arrays")
    if at is not None and (at.ndim != 2 or at.shape[0] != n or at.shape[1] != nd
                           or (at < 0).any()):
        raise ValueError("at must be an (n, ndim) array of starts")
    if dest is not None and (dest.ndim != 1 or dest.shape[0] != n):
        raise ValueError("dest must name one destination per box")
    if n and ((lo < 0).any() or (hi > np.array(shape, dtype=np.int64)).any()):
        raise ValueError(f"a box lies outside the array of shape {shape}")
    return 0


def fan_out_targets(const int64_t[:, ::1] lo, const int64_t[:, ::1] hi, at, dest,
                    tuple shape, tuple outer, tuple inner):
    """The targets of boxes ``[lo, hi)`` of an array of ``shape`` stored in
    shards ``outer`` of inner chunks ``inner``.

    ``at`` (int64, a row per box, or None for zeros) is where each box
    starts in its destination, ``dest`` (intp, or None for the box's row)
    which destination it goes to. Returns ``(targets, units, starts,
    shards, shard_units)``: the target rows sorted by shard, then inner
    chunk (see the module docstring); ``units[u]``, the linear index within
    its shard of the inner chunk of ``targets[starts[u]:starts[u + 1]]``;
    ``shards[s]``, the linear grid index of the shard of
    ``units[shard_units[s]:shard_units[s + 1]]``.
    """
    cdef Grid g
    cdef Py_ssize_t n = lo.shape[0], m, w
    cdef const int64_t[:, ::1] at_v
    cdef const Py_ssize_t[::1] dest_v
    cdef const int64_t* at_p = NULL
    cdef const Py_ssize_t* dest_p = NULL
    _grid(&g, shape, outer, inner)
    _check_boxes(np.asarray(lo), np.asarray(hi), at, dest, shape)
    if at is not None:
        at_v = at
        at_p = &at_v[0, 0] if n else NULL
    if dest is not None:
        dest_v = dest
        dest_p = &dest_v[0] if n else NULL
    w = 1 + 3 * g.nd
    with nogil:
        m = _count(&lo[0, 0] if n else NULL, &hi[0, 0] if n else NULL, n, &g)
    rows = np.empty((m, w), dtype=np.intp)
    keys = np.empty(m, dtype=np.int64)
    cdef Py_ssize_t[:, ::1] rows_v = rows
    cdef int64_t[::1] keys_v = keys
    if m:
        with nogil:
            _fill(&lo[0, 0], &hi[0, 0], at_p, dest_p, n, &g, &rows_v[0, 0], &keys_v[0])
    return _sorted_targets(rows, keys, g.per_shard, g.per_shard * _n_shards(&g))


cdef int64_t _n_shards(const Grid* g) noexcept:
    cdef int64_t total = 1
    cdef int d
    for d in range(g.nd):
        total *= g.shards[d]
    return total


cdef tuple _sorted_targets(cnp.ndarray rows, cnp.ndarray keys, int64_t per_shard,
                           int64_t n_keys):
    """``rows`` sorted by ``keys`` and cut into inner chunks and shards
    (`fan_out_targets`' result)."""
    cdef Py_ssize_t m = rows.shape[0], w = rows.shape[1]
    cdef Py_ssize_t[2] counts
    if m <= 0:
        empty = np.zeros(0, dtype=np.intp)
        return rows, empty, np.zeros(1, dtype=np.intp), np.zeros(0, dtype=np.int64), \
            np.zeros(1, dtype=np.intp)
    cdef int64_t[::1] keys_v = keys
    cdef Py_ssize_t[:, ::1] rows_v = rows
    cdef Py_ssize_t[::1] order_v
    cdef Py_ssize_t[::1] scratch_v
    if n_keys <= COUNT_SORT_SLACK * m + COUNT_SORT_MIN:
        order_v = order = np.empty(m, dtype=np.intp)
        scratch_v = np.zeros(n_keys, dtype=np.intp)
        with nogil:
            _count_sort(&keys_v[0], m, &scratch_v[0], n_keys, &order_v[0])
    else:
        order_v = order = np.argsort(keys, kind="stable").astype(np.intp, copy=False)
    targets = np.empty((m, w), dtype=np.intp)
    units = np.empty(m, dtype=np.intp)
    starts = np.empty(m + 1, dtype=np.intp)
    shards = np.empty(m, dtype=np.int64)
    shard_units = np.empty(m + 1, dtype=np.intp)
    cdef Py_ssize_t[:, ::1] t_v = targets
    cdef Py_ssize_t[::1] u_v = units, st_v = starts, su_v = shard_units
    cdef int64_t[::1] sh_v = shards
    with nogil:
        _gather(&rows_v[0, 0], &order_v[0], m, w, &t_v[0, 0])
        _cut(&keys_v[0], &order_v[0], m, per_shard, &u_v[0], &st_v[0], &sh_v[0],
             &su_v[0], counts)
    return (targets, units[:counts[0]], starts[:counts[0] + 1], shards[:counts[1]],
            shard_units[:counts[1] + 1])
