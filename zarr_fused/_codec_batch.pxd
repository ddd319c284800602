# cython: language_level=3
# The batches of codec tasks (_codec_batch.pyx) as the shard modules see
# them: they queue the tasks of a shard's inner chunks into the same batches
# and run them in their own nogil sections.

from libc.stdint cimport int64_t, uint8_t

cimport numpy as cnp

from zarr_fused._filters cimport FilterChain
from zarr_fused._codecs cimport ChainKernel, DecodeTask, EncodeTask, Status, Workspace
from zarr_fused._phase_times cimport PhaseTimes
from zarr_fused._scatter cimport ZF_MAX_DIMS

cdef void add_times(PhaseTimes* into, const PhaseTimes* t) noexcept nogil

cdef class ChunkLayout:
    cdef readonly int ndim
    cdef readonly Py_ssize_t nbytes
    cdef readonly bint transposed
    cdef Py_ssize_t shape[ZF_MAX_DIMS]
    cdef Py_ssize_t strides[ZF_MAX_DIMS]
    cdef Py_ssize_t stored_shape[ZF_MAX_DIMS]
    cdef Py_ssize_t perm[ZF_MAX_DIMS]

cdef class TaskBatch:
    cdef ChainKernel kernel
    cdef void* task_memory
    cdef Py_ssize_t* dims
    cdef int dims_per_task
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef int max_ndim
    cdef list refs
    cdef list keys
    cdef bytes fill
    cdef object describe
    cdef readonly Py_ssize_t itemsize
    cdef FilterChain filters
    cdef uint8_t* refused
    cdef object refuse
    cdef int allocate(self, ChainKernel kernel, Py_ssize_t capacity, int max_ndim, describe,
                      size_t task_size, int dims_per_task) except -1
    cdef Py_ssize_t* task_dims(self, Py_ssize_t i) noexcept nogil
    cdef const char* fill_ptr(self) noexcept
    cdef object fail(self, Status* status, Py_ssize_t failed)
    cdef Status* status_of(self, Py_ssize_t i) noexcept nogil
    cdef object raise_failed(self, Py_ssize_t failed)
    cdef Py_ssize_t run_group(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop, const char* fill,
                              Py_ssize_t* size) noexcept nogil
    cdef Py_ssize_t run_tasks(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                              const char* fill) noexcept nogil
    cdef Py_ssize_t run_clamped(self, Py_ssize_t start, Py_ssize_t stop) except -1
    cdef Py_ssize_t encoded_nbytes(self, Py_ssize_t nbytes) noexcept nogil
    cdef Py_ssize_t task_nbytes(self, Py_ssize_t i) noexcept nogil
    cdef int run_filtered(self, Workspace ws, Py_ssize_t i, const char* fill, uint8_t* a,
                          uint8_t* b) noexcept nogil
    cdef Py_ssize_t run_filtered_range(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                                       const char* fill) noexcept nogil
    cdef bint timed
    cdef bint encodes
    cdef PhaseTimes times
    cdef object start_timing(self)
    cdef object flush_times(self, sink)
    cdef Py_ssize_t run_tasks_timed(self, Workspace ws, Py_ssize_t start, Py_ssize_t stop,
                                    const char* fill) noexcept nogil
    cdef Py_ssize_t run_group_timed(self, Workspace ws, Py_ssize_t i, Py_ssize_t stop,
                                    const char* fill, Py_ssize_t* size,
                                    PhaseTimes* acc) noexcept nogil

cdef class DecodeBatch(TaskBatch):
    cdef DecodeTask* tasks
    cdef DecodeTask* next_task(self) except NULL
    cdef bint is_direct(self, DecodeTask* t, ChunkLayout layout) noexcept
    cdef int _target(self, DecodeTask* t, cnp.ndarray out, object out_selection,
                     Py_ssize_t* shape) except -2
    cdef object _add(self, payload, bytes path, ChunkLayout layout, chunk_selection,
                     cnp.ndarray out, out_selection, tuple drop_axes, key)
    cdef object finish_refused(self, Py_ssize_t start, Py_ssize_t stop)
    cdef bytes refused_payload(self, DecodeTask* t)

cdef class EncodeBatch(TaskBatch):
    cdef EncodeTask* tasks
    cdef list outputs
    cpdef Py_ssize_t encoded_bound(self, Py_ssize_t nbytes)
    cdef object _values(self, Py_ssize_t i)
    cdef object arena
    cdef Py_ssize_t arena_used
    cdef EncodeTask* queue(self, ChunkLayout layout, const char* src,
                           const Py_ssize_t* strides, bint swap, bint skip_fill,
                           cnp.ndarray out, key) except NULL

cdef Py_ssize_t contiguous_run(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                               Py_ssize_t itemsize) noexcept nogil

cdef tuple as_selection_tuple(selection)

cdef int select_basic(int ndim, const Py_ssize_t* shape, const Py_ssize_t* strides,
                      object selection, Py_ssize_t* offset, Py_ssize_t* out_shape,
                      Py_ssize_t* out_strides) except -2
