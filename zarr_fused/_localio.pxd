# cython: language_level=3
# Whole-file reads and atomic whole-file writes for zarr's LocalStore, callable
# without the GIL (the read and write paths do their file IO inside the same
# nogil call that decodes or encodes).

# What every file operation here returns; FILE_ERROR leaves the errno in *err.
cdef enum FileStatus:
    FILE_OK = 0
    FILE_MISSING = 1  # absent as LocalStore sees it (no file, a directory, ...)
    FILE_ERROR = -1
    FILE_SHORT = 2  # the file ends before the bytes asked for

cdef FileStatus open_regular(const char* path, int* fd, Py_ssize_t* size, int* err) noexcept nogil

cdef FileStatus read_file(const char* path, unsigned char** buf, size_t* cap,
                          Py_ssize_t* length, int* err) noexcept nogil

cdef FileStatus write_file_atomic(const char* path, const unsigned char* data, Py_ssize_t n,
                                  int* err) noexcept nogil

cdef FileStatus write_parts_atomic(const char* path, const unsigned char** parts,
                                   const Py_ssize_t* lengths, Py_ssize_t n, int* err) noexcept nogil

cdef FileStatus pread_full(int fd, unsigned char* dst, Py_ssize_t n, Py_ssize_t offset,
                           int* err) noexcept nogil

cdef FileStatus read_ranges_fd(int fd, Py_ssize_t n, const Py_ssize_t* starts,
                               const Py_ssize_t* lengths, unsigned char* out,
                               const Py_ssize_t* offsets, Py_ssize_t max_gap,
                               Py_ssize_t max_coalesced, unsigned char* gap, int* err,
                               Py_ssize_t* bad) noexcept nogil

cdef void advise_ranges(int fd, Py_ssize_t n, const Py_ssize_t* starts,
                        const Py_ssize_t* lengths, Py_ssize_t max_gap,
                        Py_ssize_t max_coalesced) noexcept nogil
