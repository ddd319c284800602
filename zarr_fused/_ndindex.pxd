# cython: language_level=3
# Stepping an n-d index through its shape in C order (an odometer), for the
# kernels that walk a block row by row (_scatter) and the grid of inner
# chunks a selection touches (_shard). An offset that follows the index
# moves by one precomputed step per call, whichever axes wrapped.


cdef inline int next_index(Py_ssize_t* idx, const Py_ssize_t* shape, int ndim) noexcept nogil:
    """Advance ``idx`` to the next index within ``shape`` (C order).

    Returns the axis that stepped forward (every axis after it went back to
    0), or -1 past the last index (``idx`` is all zeros again).
    """
    cdef int d = ndim - 1
    while d >= 0:
        idx[d] += 1
        if idx[d] < shape[d]:
            return d
        idx[d] = 0
        d -= 1
    return -1


cdef inline void carry_steps(const Py_ssize_t* shape, const Py_ssize_t* strides, int ndim,
                             Py_ssize_t* steps) noexcept nogil:
    """``steps[d]``: how far an offset with these ``strides`` moves when
    `next_index` returns ``d``: one stride of axis ``d`` forward, every axis
    after it back from its last index to 0."""
    cdef Py_ssize_t back = 0
    cdef int d = ndim - 1
    while d >= 0:
        steps[d] = strides[d] - back
        back += (shape[d] - 1) * strides[d]
        d -= 1
