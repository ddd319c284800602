# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Batched whole-file reads for the IO threads (`zarr_fused.io.engine`).

One call reads a group of files into one buffer with the GIL released
throughout: an IO thread that released and re-took the GIL for every file
would trade it with every other IO thread and with the compute threads,
which on a hot page cache costs more than the reads themselves. The file
semantics are LocalStore's, from ``_localio`` (`open_regular`,
`pread_full`): a missing file, a directory, or a path running through a
file is a missing key; anything else is an ``OSError``.
"""

from libc.stdlib cimport free, malloc
from posix.unistd cimport close

cimport numpy as cnp
import os

import numpy as np

from zarr_fused._localio cimport FILE_ERROR, FILE_MISSING, FILE_OK, FILE_SHORT, FileStatus
from zarr_fused._localio cimport open_regular, pread_full

cnp.import_array()


def read_files_into(list paths, cnp.ndarray arena, cnp.ndarray offsets,
                    cnp.ndarray capacities, cnp.ndarray lengths, unsigned char[::1] stop):
    """Read file ``i`` of ``paths`` (bytes) into ``arena[offsets[i]:]``.

    ``lengths[i]`` receives the file's length, -1 when it is missing, or
    ``-2 - length`` when it is larger than ``capacities[i]`` (nothing read;
    the caller reads it another way). ``stop[0]`` is checked before each
    file: once another thread sets it, the remaining files are left.

    Returns
    -------
    int
        How many files were handled (``len(paths)`` unless stopped).

    Raises
    ------
    OSError
        For the first file that cannot be read, naming it.
    """
    cdef Py_ssize_t n = len(paths), i, done = 0
    cdef int err = 0
    cdef FileStatus rc
    cdef const char** cpaths = NULL
    _check_places(paths, arena, offsets, capacities, lengths, stop)
    cpaths = <const char**>malloc(sizeof(char*) * (n if n else 1))
    if cpaths == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            cpaths[i] = <bytes>paths[i]  # the list keeps the bytes alive
        with nogil:
            rc = _read_files(cpaths, n, <unsigned char*>cnp.PyArray_DATA(arena),
                             <const Py_ssize_t*>cnp.PyArray_DATA(offsets),
                             <const Py_ssize_t*>cnp.PyArray_DATA(capacities),
                             <Py_ssize_t*>cnp.PyArray_DATA(lengths), &stop[0], &done, &err)
    finally:
        free(cpaths)
    if rc == FILE_ERROR:
        raise OSError(err, os.strerror(err), os.fsdecode(paths[done]))
    return done


cdef int _check_places(list paths, cnp.ndarray arena, cnp.ndarray offsets,
                       cnp.ndarray capacities, cnp.ndarray lengths,
                       const unsigned char[::1] stop) except -1:
    """Raise unless every path is bytes and every file's place fits the arena."""
    cdef Py_ssize_t n = len(paths), i
    cdef const Py_ssize_t* off
    cdef const Py_ssize_t* cap
    for a in (offsets, capacities, lengths):
        if a.dtype != np.intp or not a.flags.c_contiguous or a.shape[0] != n:
            raise TypeError("offsets, capacities and lengths must be intp arrays, one per path")
    if arena.dtype != np.uint8 or not arena.flags.c_contiguous or not arena.flags.writeable:
        raise TypeError("arena must be a writeable contiguous uint8 array")
    if not lengths.flags.writeable or stop.shape[0] < 1:
        raise TypeError("lengths must be writeable and stop must hold one byte")
    off = <const Py_ssize_t*>cnp.PyArray_DATA(offsets)
    cap = <const Py_ssize_t*>cnp.PyArray_DATA(capacities)
    for i in range(n):
        if type(paths[i]) is not bytes:
            raise TypeError("paths must be bytes")
        if off[i] < 0 or cap[i] < 0 or off[i] + cap[i] > arena.shape[0]:
            raise ValueError("a file's place does not fit the arena")
    return 0


cdef FileStatus _read_files(const char** paths, Py_ssize_t n, unsigned char* base,
                            const Py_ssize_t* off, const Py_ssize_t* cap, Py_ssize_t* out,
                            const unsigned char* stop, Py_ssize_t* done,
                            int* err) noexcept nogil:
    """The loop of `read_files_into`: ``done[0]`` files handled; FILE_ERROR
    with the failed file's position in ``done[0]`` and the error number in
    ``err[0]``, else FILE_OK."""
    cdef Py_ssize_t i = 0, size = 0
    cdef int fd = -1
    cdef FileStatus rc
    while i < n and stop[0] == 0:
        rc = open_regular(paths[i], &fd, &size, err)
        if rc == FILE_MISSING:
            out[i] = -1
        elif rc == FILE_OK:
            if size > cap[i]:
                out[i] = -2 - size
            else:
                rc = pread_full(fd, base + off[i], size, 0, err)
                if rc == FILE_SHORT:  # shrank while read: a writer not replacing atomically
                    err[0] = 5  # EIO, as _localio.read_into reports it
                    rc = FILE_ERROR
                out[i] = size
            close(fd)
        if rc == FILE_ERROR:
            done[0] = i
            return FILE_ERROR
        i += 1
    done[0] = i
    return FILE_OK
