# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Variable-length strings and bytes: numcodecs' vlen framing in C.

zarr's ``vlen-utf8`` and ``vlen-bytes`` codecs (format 3) and numcodecs'
``VLenUTF8`` / ``VLenBytes`` filters (format 2) store a chunk's items as one
frame: the item count (4 bytes, little-endian), then per item its length
(4 bytes, little-endian) and its bytes (UTF-8 for strings). Bytes after the
last item are ignored, as numcodecs ignores them.

Decoding undoes the chain's bytes->bytes codecs with `ChainKernel` (the
decoded size is found from the frame headers, `_decode_frame`), then walks
the frame with the GIL released, checking every length against the bytes
that remain and the item count against the chunk's, and records where each
item starts. Strings for NumPy's ``StringDType`` (zarr's in-memory type for
``str``) are then checked to be UTF-8 as Python's strict decoder accepts it
and packed into the array, still without the GIL and without one Python
object (`decode_strings`). ``bytes`` items (and strings for an object array)
are made with the GIL in one tight loop (`decode`): no Python object is made
for a frame that is corrupt.

Encoding reads each item's UTF-8 (out of a ``StringDType`` array with the
GIL released; out of a ``str`` object, which caches it, with the GIL) or
bytes, then builds the frame and compresses it with the GIL released.
"""

from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_Check, PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

import math

import numpy as np

from zarr_fused._le32 cimport load_le32, store_le32
from zarr_fused cimport _zstd as zs
from zarr_fused._codecs cimport (
    COMP_BLOSC,
    COMP_GZIP,
    COMP_NONE,
    COMP_ZSTD,
    ZF_ERR_CLAIM,
    ZF_ERR_MORE,
    ZF_ERR_NOMEM,
    ZF_ERR_SIZE,
    ZF_OK,
    ChainKernel,
    EncodeTask,
    Status,
    Workspace,
    as_bytes_view,
    status_error,
    workspace,
)

from zarr_fused.errors import CorruptChunkError

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL

# NumPy's StringDType C API (NumPy >= 2.0, as zarr's ``str`` data type needs)
cdef extern from *:
    """
    #define NPY_TARGET_VERSION NPY_2_0_API_VERSION
    #include <numpy/arrayobject.h>
    """
    ctypedef struct npy_packed_static_string:
        pass
    ctypedef struct npy_static_string:
        size_t size
        const char* buf
    ctypedef struct npy_string_allocator:
        pass
    ctypedef struct PyArray_StringDTypeObject:
        pass
    int _import_array() except -1
    npy_string_allocator* NpyString_acquire_allocator(
        const PyArray_StringDTypeObject* descr) nogil
    void NpyString_release_allocator(npy_string_allocator* allocator) nogil
    int NpyString_pack(npy_string_allocator* allocator, npy_packed_static_string* packed,
                       const char* buf, size_t size) nogil
    int NpyString_load(npy_string_allocator* allocator, const npy_packed_static_string* packed,
                       npy_static_string* unpacked) nogil

_import_array()

# after the block above: NumPy's declarations (also the shard index's)
# include NumPy's headers, which must see NPY_TARGET_VERSION first (the
# StringDType API)
cimport numpy as cnp

from zarr_fused._shard_index cimport (
    CHUNK_MISSING,
    CHUNK_OUTSIDE,
    ChunkPlace,
    chunk_place,
    outside_error,
)


cdef enum VlenStatus:
    # beyond the codec kernel's StatusCode values
    VLEN_SHORT_HEADER = 100
    VLEN_TRUNCATED = 101
    VLEN_COUNT = 102
    VLEN_TOO_LARGE = 103
    VLEN_NOT_UTF8 = 104
    VLEN_NULL = 105
    VLEN_OUTSIDE = 106

cdef Py_ssize_t HEADER = 4
# where an empty item points (memcpy takes no NULL, even for 0 bytes)
cdef const char* _EMPTY = ""
cdef uint32_t MAX_ITEM = 0xFFFFFFFF
# more than zstd (an RLE block: 4 bytes for 128 KiB), deflate (1032:1) or
# blosc can expand a payload to
cdef Py_ssize_t MAX_RATIO = 65536
# the most times a decode resizes its output to the size the stream reveals
cdef int MAX_ATTEMPTS = 48

_VLEN_ERRORS = {
    VLEN_SHORT_HEADER: "{where}: corrupt vlen frame: {a} bytes cannot hold its 4-byte item count",
    VLEN_TRUNCATED: "{where}: corrupt vlen frame: item {a} runs past the frame's end",
    VLEN_COUNT: "{where}: corrupt vlen frame: it holds {a} items, the chunk has {b}",
    VLEN_TOO_LARGE: "{where}: item {a} is {b} bytes, over the vlen frame's 4 GiB limit",
    VLEN_NULL: "{where}: item {a} is a missing string, which the vlen frame cannot store",
}


cdef object _error(Status* st, object where):
    if st.code in _VLEN_ERRORS:
        return CorruptChunkError(_VLEN_ERRORS[st.code].format(where=where, a=st.a, b=st.b))
    return status_error(st, where)


cdef Py_ssize_t _size_hint(ChainKernel k, const uint8_t* src, Py_ssize_t n) noexcept nogil:
    """A first guess of the decoded size (without inner checksums): what the
    compressed frame's header or trailer says, else a multiple of ``n``. A
    wrong guess only costs a second decode (`_decode_frame`)."""
    cdef Py_ssize_t body = n - 4 * k.outer_crcs
    cdef unsigned long long claim
    if body < 0:
        return 0
    if k.compressor == COMP_NONE:
        return body
    if k.compressor == COMP_ZSTD and body >= 4:
        claim = zs.ZSTD_getFrameContentSize(src, <size_t>body)
        if claim != zs.ZSTD_CONTENTSIZE_UNKNOWN and claim != zs.ZSTD_CONTENTSIZE_ERROR:
            if claim < <unsigned long long>(1) << 40:
                return <Py_ssize_t>claim - 4 * k.inner_crcs
    elif k.compressor == COMP_BLOSC and body >= 16:
        return <Py_ssize_t>load_le32(src + 4) - 4 * k.inner_crcs
    elif k.compressor == COMP_GZIP and body >= 18:
        # ISIZE, the last member's size modulo 2**32: exact for what
        # numcodecs and zarr_fused write (one member)
        return <Py_ssize_t>load_le32(src + body - 4) - 4 * k.inner_crcs
    return 4 * body + 64


cdef int _decode_frame(ChainKernel k, Workspace ws, const uint8_t* src, Py_ssize_t n,
                       const uint8_t** out, Py_ssize_t* out_len, Status* st) noexcept nogil:
    """Undo the chain's bytes->bytes codecs of a payload whose decoded size
    is not known in advance. The kernel insists on an exact size, and says
    what the stream holds when it differs: the size it decoded to (smaller),
    a frame's size claim, or "more"; each answer sets the next attempt's size."""
    cdef Py_ssize_t cap = _size_hint(k, src, n)
    cdef Py_ssize_t bound = n * MAX_RATIO + (1 << 20)
    cdef int _attempt
    if cap < 0:
        cap = 0
    for _attempt in range(MAX_ATTEMPTS):
        if cap > bound:
            # more than any codec here can expand to: a size claim that lies,
            # refused before it becomes an allocation
            if st.code == ZF_OK:
                st.code = ZF_ERR_CLAIM
                st.a = cap
                st.b = bound
            return -1
        memset(st, 0, sizeof(Status))
        if k.decode_payload(ws, src, n, cap, NULL, out, st) == 0:
            out_len[0] = cap
            return 0
        if st.code == ZF_ERR_SIZE and 0 <= st.a < cap:
            cap = st.a
        elif st.code == ZF_ERR_CLAIM and st.a - 4 * k.inner_crcs >= 0 and (
            st.a - 4 * k.inner_crcs != cap
        ):
            cap = st.a - 4 * k.inner_crcs
        elif st.code == ZF_ERR_MORE:
            cap = 2 * cap + 4096
        else:
            return -1
    return -1


cdef int _parse(const uint8_t* data, Py_ssize_t n, Py_ssize_t count, Py_ssize_t* starts,
                Status* st) noexcept nogil:
    """Check the frame ``data[:n]`` holds ``count`` items, each within the
    frame, and record where each item's length field is."""
    cdef Py_ssize_t pos = HEADER
    cdef Py_ssize_t i, length
    cdef uint32_t items
    if n < HEADER:
        st.code = VLEN_SHORT_HEADER
        st.a = n
        return -1
    items = load_le32(data)
    if <Py_ssize_t>items != count:
        st.code = VLEN_COUNT
        st.a = items
        st.b = count
        return -1
    for i in range(count):
        if n - pos < 4:
            st.code = VLEN_TRUNCATED
            st.a = i
            return -1
        length = <Py_ssize_t>load_le32(data + pos)
        if n - pos - 4 < length:
            st.code = VLEN_TRUNCATED
            st.a = i
            return -1
        starts[i] = pos
        pos += 4 + length
    return 0


