# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Codec-chain kernels: zarr v3 chunk codecs in C, the GIL released.

A `ChainKernel` runs one chain ``[transpose] -> bytes -> [compressor] ->
[crc32c]`` (crc32c may also sit inside the compressor). The compressor is
zstd (libzstd), gzip (zlib) or blosc (c-blosc), linked from the system.

Decoding undoes the bytes->bytes codecs into a buffer of exactly the size
the chunk's shape and data type need (a frame that claims or yields any
other size is an error, never an allocation of the claimed size); then one
strided copy applies the transpose, the byte order and the chunk selection
while writing straight into the caller's output. When the destination is
the whole chunk, contiguous, in stored order, the decompressor writes into
it directly.

`DecodeBatch` / `EncodeBatch` collect the chunks of a batch as C structs,
so a pool worker decodes or encodes its whole share in one ``nogil`` call.
Per-thread state (zstd contexts, zlib streams, scratch memory) lives in a
`Workspace` per thread and is reused across calls.

Errors leave the ``nogil`` sections as status codes and become one typed
exception (`zarr_fused.errors`) naming the chunk's key afterwards.
"""

from cpython.slice cimport PySlice_GetIndicesEx
from libc.stdint cimport uint8_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

cimport numpy as cnp
import os
import threading

import numpy as np

from zarr_fused cimport _blosc as bl
from zarr_fused._localio cimport FILE_ERROR, FILE_MISSING, read_file, write_file_atomic
from zarr_fused cimport _zlib as zl
from zarr_fused cimport _zstd as zs
from zarr_fused._scatter cimport (
    ZF_MAX_DIMS, copy_rows_side_by_side, copy_strided, equal_strided, fill_strided,
    gather_rows_side_by_side,
)

from zarr_fused.errors import ChecksumError, ChunkSizeError, DecompressionError, ZarrFusedError

cnp.import_array()

cdef extern from "_crc32c.h" nogil:
    void zf_crc32c_init()
    uint32_t zf_crc32c(const uint8_t* p, size_t n)
    uint32_t zf_crc32c_with(int force, const uint8_t* p, size_t n)
    const char* zf_crc32c_name()

cdef extern from "limits.h":
    unsigned int UINT_MAX


zf_crc32c_init()

COMPRESSORS = {None: COMP_NONE, "zstd": COMP_ZSTD, "gzip": COMP_GZIP, "blosc": COMP_BLOSC,
               "zlib": COMP_ZLIB}
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
    at the version the system has).
    """
    compressors = bl.blosc_list_compressors().decode().split(",")
    return {
        "zstd": zs.ZSTD_versionString().decode(),
        "zlib": zl.zlibVersion().decode(),
        "blosc": bl.blosc_get_version_string().decode(),
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


cdef inline uint32_t _load_le32(const uint8_t* p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline void _store_le32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xff
    p[1] = (v >> 8) & 0xff
    p[2] = (v >> 16) & 0xff
    p[3] = (v >> 24) & 0xff


cdef int _check_crc(const uint8_t* data, Py_ssize_t n, Status* st) noexcept nogil:
    """Verify the trailing crc32c of ``data[:n]``."""
    cdef uint32_t stored, computed
    if n < 4:
        st.code = ZF_ERR_CRC_SHORT
        st.a = n
        return -1
    stored = _load_le32(data + n - 4)
    computed = zf_crc32c(data, <size_t>(n - 4))
    if stored != computed:
        st.code = ZF_ERR_CRC
        st.a = stored
        st.b = computed
        return -1
    return 0


# -- per-thread state -----------------------------------------------------------------


cdef class Workspace:
    """Codec contexts and scratch memory of one thread."""

    def __cinit__(self):
        self.dctx = NULL
        self.cctx = NULL
        self.inflater_ready = False
        self.deflater_ready = False
        self.deflater_level = -100
        self.deflater_wbits = 0
        self.scratch = NULL
        self.scratch_cap = 0
        self.io_buf = NULL
        self.io_cap = 0

    def __dealloc__(self):
        if self.dctx != NULL:
            zs.ZSTD_freeDCtx(self.dctx)
        if self.cctx != NULL:
            zs.ZSTD_freeCCtx(self.cctx)
        if self.inflater_ready:
            zl.inflateEnd(&self.inflater)
        if self.deflater_ready:
            zl.deflateEnd(&self.deflater)
        free(self.scratch)
        free(self.io_buf)

    cdef uint8_t* reserve(self, size_t n) noexcept nogil:
        cdef uint8_t* grown
        if n == 0:
            n = 1
        if n > self.scratch_cap:
            grown = <uint8_t*>realloc(self.scratch, n)
            if grown == NULL:
                return NULL
            self.scratch = grown
            self.scratch_cap = n
        return self.scratch

    cdef uint8_t* reserve_io(self, size_t n) noexcept nogil:
        """The IO buffer (a payload read from its file, or an encoded chunk
        on its way to its file), at least ``n`` bytes."""
        cdef unsigned char* grown
        if n == 0:
            n = 1
        if n > self.io_cap:
            grown = <unsigned char*>realloc(self.io_buf, n)
            if grown == NULL:
                return NULL
            self.io_buf = grown
            self.io_cap = n
        return self.io_buf

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
    frame (skippable frames count 0 bytes). ``*total`` is ZSTD_CONTENTSIZE_UNKNOWN when a frame declares no
    size. Returns -1 (``st`` set) for bytes that are not whole frames, a
    sum too large to count, or a frame whose 8-byte size field holds
    2**64-1 or 2**64-2: libzstd reports those as "unknown" and "error",
    but the field is there and claims that many bytes.
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
        zstd_frame = _load_le32(src + pos) == zs.ZSTD_MAGICNUMBER
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


# gzip streams (RFC 1952) and, with ``zlib_format``, zlib streams (RFC 1950:
# numcodecs' Zlib, Python's zlib.compress). Both take the thread's one
# inflater; inflateReset2 switches its format and keeps its window.
cdef Py_ssize_t _gzip_decompress(Workspace ws, const uint8_t* src, Py_ssize_t n,
                                 uint8_t* dst, Py_ssize_t cap, Status* st,
                                 bint zlib_format) noexcept nogil:
    cdef int rc
    cdef zl.z_stream* z = &ws.inflater
    cdef int wbits = zl.MAX_WBITS if zlib_format else 16 + zl.MAX_WBITS
    if n > UINT_MAX or cap > UINT_MAX:
        st.code = ZF_ERR_TOO_LARGE
        return -1
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
    z.next_in = <unsigned char*>src
    z.avail_in = <unsigned int>n
    z.next_out = dst
    z.avail_out = <unsigned int>cap
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


cdef Py_ssize_t _blosc_decompress(const uint8_t* src, Py_ssize_t n,
                                  uint8_t* dst, Py_ssize_t cap, Status* st) noexcept nogil:
    cdef size_t claimed = 0
    cdef int r
    if n < bl.BLOSC_MIN_HEADER_LENGTH or bl.blosc_cbuffer_validate(src, <size_t>n, &claimed) < 0:
        st.code = ZF_ERR_BLOSC
        st.msg = "invalid blosc header"
        return -1
    if claimed != <size_t>cap:
        st.code = ZF_ERR_CLAIM
        st.a = <Py_ssize_t>claimed
        st.b = cap
        return -1
    if cap == 0:
        return 0
    r = bl.blosc_decompress_ctx(src, dst, <size_t>cap, 1)
    if r <= 0:
        st.code = ZF_ERR_BLOSC
        st.a = r
        st.msg = "corrupt blosc frame"
        return -1
    return r


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
    if not zlib_format and zl.deflateSetHeader(z, &_GZIP_HEADER) != zl.Z_OK:  # reset by deflateReset
        st.code = ZF_ERR_ENCODE
        st.msg = "deflateSetHeader failed"
        return -1
    z.next_in = <unsigned char*>src
    z.avail_in = <unsigned int>n
    z.next_out = dst
    z.avail_out = <unsigned int>cap
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
    if r <= 0:
        st.code = ZF_ERR_ENCODE
        st.a = r
        st.msg = "blosc compression failed"
        return -1
    return r


# -- layout helpers -----------------------------------------------------------------------


cdef inline void _c_strides(int ndim, const Py_ssize_t* shape, Py_ssize_t itemsize,
                            Py_ssize_t* out) noexcept nogil:
    cdef int i
    cdef Py_ssize_t s = itemsize
    for i in range(ndim - 1, -1, -1):
        out[i] = s
        s *= shape[i]


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
        _c_strides(self.ndim, self.stored_shape, itemsize, stored_strides)
        for i in range(self.ndim):
            self.strides[self.perm[i]] = stored_strides[i]

    @property
    def shape(self):
        return tuple(self.shape[i] for i in range(self.ndim))

    @property
    def strides(self):
        return tuple(self.strides[i] for i in range(self.ndim))


# -- the chain ------------------------------------------------------------------------------


cdef class ChainKernel:
    """One codec chain: its compressor settings, crc32c codecs and element
    layout. Immutable; shared by every thread."""

    def __init__(self, *, compressor=None, int level=0, bint checksum=False, str cname="lz4",
                 int clevel=5, str shuffle="noshuffle", int typesize=1, Py_ssize_t blocksize=0,
                 int outer_crcs=0, int inner_crcs=0, Py_ssize_t itemsize=1,
                 Py_ssize_t swap_unit=0):
        if compressor not in COMPRESSORS:
            raise ValueError(f"unknown compressor {compressor!r}")
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
            typesize=self.typesize, blocksize=self.blocksize, outer_crcs=self.outer_crcs,
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
        cdef int i
        for i in range(self.outer_crcs):
            if _check_crc(data, length, st) < 0:
                return -1
            length -= 4
        if self.compressor != COMP_NONE:
            target = nbytes + 4 * self.inner_crcs
            if direct_dst != NULL and self.inner_crcs == 0:
                buf = direct_dst
            else:
                buf = ws.reserve(<size_t>target)
                if buf == NULL:
                    st.code = ZF_ERR_NOMEM
                    return -1
            if self.compressor == COMP_ZSTD:
                produced = _zstd_decompress(ws, data, length, buf, target, st)
            elif self.compressor == COMP_GZIP or self.compressor == COMP_ZLIB:
                produced = _gzip_decompress(ws, data, length, buf, target, st,
                                            self.compressor == COMP_ZLIB)
            else:
                produced = _blosc_decompress(data, length, buf, target, st)
            if produced < 0:
                return -1
            data = buf
            length = produced
            for i in range(self.inner_crcs):
                if _check_crc(data, length, st) < 0:
                    return -1
                length -= 4
        if length != nbytes:
            st.code = ZF_ERR_SIZE
            st.a = length
            st.b = nbytes
            return -1
        out[0] = data
        return 0

    cdef void run_decode(self, Workspace ws, DecodeTask* t, const char* fill) noexcept nogil:
        cdef const uint8_t* data
        cdef const uint8_t* src = t.src
        cdef Py_ssize_t src_len = t.src_len
        cdef int rc, err = 0
        if t.path != NULL and not t.missing:
            rc = read_file(t.path, &ws.io_buf, &ws.io_cap, &src_len, &err)
            if rc == FILE_MISSING:
                t.was_missing = True
            elif rc == FILE_ERROR:
                t.status.code = ZF_ERR_IO
                t.status.a = err
                return
            src = ws.io_buf
        if t.missing or t.was_missing:
            fill_strided(t.dst, t.dst_strides, t.shape, t.ndim, fill, self.itemsize)
            return
        if self.decode_payload(ws, src, src_len, t.nbytes,
                               <uint8_t*>t.dst if t.direct else NULL, &data, &t.status) < 0:
            return
        if data == <const uint8_t*>t.dst:
            return
        copy_strided(<const char*>data + t.src_offset, t.src_strides, t.dst, t.dst_strides,
                     t.shape, t.ndim, self.itemsize, self.swap_unit)

    cdef void run_encode(self, Workspace ws, EncodeTask* t, const char* fill) noexcept nogil:
        cdef Py_ssize_t cstr[ZF_MAX_DIMS]
        cdef uint8_t* buf
        if t.check_fill and fill != NULL and equal_strided(
            t.src, t.src_strides, t.shape, t.ndim, fill, self.itemsize
        ):
            t.was_fill = True
            return
        if self._reserve_output(ws, t) < 0:
            return
        _c_strides(t.ndim, t.shape, self.itemsize, cstr)
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

    cdef int _reserve_output(self, Workspace ws, EncodeTask* t) noexcept nogil:
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
        cdef int i, err = 0
        if self.compressor == COMP_NONE:
            produced = t.nbytes
        else:
            length = t.nbytes
            for i in range(self.inner_crcs):
                _store_le32(data + length, zf_crc32c(data, <size_t>length))
                length += 4
            if self.compressor == COMP_ZSTD:
                produced = _zstd_compress(self, ws, data, inner, t.dst,
                                          t.dst_cap - 4 * self.outer_crcs, &t.status)
            elif self.compressor == COMP_GZIP or self.compressor == COMP_ZLIB:
                produced = _gzip_compress(self, ws, data, inner, t.dst,
                                          t.dst_cap - 4 * self.outer_crcs, &t.status)
            else:
                produced = _blosc_compress(self, data, inner, t.dst,
                                           t.dst_cap - 4 * self.outer_crcs, &t.status)
            if produced < 0:
                return
        for i in range(self.outer_crcs):
            _store_le32(t.dst + produced, zf_crc32c(t.dst, <size_t>produced))
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
        cdef const uint8_t[::1] src = _as_bytes_view(payload)
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
        cdef const uint8_t[::1] src = _as_bytes_view(data)
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


cdef const uint8_t[::1] _as_bytes_view(obj):
    if isinstance(obj, np.ndarray):
        arr = obj
        if not arr.flags.c_contiguous:
            raise ValueError("expected a C-contiguous buffer")
        return arr.reshape(-1).view(np.uint8)
    return memoryview(obj).cast("B")


# -- errors ------------------------------------------------------------------------------


cdef object status_error(Status* st, object where):
    """The exception for a failed task, naming ``where`` (a key description)."""
    cdef int code = st.code
    msg = st.msg.decode(errors="replace") if st.msg != NULL else ""
    if code == ZF_ERR_CRC_SHORT:
        return ChecksumError(f"{where}: {st.a} bytes cannot hold a crc32c checksum")
    if code == ZF_ERR_CRC:
        return ChecksumError(
            f"{where}: crc32c mismatch (stored {st.a:#010x}, computed {st.b:#010x})")
    if code == ZF_ERR_SIZE:
        return ChunkSizeError(f"{where}: decodes to {st.a} bytes, the chunk needs {st.b}")
    if code == ZF_ERR_CLAIM:
        # the claim is unsigned (a zstd frame's may reach 2**64-1)
        return ChunkSizeError(
            f"{where}: the compressed frame's header claims {st.a & 0xFFFFFFFFFFFFFFFF} "
            f"bytes, the chunk needs {st.b}")
    if code == ZF_ERR_MORE:
        return ChunkSizeError(
            f"{where}: the compressed frame holds more than the {st.b} bytes the chunk needs")
    if code == ZF_ERR_ZSTD:
        return DecompressionError(f"{where}: zstd: {msg}")
    if code == ZF_ERR_GZIP:
        return DecompressionError(f"{where}: gzip: {msg}")
    if code == ZF_ERR_BLOSC:
        return DecompressionError(f"{where}: blosc: {msg}")
    if code == ZF_ERR_NOMEM:
        return MemoryError(f"{where}: out of memory in a codec")
    if code == ZF_ERR_TOO_LARGE:
        return ZarrFusedError(f"{where}: chunk too large for gzip (over 4 GiB)")
    if code == ZF_ERR_ENCODE:
        return ZarrFusedError(f"{where}: encoding failed: {msg}")
    if code == ZF_ERR_IO:
        return OSError(st.a, f"{where}: {os.strerror(st.a)}")
    return ZarrFusedError(f"{where}: codec error {code}")


# -- batches ----------------------------------------------------------------------------------


# -- chunks side by side ----------------------------------------------------------------
#
# Chunks whose rows are short (a 32-element row of an inner chunk) sit in a
# large array as short runs far apart, and copying them one chunk at a time
# touches every cache line of the array several times, at different times
# (an x-neighbour copies the rest of the line later). When consecutive tasks
# are neighbours along the array's last axis, a read decodes them side by
# side into one scratch (small enough to stay in L2) and scatters them
# together, each row of the output in one run; a write gathers them the
# same way before encoding each. On this project's benchmark machine, one
# thread, 32^3 chunks of a 512^3 uint16 array: a whole read of sharded zstd
# ~0.44 -> ~0.39 s, uncompressed ~0.18 -> ~0.14 s; a whole write of
# uncompressed shards ~0.15 -> ~0.13 s.
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
                                     Py_ssize_t count) noexcept nogil:
    """Decode ``count`` tasks found by `_side_by_side` and scatter them
    together. Returns -1, or the position of the task that failed."""
    cdef const char* srcs[_SIDE_MAX]
    cdef uint8_t* slots = NULL
    cdef const uint8_t* data
    cdef DecodeTask* t0 = &tasks[0]
    cdef Py_ssize_t j
    if kernel.compressor != COMP_NONE:
        # decoded straight into the slots (no inner checksums: see run)
        slots = ws.reserve(<size_t>(count * t0.nbytes))
        if slots == NULL:
            t0.status.code = ZF_ERR_NOMEM
            return 0
    for j in range(count):
        if kernel.decode_payload(ws, tasks[j].src, tasks[j].src_len, tasks[j].nbytes,
                                 slots + j * t0.nbytes if slots != NULL else NULL,
                                 &data, &tasks[j].status) < 0:
            return j
        srcs[j] = <const char*>data + t0.src_offset
    copy_rows_side_by_side(srcs, <int>count, t0.src_strides, t0.dst, t0.dst_strides,
                           t0.shape, t0.ndim, kernel.itemsize, kernel.swap_unit)
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
                              Py_ssize_t count, const char* fill) noexcept nogil:
    """Gather ``count`` tasks found by `_encode_side_by_side` in one pass
    over the source, then encode each. Returns -1, or the position of the
    task that failed."""
    cdef char* parts[_SIDE_MAX]
    cdef Py_ssize_t cstr[ZF_MAX_DIMS]
    cdef EncodeTask* t0 = &tasks[0]
    cdef EncodeTask* t
    cdef Py_ssize_t j, slot = t0.nbytes + 4 * kernel.inner_crcs
    cdef uint8_t* slots = NULL
    if kernel.compressor == COMP_NONE:
        for j in range(count):
            if kernel._reserve_output(ws, &tasks[j]) < 0:
                return j
            parts[j] = <char*>tasks[j].dst
    else:
        slots = ws.reserve(<size_t>(count * slot))
        if slots == NULL:
            t0.status.code = ZF_ERR_NOMEM
            return 0
        for j in range(count):
            parts[j] = <char*>slots + j * slot
    _c_strides(t0.ndim, t0.shape, kernel.itemsize, cstr)
    gather_rows_side_by_side(t0.src, t0.src_strides, parts, <int>count, cstr, t0.shape, t0.ndim,
                             kernel.itemsize, t0.swap_unit)
    for j in range(count):
        t = &tasks[j]
        # the fill test reads the source, in its own byte order, as run_encode's
        if t.check_fill and fill != NULL and equal_strided(
            t.src, t.src_strides, t.shape, t.ndim, fill, kernel.itemsize
        ):
            t.was_fill = True
            continue
        if kernel.compressor != COMP_NONE and kernel._reserve_output(ws, t) < 0:
            return j
        kernel.finish_encode(ws, t, <uint8_t*>parts[j])
        if t.status.code != ZF_OK:
            return j
    return -1


