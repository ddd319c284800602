# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The shard index: its format, decoding and checking it, and laying a shard out.

A shard holds its inner chunks' payloads and an index of ``ENTRY_NBYTES``
per inner chunk, an (offset, nbytes) pair of 8-byte integers in the byte
order of the ``index_codecs``' ``bytes`` codec, followed by a crc32c of
the pairs when the index codecs include one; the index sits at the start
or at the end of the shard. An inner chunk that is not stored has both
fields set to ``MISSING_ENTRY`` (2**64-1).

`parse_index` decodes an index and checks every entry before anything
reads through it: an entry is either missing or a byte range inside the
shard that overlaps neither the index nor another chunk. `shard_parts`
and `assemble_shard` lay a shard out: payloads in the write order, then
(or before) the index with its crc32c. `index_nbytes` says how long an
index is; the Python shard engine takes the format's constants from here.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

cimport numpy as cnp

import numpy as np

from zarr_fused._crc32c cimport zf_crc32c, zf_crc32c_init

from zarr_fused.errors import CorruptShardError

cnp.import_array()

zf_crc32c_init()

INDEX_ENTRY_NBYTES = ENTRY_NBYTES
INDEX_CHECKSUM_NBYTES = CHECKSUM_NBYTES
MISSING_ENTRY = MISSING


def index_nbytes(Py_ssize_t n_chunks, bint checksum):
    """Bytes of the encoded index of a shard of ``n_chunks`` inner chunks,
    with (``checksum``) or without a trailing crc32c."""
    if n_chunks < 0:
        raise ValueError("n_chunks must be >= 0")
    return index_size(n_chunks, checksum)


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


cdef void sort_spans(Span* spans, Py_ssize_t m) noexcept nogil:
    """Sort by start; shards written in order are sorted already, and a
    check is cheaper than qsort's calls of the comparator."""
    cdef Py_ssize_t i
    for i in range(1, m):
        if spans[i].start < spans[i - 1].start:
            qsort(spans, <size_t>m, sizeof(Span), _by_start)
            return


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
            if entry_missing(off, size):
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
                if (size and off < <uint64_t>(index_start + index_len)
                        and end > <uint64_t>index_start):
                    return INDEX_INTO_INDEX
            if size:
                spans[m].start = off
                spans[m].end = end
                spans[m].chunk = i
                m += 1
        sort_spans(spans, m)
        for i in range(1, m):
            if spans[i].start < spans[i - 1].end:
                bad[0] = spans[i].chunk
                other[0] = spans[i - 1].chunk
                return INDEX_OVERLAP
        return INDEX_OK
    finally:
        free(spans)


cdef int decode_index(const uint8_t* raw, Py_ssize_t n_chunks, bint checksum, bint big_endian,
                      Py_ssize_t shard_len, Py_ssize_t index_start, uint64_t* entries,
                      Py_ssize_t* bad, Py_ssize_t* other, uint32_t* stored,
                      uint32_t* computed) noexcept nogil:
    """Decode the ``index_size(n_chunks, checksum)`` bytes at ``raw`` into native
    (offset, nbytes) pairs at ``entries`` and check them (`_validate`):
    INDEX_OK or the problem, with ``bad``/``other`` (or, for INDEX_CRC, the
    ``stored``/``computed`` checksums) filled in."""
    cdef Py_ssize_t i, nbytes = ENTRY_NBYTES * n_chunks
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
    return _validate(entries, n_chunks, shard_len, index_start, index_size(n_chunks, checksum),
                     bad, other)


cdef object index_error(int problem, cnp.ndarray entries, Py_ssize_t bad, Py_ssize_t other,
                        uint32_t stored, uint32_t computed, Py_ssize_t shard_len, grid, where):
    """The exception for a `decode_index` problem."""
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


cdef object outside_error(key, Py_ssize_t lin, uint64_t offset, uint64_t nbytes,
                          Py_ssize_t total):
    """The exception for an inner chunk (`chunk_place` CHUNK_OUTSIDE) whose
    entry points past the ``total`` bytes read of shard ``key``."""
    start = int(offset)  # a Python int: the end may not fit 64 bits
    return CorruptShardError(
        f"{key!r}: inner chunk {lin} (bytes {start}..{start + nbytes}) lies outside "
        f"the {total} bytes read")


def parse_index(index, Py_ssize_t n_chunks, *, bint checksum, bint big_endian,
                Py_ssize_t shard_len=-1, Py_ssize_t index_start=0, grid=None,
                where="shard"):
    """Decode and check a shard index.

    Parameters
    ----------
    index : bytes-like
        The encoded index: ``INDEX_ENTRY_NBYTES * n_chunks`` bytes of (offset, nbytes)
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
    cdef Py_ssize_t expected = index_size(n_chunks, checksum)
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
            problem = decode_index(rp, n_chunks, checksum, big_endian, shard_len, index_start,
                                   ep, &bad, &other, &stored, &computed)
    else:
        problem = decode_index(rp, n_chunks, checksum, big_endian, shard_len, index_start,
                               ep, &bad, &other, &stored, &computed)
    if problem != INDEX_OK:
        raise index_error(problem, entries, bad, other, stored, computed, shard_len, grid, where)
    return entries


cdef bytes _encoded_index(cnp.ndarray entries, bint checksum, bint big_endian):
    """The stored bytes of a shard index: the (n, 2) ``entries`` in the
    byte order of the index codecs, then their crc32c when ``checksum``."""
    cdef bytes index = entries.astype(">u8" if big_endian else "<u8", copy=False).tobytes()
    cdef const uint8_t[::1] iview
    cdef size_t n = len(index)
    cdef uint32_t crc
    if not checksum:
        return index
    iview = index
    if <Py_ssize_t>n >= _NOGIL_MIN_BYTES:
        with nogil:
            crc = zf_crc32c(&iview[0], n)
    else:
        crc = zf_crc32c(&iview[0], n)
    return index + int(crc).to_bytes(4, "little")


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
    cdef Py_ssize_t index_len = index_size(n, checksum)
    cdef Py_ssize_t pos, i, lin, size
    cdef cnp.ndarray entries
    cdef uint64_t* ep
    cdef Py_ssize_t* ordp
    if order.dtype != np.intp or order.ndim != 1 or order.shape[0] != n:
        raise ValueError("order must list every inner chunk once")
    ordp = <Py_ssize_t*>cnp.PyArray_DATA(order)
    entries = np.full((n, 2), MISSING, dtype=np.uint64)
    ep = <uint64_t*>cnp.PyArray_DATA(entries)
    pos = index_len if at_start else 0
    parts = []
    for i in range(n):
        lin = ordp[i]
        if lin < 0 or lin >= n:
            raise ValueError("order must list every inner chunk once")
        p = payloads[lin]
        size = 0 if p is None else len(p)
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
    index = _encoded_index(entries, checksum, big_endian)
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
