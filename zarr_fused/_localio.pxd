# cython: language_level=3
# Whole-file reads and atomic whole-file writes for zarr's LocalStore, callable
# without the GIL (the read and write paths do their file IO inside the same
# nogil call that decodes or encodes).

cdef enum FileStatus:
    FILE_OK = 0
    FILE_MISSING = 1
    FILE_ERROR = -1

cdef int read_file(const char* path, unsigned char** buf, size_t* cap,
                   Py_ssize_t* length, int* err) noexcept nogil

cdef int write_file_atomic(const char* path, const unsigned char* data, Py_ssize_t n,
                           int* err) noexcept nogil