cdef Py_ssize_t* _new_starts(Py_ssize_t count) except NULL:
    """Room for where each of ``count`` items starts (the caller frees it)."""
    cdef Py_ssize_t* starts = <Py_ssize_t*>malloc(<size_t>(count if count else 1)
                                                  * sizeof(Py_ssize_t))
    if starts == NULL:
        raise MemoryError()
    return starts


cdef int _open_frame(ChainKernel k, Workspace ws, const uint8_t[::1] src, Py_ssize_t count,
                     const uint8_t** data, Py_ssize_t* length, Py_ssize_t* starts,
                     Status* st) noexcept nogil:
    """A stored chunk's frame (`_decode_frame`) with its ``count`` items
    found (`_parse`); ``st`` cleared first."""
    cdef int rc
    cdef Py_ssize_t n = src.shape[0]
    memset(st, 0, sizeof(Status))
    rc = _decode_frame(k, ws, &src[0] if n else <const uint8_t*>b"", n, data, length, st)
    if rc == 0:
        rc = _parse(data[0], length[0], count, starts, st)
    return rc


cdef object _undecodable(object exc, Py_ssize_t item, object where):
    return CorruptChunkError(f"{where}: item {item} of the vlen-utf8 frame is not UTF-8 ({exc})")


cdef int _fill_objects(const uint8_t* data, const Py_ssize_t* starts, Py_ssize_t count,
                       bint utf8, PyObject** slots, object where,
                       Py_ssize_t first=0) except -1:
    """Make the items' objects and put them into ``slots`` (an object array
    of ``count`` items, which holds references to be replaced); errors name
    the items from ``first`` on."""
    cdef Py_ssize_t i, length
    cdef const char* p
    cdef object value
    cdef PyObject* old
    for i in range(count):
        p = <const char*>data + starts[i]
        length = <Py_ssize_t>load_le32(<const uint8_t*>p)
        if utf8:
            try:
                value = PyUnicode_DecodeUTF8(p + 4, length, NULL)
            except UnicodeDecodeError as exc:
                raise _undecodable(exc, first + i, where) from exc
        else:
            value = PyBytes_FromStringAndSize(p + 4, length)
        Py_INCREF(value)
        old = slots[i]
        slots[i] = <PyObject*>value
        Py_XDECREF(old)
    return 0


