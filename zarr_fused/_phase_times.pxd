# cython: language_level=3
# The time a batch's tasks spend in each phase while a `zarr_fused.stats`
# block counts the call: the kernels of `_codecs` and the batches of
# `_codec_batch` and `_shard_local` add to one `PhaseTimes` per run, read
# the clock only when they are given one, and hand the sums over after.

from libc.stdint cimport int64_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


# nanoseconds summed over the threads that ran the tasks, and the chunks
# the kernels decoded or encoded
cdef struct PhaseTimes:
    int64_t io_ns  # file reads inside the call (chunk files, a shard's preads)
    int64_t decode_ns
    int64_t scatter_ns  # into the output, fills of missing chunks included
    int64_t encode_ns
    int64_t write_ns  # file writes inside the call
    int64_t chunks


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline int64_t lap(int64_t* phase, int64_t since) noexcept nogil:
    """Add the time from ``since`` to now into ``phase``; now."""
    cdef int64_t now = now_ns()
    phase[0] += now - since
    return now
