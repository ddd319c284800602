# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The codec-chain kernel: zarr v3 chunk codecs in C, the GIL released.

A `ChainKernel` runs one chain ``[transpose] -> bytes -> [shuffle] ->
[compressor] -> [crc32c]`` (crc32c may also sit inside the compressor, when
nothing shuffles) over one chunk, a `DecodeTask` or an `EncodeTask`. The
compressor is zstd (libzstd), gzip or zlib (zlib; read with libdeflate),
blosc (c-blosc) or lz4 (liblz4, in numcodecs' framing), linked from the
system, or in a portable wheel built from source into the extension
(``linkage`` in `library_versions`). The shuffle is numcodecs' byte shuffle
(``numcodecs.shuffle``, format 2's ``Shuffle`` filter).

Decoding undoes the bytes->bytes codecs into a buffer of exactly the size
the chunk's shape and data type need (a frame that claims or yields any
other size is an error, never an allocation of the claimed size); then one
strided copy applies the transpose, the byte order and the chunk selection
while writing straight into the caller's output. When the destination is
the whole chunk, contiguous, in stored order, the decompressor writes into
it directly.

Per-thread state (zstd contexts, zlib streams, scratch memory) lives in a
`Workspace` per thread and is reused across calls. The batches of tasks
that a pool worker runs in one ``nogil`` call are in `_codec_batch`.

Errors leave the ``nogil`` sections as a `Status` and become one typed
exception (`zarr_fused.errors`) naming the chunk's key afterwards
(`status_error`).
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset

import os
import threading

import numpy as np

from zarr_fused._le32 cimport load_le32, store_le32
from zarr_fused cimport _blosc as bl
from zarr_fused cimport _deflate as ld
from zarr_fused cimport _lz4 as lz
from zarr_fused._crc32c cimport zf_crc32c, zf_crc32c_init, zf_crc32c_name, zf_crc32c_with
from zarr_fused._localio cimport FILE_ERROR, FILE_MISSING, read_file, write_file_atomic
from zarr_fused._phase_times cimport PhaseTimes, lap, now_ns
from zarr_fused cimport _zlib as zl
from zarr_fused cimport _zstd as zs
from zarr_fused._scatter cimport ZF_MAX_DIMS, copy_strided, equal_strided, fill_strided

from zarr_fused.errors import ChecksumError, ChunkSizeError, DecompressionError, ZarrFusedError

cdef extern from "limits.h":
    unsigned int UINT_MAX
    int INT_MAX

# setup.py defines ZF_BUNDLED_LIBS when it links the static libraries of a
# portable wheel instead of the system's
cdef extern from *:
    """
    #ifndef ZF_BUNDLED_LIBS
    #define ZF_BUNDLED_LIBS 0
    #endif
    """
    int ZF_BUNDLED_LIBS


zf_crc32c_init()

COMPRESSORS = {None: COMP_NONE, "zstd": COMP_ZSTD, "gzip": COMP_GZIP, "blosc": COMP_BLOSC,
               "zlib": COMP_ZLIB, "lz4": COMP_LZ4}
BLOSC_SHUFFLES = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


# -- crc32c ------------------------------------------------------------------------


def crc32c(data, *, bint portable=False):
    """CRC-32C of a bytes-like object, the GIL released.

    ``portable=True`` forces the table implementation (for tests); otherwise
    the CPU's CRC32 instructions are used when it has them.
    """
    cdef const uint8_t[::1] view = memoryview(data).cast("B")
    cdef uint32_t value
    cdef size_t n = view.shape[0]
    cdef const uint8_t* p = &view[0] if n else NULL
    cdef int force = 0 if portable else -1
    with nogil:
        value = zf_crc32c_with(force, p, n)
    return value


def crc32c_implementation():
    """Which crc32c implementation this CPU uses: sse4.2, armv8-crc or portable."""
    return zf_crc32c_name().decode()


def library_versions():
    """Versions of the C libraries this build links, and the crc32c path.

    ``blosc_complibs`` maps each compressor of c-blosc to the version of
    the library behind it, as c-blosc reports it (the version it was built
    against; a complib it links dynamically, such as zstd on Debian, runs
    at the version the system has). ``linkage`` is ``"system"`` for the
    system's shared libraries, ``"bundled"`` for static libraries built into
    the extension (a portable wheel). ``libdeflate`` is the version of the
    header the build saw (libdeflate has no call that reports its own).
    """
    compressors = bl.blosc_list_compressors().decode().split(",")
    return {
        "linkage": "bundled" if ZF_BUNDLED_LIBS else "system",
        "zstd": zs.ZSTD_versionString().decode(),
        "zlib": zl.zlibVersion().decode(),
        "libdeflate": ld.LIBDEFLATE_VERSION_STRING.decode(),
        "blosc": bl.blosc_get_version_string().decode(),
        "lz4": lz.LZ4_versionString().decode(),
        "blosc_compressors": compressors,
        "blosc_complibs": {name: _blosc_complib_version(name) for name in compressors},
        "crc32c": crc32c_implementation(),
    }


cdef str _blosc_complib_version(str cname):
    cdef char* complib = NULL
    cdef char* version = NULL
    cdef bytes name = cname.encode()
    try:
        if bl.blosc_get_complib_info(name, &complib, &version) < 0 or version == NULL:
            return ""
        return version.decode()
    finally:
        free(complib)
        free(version)


cdef int _check_crc(const uint8_t* data, Py_ssize_t n, Status* st) noexcept nogil:
    """Verify the trailing crc32c of ``data[:n]``."""
    cdef uint32_t stored, computed
    if n < 4:
        st.code = ZF_ERR_CRC_SHORT
        st.a = n
        return -1
    stored = load_le32(data + n - 4)
    computed = zf_crc32c(data, <size_t>(n - 4))
    if stored != computed:
        st.code = ZF_ERR_CRC
        st.a = stored
        st.b = computed
        return -1
    return 0


# -- per-thread state -----------------------------------------------------------------


cdef inline uint8_t* _grow(uint8_t** buf, size_t* cap, size_t n) noexcept nogil:
    """``*buf`` made to hold at least ``n`` bytes (at least one) by
    ``realloc``; NULL when it cannot grow (``*buf`` and ``*cap`` kept)."""
    cdef uint8_t* grown
    if n == 0:
        n = 1
    if n > cap[0]:
        grown = <uint8_t*>realloc(buf[0], n)
        if grown == NULL:
            return NULL
        buf[0] = grown
        cap[0] = n
    return buf[0]


cdef class Workspace:
    """Codec contexts and scratch memory of one thread."""

    def __cinit__(self):
        self.dctx = NULL
        self.cctx = NULL
        self.inflater_ready = False
        self.fast_inflater = NULL
        self.deflater_ready = False
        self.deflater_level = -100
        self.deflater_wbits = 0
        self.scratch = NULL
        self.scratch_cap = 0
        self.shuffled = NULL
        self.shuffled_cap = 0
        self.io_buf = NULL
        self.io_cap = 0

    def __dealloc__(self):
        if self.dctx != NULL:
            zs.ZSTD_freeDCtx(self.dctx)
        if self.cctx != NULL:
            zs.ZSTD_freeCCtx(self.cctx)
        if self.inflater_ready:
            zl.inflateEnd(&self.inflater)
        if self.fast_inflater != NULL:
            ld.libdeflate_free_decompressor(self.fast_inflater)
        if self.deflater_ready:
            zl.deflateEnd(&self.deflater)
        free(self.scratch)
        free(self.shuffled)
        free(self.io_buf)

    cdef uint8_t* reserve(self, size_t n) noexcept nogil:
        return _grow(&self.scratch, &self.scratch_cap, n)

    cdef uint8_t* reserve_io(self, size_t n) noexcept nogil:
        """The IO buffer (a payload read from its file, or an encoded chunk
        on its way to its file), at least ``n`` bytes."""
        return _grow(&self.io_buf, &self.io_cap, n)

    cdef uint8_t* reserve_shuffled(self, size_t n) noexcept nogil:
        """The buffer of a chunk's shuffled bytes, at least ``n``: apart
        from the scratch, which may hold the batch's side-by-side slots
        that the unshuffled chunks go to."""
        return _grow(&self.shuffled, &self.shuffled_cap, n)

    @property
    def scratch_bytes(self):
        return self.scratch_cap


_local = threading.local()


cpdef Workspace workspace():
    """The calling thread's workspace (created on first use)."""
    cdef Workspace ws
    try:
        return <Workspace>_local.ws
    except AttributeError:
        ws = Workspace()
        _local.ws = ws
        return ws


# -- compressors -----------------------------------------------------------------------


cdef int _zstd_claim(const uint8_t* src, size_t n, unsigned long long* total,
                     Status* st) noexcept nogil:
    """The content size the zstd frames in ``src[:n]`` declare together.

    ``src`` must be whole frames, back to back, at least one of them a zstd
    frame (skippable frames count 0 bytes). ``*total`` is
    ZSTD_CONTENTSIZE_UNKNOWN when a frame declares no size. Returns -1
    (``st`` set) for bytes that are not whole frames, a sum too large to
    count, or a frame whose 8-byte size field holds 2**64-1 or 2**64-2:
    libzstd reports those as "unknown" and "error", but the field is there
    and claims that many bytes.
    """
    cdef size_t pos = 0
    cdef size_t size
    cdef unsigned long long claim
    cdef unsigned long long sum = 0
    cdef bint known = True
    cdef bint zstd_frame
    cdef Py_ssize_t frames = 0
    while pos < n:
        size = zs.ZSTD_findFrameCompressedSize(src + pos, n - pos)
        if zs.ZSTD_isError(size):
            st.code = ZF_ERR_ZSTD
            st.msg = zs.ZSTD_getErrorName(size)
            return -1
        zstd_frame = load_le32(src + pos) == zs.ZSTD_MAGICNUMBER
        frames += zstd_frame
        claim = zs.ZSTD_getFrameContentSize(src + pos, size)
        if claim == zs.ZSTD_CONTENTSIZE_UNKNOWN or claim == zs.ZSTD_CONTENTSIZE_ERROR:
            # a parsed header (findFrameCompressedSize read it): "error"
            # can only be the value 2**64-2; either is a claim when the
            # header has an 8-byte size field (descriptor bits 7-6 = 3)
            if zstd_frame and (src[pos + 4] >> 6) == 3:
                st.code = ZF_ERR_CLAIM
                st.a = <Py_ssize_t>claim
                return -1
            known = False
        elif sum + claim < sum:
            st.code = ZF_ERR_MORE
            return -1
        else:
            sum += claim
        pos += size
    if frames == 0:  # nothing, or skippable frames only
        st.code = ZF_ERR_ZSTD
        st.msg = "no zstd frame"
        return -1
    total[0] = sum if known else zs.ZSTD_CONTENTSIZE_UNKNOWN
    return 0


cdef Py_ssize_t _zstd_decompress(Workspace ws, const uint8_t* src, Py_ssize_t n,
                                 uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    cdef unsigned long long claimed = 0
    cdef size_t r
    if _zstd_claim(src, <size_t>n, &claimed, st) < 0:
        if st.code != ZF_ERR_ZSTD:
            st.b = cap
        return -1
    if claimed != zs.ZSTD_CONTENTSIZE_UNKNOWN and claimed != <unsigned long long>cap:
        st.code = ZF_ERR_CLAIM
        st.a = <Py_ssize_t>claimed
        st.b = cap
        return -1
    if ws.dctx == NULL:
        ws.dctx = zs.ZSTD_createDCtx()
        if ws.dctx == NULL:
            st.code = ZF_ERR_NOMEM
            return -1
    r = zs.ZSTD_decompressDCtx(ws.dctx, dst, <size_t>cap, src, <size_t>n)
    if zs.ZSTD_isError(r) and zs.ZSTD_getErrorCode(r) == zs.ZSTD_error_dstSize_tooSmall:
        # more output than ``cap`` from frames that declare no size
        st.code = ZF_ERR_MORE
        st.b = cap
        return -1
    if zs.ZSTD_isError(r):
        st.code = ZF_ERR_ZSTD
        st.msg = zs.ZSTD_getErrorName(r)
        return -1
    return <Py_ssize_t>r


cdef inline void _z_buffers(zl.z_stream* z, const uint8_t* src, Py_ssize_t n, uint8_t* dst,
                            Py_ssize_t cap) noexcept nogil:
    """Give a zlib stream its input and output (both checked to fit 32 bits)."""
    z.next_in = <unsigned char*>src
    z.avail_in = <unsigned int>n
    z.next_out = dst
    z.avail_out = <unsigned int>cap


# gzip streams (RFC 1952) and, with ``zlib_format``, zlib streams (RFC 1950:
# numcodecs' Zlib, Python's zlib.compress). libdeflate, much faster than
# zlib's inflate, reads a stream it decodes whole; anything else goes to
# zlib, which decides how the read fails, so errors stay zlib's.
cdef Py_ssize_t _gzip_decompress(Workspace ws, const uint8_t* src, Py_ssize_t n,
                                 uint8_t* dst, Py_ssize_t cap, Status* st,
                                 bint zlib_format) noexcept nogil:
    cdef Py_ssize_t produced
    if n > UINT_MAX or cap > UINT_MAX:
        st.code = ZF_ERR_TOO_LARGE
        st.msg = "gzip (over 4 GiB)"
        return -1
    produced = _fast_inflate(ws, src, n, dst, cap, zlib_format)
    if produced >= 0:
        return produced
    return _zlib_inflate(ws, src, n, dst, cap, st, zlib_format)


cdef enum:
    GZIP_FLAG_OFFSET = 3
    GZIP_FHCRC = 0x02


# What zlib's loop below does, for the streams libdeflate decodes: bytes
# after a zlib stream ignored; gzip members back to back, zero padding after
# each. -1 hands the stream to zlib: libdeflate failed (corrupt, truncated,
# more than ``cap`` bytes, or no memory for its decompressor), or a gzip
# header has a header crc, which zlib checks and libdeflate skips.
cdef Py_ssize_t _fast_inflate(Workspace ws, const uint8_t* src, Py_ssize_t n,
                              uint8_t* dst, Py_ssize_t cap, bint zlib_format) noexcept nogil:
    cdef size_t used = 0
    cdef size_t made = 0
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t produced = 0
    cdef ld.libdeflate_result r
    if ws.fast_inflater == NULL:
        ws.fast_inflater = ld.libdeflate_alloc_decompressor()
        if ws.fast_inflater == NULL:
            return -1
    if zlib_format:
        r = ld.libdeflate_zlib_decompress_ex(ws.fast_inflater, src, <size_t>n, dst, <size_t>cap,
                                             &used, &made)
        return <Py_ssize_t>made if r == ld.LIBDEFLATE_SUCCESS else -1
    while True:
        if n - pos <= GZIP_FLAG_OFFSET or src[pos + GZIP_FLAG_OFFSET] & GZIP_FHCRC:
            return -1
        r = ld.libdeflate_gzip_decompress_ex(ws.fast_inflater, src + pos, <size_t>(n - pos),
                                             dst + produced, <size_t>(cap - produced),
                                             &used, &made)
        if r != ld.LIBDEFLATE_SUCCESS:
            return -1
        pos += <Py_ssize_t>used
        produced += <Py_ssize_t>made
        while pos < n and src[pos] == 0:
            pos += 1
        if pos == n:
            return produced


def fast_inflate(data, Py_ssize_t nbytes, *, bint zlib_format):
    """libdeflate's read of a gzip (or, ``zlib_format``, zlib) stream into
    at most ``nbytes`` bytes, as the kernels take it: the bytes, or None
    where zlib's inflate decides instead (for tests; decoding runs both)."""
    cdef const uint8_t[::1] view = memoryview(data).cast("B")
    cdef Py_ssize_t n = view.shape[0]
    cdef const uint8_t* src = &view[0] if n else NULL
    cdef Workspace ws = workspace()
    cdef uint8_t[::1] out
    cdef uint8_t* dst
    cdef Py_ssize_t produced
    if nbytes < 0 or nbytes > UINT_MAX or n > UINT_MAX:
        raise ValueError("the stream and nbytes must be under 4 GiB")
    out = np.empty(max(nbytes, 1), dtype=np.uint8)
    dst = &out[0]
    with nogil:
        produced = _fast_inflate(ws, src, n, dst, nbytes, zlib_format)
    return None if produced < 0 else bytes(out[:produced])


# zlib's inflate, which decides every stream libdeflate does not decode.
# Both formats take the thread's one inflater; inflateReset2 switches its
# format and keeps its window.
cdef Py_ssize_t _zlib_inflate(Workspace ws, const uint8_t* src, Py_ssize_t n,
                              uint8_t* dst, Py_ssize_t cap, Status* st,
                              bint zlib_format) noexcept nogil:
    cdef int rc
    cdef zl.z_stream* z = &ws.inflater
    cdef int wbits = zl.MAX_WBITS if zlib_format else 16 + zl.MAX_WBITS
    if not ws.inflater_ready:
        memset(z, 0, sizeof(zl.z_stream))
        if zl.inflateInit2(z, wbits) != zl.Z_OK:
            st.code = ZF_ERR_NOMEM
            return -1
        ws.inflater_ready = True
    elif zl.inflateReset2(z, wbits) != zl.Z_OK:
        st.code = ZF_ERR_GZIP
        st.msg = "inflateReset failed"
        return -1
    _z_buffers(z, src, n, dst, cap)
    while True:
        rc = zl.inflate(z, zl.Z_FINISH)
        if rc == zl.Z_STREAM_END and zlib_format:
            break  # Python's zlib.decompress ignores bytes after the stream
        if rc == zl.Z_STREAM_END:
            # Like Python's gzip module: zero padding may follow a member,
            # and further members continue the stream.
            while z.avail_in > 0 and z.next_in[0] == 0:
                z.next_in += 1
                z.avail_in -= 1
            if z.avail_in == 0:
                break
            if zl.inflateReset(z) != zl.Z_OK:
                st.code = ZF_ERR_GZIP
                st.msg = "inflateReset failed"
                return -1
            continue
        if rc == zl.Z_OK:
            continue
        # Z_BUF_ERROR: no progress possible. With input left, for want of
        # room: the stream holds more than expected. With the input used up
        # (even when the output is full), the stream is truncated.
        if rc == zl.Z_BUF_ERROR and z.avail_out == 0 and z.avail_in > 0:
            st.code = ZF_ERR_MORE
            st.b = cap
            return -1
        st.code = ZF_ERR_GZIP
        if z.msg != NULL:
            st.msg = z.msg
        elif rc == zl.Z_BUF_ERROR:
            st.msg = "truncated zlib stream" if zlib_format else "truncated gzip stream"
        else:
            st.msg = "corrupt zlib stream" if zlib_format else "corrupt gzip stream"
        return -1
    return cap - <Py_ssize_t>z.avail_out


# The 16-byte header c-blosc 1.x writes before every frame: format version
# (2), compressor format version (1), flags, typesize, then nbytes,
# blocksize and cbytes (little-endian int32); a compressed frame goes on
# with one int32 start offset per block. Flags: bit 0 byte shuffle, bit 1
# stored as is ("memcpyed"), bit 2 bit shuffle, bit 3 reserved, bit 4
# "blocks not split" (either value decodes), bits 5-7 the compressor format.
# Every field is checked here, before c-blosc sees the frame: the library's
# own checks differ between its versions and builds (a system c-blosc built
# with snappy decodes a frame whose flags byte was tampered with into wrong
# values, where numcodecs' raises), and zarr_fused must refuse what zarr
# refuses whichever c-blosc it links. What c-blosc writes always passes.
cdef enum BloscHeader:
    BLOSC_HEADER_SIZE = 16
    BLOSC_FORMAT = 2
    BLOSC_CODEC_FORMAT = 1
    BLOSC_FLAG_SHUFFLE = 0x01
    BLOSC_FLAG_MEMCPYED = 0x02
    BLOSC_FLAG_BITSHUFFLE = 0x04
    BLOSC_FLAG_RESERVED = 0x08
    BLOSC_MAX_NBYTES = 2147483647 - 16  # c-blosc 1.x: INT32_MAX - BLOSC_MAX_OVERHEAD
    # compressor formats (flags >> 5) that numcodecs' c-blosc decodes:
    # blosclz 0, lz4/lz4hc 1, zlib 3, zstd 4 (2 is snappy, which it lacks)
    BLOSC_DECODABLE_FORMATS = 0b11011


cdef int _blosc_check_fields(const uint8_t* src, Py_ssize_t n, Status* st) noexcept nogil:
    """The checks that need no chunk size: framing, versions, flags."""
    cdef uint8_t flags
    st.code = ZF_ERR_BLOSC
    if n < BLOSC_HEADER_SIZE:
        st.msg = "invalid blosc header: shorter than 16 bytes"
        return -1
    flags = src[2]
    if <Py_ssize_t>load_le32(src + 12) != n:
        st.msg = "invalid blosc header: its compressed size is not the frame's length"
    elif load_le32(src + 4) > BLOSC_MAX_NBYTES:
        st.msg = "invalid blosc header: uncompressed size over c-blosc's limit"
    elif src[0] != BLOSC_FORMAT:
        st.msg = "invalid blosc header: unknown format version"
    elif src[1] != BLOSC_CODEC_FORMAT:
        st.msg = "invalid blosc header: unknown compressor format version"
    elif flags & BLOSC_FLAG_RESERVED:
        st.msg = "invalid blosc header: reserved flag set"
    elif flags & BLOSC_FLAG_SHUFFLE and flags & BLOSC_FLAG_BITSHUFFLE:
        st.msg = "invalid blosc header: both byte and bit shuffle flagged"
    elif (flags >> 5) > 4:
        st.msg = "invalid blosc header: unknown compressor format"
    elif not flags & BLOSC_FLAG_MEMCPYED and not (BLOSC_DECODABLE_FORMATS >> (flags >> 5)) & 1:
        st.msg = "invalid blosc header: compressor format numcodecs cannot decode (snappy)"
    elif src[3] == 0:
        st.msg = "invalid blosc header: typesize 0"
    else:
        st.code = ZF_OK
        return 0
    return -1


cdef int _blosc_check_layout(const uint8_t* src, Py_ssize_t n, Py_ssize_t nbytes,
                             Status* st) noexcept nogil:
    """The checks of blocksize, a stored frame's length and the block starts
    of a compressed one, against ``nbytes`` (> 0, the header's and the chunk's)."""
    cdef Py_ssize_t blocksize = <Py_ssize_t>load_le32(src + 8)
    cdef Py_ssize_t nblocks, first, start, i
    st.code = ZF_ERR_BLOSC
    if blocksize < 1 or blocksize > nbytes:
        st.msg = "invalid blosc header: block size out of range"
        return -1
    if src[2] & BLOSC_FLAG_MEMCPYED:
        if n != nbytes + BLOSC_HEADER_SIZE:
            st.msg = "invalid blosc header: a stored frame's length is not nbytes + 16"
            return -1
        st.code = ZF_OK
        return 0
    nblocks = (nbytes + blocksize - 1) // blocksize
    first = BLOSC_HEADER_SIZE + 4 * nblocks
    if first > n:
        st.msg = "invalid blosc frame: too short for its block starts"
        return -1
    for i in range(nblocks):
        start = <Py_ssize_t>load_le32(src + BLOSC_HEADER_SIZE + 4 * i)
        if start < first or start > n - 4:
            st.msg = "invalid blosc frame: a block starts outside the frame"
            return -1
    st.code = ZF_OK
    return 0


cdef inline Py_ssize_t _blosc_size(int r, StatusCode code, const char* msg,
                                   Status* st) noexcept nogil:
    """What a blosc call returned: the size it wrote, or -1 with ``st`` set
    (blosc returns 0 or a negative code when it fails)."""
    if r > 0:
        return r
    st.code = code
    st.a = r
    st.msg = msg
    return -1


cdef Py_ssize_t _blosc_decompress(const uint8_t* src, Py_ssize_t n,
                                  uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    cdef Py_ssize_t claimed
    cdef int r
    if _blosc_check_fields(src, n, st) < 0:
        return -1
    claimed = <Py_ssize_t>load_le32(src + 4)
    if claimed != cap:
        st.code = ZF_ERR_CLAIM
        st.a = claimed
        st.b = cap
        return -1
    if cap == 0:
        return 0
    if _blosc_check_layout(src, n, cap, st) < 0:
        return -1
    r = bl.blosc_decompress_ctx(src, dst, <size_t>cap, 1)
    return _blosc_size(r, ZF_ERR_BLOSC, "corrupt blosc frame", st)


cdef Py_ssize_t _zstd_compress(ChainKernel k, Workspace ws, const uint8_t* src, Py_ssize_t n,
                               uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    cdef size_t r
    if ws.cctx == NULL:
        ws.cctx = zs.ZSTD_createCCtx()
        if ws.cctx == NULL:
            st.code = ZF_ERR_NOMEM
            return -1
    zs.ZSTD_CCtx_reset(ws.cctx, zs.ZSTD_reset_session_and_parameters)
    r = zs.ZSTD_CCtx_setParameter(ws.cctx, zs.ZSTD_c_compressionLevel, k.level)
    if not zs.ZSTD_isError(r):
        r = zs.ZSTD_CCtx_setParameter(ws.cctx, zs.ZSTD_c_checksumFlag, 1 if k.checksum else 0)
    if not zs.ZSTD_isError(r):
        r = zs.ZSTD_compress2(ws.cctx, dst, <size_t>cap, src, <size_t>n)
    if zs.ZSTD_isError(r):
        st.code = ZF_ERR_ENCODE
        st.msg = zs.ZSTD_getErrorName(r)
        return -1
    return <Py_ssize_t>r


# The gzip header zarr_fused writes: zarr's (Python's gzip module, through
# numcodecs) but for MTIME. Python writes the current time there; we write
# 0, "no time stamp" (RFC 1952), so that the same data always encodes to
# the same bytes. OS is 255, "unknown", as Python writes it (zlib's own
# default is the build host's, 3 on Unix). zlib only reads this struct.
cdef zl.gz_header _GZIP_HEADER
memset(&_GZIP_HEADER, 0, sizeof(zl.gz_header))
_GZIP_HEADER.os = 255


cdef Py_ssize_t _gzip_compress(ChainKernel k, Workspace ws, const uint8_t* src, Py_ssize_t n,
                               uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    # COMP_ZLIB writes a zlib stream as Python's zlib.compress does
    # (deflateInit's window and memLevel, no gzip header)
    cdef int rc
    cdef zl.z_stream* z = &ws.deflater
    cdef bint zlib_format = k.compressor == COMP_ZLIB
    cdef int wbits = zl.MAX_WBITS if zlib_format else 16 + zl.MAX_WBITS
    if n > UINT_MAX or cap > UINT_MAX:
        st.code = ZF_ERR_TOO_LARGE
        st.msg = "gzip (over 4 GiB)"
        return -1
    if ws.deflater_ready and (ws.deflater_level != k.level or ws.deflater_wbits != wbits):
        zl.deflateEnd(z)
        ws.deflater_ready = False
    if not ws.deflater_ready:
        memset(z, 0, sizeof(zl.z_stream))
        if zl.deflateInit2(z, k.level, zl.Z_DEFLATED, wbits, 8,
                           zl.Z_DEFAULT_STRATEGY) != zl.Z_OK:
            st.code = ZF_ERR_NOMEM
            return -1
        ws.deflater_ready = True
        ws.deflater_level = k.level
        ws.deflater_wbits = wbits
    elif zl.deflateReset(z) != zl.Z_OK:
        st.code = ZF_ERR_ENCODE
        st.msg = "deflateReset failed"
        return -1
    # the gzip header is reset by deflateReset: set it again each time
    if not zlib_format and zl.deflateSetHeader(z, &_GZIP_HEADER) != zl.Z_OK:
        st.code = ZF_ERR_ENCODE
        st.msg = "deflateSetHeader failed"
        return -1
    _z_buffers(z, src, n, dst, cap)
    rc = zl.deflate(z, zl.Z_FINISH)
    if rc != zl.Z_STREAM_END:
        st.code = ZF_ERR_ENCODE
        st.msg = "gzip output exceeds its bound"
        return -1
    return cap - <Py_ssize_t>z.avail_out


cdef Py_ssize_t _blosc_compress(ChainKernel k, const uint8_t* src, Py_ssize_t n,
                                uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    cdef int r = bl.blosc_compress_ctx(k.clevel, k.shuffle, <size_t>k.typesize, <size_t>n, src,
                                       dst, <size_t>cap, k.cname_c, <size_t>k.blocksize, 1)
    return _blosc_size(r, ZF_ERR_ENCODE, "blosc compression failed", st)


# -- lz4 ----------------------------------------------------------------------------------
# numcodecs' LZ4 frame: the uncompressed size (4 bytes, little-endian), then
# one LZ4 block. The size is the stored bytes' claim: checked against the
# chunk's size before liblz4 sees the block, and liblz4's safe decoder
# reads and writes only within the lengths it is given.

cdef enum:
    LZ4_HEADER = 4


cdef Py_ssize_t _lz4_decompress(const uint8_t* src, Py_ssize_t n, uint8_t* dst,
                                Py_ssize_t cap, Status* st) noexcept nogil:
    cdef Py_ssize_t claimed
    cdef int r
    if n < LZ4_HEADER:
        st.code = ZF_ERR_LZ4
        st.msg = "frame shorter than its 4-byte size header"
        return -1
    claimed = <Py_ssize_t>load_le32(src)
    if claimed != cap:
        st.code = ZF_ERR_CLAIM
        st.a = claimed
        st.b = cap
        return -1
    if n - LZ4_HEADER > INT_MAX or cap > lz.LZ4_MAX_INPUT_SIZE:
        st.code = ZF_ERR_TOO_LARGE
        st.msg = "lz4 (over 2 GiB)"
        return -1
    r = lz.LZ4_decompress_safe(<const char*>src + LZ4_HEADER, <char*>dst,
                               <int>(n - LZ4_HEADER), <int>cap)
    if r < 0:
        st.code = ZF_ERR_LZ4
        st.msg = "corrupt lz4 block"
        return -1
    return r


cdef Py_ssize_t _lz4_compress(ChainKernel k, const uint8_t* src, Py_ssize_t n,
                              uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    # numcodecs passes any acceleration above 0 on, and 1 for the others
    cdef int acceleration = k.acceleration if k.acceleration > 0 else 1
    cdef int r
    if n > lz.LZ4_MAX_INPUT_SIZE:
        st.code = ZF_ERR_TOO_LARGE
        st.msg = "lz4 (over 2 GiB)"
        return -1
    if cap < LZ4_HEADER + lz.LZ4_compressBound(<int>n):
        st.code = ZF_ERR_ENCODE
        st.msg = "lz4 output exceeds its bound"
        return -1
    store_le32(dst, <uint32_t>n)
    r = lz.LZ4_compress_fast(<const char*>src, <char*>dst + LZ4_HEADER, <int>n,
                             <int>(cap - LZ4_HEADER), acceleration)
    if r <= 0:
        st.code = ZF_ERR_ENCODE
        st.msg = "lz4 compression failed"
        return -1
    return r + LZ4_HEADER


# -- byte shuffle -------------------------------------------------------------------------
# numcodecs' Shuffle: byte j of element i goes to j * count + i, so the
# first bytes of all elements come first. The sizes arrays use get their
# own copy of the loop (the compiler unrolls a constant element size).


cdef inline void _shuffle_as(const uint8_t* src, uint8_t* dst, Py_ssize_t count,
                             Py_ssize_t size) noexcept nogil:
    cdef Py_ssize_t i, j
    for i in range(count):
        for j in range(size):
            dst[j * count + i] = src[i * size + j]


cdef inline void _unshuffle_as(const uint8_t* src, uint8_t* dst, Py_ssize_t count,
                               Py_ssize_t size) noexcept nogil:
    cdef Py_ssize_t i, j
    for i in range(count):
        for j in range(size):
            dst[i * size + j] = src[j * count + i]


cdef inline void _reorder_as(const uint8_t* src, uint8_t* dst, Py_ssize_t count,
                             Py_ssize_t size, bint undo) noexcept nogil:
    if undo:
        _unshuffle_as(src, dst, count, size)
    else:
        _shuffle_as(src, dst, count, size)


cdef void _byte_shuffle(const uint8_t* src, uint8_t* dst, Py_ssize_t n, Py_ssize_t size,
                        bint undo) noexcept nogil:
    """Shuffle (or with ``undo`` unshuffle) ``n`` bytes, a whole number of
    ``size``-byte elements, from ``src`` into ``dst``."""
    cdef Py_ssize_t count = n // size
    # a constant element size lets the C compiler unroll the inner loop
    if size == 2:
        _reorder_as(src, dst, count, 2, undo)
    elif size == 4:
        _reorder_as(src, dst, count, 4, undo)
    elif size == 8:
        _reorder_as(src, dst, count, 8, undo)
    else:
        _reorder_as(src, dst, count, size, undo)


cdef inline int _check_shuffle(Py_ssize_t n, Py_ssize_t size, Status* st) noexcept nogil:
    if n % size:
        st.code = ZF_ERR_SHUFFLE
        st.a = n
        st.b = size
        return -1
    return 0


cdef Py_ssize_t _decompress(int compressor, Workspace ws, const uint8_t* src, Py_ssize_t n,
                            uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    """Decompress ``src[:n]`` into at most ``cap`` bytes at ``dst``: the size
    produced, or -1 (``st`` set)."""
    if compressor == COMP_ZSTD:
        return _zstd_decompress(ws, src, n, dst, cap, st)
    if compressor == COMP_GZIP or compressor == COMP_ZLIB:
        return _gzip_decompress(ws, src, n, dst, cap, st, compressor == COMP_ZLIB)
    if compressor == COMP_LZ4:
        return _lz4_decompress(src, n, dst, cap, st)
    return _blosc_decompress(src, n, dst, cap, st)


# -- the chain ------------------------------------------------------------------------------


cdef class ChainKernel:
    """One codec chain: its compressor settings, crc32c codecs and element
    layout. Immutable; shared by every thread."""

    def __init__(self, *, compressor=None, int level=0, bint checksum=False, str cname="lz4",
                 int clevel=5, str shuffle="noshuffle", int typesize=1, Py_ssize_t blocksize=0,
                 int acceleration=1, Py_ssize_t byte_shuffle=0, int outer_crcs=0,
                 int inner_crcs=0, Py_ssize_t itemsize=1, Py_ssize_t swap_unit=0):
        if compressor not in COMPRESSORS:
            raise ValueError(f"unknown compressor {compressor!r}")
        # a byte shuffle sits right before the compressor (an element size
        # of 0 or 1 shuffles nothing)
        if byte_shuffle < 0 or (byte_shuffle > 1 and (compressor is None or inner_crcs)):
            raise ValueError("a byte shuffle needs a compressor right after it")
        if itemsize < 1 or swap_unit < 0 or (swap_unit and itemsize % swap_unit):
            raise ValueError(f"invalid itemsize {itemsize} / swap unit {swap_unit}")
        if outer_crcs < 0 or inner_crcs < 0 or (compressor is None and inner_crcs):
            raise ValueError("invalid crc32c placement")
        if shuffle not in BLOSC_SHUFFLES:
            raise ValueError(f"unknown blosc shuffle {shuffle!r}")
        encoded = cname.encode()
        if len(encoded) >= 32:
            raise ValueError(f"unknown blosc compressor {cname!r}")
        self.compressor = COMPRESSORS[compressor]
        self.level = level
        self.checksum = checksum
        self.cname = cname
        memcpy(self.cname_c, <const char*>encoded, len(encoded))
        self.cname_c[len(encoded)] = 0
        self.clevel = clevel
        self.shuffle = BLOSC_SHUFFLES[shuffle]
        self.typesize = typesize
        self.blocksize = blocksize
        self.acceleration = acceleration
        self.byte_shuffle = byte_shuffle if byte_shuffle > 1 else 0
        self.outer_crcs = outer_crcs
        self.inner_crcs = inner_crcs
        self.itemsize = itemsize
        self.swap_unit = swap_unit

    def __reduce__(self):
        names = {v: k for k, v in COMPRESSORS.items()}
        shuffles = {v: k for k, v in BLOSC_SHUFFLES.items()}
        return (_rebuild_kernel, (dict(
            compressor=names[self.compressor], level=self.level, checksum=self.checksum,
            cname=self.cname, clevel=self.clevel, shuffle=shuffles[self.shuffle],
            typesize=self.typesize, blocksize=self.blocksize, acceleration=self.acceleration,
            byte_shuffle=self.byte_shuffle, outer_crcs=self.outer_crcs,
            inner_crcs=self.inner_crcs, itemsize=self.itemsize, swap_unit=self.swap_unit),))

    def max_encoded_size(self, Py_ssize_t nbytes):
        """The most bytes a chunk of ``nbytes`` bytes can encode to."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        return self.encode_bound(nbytes)

    cdef Py_ssize_t encode_bound(self, Py_ssize_t nbytes) noexcept nogil:
        cdef Py_ssize_t inner = nbytes + 4 * self.inner_crcs
        cdef Py_ssize_t bound
        if self.compressor == COMP_ZSTD:
            bound = <Py_ssize_t>zs.ZSTD_compressBound(<size_t>inner)
        elif self.compressor == COMP_GZIP or self.compressor == COMP_ZLIB:
            bound = <Py_ssize_t>zl.compressBound(<unsigned long>inner) + 32
        elif self.compressor == COMP_BLOSC:
            bound = inner + bl.BLOSC_MAX_OVERHEAD
        elif self.compressor == COMP_LZ4:
            # LZ4_compressBound is 0 past its limit: the encode then fails
            bound = LZ4_HEADER + (<Py_ssize_t>lz.LZ4_compressBound(<int>inner)
                                  if inner <= lz.LZ4_MAX_INPUT_SIZE else inner)
        else:
            bound = inner
        return bound + 4 * self.outer_crcs

    cdef int decode_payload(self, Workspace ws, const uint8_t* src, Py_ssize_t n,
                            Py_ssize_t nbytes, uint8_t* direct_dst,
                            const uint8_t** out, Status* st) noexcept nogil:
        """Undo the bytes->bytes codecs of one payload. On success ``*out``
        points at exactly ``nbytes`` stored array bytes: ``direct_dst`` when
        the decompressor could write there, else inside ``src`` (no
        compressor) or the workspace scratch."""
        cdef Py_ssize_t length = n
        cdef Py_ssize_t target, produced
        cdef const uint8_t* data = src
        cdef uint8_t* buf
        cdef int _i
        for _i in range(self.outer_crcs):
            if _check_crc(data, length, st) < 0:
                return -1
            length -= 4
        if self.compressor != COMP_NONE:
            target = nbytes + 4 * self.inner_crcs
            if self.byte_shuffle:  # decompressed aside, unshuffled into place below
                buf = ws.reserve_shuffled(<size_t>target)
            elif direct_dst != NULL and self.inner_crcs == 0:
                buf = direct_dst
            else:
                buf = ws.reserve(<size_t>target)
            if buf == NULL:
                st.code = ZF_ERR_NOMEM
                return -1
            produced = _decompress(self.compressor, ws, data, length, buf, target, st)
            if produced < 0:
                return -1
            data = buf
            length = produced
            for _i in range(self.inner_crcs):
                if _check_crc(data, length, st) < 0:
                    return -1
                length -= 4
        if length != nbytes:
            st.code = ZF_ERR_SIZE
            st.a = length
            st.b = nbytes
            return -1
        if self.byte_shuffle:
            if _check_shuffle(nbytes, self.byte_shuffle, st) < 0:
                return -1
            buf = direct_dst if direct_dst != NULL else ws.reserve(<size_t>nbytes)
            if buf == NULL:
                st.code = ZF_ERR_NOMEM
                return -1
            _byte_shuffle(data, buf, nbytes, self.byte_shuffle, True)
            data = buf
        out[0] = data
        return 0

    cdef void run_decode(self, Workspace ws, DecodeTask* t, const char* fill,
                         PhaseTimes* acc) noexcept nogil:
        """Read (a file task), decode and scatter one chunk, or fill it when
        missing; with ``acc``, the time of each step is added there (the
        clock is read only then)."""
        cdef const uint8_t* data
        cdef const uint8_t* src = t.src
        cdef Py_ssize_t src_len = t.src_len
        cdef int rc, err = 0
        cdef int64_t mark = now_ns() if acc != NULL else 0
        if t.path != NULL and not t.missing:
            rc = read_file(t.path, &ws.io_buf, &ws.io_cap, &src_len, &err)
            if acc != NULL:
                mark = lap(&acc.io_ns, mark)
            if rc == FILE_MISSING:
                t.was_missing = True
            elif rc == FILE_ERROR:
                t.status.code = ZF_ERR_IO
                t.status.a = err
                return
            src = ws.io_buf
        if t.missing or t.was_missing:
            fill_strided(t.dst, t.dst_strides, t.shape, t.ndim, fill, self.itemsize)
            if acc != NULL:
                lap(&acc.scatter_ns, mark)
            return
        rc = self.decode_payload(ws, src, src_len, t.nbytes,
                                 <uint8_t*>t.dst if t.direct else NULL, &data, &t.status)
        if acc != NULL:
            mark = lap(&acc.decode_ns, mark)
        if rc < 0:
            return
        if acc != NULL:
            acc.chunks += 1
        if data == <const uint8_t*>t.dst:
            return
        copy_strided(<const char*>data + t.src_offset, t.src_strides, t.dst, t.dst_strides,
                     t.shape, t.ndim, self.itemsize, self.swap_unit)
        if acc != NULL:
            lap(&acc.scatter_ns, mark)

    cdef void run_encode(self, Workspace ws, EncodeTask* t, const char* fill) noexcept nogil:
        cdef Py_ssize_t cstr[ZF_MAX_DIMS]
        cdef uint8_t* buf
        if t.check_fill and fill != NULL and equal_strided(
            t.src, t.src_strides, t.shape, t.ndim, fill, self.itemsize
        ):
            t.was_fill = True
            return
        if self.reserve_output(ws, t) < 0:
            return
        c_strides(t.ndim, t.shape, self.itemsize, cstr)
        if self.compressor == COMP_NONE:  # stored as is: straight into the output
            copy_strided(t.src, t.src_strides, <char*>t.dst, cstr, t.shape, t.ndim,
                         self.itemsize, t.swap_unit)
            self.finish_encode(ws, t, NULL)
        elif t.contiguous and t.swap_unit == 0 and self.inner_crcs == 0:
            self.finish_encode(ws, t, <uint8_t*>t.src)
        else:
            buf = ws.reserve(<size_t>(t.nbytes + 4 * self.inner_crcs))
            if buf == NULL:
                t.status.code = ZF_ERR_NOMEM
                return
            copy_strided(t.src, t.src_strides, <char*>buf, cstr, t.shape, t.ndim,
                         self.itemsize, t.swap_unit)
            self.finish_encode(ws, t, buf)

    cdef int reserve_output(self, Workspace ws, EncodeTask* t) noexcept nogil:
        """Point a file-bound task at this thread's IO buffer; check that an
        uncompressed chunk fits its output. -1 (status set) on failure."""
        if t.dst == NULL:  # bound for its file: encode into this thread's IO buffer
            t.dst = ws.reserve_io(<size_t>t.dst_cap)
            if t.dst == NULL:
                t.status.code = ZF_ERR_NOMEM
                return -1
        if self.compressor == COMP_NONE and t.dst_cap < t.nbytes + 4 * self.outer_crcs:
            t.status.code = ZF_ERR_ENCODE
            t.status.msg = "output buffer too small"
            return -1
        return 0

    cdef void finish_encode(self, Workspace ws, EncodeTask* t, uint8_t* data) noexcept nogil:
        """Encode a chunk whose stored bytes are gathered: in ``data`` (with
        room for the inner checksums after them), or, without a compressor,
        already in ``t.dst`` (``data`` unused). Then the outer checksums and,
        for a file-bound task, the write."""
        cdef Py_ssize_t length, produced
        cdef Py_ssize_t inner = t.nbytes + 4 * self.inner_crcs
        cdef uint8_t* shuffled
        cdef int _i, err = 0
        if self.compressor == COMP_NONE:
            produced = t.nbytes
        else:
            length = t.nbytes
            for _i in range(self.inner_crcs):
                store_le32(data + length, zf_crc32c(data, <size_t>length))
                length += 4
            if self.byte_shuffle:  # aside: ``data`` may be the caller's array
                if _check_shuffle(t.nbytes, self.byte_shuffle, &t.status) < 0:
                    return
                shuffled = ws.reserve_shuffled(<size_t>t.nbytes)
                if shuffled == NULL:
                    t.status.code = ZF_ERR_NOMEM
                    return
                _byte_shuffle(data, shuffled, t.nbytes, self.byte_shuffle, False)
                data = shuffled
            if self.compressor == COMP_ZSTD:
                produced = _zstd_compress(self, ws, data, inner, t.dst,
                                          t.dst_cap - 4 * self.outer_crcs, &t.status)
            elif self.compressor == COMP_GZIP or self.compressor == COMP_ZLIB:
                produced = _gzip_compress(self, ws, data, inner, t.dst,
                                          t.dst_cap - 4 * self.outer_crcs, &t.status)
            elif self.compressor == COMP_LZ4:
                produced = _lz4_compress(self, data, inner, t.dst,
                                         t.dst_cap - 4 * self.outer_crcs, &t.status)
            else:
                produced = _blosc_compress(self, data, inner, t.dst,
                                           t.dst_cap - 4 * self.outer_crcs, &t.status)
            if produced < 0:
                return
        for _i in range(self.outer_crcs):
            store_le32(t.dst + produced, zf_crc32c(t.dst, <size_t>produced))
            produced += 4
        t.out_len = produced
        if t.path != NULL:
            if write_file_atomic(t.path, t.dst, produced, &err) == FILE_ERROR:
                t.status.code = ZF_ERR_IO
                t.status.a = err
            t.dst = NULL  # the IO buffer is reused by this thread's next task

    # -- bytes-level API (one payload) --

    def decode(self, payload, Py_ssize_t nbytes, out=None):
        """Undo the bytes->bytes codecs of ``payload`` into ``nbytes`` bytes.

        Parameters
        ----------
        payload : bytes-like
            The stored chunk.
        nbytes : int
            The exact decoded size (shape x item size of the chunk).
        out : writeable C-contiguous buffer, optional
            Receives the bytes (at least ``nbytes`` long). A new array when
            omitted.

        Returns
        -------
        numpy.ndarray
            ``nbytes`` uint8, a view of ``out`` when given.
        """
        cdef const uint8_t[::1] src = as_bytes_view(payload)
        cdef uint8_t[::1] dst
        cdef Status st
        cdef const uint8_t* data
        cdef Workspace ws = workspace()
        cdef Py_ssize_t n = src.shape[0]
        cdef const uint8_t* sp = &src[0] if n else <const uint8_t*>b""
        cdef uint8_t* dp
        cdef int rc
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if out is None:
            result = np.empty(nbytes, dtype=np.uint8)
        else:
            result = np.frombuffer(out, dtype=np.uint8) if not isinstance(out, np.ndarray) else out
            if not result.flags.c_contiguous or not result.flags.writeable:
                raise ValueError("out must be a writeable C-contiguous buffer")
            result = result.reshape(-1).view(np.uint8)
            if result.shape[0] < nbytes:
                raise ValueError(f"out holds {result.shape[0]} bytes, {nbytes} needed")
            result = result[:nbytes]
        dst = result if nbytes else np.empty(1, np.uint8)
        dp = &dst[0]
        memset(&st, 0, sizeof(Status))
        with nogil:
            rc = self.decode_payload(ws, sp, n, nbytes, dp, &data, &st)
            if rc == 0 and data != dp and nbytes:
                memcpy(dp, data, <size_t>nbytes)
        if rc < 0:
            raise status_error(&st, "payload")
        return result

    def encode(self, data):
        """Apply the bytes->bytes codecs to ``data`` (the stored array bytes).

        Returns
        -------
        numpy.ndarray
            The encoded payload, uint8.
        """
        cdef const uint8_t[::1] src = as_bytes_view(data)
        cdef EncodeTask t
        cdef Py_ssize_t shape[1]
        cdef Py_ssize_t strides[1]
        cdef Workspace ws = workspace()
        cdef Py_ssize_t n = src.shape[0]
        cdef uint8_t[::1] dst
        if self.itemsize != 1 and n % self.itemsize:
            raise ValueError(f"{n} bytes are not a whole number of {self.itemsize}-byte items")
        out = np.empty(self.encode_bound(n), dtype=np.uint8)
        dst = out
        memset(&t, 0, sizeof(EncodeTask))
        shape[0] = n // self.itemsize
        strides[0] = self.itemsize
        t.src = <const char*>&src[0] if n else <const char*>b""
        t.shape = shape
        t.src_strides = strides
        t.ndim = 1
        t.nbytes = n
        t.swap_unit = 0
        t.contiguous = True
        t.dst = &dst[0]
        t.dst_cap = dst.shape[0]
        with nogil:
            self.run_encode(ws, &t, NULL)
        if t.status.code != ZF_OK:
            raise status_error(&t.status, "payload")
        return out[:t.out_len].copy()


def _rebuild_kernel(kwargs):
    return ChainKernel(**kwargs)


cdef const uint8_t[::1] as_bytes_view(obj):
    if isinstance(obj, np.ndarray):
        arr = obj
        if not arr.flags.c_contiguous:
            raise ValueError("expected a C-contiguous buffer")
        return arr.reshape(-1).view(np.uint8)
    return memoryview(obj).cast("B")


# -- errors ------------------------------------------------------------------------------


# What each failed status becomes: an exception class and its message, whose
# fields are the store key's description (``where``), the status's numbers
# (``a``, ``b``; ``ua``: ``a`` unsigned, as a zstd frame's size claim may
# reach 2**64-1) and its static message (``msg``).
_STATUS_ERRORS = {
    ZF_ERR_CRC_SHORT: (ChecksumError, "{where}: {a} bytes cannot hold a crc32c checksum"),
    ZF_ERR_CRC: (ChecksumError,
                 "{where}: crc32c mismatch (stored {a:#010x}, computed {b:#010x})"),
    ZF_ERR_SIZE: (ChunkSizeError, "{where}: decodes to {a} bytes, the chunk needs {b}"),
    ZF_ERR_CLAIM: (ChunkSizeError,
                   "{where}: the compressed frame's header claims {ua} bytes, the chunk needs {b}"),
    ZF_ERR_MORE: (ChunkSizeError,
                  "{where}: the compressed frame holds more than the {b} bytes the chunk needs"),
    ZF_ERR_ZSTD: (DecompressionError, "{where}: zstd: {msg}"),
    ZF_ERR_GZIP: (DecompressionError, "{where}: gzip: {msg}"),
    ZF_ERR_BLOSC: (DecompressionError, "{where}: blosc: {msg}"),
    ZF_ERR_LZ4: (DecompressionError, "{where}: lz4: {msg}"),
    ZF_ERR_SHUFFLE: (ChunkSizeError,
                     "{where}: shuffle: {a} bytes are not a whole number of {b}-byte elements"),
    ZF_ERR_NOMEM: (MemoryError, "{where}: out of memory in a codec"),
    ZF_ERR_TOO_LARGE: (ZarrFusedError, "{where}: chunk too large for {msg}"),
    ZF_ERR_ENCODE: (ZarrFusedError, "{where}: encoding failed: {msg}"),
}


cdef object status_error(Status* st, object where):
    """The exception for a failed task, naming ``where`` (a key description)."""
    if st.code == ZF_ERR_IO:
        return OSError(st.a, f"{where}: {os.strerror(st.a)}")
    if st.code not in _STATUS_ERRORS:
        return ZarrFusedError(f"{where}: codec error {st.code}")
    cls, text = _STATUS_ERRORS[st.code]
    msg = st.msg.decode(errors="replace") if st.msg != NULL else ""
    return cls(text.format(where=where, a=st.a, ua=st.a & 0xFFFFFFFFFFFFFFFF, b=st.b, msg=msg))
