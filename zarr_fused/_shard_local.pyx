# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A partial read of a shard in a local file, decoded in the same nogil call.

`fetch_partial_local` opens the shard once, reads its index, checks it
against the file's size, and reads the touched inner chunks (neighbours
coalesced into one ``preadv``) into a buffer the caller lends. With a
`DecodeBatch` whose tasks `zarr_fused._shard.add_shard` queued with
``defer=True``, the tasks are pointed at the fetched chunks and decoded in
the same release of the GIL (`read_shard_local`): a busy multi-threaded
reader pays one hand-over of the GIL per shard, not two.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset
from posix.unistd cimport close

cimport numpy as cnp

import os

import numpy as np

from zarr_fused._codec_batch cimport DecodeBatch, add_times
from zarr_fused._phase_times cimport PhaseTimes, now_ns
from zarr_fused._codecs cimport DecodeTask, Workspace, workspace
from zarr_fused._localio cimport (
    FILE_ERROR,
    FILE_MISSING,
    FILE_OK,
    FILE_SHORT,
    FileStatus,
    advise_ranges,
    open_regular,
    pread_full,
    read_ranges_fd,
)
from zarr_fused._shard_index cimport (
    CHUNK_MISSING,
    CHUNK_OUTSIDE,
    INDEX_NOMEM,
    INDEX_OK,
    MISSING,
    ChunkPlace,
    Span,
    chunk_place,
    decode_index,
    index_error,
    index_size,
    outside_error,
    sort_spans,
)

from zarr_fused.errors import CorruptShardError

cnp.import_array()


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
    bint prefetch
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
    FileStatus rc
    FileStatus ranges_rc
    int problem
    int err
    Py_ssize_t bad
    Py_ssize_t other
    uint32_t stored
    uint32_t computed
    bint fetched


cdef int _fetch_setup(PartialFetch* f, bytes path, Py_ssize_t n_chunks, cnp.ndarray touched,
                      cnp.ndarray entries, bint checksum, bint big_endian, bint at_start,
                      Py_ssize_t max_gap, Py_ssize_t max_coalesced, bint prefetch) except -1:
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
    f.isize = index_size(n_chunks, checksum)
    f.checksum = checksum
    f.big_endian = big_endian
    f.at_start = at_start
    f.max_gap = max_gap
    f.max_coalesced = max_coalesced
    f.prefetch = prefetch
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


