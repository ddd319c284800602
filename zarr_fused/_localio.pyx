# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""File IO of zarr's LocalStore in C, so it can run without the GIL.

Semantics follow ``zarr.storage.LocalStore`` exactly:

- a read of a key whose file does not exist, or whose path is a directory
  or runs through a file, is a missing key (``get_sync`` returns None);
  any other failure is an ``OSError``;
- a write goes to a temporary file next to the target, which then replaces
  the target with ``rename`` (``Path.replace``), so a reader never sees a
  half-written chunk and a failed write leaves the old one intact; on any
  error the temporary file is removed.

Parent directories are created by the caller (once per batch), not here.
"""

from libc.errno cimport EINTR, EISDIR, ENOENT, ENOTDIR, errno
from libc.stdio cimport snprintf
from libc.stdlib cimport free, realloc
from posix.fcntl cimport O_CLOEXEC, O_CREAT, O_EXCL, O_RDONLY, O_WRONLY, open
from posix.stat cimport S_ISDIR, fstat, struct_stat
from posix.unistd cimport close, getpid, read, unlink, write

import os

cdef extern from "stdio.h" nogil:
    int rename(const char* old, const char* new)

cdef extern from *:
    """
    #include <stdint.h>
    static uint64_t zf_tmp_counter = 0;
    static uint64_t zf_next_tmp_id(void) {
    #if defined(__GNUC__) || defined(__clang__)
        return __atomic_add_fetch(&zf_tmp_counter, 1, __ATOMIC_RELAXED);
    #else
        return ++zf_tmp_counter;
    #endif
    }
    """
    unsigned long long zf_next_tmp_id() nogil

# distinguishes temporary names of processes that share a pid namespace
# (containers) and of forked children, whose counters continue the parent's
cdef unsigned long long _salt = int.from_bytes(os.urandom(8), "little")

cdef enum:
    TMP_SUFFIX_MAX = 64


cdef int read_file(const char* path, unsigned char** buf, size_t* cap,
                   Py_ssize_t* length, int* err) noexcept nogil:
    """Read the whole file at ``path`` into ``*buf`` (grown as needed)."""
    cdef int fd
    cdef struct_stat st
    cdef Py_ssize_t size, done
    cdef Py_ssize_t got
    cdef unsigned char* grown
    while True:
        fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd >= 0 or errno != EINTR:
            break
    if fd < 0:
        if errno == ENOENT or errno == ENOTDIR or errno == EISDIR:
            return FILE_MISSING
        err[0] = errno
        return FILE_ERROR
    if fstat(fd, &st) != 0:
        err[0] = errno
        close(fd)
        return FILE_ERROR
    if S_ISDIR(st.st_mode):
        close(fd)
        return FILE_MISSING
    size = st.st_size
    # one byte more than the size, so growth while reading is noticed
    if <size_t>(size + 1) > cap[0]:
        grown = <unsigned char*>realloc(buf[0], <size_t>(size + 1))
        if grown == NULL:
            close(fd)
            err[0] = 12  # ENOMEM
            return FILE_ERROR
        buf[0] = grown
        cap[0] = <size_t>(size + 1)
    done = 0
    while True:
        if <size_t>done == cap[0]:
            grown = <unsigned char*>realloc(buf[0], cap[0] * 2)
            if grown == NULL:
                close(fd)
                err[0] = 12
                return FILE_ERROR
            buf[0] = grown
            cap[0] = cap[0] * 2
        got = read(fd, buf[0] + done, cap[0] - <size_t>done)
        if got < 0:
            if errno == EINTR:
                continue
            err[0] = errno
            close(fd)
            return FILE_ERROR
        if got == 0:
            break
        done += got
    close(fd)
    length[0] = done
    return FILE_OK


cdef int write_file_atomic(const char* path, const unsigned char* data, Py_ssize_t n,
                           int* err) noexcept nogil:
    """Write ``data`` to a temporary file, then rename it over ``path``."""
    cdef char tmp[4096 + TMP_SUFFIX_MAX]
    cdef int fd, written_ok
    cdef Py_ssize_t done = 0
    cdef Py_ssize_t put
    cdef int rc = snprintf(tmp, sizeof(tmp), "%s.%llx-%x-%llx.partial", path, _salt,
                           <unsigned int>getpid(), zf_next_tmp_id())
    if rc < 0 or <size_t>rc >= sizeof(tmp):
        err[0] = 36  # ENAMETOOLONG
        return FILE_ERROR
    while True:
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
        if fd >= 0 or errno != EINTR:
            break
    if fd < 0:
        err[0] = errno
        return FILE_ERROR
    while done < n:
        put = write(fd, data + done, <size_t>(n - done))
        if put < 0:
            if errno == EINTR:
                continue
            err[0] = errno
            close(fd)
            unlink(tmp)
            return FILE_ERROR
        done += put
    if close(fd) != 0:
        err[0] = errno
        unlink(tmp)
        return FILE_ERROR
    if rename(tmp, path) != 0:
        err[0] = errno
        unlink(tmp)
        return FILE_ERROR
    return FILE_OK


def read_whole(path):
    """Read a file like LocalStore does; None when it is missing (for tests)."""
    cdef bytes p = os.fsencode(path)
    cdef const char* cp = p
    cdef unsigned char* buf = NULL
    cdef size_t cap = 0
    cdef Py_ssize_t n = 0
    cdef int err = 0
    cdef int rc
    try:
        with nogil:
            rc = read_file(cp, &buf, &cap, &n, &err)
        if rc == FILE_MISSING:
            return None
        if rc == FILE_ERROR:
            raise OSError(err, os.strerror(err), path)
        return (<char*>buf)[:n] if n else b""
    finally:
        free(buf)


def write_whole(path, data):
    """Atomically write ``data`` to ``path`` like LocalStore does (for tests)."""
    cdef bytes p = os.fsencode(path)
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef const char* cp = p
    cdef int err = 0
    cdef int rc
    cdef Py_ssize_t n = view.shape[0]
    cdef const unsigned char* dp = &view[0] if n else <const unsigned char*>b""
    with nogil:
        rc = write_file_atomic(cp, dp, n, &err)
    if rc != FILE_OK:
        raise OSError(err, os.strerror(err), path)
