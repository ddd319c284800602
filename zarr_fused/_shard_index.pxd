# cython: language_level=3
# The shard index format (_shard_index.pyx) as the shard modules see it: its
# sizes, the entry of a missing inner chunk, and the decode-and-check step
# that a local partial read runs inside its own nogil section.

from libc.stdint cimport uint8_t, uint32_t, uint64_t

cimport numpy as cnp

cdef enum:
    # one entry per inner chunk: (offset, nbytes), two 8-byte integers
    ENTRY_NBYTES = 16
    # the optional crc32c of the entries, after them
    CHECKSUM_NBYTES = 4

# both fields of a missing inner chunk's entry hold 2**64-1
cdef extern from *:
    """
    #define ZF_MISSING_ENTRY UINT64_MAX
    """
    const uint64_t MISSING "ZF_MISSING_ENTRY"


cdef inline bint entry_missing(uint64_t offset, uint64_t nbytes) noexcept nogil:
    return offset == MISSING and nbytes == MISSING


# Where an inner chunk's bytes are among the bytes read of its shard
cdef enum ChunkPlace:
    CHUNK_PRESENT = 0
    CHUNK_MISSING = 1
    CHUNK_OUTSIDE = 2  # its entry points past the bytes read


cdef inline ChunkPlace chunk_place(const uint64_t* entries, Py_ssize_t lin, Py_ssize_t total,
                                   uint64_t* offset, uint64_t* nbytes) noexcept nogil:
    """Where inner chunk ``lin`` lies among ``total`` bytes read, by its
    index entry (``offset[0]``, ``nbytes[0]``)."""
    offset[0] = entries[2 * lin]
    nbytes[0] = entries[2 * lin + 1]
    if entry_missing(offset[0], nbytes[0]):
        return CHUNK_MISSING
    if offset[0] > <uint64_t>total or nbytes[0] > <uint64_t>total - offset[0]:
        return CHUNK_OUTSIDE
    return CHUNK_PRESENT


cdef inline Py_ssize_t index_size(Py_ssize_t n_chunks, bint checksum) noexcept nogil:
    """Bytes of the encoded index of ``n_chunks`` inner chunks."""
    return ENTRY_NBYTES * n_chunks + (CHECKSUM_NBYTES if checksum else 0)


cdef enum IndexProblem:
    INDEX_OK = 0
    INDEX_HALF_MISSING = 1
    INDEX_OVERFLOW = 2
    INDEX_PAST_END = 3
    INDEX_INTO_INDEX = 4
    INDEX_OVERLAP = 5
    INDEX_NOMEM = 6
    INDEX_CRC = 7

# a byte range of the shard holding inner chunk ``chunk``
cdef struct Span:
    uint64_t start
    uint64_t end
    Py_ssize_t chunk

cdef void sort_spans(Span* spans, Py_ssize_t m) noexcept nogil

cdef int decode_index(const uint8_t* raw, Py_ssize_t n_chunks, bint checksum, bint big_endian,
                      Py_ssize_t shard_len, Py_ssize_t index_start, uint64_t* entries,
                      Py_ssize_t* bad, Py_ssize_t* other, uint32_t* stored,
                      uint32_t* computed) noexcept nogil

cdef object index_error(int problem, cnp.ndarray entries, Py_ssize_t bad, Py_ssize_t other,
                        uint32_t stored, uint32_t computed, Py_ssize_t shard_len, grid, where)

cdef object outside_error(key, Py_ssize_t lin, uint64_t offset, uint64_t nbytes, Py_ssize_t total)
