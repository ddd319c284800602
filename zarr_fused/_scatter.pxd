# cython: language_level=3
# Shared declarations of the strided copy/fill kernels, cimported by the
# other kernel modules (codecs decode straight into the output through them).

cdef enum:
    ZF_MAX_DIMS = 64

cdef int copy_strided(const char* src, const Py_ssize_t* src_strides, char* dst,
                      const Py_ssize_t* dst_strides, const Py_ssize_t* shape, int ndim,
                      Py_ssize_t itemsize, Py_ssize_t swap_unit) noexcept nogil

cdef int rows_side_by_side(char* big, const Py_ssize_t* big_strides, char* const* parts,
                           const Py_ssize_t* part_strides, int count, const Py_ssize_t* shape,
                           int ndim, Py_ssize_t itemsize, Py_ssize_t swap_unit,
                           bint into_big) noexcept nogil

cdef int fill_strided(char* dst, const Py_ssize_t* dst_strides, const Py_ssize_t* shape,
                      int ndim, const char* pattern, Py_ssize_t itemsize) noexcept nogil

cdef bint equal_strided(const char* src, const Py_ssize_t* src_strides, const Py_ssize_t* shape,
                        int ndim, const char* pattern, Py_ssize_t itemsize) noexcept nogil