cdef void _fetch_free(PartialFetch* f) noexcept nogil:
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
    present chunks: ``f.m`` ranges of ``f.total`` bytes (``f.rc`` FILE_OK and
    ``f.problem`` INDEX_OK when all went well)."""
    cdef Py_ssize_t i, lin, biggest_gap = 0
    cdef uint64_t* ep = f.entries
    f.rc = open_regular(f.path, &f.fd, &f.size, &f.err)
    if f.rc != FILE_OK:
        return
    if f.size < f.isize:
        f.rc = FILE_SHORT
        return
    f.index_at = 0 if f.at_start else f.size - f.isize
    f.rc = pread_full(f.fd, f.raw, f.isize, f.index_at, &f.err)
    if f.rc != FILE_OK:
        return
    f.problem = decode_index(f.raw, f.n_chunks, f.checksum, f.big_endian, f.size, f.index_at,
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
    sort_spans(f.wanted, f.m)
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
    if f.prefetch and f.m > 1:
        advise_ranges(f.fd, f.m, f.starts, f.lengths, f.max_gap, f.max_coalesced)
    f.ranges_rc = read_ranges_fd(f.fd, f.m, f.starts, f.lengths, bp, f.offsets, f.max_gap,
                                 f.max_coalesced, f.gap, &f.err, &f.bad)
    f.fetched = True
    if f.ranges_rc == FILE_OK:
        for i in range(f.m):
            f.entries[2 * f.wanted[i].chunk] = <uint64_t>f.offsets[i]


cdef int _fetch_check(PartialFetch* f, bytes path, cnp.ndarray entries, grid, where) except -1:
    """Raise for a failed `_fetch_index` / `_fetch_ranges`; 1 when the
    shard is missing, else 0."""
    if f.rc == FILE_MISSING:
        return 1
    if f.rc == FILE_ERROR or f.ranges_rc == FILE_ERROR:
        raise OSError(f.err, os.strerror(f.err), os.fsdecode(path))
    if f.rc == FILE_SHORT:
        w = where() if callable(where) else where
        raise CorruptShardError.truncated(w, None, f.isize)
    if f.problem != INDEX_OK:
        raise index_error(f.problem, entries, f.bad, f.other, f.stored, f.computed, f.size,
                          grid, where)
    # ranges checked against the file's size end short only when the file shrank
    if f.ranges_rc == FILE_SHORT:
        w = where() if callable(where) else where
        raise CorruptShardError(f"{w}: the shard changed size while it was read")
    return 0


def fetch_partial_local(bytes path, Py_ssize_t n_chunks, cnp.ndarray touched, take, *,
                        bint checksum, bint big_endian, bint at_start,
                        Py_ssize_t max_gap=1 << 20, Py_ssize_t max_coalesced=16 << 20,
                        Py_ssize_t size_hint=0, give=None, grid=None, where="shard",
                        DecodeBatch decode=None, Py_ssize_t first=0, bint prefetch=False):
    """A partial read of a shard in a local file: its index, then the touched
    chunks (neighbours coalesced into one ``preadv``), from one open
    file, with the index checked against the file's size.

    ``take(nbytes)`` returns a writeable uint8 buffer of at least ``nbytes``;
    ``give(buffer)``, if given, takes back one that turned out too small.
    ``size_hint``, the bytes the touched chunks likely hold, sizes the buffer
    taken up front: when they fit, the index and the chunks are read, and
    the index checked, in one release of the GIL (a busy multi-threaded
    reader pays a hand-over of the GIL for each release); else the chunks
    are read in a second one. With ``decode``, that batch's tasks ``first:``
    are decoded from the fetched chunks in the same release (see
    `read_shard_local`). With ``prefetch``, the kernel is told up front that
    all the chunks' ranges are needed (``POSIX_FADV_WILLNEED``, a call per
    coalesced group) before they are read one after another: from a cold
    page cache the device reads them at once, not one per round trip.

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
                     max_gap, max_coalesced, prefetch)
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
    # the file reads' time, when a stats block counts the batch's call
    cdef PhaseTimes io
    cdef bint timed = False
    cdef int64_t began = 0
    if decode and (first < 0 or first > stop):
        raise IndexError("no such task")
    if decode and fill == NULL and stop > first:
        raise ValueError("set_fill() first")
    sink = batch.start_timing() if decode else None
    if sink is not None:
        timed = True
        memset(&io, 0, sizeof(PhaseTimes))
    try:
        with nogil:
            if timed:
                began = now_ns()
            _fetch_index(f)
            if f.rc == FILE_OK and f.problem == INDEX_OK and f.total <= buf.shape[0]:
                _fetch_ranges(f, bp)
                if timed:
                    io.io_ns += now_ns() - began
                    began = 0
                if decode and f.ranges_rc == FILE_OK:
                    _bind_and_decode(batch, ws, first, stop, fill, f.entries, bp, f.total,
                                     &outside, &failed)
            if began:
                io.io_ns += now_ns() - began
        buf = _fetch_rest(f, path, entries, take, give, grid, where, batch, first, buf, ws, fill,
                          stop, &outside, &failed, timed, &io)
        if buf is None:
            return None
        if decode:
            _raise_for(batch, entries, f.total, outside, failed)
            batch.finish_refused(first, stop)  # while ``buf`` holds their payloads
        return buf
    finally:
        if sink is not None:
            add_times(&batch.times, &io)
            batch.flush_times(sink)


cdef cnp.ndarray _fetch_rest(PartialFetch* f, bytes path, cnp.ndarray entries, take, give,
                             grid, where, DecodeBatch batch, Py_ssize_t first, cnp.ndarray buf,
                             Workspace ws, const char* fill, Py_ssize_t stop,
                             Py_ssize_t* outside, Py_ssize_t* failed, bint timed,
                             PhaseTimes* io):
    """The rest of `_fetch` once the first release of the GIL is over: the
    shard checked, and its chunks read into a bigger buffer (and decoded)
    when they outgrew the first. Returns the buffer, None when the shard is
    missing."""
    cdef bint decode = batch is not None
    cdef unsigned char* bp
    cdef int64_t began = 0
    if _fetch_check(f, path, entries, grid, where):
        give_back(give, buf)
        return None
    if not f.fetched:  # the chunks outgrew the hint: a bigger buffer
        give_back(give, buf)
        buf = _usable(take(f.total), f.total)
        bp = <unsigned char*>cnp.PyArray_DATA(buf)
        with nogil:
            if timed:
                began = now_ns()
            _fetch_ranges(f, bp)
            if timed:
                io.io_ns += now_ns() - began
            if decode and f.ranges_rc == FILE_OK:
                _bind_and_decode(batch, ws, first, stop, fill, f.entries, bp, f.total, outside,
                                 failed)
        _fetch_check(f, path, entries, grid, where)
    return buf