cdef class DecodeBatch:
    """The decode work of a group of chunks, as C tasks, run in one nogil call.

    ``add`` describes one chunk (payload, where its selection lands in
    ``out``); ``add_missing`` a chunk to fill. Both return False when the
    selection is not a basic one (the caller decodes that chunk another way).
    ``run`` executes the tasks in order and stops at the first one that
    fails, raising for it (the tasks before it have been applied). Several
    threads may run disjoint ranges of one batch at once.
    """

    def __cinit__(self, ChainKernel kernel, Py_ssize_t capacity, int max_ndim, describe=repr):
        if capacity < 0 or max_ndim < 0 or max_ndim > ZF_MAX_DIMS:
            raise ValueError("invalid batch size")
        self.kernel = kernel
        self.cap = capacity
        self.max_ndim = max_ndim
        self.n = 0
        self.tasks = <DecodeTask*>malloc(sizeof(DecodeTask) * (capacity if capacity else 1))
        self.dims = <Py_ssize_t*>malloc(
            sizeof(Py_ssize_t) * 3 * (capacity if capacity else 1) * (max_ndim if max_ndim else 1))
        if self.tasks == NULL or self.dims == NULL:
            raise MemoryError()
        self.refs = []
        self.keys = []
        self.fill = None
        self.describe = describe

    def __dealloc__(self):
        free(self.tasks)
        free(self.dims)

    def __len__(self):
        return self.n

    def set_fill(self, bytes pattern):
        """The element written into missing chunks (``itemsize`` bytes)."""
        if len(pattern) != self.kernel.itemsize:
            raise ValueError("fill pattern must be one element")
        self.fill = pattern

    cdef DecodeTask* _next(self) except NULL:
        cdef DecodeTask* t
        if self.n >= self.cap:
            raise IndexError("decode batch is full")
        t = &self.tasks[self.n]
        memset(t, 0, sizeof(DecodeTask))
        t.shape = self.dims + 3 * self.n * self.max_ndim
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
        return nd

    cdef bint is_direct(self, DecodeTask* t, ChunkLayout layout) noexcept:
        """Whole chunk, stored order, no swap, contiguous destination: the
        decompressor can write into the output itself."""
        return (
            not layout.transposed
            and self.kernel.swap_unit == 0
            and t.src_offset == 0
            and contiguous_run(t.ndim, t.shape, t.src_strides, self.kernel.itemsize)
            * self.kernel.itemsize == layout.nbytes
            and contiguous_run(t.ndim, t.shape, t.dst_strides, self.kernel.itemsize)
            * self.kernel.itemsize == layout.nbytes
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
        cdef DecodeTask* t = self._next()
        cdef Py_ssize_t src_shape[ZF_MAX_DIMS]
        cdef Py_ssize_t src_strides[ZF_MAX_DIMS]
        cdef Py_ssize_t dst_shape[ZF_MAX_DIMS]
        cdef Py_ssize_t offset = 0
        cdef int nd_src, nd_dst, i, k
        cdef const uint8_t[::1] view
        if out.dtype.itemsize != self.kernel.itemsize:
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
            view = _as_bytes_view(payload)
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
        cdef DecodeTask* t = self._next()
        cdef Py_ssize_t shape[ZF_MAX_DIMS]
        cdef int nd, i
        if self.fill is None:
            raise ValueError("set_fill() first")
        if out.dtype.itemsize != self.kernel.itemsize:
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

    def run(self, Py_ssize_t start=0, Py_ssize_t stop=-1):
        """Decode the queued chunks ``start:stop`` (all by default) with the
        GIL released; raise for the first one that failed.

        Returns
        -------
        list of int
            Positions (in order of adding) of the chunks in the range whose
            file was missing (`add_file`); their regions hold the fill value.
        """
        cdef Workspace ws = workspace()
        cdef const char* fill = self.fill_ptr()
        cdef Py_ssize_t failed
        if stop < 0 or stop > self.n:
            stop = self.n
        if start < 0:
            start = 0
        with nogil:
            failed = self.run_range(ws, start, stop, fill)
        if failed >= 0:
            self.raise_failed(failed)
        return [i for i in range(start, stop) if self.tasks[i].was_missing]

    cdef const char* fill_ptr(self):
        return <const char*>self.fill if self.fill is not None else NULL

    cdef Py_ssize_t run_range(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                              const char* fill) noexcept nogil:
        """Decode tasks ``start:stop`` (a valid range) with ``fill`` for
        missing chunks; the first failed task's position, or -1."""
        # side by side only where every payload decodes into its own slot:
        # not with inner checksums (decoded through the shared scratch)
        cdef bint side = (self.kernel.compressor == COMP_NONE or self.kernel.inner_crcs == 0)
        cdef Py_ssize_t g, bad, i = start
        while i < stop:
            g = _side_by_side(&self.tasks[i], stop - i, self.kernel.itemsize) if side else 1
            if g > 1:
                bad = _decode_side_by_side(self.kernel, ws, &self.tasks[i], g)
                if bad >= 0:
                    return i + bad
            else:
                self.kernel.run_decode(ws, &self.tasks[i], fill)
                if self.tasks[i].status.code != ZF_OK:
                    return i
            i += g
        return -1

    cdef object raise_failed(self, Py_ssize_t failed):
        raise status_error(&self.tasks[failed].status, self.describe(self.keys[failed]))


cdef class EncodeBatch:
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
        if capacity < 0 or max_ndim < 0 or max_ndim > ZF_MAX_DIMS:
            raise ValueError("invalid batch size")
        if arena is not None and (
            not isinstance(arena, np.ndarray) or arena.dtype != np.uint8 or arena.ndim != 1
            or not arena.flags.c_contiguous or not arena.flags.writeable
        ):
            raise TypeError("arena must be a writeable contiguous 1-d uint8 array")
        self.kernel = kernel
        self.cap = capacity
        self.max_ndim = max_ndim
        self.n = 0
        self.fill = None
        self.arena = arena
        self.arena_used = 0
        self.tasks = <EncodeTask*>malloc(sizeof(EncodeTask) * (capacity if capacity else 1))
        self.dims = <Py_ssize_t*>malloc(
            sizeof(Py_ssize_t) * 2 * (capacity if capacity else 1) * (max_ndim if max_ndim else 1))
        if self.tasks == NULL or self.dims == NULL:
            raise MemoryError()
        self.refs = []
        self.outputs = []
        self.keys = []
        self.describe = describe

    def __dealloc__(self):
        free(self.tasks)
        free(self.dims)

    def __len__(self):
        return self.n

    def set_fill(self, bytes pattern):
        """The fill value as one element in the chunks' own byte order."""
        if len(pattern) != self.kernel.itemsize:
            raise ValueError("fill pattern must be one element")
        self.fill = pattern

    def add(self, cnp.ndarray chunk, ChunkLayout layout, bint swap, key, bytes path=None,
            bint skip_fill=False):
        """Queue the encode of ``chunk`` (shape ``layout.shape``); ``swap``
        reverses the byte order on the way (stored order differs). With
        ``path``, `run` also writes the result to that file (atomically).
        With ``skip_fill``, a chunk equal to the fill value throughout is
        skipped (see the class docstring)."""
        if skip_fill and self.fill is None:
            raise ValueError("set_fill() first")
        cdef EncodeTask* t
        cdef int i
        if self.n >= self.cap:
            raise IndexError("encode batch is full")
        if chunk.ndim != layout.ndim or chunk.ndim > self.max_ndim:
            raise ValueError("chunk does not match its layout")
        if chunk.dtype.itemsize != self.kernel.itemsize or chunk.dtype.hasobject:
            raise TypeError(f"cannot encode {chunk.dtype} with this chain")
        for i in range(layout.ndim):
            if cnp.PyArray_DIMS(chunk)[i] != layout.shape[i]:
                raise ValueError("chunk does not match its layout")
        t = &self.tasks[self.n]
        memset(t, 0, sizeof(EncodeTask))
        t.shape = self.dims + 2 * self.n * self.max_ndim
        t.src_strides = t.shape + self.max_ndim
        for i in range(layout.ndim):
            t.shape[i] = layout.stored_shape[i]
            t.src_strides[i] = cnp.PyArray_STRIDES(chunk)[layout.perm[i]]
        t.ndim = layout.ndim
        t.src = <const char*>cnp.PyArray_DATA(chunk)
        t.nbytes = layout.nbytes
        t.swap_unit = self.kernel.swap_unit if swap else 0
        t.contiguous = (
            contiguous_run(t.ndim, t.shape, t.src_strides, self.kernel.itemsize)
            * self.kernel.itemsize == layout.nbytes
        )
        bound = self.kernel.encode_bound(layout.nbytes)
        if path is not None:  # encoded into the running thread's IO buffer
            out = None
            t.dst = NULL
            t.path = path
            self.refs.append(path)
        elif self.arena is not None and self.arena_used + bound <= self.arena.shape[0]:
            out = self.arena[self.arena_used:self.arena_used + bound]
            self.arena_used += bound
            t.dst = <uint8_t*>cnp.PyArray_DATA(out)
        else:
            out = np.empty(bound, dtype=np.uint8)
            t.dst = <uint8_t*>cnp.PyArray_DATA(out)
        t.dst_cap = bound
        t.check_fill = skip_fill
        self.refs.append(chunk)
        self.outputs.append(out)
        self.keys.append(key)
        self.n += 1
        return self.n - 1

    def run_range(self, Py_ssize_t start=0, Py_ssize_t stop=-1):
        """Encode the queued chunks ``start:stop`` with the GIL released
        (several threads may run disjoint ranges at once); raise for the
        first that failed."""
        cdef Workspace ws = workspace()
        cdef Py_ssize_t i
        cdef Py_ssize_t failed = -1
        cdef const char* fill = <const char*>self.fill if self.fill is not None else NULL
        if stop < 0 or stop > self.n:
            stop = self.n
        if start < 0:
            start = 0
        cdef Py_ssize_t g, bad
        with nogil:
            i = start
            while i < stop:
                g = _encode_side_by_side(&self.tasks[i], stop - i, self.kernel)
                if g > 1:
                    bad = _encode_group(self.kernel, ws, &self.tasks[i], g, fill)
                    if bad >= 0:
                        failed = i + bad
                        break
                else:
                    self.kernel.run_encode(ws, &self.tasks[i], fill)
                    if self.tasks[i].status.code != ZF_OK:
                        failed = i
                        break
                i += g
        if failed >= 0:
            raise status_error(&self.tasks[failed].status, self.describe(self.keys[failed]))

    def results(self):
        """The outcome of every task, once all have run (see `run`)."""
        cdef Py_ssize_t i
        result = []
        for i in range(self.n):
            if self.tasks[i].was_fill:
                result.append(False)  # all fill value: store nothing
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

    def run(self):
        """Encode every queued chunk with the GIL released.

        Returns
        -------
        list of numpy.ndarray, None or False
            The encoded payloads (uint8), in the order they were added;
            None for those written to their file; False for chunks skipped
            because they hold only the fill value.
        """
        self.run_range()
        return self.results()