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
from libc.stdint cimport uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

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


cdef enum VlenStatus:
    # beyond the codec kernel's StatusCode values
    VLEN_SHORT_HEADER = 100
    VLEN_TRUNCATED = 101
    VLEN_COUNT = 102
    VLEN_TOO_LARGE = 103
    VLEN_NOT_UTF8 = 104
    VLEN_NULL = 105

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
            # Python's decoder names the bad byte as zarr's error would
            _fill_objects(data, starts + st.a, 1, True,
                          <PyObject**><Py_ssize_t>np.empty(1, object).ctypes.data, where, st.a)
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
