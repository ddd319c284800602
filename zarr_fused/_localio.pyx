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

from libc.errno cimport (
    EEXIST,
    EINTR,
    EINVAL,
    EISDIR,
    ENOENT,
    ENOSYS,
    ENOTDIR,
    EOPNOTSUPP,
    errno,
)
from libc.stdio cimport snprintf
from libc.stdlib cimport free, malloc, realloc
from posix.fcntl cimport (
    O_CLOEXEC,
    O_CREAT,
    O_EXCL,
    O_RDONLY,
    O_WRONLY,
    POSIX_FADV_WILLNEED,
    open,
    posix_fadvise,
)
from posix.stat cimport S_ISDIR, fstat, struct_stat
from posix.unistd cimport close, getpid, read, unlink

cimport numpy as cnp
import os

import numpy as np

cnp.import_array()

cdef extern from "stdio.h" nogil:
    int rename(const char* old, const char* new)

# renameat2 (Linux 3.15) and sync_file_range where the kernel headers have
# them; elsewhere both report ENOSYS and every write takes plain ``rename``.
# Against glibc 2.28 or newer, renameat2 is glibc's (so LD_PRELOAD shims such
# as the tests' faultfs see it); built for an older glibc (the manylinux2014
# wheel), it goes through syscall(2), which such a build still has.
cdef extern from *:
    """
    #include <errno.h>
    #include <fcntl.h>
    #include <stdio.h>
    #if defined(__linux__)
    #include <sys/syscall.h>
    #include <unistd.h>
    #endif
    #if defined(__linux__) && defined(SYS_renameat2) && defined(SYNC_FILE_RANGE_WRITE)
    #define ZF_RENAME_NOREPLACE (1U << 0)
    #define ZF_RENAME_EXCHANGE (1U << 1)
    #if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 28)
    static int zf_rename_flags(const char* old, const char* new, unsigned int flags) {
        return renameat2(AT_FDCWD, old, AT_FDCWD, new, flags);
    }
    #else
    static int zf_rename_flags(const char* old, const char* new, unsigned int flags) {
        return (int)syscall(SYS_renameat2, AT_FDCWD, old, AT_FDCWD, new, flags);
    }
    #endif
    static void zf_start_writeback(int fd) {
        (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    #else
    static int zf_rename_flags(const char* old, const char* new, unsigned int flags) {
        (void)old; (void)new; (void)flags;
        errno = ENOSYS;
        return -1;
    }
    static void zf_start_writeback(int fd) { (void)fd; }
    #define ZF_RENAME_NOREPLACE 1
    #define ZF_RENAME_EXCHANGE 2
    #endif
    static int zf_replace_hint = 0;
    static int zf_get_hint(void) { return __atomic_load_n(&zf_replace_hint, __ATOMIC_RELAXED); }
    static void zf_set_hint(int h) { __atomic_store_n(&zf_replace_hint, h, __ATOMIC_RELAXED); }
    """
    int zf_rename_flags(const char* old, const char* new, unsigned int flags) nogil
    void zf_start_writeback(int fd) nogil
    int zf_get_hint() nogil
    void zf_set_hint(int hint) nogil
    unsigned int ZF_RENAME_NOREPLACE
    unsigned int ZF_RENAME_EXCHANGE

