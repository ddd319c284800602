# cython: language_level=3
# The cast_value kernel (_cast_value.pyx) as the filter chains see it: one
# direction of a cast (encode or decode) as a plain struct, run with the GIL
# released by `cast_run`.

from libc.stdint cimport uint64_t

# What a cast returns; the first value that fails stops it.
cpdef enum CastStatus:
    CAST_OK = 0
    CAST_NAN_OR_INF = 1  # NaN or an infinity to an integer
    CAST_OUT_OF_RANGE = 2  # out of the target's range, no out_of_range mode

# At most this many scalar_map entries per direction (more run zarr's code).
cdef enum:
    CAST_MAX_ENTRIES = 8

# One scalar_map entry: the bits of a source-type and a target-type value,
# in the first bytes of each field.
cdef struct CastEntry:
    uint64_t src
    uint64_t dst

# One direction of a cast. ``src_code``/``dst_code`` number the types
# (int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32,
# float64: 0..9). An integer target's range: ``lo``/``hi`` (bits of the
# source type: its bounds clipped to the source's, for an integer source),
# ``flo``/``fhi`` (as doubles, for a float source: its minimum and the
# power of two past its maximum, both exact), ``dmin``/``dmax`` (bits of
# the target type).
cdef struct CastPlan:
    int src_code
    int dst_code
    int rounding
    int out_of_range
    Py_ssize_t n_entries
    CastEntry entries[CAST_MAX_ENTRIES]
    uint64_t lo
    uint64_t hi
    double flo
    double fhi
    uint64_t dmin
    uint64_t dmax

cdef class CastSpec:
    cdef CastPlan plan
    cdef readonly object src
    cdef readonly object dst
    cdef readonly bint can_fail

cdef CastStatus cast_run(const CastPlan* p, const void* src, void* dst,
                         Py_ssize_t n) noexcept nogil
