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

from zarr_fused._localio cimport FILE_ERROR, FILE_MISSING, FILE_OK, open_regular, pread_full

cnp.import_array()


cdef enum ReadStatus:
    READ_OK = 0
    READ_SHRANK = 1  # the file ended before its size (a writer not replacing atomically)
    READ_FAILED = -1


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
    cdef Py_ssize_t n = len(paths), i, done = 0, size = 0
    cdef int fd = -1, rc = FILE_OK, err = 0
    cdef const char** cpaths = NULL
    cdef unsigned char* base
    cdef Py_ssize_t* off
    cdef Py_ssize_t* cap
    cdef Py_ssize_t* out
    for a in (offsets, capacities, lengths):
        if a.dtype != np.intp or not a.flags.c_contiguous or a.shape[0] != n:
            raise TypeError("offsets, capacities and lengths must be intp arrays, one per path")
    if arena.dtype != np.uint8 or not arena.flags.c_contiguous or not arena.flags.writeable:
        raise TypeError("arena must be a writeable contiguous uint8 array")
    if not lengths.flags.writeable or stop.shape[0] < 1:
        raise TypeError("lengths must be writeable and stop must hold one byte")
    off = <Py_ssize_t*>cnp.PyArray_DATA(offsets)
    cap = <Py_ssize_t*>cnp.PyArray_DATA(capacities)
    out = <Py_ssize_t*>cnp.PyArray_DATA(lengths)
    for i in range(n):
        if type(paths[i]) is not bytes:
            raise TypeError("paths must be bytes")
        if off[i] < 0 or cap[i] < 0 or off[i] + cap[i] > arena.shape[0]:
            raise ValueError("a file's place does not fit the arena")
    base = <unsigned char*>cnp.PyArray_DATA(arena)
    cpaths = <const char**>malloc(sizeof(char*) * (n if n else 1))
    if cpaths == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            cpaths[i] = <bytes>paths[i]  # the list keeps the bytes alive
        with nogil:
            i = 0
            while i < n and stop[0] == 0:
                rc = open_regular(cpaths[i], &fd, &size, &err)
                if rc == FILE_MISSING:
                    out[i] = -1
                elif rc == FILE_OK:
                    if size > cap[i]:
                        out[i] = -2 - size
                    else:
                        rc = pread_full(fd, base + off[i], size, 0, &err)
                        if rc == READ_SHRANK:
                            err = 5  # EIO, as _localio.read_into reports it
                            rc = READ_FAILED
                        out[i] = size
                    close(fd)
                if rc == FILE_ERROR or rc == READ_FAILED:
                    break
                i += 1
            done = i
    finally:
        free(cpaths)
    if rc == FILE_ERROR or rc == READ_FAILED:
        raise OSError(err, os.strerror(err), os.fsdecode(paths[done]))
    return done