cdef extern from *:
    """
    #include <stdint.h>
    static unsigned long long zf_tmp_counter = 0;
    static unsigned long long zf_next_tmp_id(void) {
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
# the pid in temporary names, read once (and again in a forked child), not
# with a getpid() system call for every file written
cdef unsigned int _pid = <unsigned int>getpid()


def _refresh_pid():
    global _pid
    _pid = <unsigned int>getpid()


os.register_at_fork(after_in_child=_refresh_pid)

cdef enum:
    TMP_SUFFIX_MAX = 64

cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    Py_ssize_t preadv(int fd, const iovec* iov, int iovcnt, long offset)
    Py_ssize_t writev(int fd, const iovec* iov, int iovcnt)

cdef extern from "unistd.h" nogil:
    Py_ssize_t pread(int fd, void* buf, size_t count, long offset)

cdef enum:
    GROUP_MAX = 512  # iovecs per preadv/writev call (Linux allows 1024)


cdef FileStatus open_regular(const char* path, int* fd, Py_ssize_t* size, int* err) noexcept nogil:
    """Open a file for reading as LocalStore sees files: FILE_OK (``*fd``
    open, ``*size`` its length), FILE_MISSING (absent, a directory, or a
    path running through a file), FILE_ERROR (errno in ``*err``)."""
    cdef struct_stat st
    while True:
        fd[0] = open(path, O_RDONLY | O_CLOEXEC)
        if fd[0] >= 0 or errno != EINTR:
            break
    if fd[0] < 0:
        err[0] = errno
        if err[0] == ENOENT or err[0] == ENOTDIR or err[0] == EISDIR:
            return FILE_MISSING
        return FILE_ERROR
    if fstat(fd[0], &st) != 0:
        err[0] = errno
        close(fd[0])
        fd[0] = -1
        return FILE_ERROR
    if S_ISDIR(st.st_mode):
        close(fd[0])
        fd[0] = -1
        return FILE_MISSING
    size[0] = st.st_size
    return FILE_OK


cdef enum:
    READ_FILE_MIN_CAP = 64 << 10  # first buffer of a thread that has read no file yet


cdef FileStatus read_file(const char* path, unsigned char** buf, size_t* cap,
                          Py_ssize_t* length, int* err) noexcept nogil:
    """Read the whole file at ``path`` into ``*buf`` (grown as needed).

    No ``fstat`` for the size: the buffer (reused from file to file by the
    caller) is read into until ``read`` returns 0, and doubled when full.
    On a hot page cache the ``fstat`` was a fifth of the cost of a small
    chunk file (docs/performance.md); a directory, which ``open`` accepts,
    fails the first ``read`` with ``EISDIR`` and is a missing key, as for
    LocalStore.
    """
    cdef int fd
    cdef Py_ssize_t done = 0
    cdef Py_ssize_t got
    cdef size_t want
    cdef unsigned char* grown
    while True:
        fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd >= 0 or errno != EINTR:
            break
    if fd < 0:
        err[0] = errno
        if err[0] == ENOENT or err[0] == ENOTDIR or err[0] == EISDIR:
            return FILE_MISSING
        return FILE_ERROR
    while True:
        if <size_t>done == cap[0]:
            want = cap[0] * 2 if cap[0] else READ_FILE_MIN_CAP
            grown = <unsigned char*>realloc(buf[0], want)
            if grown == NULL:
                close(fd)
                err[0] = 12  # ENOMEM
                return FILE_ERROR
            buf[0] = grown
            cap[0] = want
        got = read(fd, buf[0] + done, cap[0] - <size_t>done)
        if got < 0:
            if errno == EINTR:
                continue
            err[0] = errno
            close(fd)
            if err[0] == EISDIR:
                return FILE_MISSING
            return FILE_ERROR
        if got == 0:
            break
        done += got
    close(fd)
    length[0] = done
    return FILE_OK


# How the last replacement found its target, which decides how the next one
# is tried first (one hint for the process: a write mostly either creates
# chunks or replaces them, and a wrong guess costs one failed system call).
cdef enum ReplaceHint:
    TARGET_NEW = 0  # rename with RENAME_NOREPLACE
    TARGET_EXISTED = 1  # start the writeback, exchange, unlink the old file
    PLAIN_RENAME = 2  # the kernel or filesystem has no renameat2 flags


cdef inline bint _flags_unsupported(int e) noexcept nogil:
    return e == EINVAL or e == ENOSYS or e == EOPNOTSUPP


cdef inline int _refused(int guessed_wrong, int hint) noexcept nogil:
    """After a ``renameat2`` that failed (``errno``): 0 when a plain rename
    may follow, because the target's existence was guessed wrong (errno
    ``guessed_wrong``: ``hint`` is what the next write tries) or the flags
    are not supported here (no more tries); else the error number."""
    cdef int e = errno
    if e == guessed_wrong:
        zf_set_hint(hint)
    elif _flags_unsupported(e):
        zf_set_hint(PLAIN_RENAME)
    else:
        return e
    return 0


cdef int replace_target(const char* tmp, const char* path, int hint) noexcept nogil:
    """Put the file ``tmp`` in the place of ``path`` atomically, as ``rename``
    does: 0, or the error number (``tmp`` is then still there).

    An existing target is exchanged with ``tmp`` and then unlinked, rather
    than renamed over: a rename drops the old file inside the directory's
    lock, and where its blocks were written back that means freeing them
    there, and with online discard waiting for the device, while every
    create and rename in that directory waits too; ``unlink`` frees them
    after releasing the lock (docs/performance.md, overwrites after
    writeback). The caller started the new file's writeback before (what
    ext4 does in a rename over a file, ``auto_da_alloc``), so the order
    data-then-name after a power loss is what a rename would give."""
    cdef int e
    if hint == TARGET_EXISTED:
        if zf_rename_flags(tmp, path, ZF_RENAME_EXCHANGE) == 0:
            if unlink(tmp) != 0 and errno == EISDIR:
                # the target was a directory, which rename refuses: put it back
                zf_rename_flags(tmp, path, ZF_RENAME_EXCHANGE)
                return EISDIR
            # any other failure to unlink leaves the old chunk under the
            # temporary name (as a crash would); the new one is in place
            return 0
        e = _refused(ENOENT, TARGET_NEW)
        if e:
            return e
    elif hint == TARGET_NEW:
        if zf_rename_flags(tmp, path, ZF_RENAME_NOREPLACE) == 0:
            return 0
        e = _refused(EEXIST, TARGET_EXISTED)
        if e:
            return e
    return errno if rename(tmp, path) != 0 else 0


cdef int _write_all(int fd, const unsigned char** parts, const Py_ssize_t* lengths,
                    Py_ssize_t n) noexcept nogil:
    """Write the concatenation of ``n`` parts to ``fd`` with ``writev``, up
    to ``GROUP_MAX`` parts a call: 0, or the error number."""
    cdef iovec iov[GROUP_MAX]
    cdef int cnt
    cdef Py_ssize_t i = 0, k, off = 0, put
    while True:
        # the next parts still to write (the first from ``off`` on)
        cnt = 0
        k = i
        while k < n and cnt < GROUP_MAX:
            if lengths[k] > (off if k == i else 0):
                iov[cnt].iov_base = <void*>(parts[k] + (off if k == i else 0))
                iov[cnt].iov_len = <size_t>(lengths[k] - (off if k == i else 0))
                cnt += 1
            k += 1
        if cnt == 0:
            return 0
        put = writev(fd, iov, cnt)
        if put <= 0:
            if put < 0 and errno == EINTR:
                continue
            return errno if put < 0 else 5  # EIO: no progress
        # step over what was written (whole parts, then into the next one)
        while i < n and put >= lengths[i] - off:
            put -= lengths[i] - off
            i += 1
            off = 0
        if i < n:
            off += put


cdef FileStatus write_file_atomic(const char* path, const unsigned char* data, Py_ssize_t n,
                                  int* err) noexcept nogil:
    """Write ``data`` to a temporary file, then rename it over ``path``."""
    return write_parts_atomic(path, &data, &n, 1, err)


cdef FileStatus write_parts_atomic(const char* path, const unsigned char** parts,
                                   const Py_ssize_t* lengths, Py_ssize_t n,
                                   int* err) noexcept nogil:
    """Write the concatenation of ``n`` parts to a temporary file (writev, so
    a shard's payloads and index go out without being copied together
    first), then rename it over ``path``: readers see the old file or the
    whole new one, never a part."""
    cdef char tmp[4096 + TMP_SUFFIX_MAX]
    cdef int fd, hint
    cdef int rc = snprintf(tmp, sizeof(tmp), "%s.%llx-%x-%llx.partial", path, _salt,
                           _pid, zf_next_tmp_id())
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
    rc = _write_all(fd, parts, lengths, n)
    if rc != 0:
        err[0] = rc
        close(fd)
        unlink(tmp)
        return FILE_ERROR
    hint = zf_get_hint()
    if hint == TARGET_EXISTED:
        zf_start_writeback(fd)
    if close(fd) != 0:
        err[0] = errno
        unlink(tmp)
        return FILE_ERROR
    rc = replace_target(tmp, path, hint)
    if rc != 0:
        err[0] = rc
        unlink(tmp)
        return FILE_ERROR
    return FILE_OK


_REPLACE_MODES = {"new": TARGET_NEW, "existed": TARGET_EXISTED, "rename": PLAIN_RENAME}


def replace_mode(mode=None):
    """How the next write first tries to replace its target: ``"new"``
    (rename without replacing), ``"existed"`` (exchange, then unlink the
    old file) or ``"rename"`` (plain rename, kept once chosen: the kernel
    or filesystem refused the flags). With ``mode``, set it first (tests
    and benchmarks compare the ways); returns the mode before."""
    names = {v: k for k, v in _REPLACE_MODES.items()}
    before = names[zf_get_hint()]
    if mode is not None:
        zf_set_hint(_REPLACE_MODES[mode])
    return before


def read_whole(path):
    """Read a file like LocalStore does; None when it is missing (for tests)."""
    cdef bytes p = os.fsencode(path)
    cdef const char* cp = p
    cdef unsigned char* buf = NULL
    cdef size_t cap = 0
    cdef Py_ssize_t n = 0
    cdef int err = 0
    cdef FileStatus rc
    try:
        with nogil:
            rc = read_file(cp, &buf, &cap, &n, &err)
        if rc == FILE_MISSING:
            return None
        if rc == FILE_ERROR:
            raise OSError(err, os.strerror(err), os.fsdecode(path))
        return (<char*>buf)[:n] if n else b""
    finally:
        free(buf)


def write_parts(path, parts):
    """Atomically write the concatenation of ``parts`` (bytes-like objects)
    to ``path``, like LocalStore writes a value, with the GIL released."""
    cdef bytes p = os.fsencode(path)
    cdef const char* cp = p
    cdef Py_ssize_t n = len(parts), i
    cdef const unsigned char[::1] view
    cdef const unsigned char** ptrs = NULL
    cdef Py_ssize_t* lengths = NULL
    cdef int err = 0
    cdef FileStatus rc
    views = [memoryview(part).cast("B") for part in parts]  # holds the buffers
    ptrs = <const unsigned char**>malloc(sizeof(unsigned char*) * (n if n else 1))
    lengths = <Py_ssize_t*>malloc(sizeof(Py_ssize_t) * (n if n else 1))
    try:
        if ptrs == NULL or lengths == NULL:
            raise MemoryError()
        for i in range(n):
            view = views[i]
            lengths[i] = view.shape[0]
            ptrs[i] = &view[0] if lengths[i] else <const unsigned char*>b""
        with nogil:
            rc = write_parts_atomic(cp, ptrs, lengths, n, &err)
    finally:
        free(ptrs)
        free(lengths)
    if rc != FILE_OK:
        raise OSError(err, os.strerror(err), os.fsdecode(p))


def write_whole(path, data):
    """Atomically write ``data`` to ``path`` like LocalStore does (for tests)."""
    cdef bytes p = os.fsencode(path)
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef const char* cp = p
    cdef int err = 0
    cdef FileStatus rc
    cdef Py_ssize_t n = view.shape[0]
    cdef const unsigned char* dp = &view[0] if n else <const unsigned char*>b""
    with nogil:
        rc = write_file_atomic(cp, dp, n, &err)
    if rc != FILE_OK:
        raise OSError(err, os.strerror(err), os.fsdecode(path))


# -- ranges of one file, for shards -------------------------------------------------

cdef FileStatus pread_full(int fd, unsigned char* dst, Py_ssize_t n, Py_ssize_t offset,
                           int* err) noexcept nogil:
    """Read exactly n bytes at offset: FILE_OK, FILE_SHORT when the file
    ends first, FILE_ERROR."""
    cdef Py_ssize_t done = 0, got
    while done < n:
        got = pread(fd, dst + done, <size_t>(n - done), offset + done)
        if got < 0:
            if errno == EINTR:
                continue
            err[0] = errno
            return FILE_ERROR
        if got == 0:
            return FILE_SHORT
        done += got
    return FILE_OK


cdef inline Py_ssize_t group_stop(Py_ssize_t n, const Py_ssize_t* starts,
                                  const Py_ssize_t* lengths, Py_ssize_t i,
                                  Py_ssize_t max_gap, Py_ssize_t max_coalesced,
                                  Py_ssize_t* end) noexcept nogil:
    """Where the group of sorted ranges starting at ``i`` ends (exclusive):
    neighbours no further apart than max_gap, spanning at most
    max_coalesced, at most GROUP_MAX ranges; ``*end`` is its last byte + 1."""
    cdef Py_ssize_t j = i + 1
    end[0] = starts[i] + lengths[i]
    while (j < n and j - i < GROUP_MAX and starts[j] >= end[0]
           and starts[j] - end[0] <= max_gap
           and starts[j] + lengths[j] - starts[i] <= max_coalesced):
        end[0] = starts[j] + lengths[j]
        j += 1
    return j


cdef FileStatus read_ranges_fd(int fd, Py_ssize_t n, const Py_ssize_t* starts,
                               const Py_ssize_t* lengths, unsigned char* out,
                               const Py_ssize_t* offsets, Py_ssize_t max_gap,
                               Py_ssize_t max_coalesced, unsigned char* gap, int* err,
                               Py_ssize_t* bad) noexcept nogil:
    """Read sorted, non-overlapping ranges; neighbours no further apart than
    max_gap (and spanning at most max_coalesced) share one preadv. FILE_OK,
    or FILE_SHORT / FILE_ERROR with the failed range's position in ``*bad``."""
    cdef iovec iov[2 * GROUP_MAX]
    cdef Py_ssize_t i = 0, j, k, end, span, got
    cdef int cnt
    cdef FileStatus rc
    while i < n:
        j = group_stop(n, starts, lengths, i, max_gap, max_coalesced, &end)
        if j == i + 1:
            rc = pread_full(fd, out + offsets[i], lengths[i], starts[i], err)
            if rc != FILE_OK:
                bad[0] = i
                return rc
            i = j
            continue
        cnt = 0
        span = 0
        for k in range(i, j):
            if k > i and starts[k] > starts[k - 1] + lengths[k - 1]:
                iov[cnt].iov_base = gap
                iov[cnt].iov_len = <size_t>(starts[k] - starts[k - 1] - lengths[k - 1])
                span += <Py_ssize_t>iov[cnt].iov_len
                cnt += 1
            iov[cnt].iov_base = out + offsets[k]
            iov[cnt].iov_len = <size_t>lengths[k]
            span += lengths[k]
            cnt += 1
        while True:
            got = preadv(fd, iov, cnt, starts[i])
            if got >= 0 or errno != EINTR:
                break
        if got < 0:
            err[0] = errno
            bad[0] = i
            return FILE_ERROR
        if got < span:
            # short: finish range by range, which finds where the file ends
            for k in range(i, j):
                rc = pread_full(fd, out + offsets[k], lengths[k], starts[k], err)
                if rc != FILE_OK:
                    bad[0] = k
                    return rc
        i = j
    return FILE_OK


