# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Moving decoded chunk data into the output array, with the GIL released.

Three kernels work on n-d strided blocks. Two cover the scatter stage of
the read path: ``copy_strided`` copies
an n-d strided block into another n-d strided block of the same shape (with
an optional per-element byte swap, so a big-endian payload lands in a
little-endian output in one pass), and ``fill_strided`` writes one element
pattern (the fill value) into every element of an n-d strided block. The
write path asks ``equal_strided`` whether every element of a chunk equals
the fill value (such chunks are not stored).

The ``def`` wrappers validate everything (array types, shapes, item sizes,
byte orders, writeability, overlap) before the kernels run; the kernels
themselves trust their arguments and never touch the Python API.
"""

from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

cimport numpy as cnp
import numpy as np

from zarr_fused._ndindex cimport carry_steps, next_index

from zarr_fused._dtypes import element_bytes

cnp.import_array()

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define ZF_BSWAP16(x) __builtin_bswap16(x)
    #define ZF_BSWAP32(x) __builtin_bswap32(x)
    #define ZF_BSWAP64(x) __builtin_bswap64(x)
    #else
    static inline uint16_t ZF_BSWAP16(uint16_t x) { return (uint16_t)((x >> 8) | (x << 8)); }
    static inline uint32_t ZF_BSWAP32(uint32_t x) {
        return ((x >> 24) & 0xffu) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
    }
    static inline uint64_t ZF_BSWAP64(uint64_t x) {
        return ((uint64_t)ZF_BSWAP32((uint32_t)x) << 32) | ZF_BSWAP32((uint32_t)(x >> 32));
    }
    #endif
    """
    uint16_t ZF_BSWAP16(uint16_t x) noexcept nogil
    uint32_t ZF_BSWAP32(uint32_t x) noexcept nogil
    uint64_t ZF_BSWAP64(uint64_t x) noexcept nogil


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define ZF_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
    #define ZF_PREFETCH_R(p) __builtin_prefetch((p), 0, 3)
    #else
    #define ZF_PREFETCH_W(p) ((void)(p))
    #define ZF_PREFETCH_R(p) ((void)(p))
    #endif
    """
    void ZF_PREFETCH_W(const void* p) noexcept nogil
    void ZF_PREFETCH_R(const void* p) noexcept nogil


# One full tile of a transposed copy: ``n`` x ``n`` elements of ``e`` bytes
# (``n * e`` == 64, a cache line each way), element (b, a) of the source
# (rows ``ss`` bytes apart, elements dense) to element (a, b) of the
# destination (rows ``ds`` bytes apart, elements dense). A scalar walk moves
# one element per load and store; SSE2 (part of every x86-64 CPU, so no flag
# from the build host) transposes 2x2, 4x4 or 8x8 sub-blocks in registers
# with byte-exact shuffles. Other CPUs and item sizes take the scalar walk,
# whose fixed trip counts the compiler unrolls.
cdef extern from *:
    """
    #include <string.h>
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #define ZF_TILE_SSE2 1
    #else
    #define ZF_TILE_SSE2 0
    #endif

    #define ZF_TILE_SCALAR(E, T)                                                     \
        for (Py_ssize_t a = 0; a < (T); a++) {                                       \
            char* dr = d + a * ds;                                                   \
            const char* sc = s + a * (E);                                            \
            for (Py_ssize_t b = 0; b < (T); b++) memcpy(dr + b * (E), sc + b * ss, (E)); \
        }

    #if ZF_TILE_SSE2
    #define ZF_LD(p) _mm_loadu_si128((const __m128i*)(p))
    #define ZF_ST(p, v) _mm_storeu_si128((__m128i*)(p), (v))

    static inline void zf_tile8(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        for (Py_ssize_t a = 0; a < 8; a += 2)
            for (Py_ssize_t b = 0; b < 8; b += 2) {
                __m128i r0 = ZF_LD(s + b * ss + a * 8), r1 = ZF_LD(s + (b + 1) * ss + a * 8);
                ZF_ST(d + a * ds + b * 8, _mm_unpacklo_epi64(r0, r1));
                ZF_ST(d + (a + 1) * ds + b * 8, _mm_unpackhi_epi64(r0, r1));
            }
    }

    static inline void zf_tile4(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        for (Py_ssize_t a = 0; a < 16; a += 4)
            for (Py_ssize_t b = 0; b < 16; b += 4) {
                const char* p = s + b * ss + a * 4;
                __m128i r0 = ZF_LD(p), r1 = ZF_LD(p + ss), r2 = ZF_LD(p + 2 * ss),
                        r3 = ZF_LD(p + 3 * ss);
                __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
                __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
                char* q = d + a * ds + b * 4;
                ZF_ST(q, _mm_unpacklo_epi64(t0, t1));
                ZF_ST(q + ds, _mm_unpackhi_epi64(t0, t1));
                ZF_ST(q + 2 * ds, _mm_unpacklo_epi64(t2, t3));
                ZF_ST(q + 3 * ds, _mm_unpackhi_epi64(t2, t3));
            }
    }

    static inline void zf_tile2(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        for (Py_ssize_t a = 0; a < 32; a += 8)
            for (Py_ssize_t b = 0; b < 32; b += 8) {
                const char* p = s + b * ss + a * 2;
                __m128i r0 = ZF_LD(p), r1 = ZF_LD(p + ss), r2 = ZF_LD(p + 2 * ss),
                        r3 = ZF_LD(p + 3 * ss), r4 = ZF_LD(p + 4 * ss), r5 = ZF_LD(p + 5 * ss),
                        r6 = ZF_LD(p + 6 * ss), r7 = ZF_LD(p + 7 * ss);
                __m128i a0 = _mm_unpacklo_epi16(r0, r1), a1 = _mm_unpacklo_epi16(r2, r3),
                        a2 = _mm_unpacklo_epi16(r4, r5), a3 = _mm_unpacklo_epi16(r6, r7),
                        a4 = _mm_unpackhi_epi16(r0, r1), a5 = _mm_unpackhi_epi16(r2, r3),
                        a6 = _mm_unpackhi_epi16(r4, r5), a7 = _mm_unpackhi_epi16(r6, r7);
                __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1),
                        b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3),
                        b4 = _mm_unpacklo_epi32(a4, a5), b5 = _mm_unpackhi_epi32(a4, a5),
                        b6 = _mm_unpacklo_epi32(a6, a7), b7 = _mm_unpackhi_epi32(a6, a7);
                char* q = d + a * ds + b * 2;
                ZF_ST(q, _mm_unpacklo_epi64(b0, b2));
                ZF_ST(q + ds, _mm_unpackhi_epi64(b0, b2));
                ZF_ST(q + 2 * ds, _mm_unpacklo_epi64(b1, b3));
                ZF_ST(q + 3 * ds, _mm_unpackhi_epi64(b1, b3));
                ZF_ST(q + 4 * ds, _mm_unpacklo_epi64(b4, b6));
                ZF_ST(q + 5 * ds, _mm_unpackhi_epi64(b4, b6));
                ZF_ST(q + 6 * ds, _mm_unpacklo_epi64(b5, b7));
                ZF_ST(q + 7 * ds, _mm_unpackhi_epi64(b5, b7));
            }
    }
    #else
    static inline void zf_tile8(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        ZF_TILE_SCALAR(8, 8)
    }
    static inline void zf_tile4(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        ZF_TILE_SCALAR(4, 16)
    }
    static inline void zf_tile2(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        ZF_TILE_SCALAR(2, 32)
    }
    #endif

    static inline void zf_tile1(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds) {
        ZF_TILE_SCALAR(1, 64)
    }

    /* 0 when ``e`` has no full-tile kernel */
    static inline int zf_transpose_tile(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds,
                                        Py_ssize_t e) {
        switch (e) {
        case 8: zf_tile8(s, ss, d, ds); return 1;
        case 4: zf_tile4(s, ss, d, ds); return 1;
        case 2: zf_tile2(s, ss, d, ds); return 1;
        case 1: zf_tile1(s, ss, d, ds); return 1;
        default: return 0;
        }
    }
    """
    int zf_transpose_tile(const char* s, Py_ssize_t ss, char* d, Py_ssize_t ds,
                          Py_ssize_t e) noexcept nogil


# Short rows far apart (a 32-element row of a chunk inside a large output
# array) defeat the hardware prefetchers: every row's first store waits for
# its cache lines to be read from memory, one row at a time. The kernels
# below ask for the lines of the row ``_PREFETCH_ROWS`` ahead while copying
# the current one, so those reads overlap instead of queueing (the gain is
# in docs/performance.md, "Design measurements"). Rows longer than
# ``_PREFETCH_MAX_SPAN`` bytes are left to the hardware prefetchers, which
# follow them well; so are rows that start fewer than ``_PREFETCH_MIN_STEP``
# bytes apart (a 32^3 region's rows, 64 bytes apart, cut by a chunk edge):
# the hardware sees them as one stream, and walking a second row index and
# issuing the prefetches cost more than they save.
cdef enum:
    _PREFETCH_ROWS = 4
    _PREFETCH_MAX_SPAN = 1024
    _PREFETCH_MIN_STEP = 256
    # rows up to this many bytes are copied inline rather than by libc's memcpy
    _SHORT_ROW = 512


cdef inline Py_ssize_t _row_span(Py_ssize_t n, Py_ssize_t stride,
                                 Py_ssize_t itemsize) noexcept nogil:
    """Bytes covered by a row of ``n`` elements ``stride`` apart; 0 when the
    row is not worth prefetching (too long, or running backwards)."""
    cdef Py_ssize_t span
    if stride <= 0:
        return 0
    span = (n - 1) * stride + itemsize
    return span if span <= _PREFETCH_MAX_SPAN else 0


cdef inline void _prefetch_span(const char* p, Py_ssize_t span, bint write) noexcept nogil:
    cdef Py_ssize_t off = 0
    while off < span:
        if write:
            ZF_PREFETCH_W(p + off)
        else:
            ZF_PREFETCH_R(p + off)
        off += 64
    # the last byte's line, when ``p`` is not line-aligned
    if write:
        ZF_PREFETCH_W(p + span - 1)
    else:
        ZF_PREFETCH_R(p + span - 1)


# A block's dimensions as the kernels walk them: its shape and the strides of
# the two arrays it moves between (a fill or a comparison has one array: its
# strides twice), sorted and coalesced by `_load_dims`.
cdef struct _Dims:
    int n
    Py_ssize_t shape[ZF_MAX_DIMS]
    Py_ssize_t s1[ZF_MAX_DIMS]
    Py_ssize_t s2[ZF_MAX_DIMS]


cdef int _coalesce(_Dims* b) noexcept nogil:
    """Drop unit dimensions and merge dimensions that are contiguous in both
    arrays, in place. Returns the new ndim, or -1 when the block is empty."""
    cdef int i
    cdef int n = 0
    for i in range(b.n):
        if b.shape[i] == 0:
            return -1
    for i in range(b.n):
        if b.shape[i] == 1:
            continue
        if n > 0 and b.s1[n - 1] == b.shape[i] * b.s1[i] and b.s2[n - 1] == b.shape[i] * b.s2[i]:
            b.shape[n - 1] *= b.shape[i]
            b.s1[n - 1] = b.s1[i]
            b.s2[n - 1] = b.s2[i]
        else:
            b.shape[n] = b.shape[i]
            b.s1[n] = b.s1[i]
            b.s2[n] = b.s2[i]
            n += 1
    b.n = n
    return n


cdef inline Py_ssize_t _mag(Py_ssize_t x) noexcept nogil:
    return x if x >= 0 else -x


cdef void _sort_dims(_Dims* b) noexcept nogil:
    """The dimensions reordered by decreasing ``|s2|`` (ties by ``|s1|``), in
    place, a stable insertion sort.

    An element-wise walk may take the dimensions in any order; the kernels
    walk them in C order, so this puts the one ``s2`` steps through fastest
    innermost. For a copy, ``s2`` is the destination: an F-ordered output
    (zarr allocates one for an ``order="F"`` array) then gets whole columns
    written at once instead of one element per cache line, 8 KiB apart.
    """
    cdef int i, j
    cdef Py_ssize_t n, v1, v2, k1, k2
    for i in range(1, b.n):
        n = b.shape[i]
        v1 = b.s1[i]
        v2 = b.s2[i]
        k1 = _mag(v1)
        k2 = _mag(v2)
        j = i
        while j > 0 and (_mag(b.s2[j - 1]) < k2
                         or (_mag(b.s2[j - 1]) == k2 and _mag(b.s1[j - 1]) < k1)):
            b.shape[j] = b.shape[j - 1]
            b.s1[j] = b.s1[j - 1]
            b.s2[j] = b.s2[j - 1]
            j -= 1
        b.shape[j] = n
        b.s1[j] = v1
        b.s2[j] = v2


cdef int _load_dims(_Dims* b, const Py_ssize_t* shape, const Py_ssize_t* s1,
                    const Py_ssize_t* s2, int ndim) noexcept nogil:
    """``b``: the block ``shape`` with the strides ``s1``, ``s2``, sorted by
    ``s2`` (`_sort_dims`) and coalesced; ``ndim`` <= ZF_MAX_DIMS. Returns the
    coalesced ndim, or -1 when the block is empty."""
    cdef int i
    # element by element: a 0-d array's shape and strides may be NULL
    for i in range(ndim):
        b.shape[i] = shape[i]
        b.s1[i] = s1[i]
        b.s2[i] = s2[i]
    b.n = ndim
    _sort_dims(b)
    return _coalesce(b)


cdef inline void _swap_element(
    const char* s, char* d, Py_ssize_t itemsize, Py_ssize_t unit
) noexcept nogil:
    cdef uint16_t v16
    cdef uint32_t v32
    cdef uint64_t v64
    cdef Py_ssize_t off, b
    off = 0
    while off < itemsize:
        if unit == 2:
            memcpy(&v16, s + off, 2)
            v16 = ZF_BSWAP16(v16)
            memcpy(d + off, &v16, 2)
        elif unit == 4:
            memcpy(&v32, s + off, 4)
            v32 = ZF_BSWAP32(v32)
            memcpy(d + off, &v32, 4)
        elif unit == 8:
            memcpy(&v64, s + off, 8)
            v64 = ZF_BSWAP64(v64)
            memcpy(d + off, &v64, 8)
        else:
            for b in range(unit):
                d[off + b] = s[off + unit - 1 - b]
        off += unit


cdef inline void _copy_short(char* d, const char* s, Py_ssize_t n) noexcept nogil:
    """memcpy for short runs, inlined, no libc call: fixed-size moves only,
    the last one overlapping the one before (a run of 2-62 bytes, a region
    row cut by a chunk edge, would otherwise end in a libc call for its
    odd tail)."""
    if n >= 16:
        while n > 16:
            memcpy(d, s, 16)
            d += 16
            s += 16
            n -= 16
        memcpy(d + n - 16, s + n - 16, 16)
    elif n >= 8:
        memcpy(d, s, 8)
        memcpy(d + n - 8, s + n - 8, 8)
    elif n >= 4:
        memcpy(d, s, 4)
        memcpy(d + n - 4, s + n - 4, 4)
    elif n >= 2:
        memcpy(d, s, 2)
        memcpy(d + n - 2, s + n - 2, 2)
    elif n == 1:
        d[0] = s[0]


cdef inline void _copy_row(
    const char* sp,
    Py_ssize_t ss,
    char* dp,
    Py_ssize_t ds,
    Py_ssize_t n,
    Py_ssize_t itemsize,
    Py_ssize_t swap_unit,
) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint16_t v16
    cdef uint32_t v32
    cdef uint64_t v64
    if swap_unit == 0:
        if ss == itemsize and ds == itemsize:
            if n * itemsize <= _SHORT_ROW:
                _copy_short(dp, sp, n * itemsize)
            else:
                memcpy(dp, sp, <size_t>(n * itemsize))
        elif itemsize == 1:
            for i in range(n):
                dp[i * ds] = sp[i * ss]
        elif itemsize == 2:
            for i in range(n):
                memcpy(&v16, sp + i * ss, 2)
                memcpy(dp + i * ds, &v16, 2)
        elif itemsize == 4:
            for i in range(n):
                memcpy(&v32, sp + i * ss, 4)
                memcpy(dp + i * ds, &v32, 4)
        elif itemsize == 8:
            for i in range(n):
                memcpy(&v64, sp + i * ss, 8)
                memcpy(dp + i * ds, &v64, 8)
        else:
            for i in range(n):
                memcpy(dp + i * ds, sp + i * ss, <size_t>itemsize)
    elif swap_unit == itemsize and itemsize == 2:
        for i in range(n):
            memcpy(&v16, sp + i * ss, 2)
            v16 = ZF_BSWAP16(v16)
            memcpy(dp + i * ds, &v16, 2)
    elif swap_unit == itemsize and itemsize == 4:
        for i in range(n):
            memcpy(&v32, sp + i * ss, 4)
            v32 = ZF_BSWAP32(v32)
            memcpy(dp + i * ds, &v32, 4)
    elif swap_unit == itemsize and itemsize == 8:
        for i in range(n):
            memcpy(&v64, sp + i * ss, 8)
            v64 = ZF_BSWAP64(v64)
            memcpy(dp + i * ds, &v64, 8)
    else:
        for i in range(n):
            _swap_element(sp + i * ss, dp + i * ds, itemsize, swap_unit)


cdef inline bint _next_row(Py_ssize_t* idx, const Py_ssize_t* shape, int outer,
                           const Py_ssize_t* step1, const Py_ssize_t* step2, Py_ssize_t* o1,
                           Py_ssize_t* o2) noexcept nogil:
    """Move two offsets to the next row of an ``outer``-d grid of rows (C
    order), by their `carry_steps`; False past the last row."""
    cdef int d = next_index(idx, shape, outer)
    if d < 0:
        return False
    o1[0] += step1[d]
    o2[0] += step2[d]
    return True


cdef inline bint _rows_ahead(Py_ssize_t* idx, const Py_ssize_t* shape, int outer,
                             const Py_ssize_t* step1, const Py_ssize_t* step2, Py_ssize_t* o1,
                             Py_ssize_t* o2) noexcept nogil:
    """Start a second walk of the grid (`_next_row`) ``_PREFETCH_ROWS`` rows
    ahead of the first, into the next plane too; False when fewer rows
    remain."""
    cdef int _k
    memset(idx, 0, sizeof(Py_ssize_t) * outer)
    for _k in range(_PREFETCH_ROWS):
        if not _next_row(idx, shape, outer, step1, step2, o1, o2):
            return False
    return True


# A copy whose destination rows are dense but whose source steps far along
# them (an F-order chunk into a C-order output, or the reverse) reads one
# element per cache line. Walking tiles of ``_TILE_BYTES`` square instead
# reads each source line once per tile and writes each destination line
# once: the tile's lines stay in L1 however large the chunk, where a plain
# row-by-row walk of a chunk with power-of-two rows maps all of a row's
# source lines onto a few cache sets. A block whose source rows span less
# than ``_TILE_MIN_SPAN`` bytes (a 64x64 float32 chunk: 16 KiB) stays in L1
# anyway and is copied row by row, with the rows prefetched.
cdef enum:
    _TILE_BYTES = 64
    _TILE_MIN_SPAN = 32768


cdef void _copy_tile_block(
    const char* sp,
    char* dp,
    Py_ssize_t na,
    Py_ssize_t nb,
    Py_ssize_t ssa,
    Py_ssize_t ssb,
    Py_ssize_t dsa,
    Py_ssize_t dsb,
    Py_ssize_t itemsize,
    Py_ssize_t swap_unit,
) noexcept nogil:
    """Copy an ``na`` x ``nb`` block (strides ``ssa``, ``ssb`` in the source,
    ``dsa``, ``dsb`` in the destination) tile by tile."""
    cdef Py_ssize_t step = _TILE_BYTES // itemsize
    cdef Py_ssize_t a0, b0, a, a_end, tb
    # full tiles with both inner runs dense go through `zf_transpose_tile`
    cdef bint dense = swap_unit == 0 and ssa == itemsize and dsb == itemsize
    a0 = 0
    while a0 < na:
        a_end = a0 + step if a0 + step < na else na
        b0 = 0
        while b0 < nb:
            tb = step if b0 + step <= nb else nb - b0
            if (dense and tb == step and a_end - a0 == step
                    and zf_transpose_tile(sp + a0 * ssa + b0 * ssb, ssb,
                                          dp + a0 * dsa + b0 * dsb, dsa, itemsize)):
                b0 += step
                continue
            for a in range(a0, a_end):
                _copy_row(sp + a * ssa + b0 * ssb, ssb, dp + a * dsa + b0 * dsb, dsb, tb,
                          itemsize, swap_unit)
            b0 += step
        a0 += step


cdef int _tile_partner(const _Dims* b, Py_ssize_t itemsize) noexcept nogil:
    """The dimension to tile with the innermost one: where the innermost
    destination stride (``s2``) is dense and the source's (``s1``) far, the
    dimension whose source stride is one element (-1 when there is none or
    tiling would not pay)."""
    cdef int d, inner = b.n - 1
    if b.n < 2 or itemsize > _TILE_BYTES // 2:
        return -1
    if _mag(b.s2[inner]) >= _TILE_BYTES or _mag(b.s1[inner]) < _TILE_BYTES:
        return -1
    if _mag(b.s1[inner]) * b.shape[inner] < _TILE_MIN_SPAN:
        return -1
    for d in range(inner):
        if b.s1[d] == itemsize:
            return d
    return -1


cdef void _copy_tiled(const char* src, char* dst, const _Dims* b, int p, Py_ssize_t itemsize,
                      Py_ssize_t swap_unit) noexcept nogil:
    """`copy_strided` of a coalesced block (``s1`` the source's strides,
    ``s2`` the destination's), tiling dimension ``p`` with the innermost one
    (`_copy_tile_block`) and walking the others around."""
    cdef _Dims g  # the dimensions other than ``p`` and the innermost
    cdef Py_ssize_t sstep[ZF_MAX_DIMS]
    cdef Py_ssize_t dstep[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t soff = 0, doff = 0
    cdef int d, inner = b.n - 1
    g.n = 0
    for d in range(inner):
        if d != p:
            g.shape[g.n] = b.shape[d]
            g.s1[g.n] = b.s1[d]
            g.s2[g.n] = b.s2[d]
            idx[g.n] = 0
            g.n += 1
    carry_steps(g.shape, g.s1, g.n, sstep)
    carry_steps(g.shape, g.s2, g.n, dstep)
    while True:
        _copy_tile_block(src + soff, dst + doff, b.shape[p], b.shape[inner], b.s1[p],
                         b.s1[inner], b.s2[p], b.s2[inner], itemsize, swap_unit)
        if not _next_row(idx, g.shape, g.n, sstep, dstep, &soff, &doff):
            break


cdef void _copy_rows(const char* src, char* dst, const _Dims* b, Py_ssize_t itemsize,
                     Py_ssize_t swap_unit) noexcept nogil:
    """`copy_strided` of a coalesced block (``s1`` the source's strides,
    ``s2`` the destination's), row by row (its innermost dimension)."""
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t ahead_idx[ZF_MAX_DIMS]
    cdef Py_ssize_t sstep[ZF_MAX_DIMS]
    cdef Py_ssize_t dstep[ZF_MAX_DIMS]
    cdef Py_ssize_t soff = 0, doff = 0, sahead = 0, dahead = 0, dspan = 0, sspan = 0
    cdef int inner = b.n - 1
    cdef Py_ssize_t n = b.shape[inner], ss = b.s1[inner], ds = b.s2[inner]
    cdef bint more
    # prefetch along the dimension just outside the rows, when rows are short
    # and that dimension steps far (beyond the row itself)
    if inner >= 1:
        dspan = _row_span(n, ds, itemsize)
        sspan = _row_span(n, ss, itemsize)
        if b.s2[inner - 1] <= dspan or b.s2[inner - 1] < _PREFETCH_MIN_STEP:
            dspan = 0
        if b.s1[inner - 1] <= sspan or b.s1[inner - 1] < _PREFETCH_MIN_STEP:
            sspan = 0
    carry_steps(b.shape, b.s1, inner, sstep)
    carry_steps(b.shape, b.s2, inner, dstep)
    memset(idx, 0, sizeof(Py_ssize_t) * inner)
    more = (dspan != 0 or sspan != 0) and _rows_ahead(ahead_idx, b.shape, inner, sstep, dstep,
                                                      &sahead, &dahead)
    while True:
        if more:
            if dspan:
                _prefetch_span(dst + dahead, dspan, True)
            if sspan:
                _prefetch_span(src + sahead, sspan, False)
            more = _next_row(ahead_idx, b.shape, inner, sstep, dstep, &sahead, &dahead)
        _copy_row(src + soff, ss, dst + doff, ds, n, itemsize, swap_unit)
        if not _next_row(idx, b.shape, inner, sstep, dstep, &soff, &doff):
            break


cdef int copy_strided(const char* src, const Py_ssize_t* src_strides, char* dst,
                      const Py_ssize_t* dst_strides, const Py_ssize_t* shape, int ndim,
                      Py_ssize_t itemsize, Py_ssize_t swap_unit) noexcept nogil:
    """Copy an n-d strided block; ``swap_unit`` > 0 reverses the bytes of each
    ``swap_unit``-sized group of every element. Returns 0, or -1 on bad ndim."""
    cdef _Dims b
    cdef int n, p
    if ndim < 0 or ndim > ZF_MAX_DIMS:
        return -1
    n = _load_dims(&b, shape, src_strides, dst_strides, ndim)
    if n < 0:
        return 0
    if n == 0:
        _copy_row(src, itemsize, dst, itemsize, 1, itemsize, swap_unit)
        return 0
    p = _tile_partner(&b, itemsize)
    if p >= 0:
        _copy_tiled(src, dst, &b, p, itemsize, swap_unit)
    else:
        _copy_rows(src, dst, &b, itemsize, swap_unit)
    return 0


cdef int rows_side_by_side(char* big, const Py_ssize_t* big_strides, char* const* parts,
                           const Py_ssize_t* part_strides, int count, const Py_ssize_t* shape,
                           int ndim, Py_ssize_t itemsize, Py_ssize_t swap_unit,
                           bint into_big) noexcept nogil:
    """Copy between ``count`` blocks (``parts``, same shape and strides) and
    the region of a large array where they sit side by side along its last
    axis (block ``k`` starts ``k`` rows' width after ``big``), one whole row
    of the region at a time: the large array is touched in runs of
    ``count`` rows instead of ``count`` short runs at different times.
    ``into_big``: parts -> big (a scatter, ``big`` written), else big ->
    parts (a gather, ``big`` only read). Rows must be contiguous on both
    sides. Returns 0, or -1 on bad arguments."""
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef Py_ssize_t ahead_idx[ZF_MAX_DIMS]
    cdef Py_ssize_t bstep[ZF_MAX_DIMS]
    cdef Py_ssize_t pstep[ZF_MAX_DIMS]
    cdef Py_ssize_t n, row, span, boff = 0, poff = 0, ahead = 0, unused = 0
    cdef bint more
    cdef int d, k, outer
    if ndim < 1 or ndim > ZF_MAX_DIMS or count < 1:
        return -1
    if big_strides[ndim - 1] != itemsize or part_strides[ndim - 1] != itemsize:
        return -1
    for d in range(ndim):
        if shape[d] <= 0:
            return 0
        idx[d] = 0
    n = shape[ndim - 1]
    row = n * itemsize
    outer = ndim - 1
    carry_steps(shape, big_strides, outer, bstep)
    carry_steps(shape, part_strides, outer, pstep)
    # the region's row ``_PREFETCH_ROWS`` rows ahead, prefetched like
    # copy_strided's when rows are short and far apart
    span = count * row
    more = (outer > 0 and span <= _PREFETCH_MAX_SPAN and big_strides[outer - 1] > span
            and _rows_ahead(ahead_idx, shape, outer, bstep, pstep, &ahead, &unused))
    while True:
        if more:
            _prefetch_span(big + ahead, span, into_big)
            more = _next_row(ahead_idx, shape, outer, bstep, pstep, &ahead, &unused)
        for k in range(count):
            if into_big:
                _copy_row(parts[k] + poff, itemsize, big + boff + k * row, itemsize, n,
                          itemsize, swap_unit)
            else:
                _copy_row(big + boff + k * row, itemsize, parts[k] + poff, itemsize, n,
                          itemsize, swap_unit)
        if not _next_row(idx, shape, outer, bstep, pstep, &boff, &poff):
            break
    return 0


cdef void _fill_row(
    char* dp, Py_ssize_t ds, Py_ssize_t n, const char* pattern, Py_ssize_t itemsize, bint zero
) noexcept nogil:
    cdef Py_ssize_t i, done, step
    if ds == itemsize:
        if zero:
            memset(dp, 0, <size_t>(n * itemsize))
        elif itemsize == 1:
            memset(dp, pattern[0], <size_t>n)
        else:
            # write one element, then double the filled prefix until done
            memcpy(dp, pattern, <size_t>itemsize)
            done = 1
            while done < n:
                step = done if done <= n - done else n - done
                memcpy(dp + done * itemsize, dp, <size_t>(step * itemsize))
                done += step
    else:
        for i in range(n):
            memcpy(dp + i * ds, pattern, <size_t>itemsize)


cdef inline int _block_rows(_Dims* b, const Py_ssize_t* shape, const Py_ssize_t* strides,
                            int ndim, Py_ssize_t* steps, Py_ssize_t* idx) noexcept nogil:
    """Set up a walk over the rows of one n-d block (`fill_strided`,
    `equal_strided`): its dimensions sorted and coalesced into ``b`` (its
    strides in ``s1``), the rows' index ``idx`` at 0 and the `carry_steps`
    of an offset. Returns the coalesced ndim (-1 for an empty block)."""
    cdef int n = _load_dims(b, shape, strides, strides, ndim)
    if n > 0:
        carry_steps(b.shape, b.s1, n - 1, steps)
        memset(idx, 0, sizeof(Py_ssize_t) * (n - 1))
    return n


cdef int fill_strided(char* dst, const Py_ssize_t* dst_strides, const Py_ssize_t* shape,
                      int ndim, const char* pattern, Py_ssize_t itemsize) noexcept nogil:
    """Write ``pattern`` (one element) into every element of an n-d block."""
    cdef _Dims b
    cdef Py_ssize_t steps[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef int n, d, inner
    cdef Py_ssize_t k, off = 0, dspan = 0, rows = 0, row_step = 0, ds, count
    cdef bint zero = True
    if ndim < 0 or ndim > ZF_MAX_DIMS:
        return -1
    for k in range(itemsize):
        if pattern[k] != 0:
            zero = False
            break
    n = _block_rows(&b, shape, dst_strides, ndim, steps, idx)
    if n < 0:
        return 0
    if n == 0:
        memcpy(dst, pattern, <size_t>itemsize)
        return 0
    inner = n - 1
    ds = b.s1[inner]
    count = b.shape[inner]
    if inner >= 1:
        rows = b.shape[inner - 1]
        row_step = b.s1[inner - 1]
        dspan = _row_span(count, ds, itemsize)
        if row_step <= dspan:
            dspan = 0
    while True:
        if dspan and idx[inner - 1] + _PREFETCH_ROWS < rows:
            _prefetch_span(dst + off + _PREFETCH_ROWS * row_step, dspan, True)
        _fill_row(dst + off, ds, count, pattern, itemsize, zero)
        d = next_index(idx, b.shape, inner)
        if d < 0:
            break
        off += steps[d]
    return 0


cdef bint _row_equal(const char* sp, Py_ssize_t ss, Py_ssize_t n, const char* pattern,
                     Py_ssize_t itemsize, uint64_t word) noexcept nogil:
    cdef Py_ssize_t i, nwords, total
    cdef uint64_t v
    if ss == itemsize and 8 % itemsize == 0:
        total = n * itemsize
        nwords = total // 8
        for i in range(nwords):
            memcpy(&v, sp + 8 * i, 8)
            if v != word:
                return False
        for i in range(nwords * 8, total):
            if sp[i] != pattern[i % itemsize]:
                return False
        return True
    for i in range(n):
        if memcmp(sp + i * ss, pattern, <size_t>itemsize) != 0:
            return False
    return True


cdef bint equal_strided(const char* src, const Py_ssize_t* src_strides, const Py_ssize_t* shape,
                        int ndim, const char* pattern, Py_ssize_t itemsize) noexcept nogil:
    """Whether every element of an n-d block has the bytes of ``pattern``."""
    cdef _Dims b
    cdef Py_ssize_t steps[ZF_MAX_DIMS]
    cdef Py_ssize_t idx[ZF_MAX_DIMS]
    cdef int n, d, inner
    cdef Py_ssize_t k, off = 0
    cdef uint64_t word = 0
    if ndim < 0 or ndim > ZF_MAX_DIMS:
        return False
    if 8 % itemsize == 0:
        for k in range(8):
            (<char*>&word)[k] = pattern[k % itemsize]
    n = _block_rows(&b, shape, src_strides, ndim, steps, idx)
    if n < 0:
        return True
    if n == 0:
        return memcmp(src, pattern, <size_t>itemsize) == 0
    inner = n - 1
    while True:
        if not _row_equal(src + off, b.s1[inner], b.shape[inner], pattern, itemsize, word):
            return False
        d = next_index(idx, b.shape, inner)
        if d < 0:
            return True
        off += steps[d]


# -- Python-facing wrappers ---------------------------------------------------

cdef object _basic_view(cnp.ndarray out, object selection):
    """``out[selection]`` as an ndarray view; basic selections only.

    A trailing Ellipsis makes numpy return a 0-d view (not a scalar copy)
    when every axis is indexed by an integer.
    """
    if selection is None:
        return out
    if not isinstance(selection, tuple):
        selection = (selection,)
    for s in selection:
        # a Python bool is an int, but numpy takes it as a mask (a copy)
        if isinstance(s, bool) or not (
            isinstance(s, (slice, int, np.integer)) or s is Ellipsis
        ):
            raise TypeError(
                f"scatter/fill take basic selections (slices and integers), got {type(s).__name__}"
            )
    if Ellipsis not in selection:
        selection = selection + (Ellipsis,)
    return out[selection]


cdef Py_ssize_t _swap_unit(cnp.dtype dtype):
    # The byte groups that ``dtype.newbyteorder()`` reverses: each component
    # of a complex, each UCS4 code unit of a unicode string; none for byte
    # strings and unstructured void, whose opposite byte order is themselves.
    if dtype.itemsize <= 1 or dtype.kind == "S" or (
        dtype.kind == "V" and not cnp.PyDataType_HASFIELDS(dtype)
    ):
        return 0
    if dtype.kind == "c":
        return dtype.itemsize // 2
    if dtype.kind == "U":
        return 4
    return dtype.itemsize


cdef cnp.ndarray _scatter_target(cnp.ndarray s, out, selection, bint swap):
    """``out[selection]``, checked to receive ``s`` (in the opposite byte
    order when ``swap``)."""
    want = s.dtype.newbyteorder() if swap else s.dtype
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    dview = _basic_view(<cnp.ndarray>out, selection)
    shape = (<object>s).shape  # a tuple (cnp.ndarray's own is a C array)
    if dview.shape != shape:
        raise ValueError(
            f"destination shape {dview.shape} does not match source shape {shape}"
        )
    if dview.dtype != want:
        raise TypeError(f"destination dtype {dview.dtype} does not match {want} (swap={swap})")
    if np.may_share_memory(s, dview):
        raise ValueError("src and out overlap")
    if swap and cnp.PyDataType_HASFIELDS(s.dtype):
        raise TypeError("scatter cannot swap the byte order of structured elements")
    return <cnp.ndarray>dview


def scatter(src, out=None, selection=None, *, bint swap=False):
    """Copy ``src`` into ``out[selection]`` with the GIL released.

    Parameters
    ----------
    src : numpy.ndarray
        The block to copy, any strides.
    out : numpy.ndarray, optional
        Destination array. When omitted, a new C-ordered array is allocated
        (``selection`` must then be omitted too).
    selection : tuple of slice or int, optional
        Basic selection of ``out`` receiving ``src``; its shape must equal
        ``src.shape``.
    swap : bool
        Reverse the byte order of every element while copying (per component
        for complex types). ``out`` must then have ``src``'s dtype in the
        opposite byte order.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    cdef cnp.ndarray s, d
    cdef const char* sp
    cdef char* dp
    cdef Py_ssize_t* sstr
    cdef Py_ssize_t* dstr
    cdef Py_ssize_t* shp
    cdef int ndim, rc
    cdef Py_ssize_t itemsize, unit
    if not isinstance(src, np.ndarray):
        raise TypeError(f"src must be a numpy.ndarray, got {type(src).__name__}")
    s = <cnp.ndarray>src
    if s.dtype.hasobject:
        raise TypeError("scatter cannot copy object arrays")
    if out is None:
        if selection is not None:
            raise ValueError("selection needs an out array")
        out = np.empty(src.shape, dtype=s.dtype.newbyteorder() if swap else s.dtype)
    d = _scatter_target(s, out, selection, swap)
    ndim = s.ndim
    itemsize = s.dtype.itemsize
    unit = _swap_unit(s.dtype) if swap else 0
    sp = <const char*>cnp.PyArray_DATA(s)
    dp = <char*>cnp.PyArray_DATA(d)
    sstr = <Py_ssize_t*>cnp.PyArray_STRIDES(s)
    dstr = <Py_ssize_t*>cnp.PyArray_STRIDES(d)
    shp = <Py_ssize_t*>cnp.PyArray_DIMS(s)
    with nogil:
        rc = copy_strided(sp, sstr, dp, dstr, shp, ndim, itemsize, unit)
    if rc < 0:
        raise ValueError(f"arrays with {ndim} dimensions are not supported")
    return out


def fill(out, value, selection=None):
    """Write ``value`` into every element of ``out[selection]``, GIL released.

    Parameters
    ----------
    out : numpy.ndarray
        Destination array (writeable, not of object dtype).
    value : scalar
        Converted to ``out.dtype`` with numpy's casting rules.
    selection : tuple of slice or int, optional
        Basic selection of ``out`` to fill; everything when omitted.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    cdef cnp.ndarray o, d
    cdef bytes pattern
    cdef const char* pp
    cdef char* dp
    cdef Py_ssize_t* dstr
    cdef Py_ssize_t* shp
    cdef int ndim, rc
    cdef Py_ssize_t itemsize
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    o = <cnp.ndarray>out
    if o.dtype.hasobject:
        raise TypeError("fill cannot write object arrays")
    if not o.flags.writeable:
        raise ValueError("out is read-only")
    d = <cnp.ndarray>_basic_view(o, selection)
    # Same casting as ``out[selection] = value``.
    pattern = element_bytes(value, d.dtype)
    itemsize = d.dtype.itemsize
    if len(pattern) != itemsize:
        raise ValueError("fill value does not convert to a single element")
    if itemsize == 0:
        return out
    pp = pattern
    dp = <char*>cnp.PyArray_DATA(d)
    dstr = <Py_ssize_t*>cnp.PyArray_STRIDES(d)
    shp = <Py_ssize_t*>cnp.PyArray_DIMS(d)
    ndim = d.ndim
    with nogil:
        rc = fill_strided(dp, dstr, shp, ndim, pp, itemsize)
    if rc < 0:
        raise ValueError(f"arrays with {ndim} dimensions are not supported")
    return out
