# cython: language_level=3
# The item types the filter and cast kernels take (`_filters`,
# `_cast_value`), as fused types: a kernel written once over them is
# compiled for each. Each set is declared twice, so that a function of an
# ``_a`` and a ``_b`` type covers every pair of the set.

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


ctypedef fused item_a:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double


ctypedef fused item_b:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double


ctypedef fused int_a:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t


ctypedef fused int_b:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t


ctypedef fused float_a:
    float
    double


ctypedef fused float_b:
    float
    double