cdef int _raise_undecodable(const uint8_t* data, const Py_ssize_t* starts, Py_ssize_t item,
                            object where) except -1:
    """Raise the error of ``item``, found not to be UTF-8: Python's decoder
    names the bad byte as zarr's error would."""
    scratch = np.empty(1, dtype=object)  # held: the decoder writes into it
    _fill_objects(data, starts + item, 1, True, <PyObject**><Py_ssize_t>scratch.ctypes.data,
                  where, item)
    raise CorruptChunkError(f"{where}: item {item} of the vlen-utf8 frame is not UTF-8")


def decode(ChainKernel kernel, payload, Py_ssize_t count, bint utf8, where="payload", out=None):
    """Decode a stored vlen chunk of ``count`` items.

    Parameters
    ----------
    kernel : ChainKernel
        The bytes->bytes codecs after the vlen codec (``itemsize`` 1).
    payload : bytes-like
        The stored chunk.
    count : int
        The chunk's number of items; the frame must hold exactly that many.
    utf8 : bool
        Items are ``str`` (UTF-8) when true, ``bytes`` otherwise.
    where : object
        Names the chunk in errors (its key).
    out : numpy.ndarray, optional
        An object array of at least ``count`` items (C-contiguous) that
        receives the items; a new one when omitted.

    Returns
    -------
    numpy.ndarray
        ``count`` objects, a view of ``out`` when given.
    """
    cdef const uint8_t[::1] src = as_bytes_view(payload)
    cdef Workspace ws = workspace()
    cdef const uint8_t* data = NULL
    cdef Py_ssize_t length = 0
    cdef Py_ssize_t* starts
    cdef Status st
    cdef int rc
    if count < 0:
        raise ValueError("count must be >= 0")
    result = _output(out, count)
    starts = _new_starts(count)
    try:
        with nogil:
            rc = _open_frame(kernel, ws, src, count, &data, &length, starts, &st)
        if rc < 0:
            raise _error(&st, where)
        # ``data`` is in this thread's workspace or in ``payload``: both
        # stay as they are until this thread decodes again
        _fill_objects(data, starts, count, utf8, <PyObject**><Py_ssize_t>result.ctypes.data,
                      where)
    finally:
        free(starts)
    return result


cdef object _output(object out, Py_ssize_t count):
    if out is None:
        return np.empty(count, dtype=object)
    if type(out) is not np.ndarray or out.dtype != object:
        raise TypeError("out must be a NumPy object array")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    flat = out.reshape(-1)
    if flat.shape[0] < count:
        raise ValueError(f"out holds {flat.shape[0]} items, {count} needed")
    return flat[:count]


cdef int _item_arrays(Py_ssize_t count, const char*** ptrs, Py_ssize_t** lengths) except -1:
    """Room for the pointers to and the lengths of ``count`` items to frame
    (the caller frees both), after checking a frame can hold that many."""
    cdef size_t n = <size_t>(count if count else 1)
    if <size_t>count > MAX_ITEM:
        raise ValueError(f"{count} items are over the vlen frame's limit")
    ptrs[0] = <const char**>malloc(n * sizeof(char*))
    lengths[0] = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    if ptrs[0] == NULL or lengths[0] == NULL:
        free(ptrs[0])
        free(lengths[0])
        ptrs[0] = NULL
        lengths[0] = NULL
        raise MemoryError()
    return 0


cdef Py_ssize_t _gather(object values, bint utf8, const char** ptrs,
                        Py_ssize_t* lengths) except -1:
    """Each item's bytes (pointers into the objects, which ``values`` keeps
    alive) and the frame's total size. None and 0 are empty items, as
    numcodecs treats them."""
    cdef Py_ssize_t i, length
    cdef Py_ssize_t total = HEADER
    cdef Py_ssize_t count = values.shape[0]
    cdef PyObject** items = <PyObject**><Py_ssize_t>values.ctypes.data
    cdef object item
    for i in range(count):
        item = <object>items[i]
        if utf8 and PyUnicode_Check(item):
            ptrs[i] = PyUnicode_AsUTF8AndSize(item, &length)
        elif not utf8 and PyBytes_Check(item):
            ptrs[i] = PyBytes_AS_STRING(item)
            length = PyBytes_GET_SIZE(item)
        elif item is None or item == 0:
            ptrs[i] = _EMPTY
            length = 0
        elif utf8:
            raise TypeError(f"expected unicode string, found {item!r}")
        else:
            raise TypeError(f"expected byte string, found {item!r}")
        if <size_t>length > MAX_ITEM:
            raise CorruptChunkError(
                f"item {i} is {length} bytes, over the vlen frame's 4 GiB limit"
            )
        lengths[i] = length
        total += 4 + length
    return total


cdef void _build(uint8_t* frame, Py_ssize_t count, const char** ptrs,
                 const Py_ssize_t* lengths) noexcept nogil:
    cdef Py_ssize_t i
    cdef uint8_t* p = frame + HEADER
    store_le32(frame, <uint32_t>count)
    for i in range(count):
        store_le32(p, <uint32_t>lengths[i])
        memcpy(p + 4, ptrs[i], <size_t>lengths[i])
        p += 4 + lengths[i]


cdef uint8_t* _framed(Py_ssize_t count, const char** ptrs, const Py_ssize_t* lengths,
                      Py_ssize_t total, Status* st) noexcept nogil:
    """A new frame of ``total`` bytes (freed by the caller), or NULL."""
    cdef uint8_t* frame = <uint8_t*>malloc(<size_t>total)
    if frame == NULL:
        st.code = ZF_ERR_NOMEM
        return NULL
    _build(frame, count, ptrs, lengths)
    return frame