cdef inline void give_back(give, buf):
    if give is not None:
        give(buf)


def read_shard_local(DecodeBatch batch, Py_ssize_t first, bytes path, Py_ssize_t n_chunks,
                     cnp.ndarray touched, take, give, *, bint checksum, bint big_endian,
                     bint at_start, Py_ssize_t max_gap=1 << 20,
                     Py_ssize_t max_coalesced=16 << 20, Py_ssize_t size_hint=0, grid=None,
                     where="shard", bint prefetch=False):
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
        give=give, grid=grid, where=where, decode=batch, first=first, prefetch=prefetch)
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
    cdef Py_ssize_t i
    cdef uint64_t off, size
    cdef ChunkPlace place
    cdef DecodeTask* t
    for i in range(first, stop):
        t = &batch.tasks[i]
        place = chunk_place(ep, t.chunk, total, &off, &size)
        if place == CHUNK_OUTSIDE:
            return i
        if place == CHUNK_MISSING:
            t.missing = True
        else:
            t.src = data + off
            t.src_len = <Py_ssize_t>size
    return -1


cdef void _bind_and_decode(DecodeBatch batch, Workspace ws, Py_ssize_t first, Py_ssize_t stop,
                           const char* fill, const uint64_t* ep, const unsigned char* data,
                           Py_ssize_t total, Py_ssize_t* outside,
                           Py_ssize_t* failed) noexcept nogil:
    """`_bind` the deferred tasks ``first:stop``, then decode them: the task
    whose chunk lies outside the bytes read into ``outside[0]``, else the
    first that failed to decode into ``failed[0]`` (-1 when none)."""
    outside[0] = _bind(batch, first, stop, ep, data, total)
    if outside[0] < 0:
        failed[0] = batch.run_tasks(ws, first, stop, fill)


cdef int _raise_for(DecodeBatch batch, cnp.ndarray entries, Py_ssize_t total,
                    Py_ssize_t outside, Py_ssize_t failed) except -1:
    """Raise for what `_bind_and_decode` found, if anything."""
    if outside >= 0:
        lin = batch.tasks[outside].chunk
        off, size = entries[lin]
        raise outside_error(batch.keys[outside][0], lin, off, size, total)
    if failed >= 0:
        batch.raise_failed(failed)
    return 0


cdef cnp.ndarray _usable(buf, Py_ssize_t nbytes):
    """``buf`` if it is a writeable C-contiguous uint8 array of at least
    ``nbytes`` bytes, else ValueError."""
    if (not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or not buf.flags.c_contiguous
            or not buf.flags.writeable or buf.shape[0] < nbytes):
        raise ValueError("take() returned an unusable buffer")
    return buf


def decode_part(DecodeBatch batch, Py_ssize_t first, Py_ssize_t stop, cnp.ndarray entries,
                cnp.ndarray payload):
    """Decode the batch's tasks ``first:stop`` (queued by `add_shard` with
    ``defer=True``) from one fetched part of their shard: ``entries`` is the
    index `fetch_partial_local` returned for the part, its touched chunks'
    offsets pointing into ``payload``. A part's chunks are decoded as soon
    as they arrive, without first packing all parts of the shard into one
    buffer; several threads may decode disjoint ranges of one batch at once.
    """
    cdef Workspace ws = workspace()
    cdef const char* fill = batch.fill_ptr()
    cdef Py_ssize_t failed = -1, outside = -1, total, i
    if first < 0 or first > stop or stop > batch.n:
        raise IndexError("no such tasks")
    if fill == NULL and stop > first:
        raise ValueError("set_fill() first")
    if (entries.dtype != np.uint64 or entries.ndim != 2 or entries.shape[1] != 2
            or not entries.flags.c_contiguous):
        raise ValueError("entries must be a shard's (n, 2) uint64 index")
    if payload.dtype != np.uint8 or payload.ndim != 1 or not payload.flags.c_contiguous:
        raise ValueError("payload must be a contiguous uint8 array")
    for i in range(first, stop):
        if batch.tasks[i].chunk >= entries.shape[0]:
            raise IndexError("a task's chunk is not in entries")
    total = payload.shape[0]
    sink = batch.start_timing()
    with nogil:
        _bind_and_decode(batch, ws, first, stop, fill, <const uint64_t*>cnp.PyArray_DATA(entries),
                         <const unsigned char*>cnp.PyArray_DATA(payload), total, &outside,
                         &failed)
    if sink is not None:
        batch.flush_times(sink)
    _raise_for(batch, entries, total, outside, failed)