cdef void advise_ranges(int fd, Py_ssize_t n, const Py_ssize_t* starts,
                        const Py_ssize_t* lengths, Py_ssize_t max_gap,
                        Py_ssize_t max_coalesced) noexcept nogil:
    """Ask the kernel to start reading the sorted ranges now
    (``POSIX_FADV_WILLNEED``), one call per group `read_ranges_fd` would
    read with one call: on a cold page cache the device then works on all of
    them at once while the reads that follow wait for the first, instead of
    one range per round trip. Only a hint: failures are ignored, and ranges
    already cached cost a lookup."""
    cdef Py_ssize_t i = 0, j, end
    while i < n:
        j = group_stop(n, starts, lengths, i, max_gap, max_coalesced, &end)
        if end > starts[i]:
            posix_fadvise(fd, starts[i], end - starts[i], POSIX_FADV_WILLNEED)
        i = j


def read_into(path, cnp.ndarray out):
    """Read the whole file at ``path`` into ``out`` (writeable contiguous
    uint8), with the GIL released.

    Returns
    -------
    int or None
        The file's length; None when it is missing (as LocalStore sees it).
        A length over ``len(out)`` means nothing was read: ``out`` is too
        small, and a buffer of that length holds the file.
    """
    cdef bytes p = os.fsencode(path)
    cdef const char* cp = p
    cdef int fd, err = 0
    cdef FileStatus rc
    cdef Py_ssize_t size = 0
    if out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
        raise TypeError("read_into needs a writeable contiguous uint8 array")
    with nogil:
        rc = open_regular(cp, &fd, &size, &err)
        if rc == FILE_OK:
            if size <= out.shape[0]:
                rc = pread_full(fd, <unsigned char*>cnp.PyArray_DATA(out), size, 0, &err)
                if rc == FILE_SHORT:  # shrank while reading: a writer not replacing atomically
                    err = 5  # EIO
                    rc = FILE_ERROR
            close(fd)
    if rc == FILE_MISSING:
        return None
    if rc == FILE_ERROR:
        raise OSError(err, os.strerror(err), os.fsdecode(path))
    return size