cdef void _compress(ChainKernel kernel, Workspace ws, const uint8_t* frame, Py_ssize_t total,
                    uint8_t* dst, Py_ssize_t cap, EncodeTask* t) noexcept nogil:
    """Run the chain's bytes->bytes codecs over ``frame`` into ``dst``."""
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]
    shape[0] = total
    strides[0] = 1
    t.src = <const char*>frame
    t.shape = shape
    t.src_strides = strides
    t.ndim = 1
    t.nbytes = total
    t.contiguous = True
    t.dst = dst
    t.dst_cap = cap
    kernel.run_encode(ws, t, NULL)


def encode(ChainKernel kernel, values, bint utf8, where="chunk"):
    """Encode a chunk's items (a flat object array, in stored order).

    Parameters
    ----------
    kernel : ChainKernel
        The bytes->bytes codecs after the vlen codec (``itemsize`` 1).
    values : numpy.ndarray
        One-dimensional, C-contiguous, of objects: ``str`` (``utf8``) or
        ``bytes``; None and 0 store empty items, as numcodecs stores them.
    utf8 : bool
        Whether the items are strings.
    where : object
        Names the chunk in errors.

    Returns
    -------
    numpy.ndarray
        The stored bytes, uint8.
    """
    cdef Py_ssize_t count, total
    cdef const char** ptrs
    cdef Py_ssize_t* lengths
    cdef uint8_t* frame = NULL
    cdef EncodeTask t
    cdef Workspace ws = workspace()
    cdef uint8_t[::1] dst
    if type(values) is not np.ndarray or values.dtype != object or values.ndim != 1:
        raise TypeError("values must be a one-dimensional NumPy object array")
    if not values.flags.c_contiguous:
        raise ValueError("values must be C-contiguous")
    count = values.shape[0]
    _item_arrays(count, &ptrs, &lengths)
    memset(&t, 0, sizeof(EncodeTask))
    try:
        total = _gather(values, utf8, ptrs, lengths)
        out = np.empty(kernel.encode_bound(total), dtype=np.uint8)
        dst = out
        with nogil:
            frame = _framed(count, ptrs, lengths, total, &t.status)
            if frame != NULL:
                _compress(kernel, ws, frame, total, &dst[0], dst.shape[0], &t)
                free(frame)
        if t.status.code != ZF_OK:
            raise _error(&t.status, where)
    finally:
        free(ptrs)
        free(lengths)
    return out[:t.out_len].copy()


# -- NumPy StringDType arrays: no Python object per item -----------------------------


cdef inline bint _cont(uint8_t c) noexcept nogil:
    return (c & 0xC0) == 0x80


cdef Py_ssize_t _utf8_error(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """-1 when ``s[:n]`` is UTF-8 as Python's strict decoder accepts it (no
    overlong forms, no encoded surrogates, nothing past U+10FFFF), else the
    offset of the first byte it refuses."""
    cdef Py_ssize_t i = 0
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return i
        if c < 0xE0:
            if n - i < 2 or not _cont(s[i + 1]):
                return i
            i += 2
            continue
        c1 = s[i + 1] if n - i > 1 else 0
        if c < 0xF0:
            if n - i < 3 or not _cont(c1) or not _cont(s[i + 2]):
                return i
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 > 0x9F):
                return i
            i += 3
            continue
        if n - i < 4 or not _cont(c1) or not _cont(s[i + 2]) or not _cont(s[i + 3]):
            return i
        if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 > 0x8F):
            return i
        i += 4
    return -1


cdef int _check_utf8(const uint8_t* data, const Py_ssize_t* starts, Py_ssize_t count,
                     Status* st) noexcept nogil:
    """Check each item is UTF-8 (before the allocator is held: an output
    array's allocator is shared by every chunk decoded into it)."""
    cdef Py_ssize_t i
    cdef const uint8_t* p
    for i in range(count):
        p = data + starts[i]
        if _utf8_error(p + 4, <Py_ssize_t>load_le32(p)) >= 0:
            st.code = VLEN_NOT_UTF8
            st.a = i
            return -1
    return 0


cdef int _pack(const uint8_t* data, const Py_ssize_t* starts, Py_ssize_t count,
               char* dst, Py_ssize_t stride, npy_string_allocator* allocator,
               Status* st) noexcept nogil:
    """Pack each item into the StringDType element at ``dst + i * stride``."""
    cdef Py_ssize_t i
    cdef const uint8_t* p
    for i in range(count):
        p = data + starts[i]
        if NpyString_pack(allocator, <npy_packed_static_string*>(dst + i * stride),
                          <const char*>p + 4, <size_t>load_le32(p)) < 0:
            st.code = ZF_ERR_NOMEM
            return -1
    return 0


cdef object _string_array(object array, Py_ssize_t count):
    """``array`` as a C-contiguous one-dimensional StringDType array of at
    least ``count`` items, or a TypeError / ValueError."""
    if type(array) is not np.ndarray or array.dtype.kind != "T":
        raise TypeError("expected a NumPy StringDType array")
    if hasattr(array.dtype, "na_object"):
        raise TypeError("StringDType with a missing-value object is not stored in vlen frames")
    if not array.flags.c_contiguous:
        raise ValueError("the StringDType array must be C-contiguous")
    flat = array.reshape(-1)
    if flat.shape[0] < count:
        raise ValueError(f"out holds {flat.shape[0]} items, {count} needed")
    return flat


def decode_strings(ChainKernel kernel, payload, out, where="payload"):
    """Decode a stored vlen-utf8 chunk into ``out``, a NumPy StringDType
    array (C-contiguous; a new one, or a view of the caller's output) whose
    size is the chunk's item count, with the GIL released throughout.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    cdef const uint8_t[::1] src = as_bytes_view(payload)
    cdef Workspace ws = workspace()
    cdef const uint8_t* data = NULL
    cdef Py_ssize_t length = 0
    cdef Py_ssize_t count = out.size
    cdef Py_ssize_t* starts
    cdef Status st
    cdef int rc
    cdef npy_string_allocator* allocator
    flat = _string_array(out, count)
    cdef char* dst = <char*><Py_ssize_t>flat.ctypes.data
    cdef Py_ssize_t stride = flat.dtype.itemsize
    cdef PyArray_StringDTypeObject* descr = <PyArray_StringDTypeObject*>flat.dtype
    if not flat.flags.writeable:
        raise ValueError("out must be writeable")
    starts = _new_starts(count)
    try:
        with nogil:
            rc = _open_frame(kernel, ws, src, count, &data, &length, starts, &st)
            if rc == 0:
                rc = _check_utf8(data, starts, count, &st)
            if rc == 0:
                allocator = NpyString_acquire_allocator(descr)
                rc = _pack(data, starts, count, dst, stride, allocator, &st)
                NpyString_release_allocator(allocator)
        if rc < 0 and st.code == VLEN_NOT_UTF8:
            _raise_undecodable(data, starts, st.a, where)
        if rc < 0:
            raise _error(&st, where)
    finally:
        free(starts)
    return out


cdef int _load_strings(const char* src, Py_ssize_t stride, Py_ssize_t count,
                       npy_string_allocator* allocator, const char** ptrs,
                       Py_ssize_t* lengths, Py_ssize_t* total, Status* st) noexcept nogil:
    cdef Py_ssize_t i
    cdef npy_static_string item
    cdef int rc
    total[0] = HEADER
    for i in range(count):
        rc = NpyString_load(allocator, <const npy_packed_static_string*>(src + i * stride), &item)
        if rc != 0:
            st.code = <int>VLEN_NULL if rc == 1 else <int>ZF_ERR_NOMEM
            st.a = i
            return -1
        if item.size > MAX_ITEM:
            st.code = VLEN_TOO_LARGE
            st.a = i
            st.b = <Py_ssize_t>item.size
            return -1
        ptrs[i] = item.buf if item.size else _EMPTY
        lengths[i] = <Py_ssize_t>item.size
        total[0] += 4 + lengths[i]
    return 0


def encode_strings(ChainKernel kernel, values, where="chunk"):
    """Encode a chunk's strings from a one-dimensional C-contiguous NumPy
    StringDType array (in stored order), with the GIL released throughout.

    Returns
    -------
    numpy.ndarray
        The stored bytes, uint8.
    """
    cdef Py_ssize_t count = values.size
    cdef Py_ssize_t total = 0
    cdef const char** ptrs
    cdef Py_ssize_t* lengths
    cdef uint8_t* frame = NULL
    cdef uint8_t* encoded = NULL
    cdef EncodeTask t
    cdef Workspace ws = workspace()
    cdef npy_string_allocator* allocator
    cdef int rc
    flat = _string_array(values, count)
    cdef const char* src = <const char*><Py_ssize_t>flat.ctypes.data
    cdef Py_ssize_t stride = flat.dtype.itemsize
    cdef PyArray_StringDTypeObject* descr = <PyArray_StringDTypeObject*>flat.dtype
    _item_arrays(count, &ptrs, &lengths)
    memset(&t, 0, sizeof(EncodeTask))
    try:
        with nogil:
            # the loaded pointers are valid while the allocator is held; the
            # compression, the bulk of the work, runs after it is released
            allocator = NpyString_acquire_allocator(descr)
            rc = _load_strings(src, stride, count, allocator, ptrs, lengths, &total, &t.status)
            if rc == 0:
                frame = _framed(count, ptrs, lengths, total, &t.status)
            NpyString_release_allocator(allocator)
            if frame != NULL:
                encoded = <uint8_t*>malloc(<size_t>kernel.encode_bound(total))
                if encoded == NULL:
                    t.status.code = ZF_ERR_NOMEM
                else:
                    _compress(kernel, ws, frame, total, encoded, kernel.encode_bound(total), &t)
                free(frame)
        if t.status.code != ZF_OK:
            raise _error(&t.status, where)
        out = np.empty(t.out_len, dtype=np.uint8)
        if t.out_len:
            memcpy(<void*><Py_ssize_t>out.ctypes.data, encoded, <size_t>t.out_len)
        return out
    finally:
        free(encoded)
        free(ptrs)
        free(lengths)


# -- a shard's selected inner chunks in one call -------------------------------------
#
# A sharded read selects a box (slices with steps, integers) of each shard,
# which zarr's indexer splits per dimension into rows: one per inner chunk
# along that dimension, saying which of its items the box takes and where
# they go along the output's axis. The inner chunks to decode are the
# product of the dimensions' rows ("tasks", in C order). `VlenRegion` checks
# the rows against the inner chunks and the output once, then decodes any
# run of tasks: each frame decompressed and parsed with the GIL released,
# then only its selected items placed into the output (NpyString_pack for a
# StringDType output, without the GIL; objects in one loop with it).


cdef enum:
    # NumPy's most dimensions
    MAX_DIMS = 64
    # a row: inner chunk index along the dimension, first item, step, items,
    # first index along the output's axis
    ROW = 5


cdef struct Geometry:
    int ndim
    Py_ssize_t items  # of an inner chunk
    const Py_ssize_t* rows  # ROW numbers per row, the dimensions' rows in turn
    const uint8_t* payload  # the fetched inner chunks
    Py_ssize_t payload_len
    const uint64_t* entries  # where each inner chunk is in ``payload``
    char* base  # the output's element [0, ..., 0]
    Py_ssize_t row0[MAX_DIMS]  # each dimension's first row
    Py_ssize_t nrows[MAX_DIMS]
    Py_ssize_t item_strides[MAX_DIMS]  # an inner chunk's C-order strides, in items
    Py_ssize_t out_strides[MAX_DIMS]  # in bytes along the output; 0 for integers
    Py_ssize_t grid_strides[MAX_DIMS]  # the shard's C-order strides, in inner chunks


cdef Py_ssize_t _select(const Geometry* g, Py_ssize_t task, Py_ssize_t* items,
                        Py_ssize_t* dsts, Py_ssize_t* lin) noexcept nogil:
    """The inner chunk of ``task`` (``lin``: its linear index in the shard)
    and its selected items in C order: each one's place in the frame
    (``items``) and its byte offset in the output (``dsts``); returns how
    many."""
    cdef Py_ssize_t counter[MAX_DIMS]
    cdef Py_ssize_t counts[MAX_DIMS]
    cdef Py_ssize_t steps[MAX_DIMS]
    cdef Py_ssize_t rest = task
    cdef Py_ssize_t src = 0
    cdef Py_ssize_t dst = 0
    cdef Py_ssize_t m = 1
    cdef Py_ssize_t j
    cdef const Py_ssize_t* row
    cdef int d
    lin[0] = 0
    for d in range(g.ndim - 1, -1, -1):
        row = g.rows + ROW * (g.row0[d] + rest % g.nrows[d])
        rest = rest // g.nrows[d]
        lin[0] += row[0] * g.grid_strides[d]
        src += row[1] * g.item_strides[d]
        steps[d] = row[2] * g.item_strides[d]
        counts[d] = row[3]
        dst += row[4] * g.out_strides[d]
        counter[d] = 0
        m *= row[3]
    for j in range(m):
        items[j] = src
        dsts[j] = dst
        d = g.ndim - 1
        while d >= 0:
            counter[d] += 1
            src += steps[d]
            dst += g.out_strides[d]
            if counter[d] < counts[d]:
                break
            src -= counts[d] * steps[d]
            dst -= counts[d] * g.out_strides[d]
            counter[d] = 0
            d -= 1
    return m


cdef int _open_chunk(const Geometry* g, ChainKernel k, Workspace ws, Py_ssize_t lin,
                     bint utf8, const uint8_t** data, Py_ssize_t* starts,
                     Status* st) noexcept nogil:
    """Inner chunk ``lin``'s frame decoded and parsed (0; its strings checked
    when ``utf8``: zarr decodes every item, selected or not), CHUNK_MISSING
    when it is not stored, or -1 (``st``; VLEN_OUTSIDE: its index entry
    points past the fetched bytes)."""
    cdef uint64_t off, size
    cdef Py_ssize_t length = 0
    cdef ChunkPlace place = chunk_place(g.entries, lin, g.payload_len, &off, &size)
    cdef int rc
    memset(st, 0, sizeof(Status))
    if place == CHUNK_MISSING:
        return CHUNK_MISSING
    if place == CHUNK_OUTSIDE:
        st.code = VLEN_OUTSIDE
        return -1
    rc = _decode_frame(k, ws, g.payload + off if size else <const uint8_t*>b"",
                       <Py_ssize_t>size, data, &length, st)
    if rc == 0:
        rc = _parse(data[0], length, g.items, starts, st)
    if rc == 0 and utf8:
        rc = _check_utf8(data[0], starts, g.items, st)
    return rc


cdef int _pack_selected(const uint8_t* data, const Py_ssize_t* starts, const Py_ssize_t* items,
                        const Py_ssize_t* dsts, Py_ssize_t m, char* base,
                        npy_string_allocator* allocator, Status* st) noexcept nogil:
    """Pack the selected items into their StringDType elements."""
    cdef Py_ssize_t j
    cdef const uint8_t* p
    for j in range(m):
        p = data + starts[items[j]]
        if NpyString_pack(allocator, <npy_packed_static_string*>(base + dsts[j]),
                          <const char*>p + 4, <size_t>load_le32(p)) < 0:
            st.code = ZF_ERR_NOMEM
            return -1
    return 0


cdef int _pack_fill(const char* fill, size_t n, const Py_ssize_t* dsts, Py_ssize_t m,
                    char* base, npy_string_allocator* allocator, Status* st) noexcept nogil:
    """Pack the fill value (``n`` bytes of UTF-8) into StringDType elements."""
    cdef Py_ssize_t j
    for j in range(m):
        if NpyString_pack(allocator, <npy_packed_static_string*>(base + dsts[j]), fill, n) < 0:
            st.code = ZF_ERR_NOMEM
            return -1
    return 0


cdef int _set_objects(const uint8_t* data, const Py_ssize_t* starts, const Py_ssize_t* items,
                      const Py_ssize_t* dsts, Py_ssize_t m, bint utf8, char* base,
                      object fill) except -1:
    """Make the selected items' objects (``data`` NULL: ``fill``) and put
    them into their slots of an object output."""
    cdef Py_ssize_t j, length
    cdef const uint8_t* p
    cdef object value = fill
    cdef PyObject* old
    cdef PyObject** slot
    for j in range(m):
        if data != NULL:
            p = data + starts[items[j]]
            length = <Py_ssize_t>load_le32(p)
            if utf8:
                value = PyUnicode_DecodeUTF8(<const char*>p + 4, length, NULL)
            else:
                value = PyBytes_FromStringAndSize(<const char*>p + 4, length)
        slot = <PyObject**>(base + dsts[j])
        Py_INCREF(value)
        old = slot[0]
        slot[0] = <PyObject*>value
        Py_XDECREF(old)
    return 0


cdef int _check_row(const Py_ssize_t* row, Py_ssize_t inner, Py_ssize_t chunks,
                    Py_ssize_t extent) except -1:
    """A row (see `Geometry`) within its dimension: an inner chunk of the
    ``chunks`` along it, items within its ``inner`` ones, places within the
    output axis's ``extent`` (1 for an integer's dimension)."""
    cdef Py_ssize_t ix = row[0], start = row[1], step = row[2], count = row[3], out = row[4]
    if not 0 <= ix < chunks or step < 1 or count < 1 or not 0 <= start < inner:
        raise ValueError(f"row {ix, start, step, count, out} is not a selection of one of "
                         f"{chunks} inner chunks")
    # (count - 1) * step < inner - start, without overflow
    if (count - 1) > (inner - 1 - start) // step or out < 0 or count > extent - out:
        raise ValueError(f"row {ix, start, step, count, out} selects past the inner chunk "
                         f"({inner}) or the output ({extent})")
    return 0


cdef class VlenRegion:
    """The selected items of a shard's inner chunks, decoded into an output.

    Parameters
    ----------
    kernel : ChainKernel
        The inner chunks' bytes->bytes codecs (``itemsize`` 1).
    payload : bytes-like
        The fetched inner chunks.
    entries : numpy.ndarray
        ``(n, 2)`` uint64: each inner chunk's offset in ``payload`` and
        size, both 2**64-1 when it is not stored (the shard index).
    rows : numpy.ndarray
        ``(r, 5)`` intp: per dimension in turn, one row per inner chunk
        along it that the selection touches (inner chunk index, first item,
        step, items, first index along the output's axis).
    dim_rows : sequence of int
        How many rows each dimension has (at least one).
    out_axes : sequence of int
        Each dimension's axis of ``out``; -1 for a dimension an integer
        selects (its rows take one item each, at output index 0).
    inner_shape, grid : sequence of int
        An inner chunk's shape, the shard's inner chunks per dimension.
    out : numpy.ndarray
        Writeable: of objects (``bytes``, or ``str`` when ``utf8``), or a
        StringDType without a missing-value object (``utf8``); any strides.
    utf8 : bool
        Whether the items are strings.
    fill : object
        What a missing inner chunk's items become: an object, or a ``str``
        for a StringDType output.
    key, describe : object
        ``describe((key, lin))`` names inner chunk ``lin`` in errors; ``key``
        names the shard.
    order : {"C", "F"}
        The order the frames list an inner chunk's items in.
    """

    cdef Geometry g
    cdef ChainKernel kernel
    cdef bint utf8
    cdef bint strings
    cdef object out
    cdef object fill
    cdef bytes fill_utf8
    cdef object key
    cdef object describe
    cdef object _rows
    cdef object _entries
    cdef const uint8_t[::1] _payload
    cdef PyArray_StringDTypeObject* descr
    cdef readonly Py_ssize_t n_tasks

    def __init__(self, ChainKernel kernel, payload, entries, rows, dim_rows, out_axes,
                 inner_shape, grid, out, bint utf8, fill, key, describe, *, order="C"):
        ndim = len(inner_shape)
        if not 1 <= ndim <= MAX_DIMS or not len(grid) == len(dim_rows) == len(out_axes) == ndim:
            raise ValueError("inner_shape, grid, dim_rows and out_axes must each give "
                             f"1 to {<int>MAX_DIMS} dimensions alike")
        self._set_output(out, utf8, fill)
        self.kernel = kernel
        self.key = key
        self.describe = describe
        cdef cnp.ndarray table = np.ascontiguousarray(entries, dtype=np.uint64)
        if table.ndim != 2 or table.shape[0] != math.prod(grid) or table.shape[1] != 2:
            raise ValueError(f"entries must be ({math.prod(grid)}, 2)")
        self._entries = table
        self.g.entries = <const uint64_t*>cnp.PyArray_DATA(table)
        table = np.ascontiguousarray(rows, dtype=np.intp)
        if table.ndim != 2 or table.shape[0] != sum(dim_rows) or table.shape[1] != ROW:
            raise ValueError(f"rows must be ({sum(dim_rows)}, {<int>ROW})")
        self._rows = table
        self.g.rows = <const Py_ssize_t*>cnp.PyArray_DATA(table)
        self._payload = as_bytes_view(payload)
        self.g.ndim = ndim
        self.g.payload = &self._payload[0] if self._payload.shape[0] else NULL
        self.g.payload_len = self._payload.shape[0]
        self._set_strides(inner_shape, grid, order == "F")
        self.n_tasks = self._set_rows(dim_rows, out_axes, inner_shape, grid)

    cdef int _set_output(self, out, bint utf8, fill) except -1:
        if type(out) is not np.ndarray:
            raise TypeError("out must be a NumPy array")
        cdef cnp.ndarray array = out
        if not cnp.PyArray_ISWRITEABLE(array) or not cnp.PyArray_ISALIGNED(array):
            raise ValueError("out must be writeable and aligned")
        if array.dtype == object:
            self.strings = False
        elif utf8 and array.dtype.kind == "T" and not hasattr(array.dtype, "na_object"):
            self.strings = True
            self.descr = <PyArray_StringDTypeObject*>array.dtype
            self.fill_utf8 = fill.encode("utf-8")
        else:
            raise TypeError("out must be an object array or (strings) a StringDType array")
        self.out = array
        self.utf8 = utf8
        self.fill = fill
        self.g.base = <char*>cnp.PyArray_DATA(array)
        return 0

    cdef int _set_strides(self, inner_shape, grid, bint f_order) except -1:
        cdef int d, e
        items = 1
        chunks = 1
        for d in range(self.g.ndim - 1, -1, -1):
            if inner_shape[d] < 1 or grid[d] < 1:
                raise ValueError("inner_shape and grid must be positive")
            self.g.grid_strides[d] = chunks
            chunks *= int(grid[d])
        for e in range(self.g.ndim):
            # the frame lists an inner chunk's items in C order, or in F order
            # (a format-2 array's memory order)
            d = e if f_order else self.g.ndim - 1 - e
            self.g.item_strides[d] = items
            items *= int(inner_shape[d])
        # room for three numbers per item (`decode`)
        if items > (1 << 62) // (3 * sizeof(Py_ssize_t)):
            raise ValueError(f"inner chunks of {items} items are too large")
        self.g.items = items
        return 0

    cdef Py_ssize_t _set_rows(self, dim_rows, out_axes, inner_shape, grid) except -1:
        """Check each dimension's rows; the number of tasks."""
        cdef Py_ssize_t tasks = 1
        cdef Py_ssize_t first = 0
        cdef Py_ssize_t total = self._rows.shape[0]
        cdef Py_ssize_t n, axis, extent, r
        cdef cnp.ndarray out = self.out
        cdef int d
        for d in range(self.g.ndim):
            n = dim_rows[d]
            axis = out_axes[d]
            if not 1 <= n <= total - first or not -1 <= axis < out.ndim:
                raise ValueError(f"dimension {d}: {n} rows, output axis {axis}")
            extent = 1 if axis < 0 else cnp.PyArray_DIMS(out)[axis]
            for r in range(first, first + n):
                _check_row(self.g.rows + ROW * r, inner_shape[d], grid[d], extent)
            self.g.row0[d] = first
            self.g.nrows[d] = n
            self.g.out_strides[d] = 0 if axis < 0 else cnp.PyArray_STRIDES(out)[axis]
            first += n
            if tasks > (1 << 62) // n:
                raise ValueError("too many inner chunks")
            tasks *= n
        return tasks

    def decode(self, Py_ssize_t first, Py_ssize_t last):
        """Decode tasks ``first`` to ``last`` (excluded; tasks are the touched
        inner chunks in C order) into the output. Threads may decode
        different tasks of one region at once."""
        cdef Workspace ws = workspace()
        cdef Py_ssize_t* buf
        if not 0 <= first <= last <= self.n_tasks:
            raise ValueError(f"tasks {first}..{last} of {self.n_tasks}")
        buf = <Py_ssize_t*>malloc(<size_t>(3 * self.g.items) * sizeof(Py_ssize_t))
        if buf == NULL:
            raise MemoryError()
        try:
            if self.strings:
                self._strings(ws, first, last, buf)
            else:
                self._objects(ws, first, last, buf)
        finally:
            free(buf)

    cdef int _strings(self, Workspace ws, Py_ssize_t first, Py_ssize_t last,
                      Py_ssize_t* buf) except -1:
        cdef const Geometry* g = &self.g
        cdef ChainKernel k = self.kernel
        cdef PyArray_StringDTypeObject* descr = self.descr
        cdef const char* fill = PyBytes_AS_STRING(self.fill_utf8)
        cdef size_t fill_len = <size_t>PyBytes_GET_SIZE(self.fill_utf8)
        cdef Py_ssize_t* items = buf + g.items
        cdef Py_ssize_t* dsts = buf + 2 * g.items
        cdef const uint8_t* data = NULL
        cdef npy_string_allocator* allocator
        cdef Py_ssize_t task, m
        cdef Py_ssize_t lin = 0
        cdef Status st
        cdef int rc = 0
        with nogil:
            for task in range(first, last):
                m = _select(g, task, items, dsts, &lin)
                rc = _open_chunk(g, k, ws, lin, True, &data, buf, &st)
                if rc < 0:
                    break
                allocator = NpyString_acquire_allocator(descr)
                if rc == CHUNK_MISSING:
                    rc = _pack_fill(fill, fill_len, dsts, m, g.base, allocator, &st)
                else:
                    rc = _pack_selected(data, buf, items, dsts, m, g.base, allocator, &st)
                NpyString_release_allocator(allocator)
                if rc < 0:
                    break
        if rc < 0:
            self._raise(&st, lin, data, buf)
        return 0

    cdef int _objects(self, Workspace ws, Py_ssize_t first, Py_ssize_t last,
                      Py_ssize_t* buf) except -1:
        cdef const Geometry* g = &self.g
        cdef ChainKernel k = self.kernel
        cdef bint utf8 = self.utf8
        cdef Py_ssize_t* items = buf + g.items
        cdef Py_ssize_t* dsts = buf + 2 * g.items
        cdef const uint8_t* data = NULL
        cdef Py_ssize_t task, m
        cdef Py_ssize_t lin = 0
        cdef Status st
        cdef int rc
        for task in range(first, last):
            with nogil:
                m = _select(g, task, items, dsts, &lin)
                rc = _open_chunk(g, k, ws, lin, utf8, &data, buf, &st)
            if rc < 0:
                self._raise(&st, lin, data, buf)
            if rc == CHUNK_MISSING:
                data = NULL
            # ``data`` is in this thread's workspace or in the payload: both
            # stay as they are until this thread decodes again
            _set_objects(data, buf, items, dsts, m, utf8, g.base, self.fill)
        return 0

    cdef int _raise(self, Status* st, Py_ssize_t lin, const uint8_t* data,
                    const Py_ssize_t* starts) except -1:
        """Raise the error ``st`` describes for inner chunk ``lin``."""
        cdef uint64_t off, size
        where = self.describe((self.key, lin))
        if st.code == VLEN_OUTSIDE:
            chunk_place(self.g.entries, lin, self.g.payload_len, &off, &size)
            raise outside_error(self.key, lin, off, size, self.g.payload_len)
        if st.code == VLEN_NOT_UTF8:
            _raise_undecodable(data, starts, st.a, where)
        raise _error(st, where)
