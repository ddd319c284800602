"""Typed interface of the compiled `zarr_fused._codec_batch` (see _codec_batch.pyx)."""

from collections.abc import Buffer, Callable, Sequence
from typing import Any, Self

import numpy as np
from typing_extensions import disjoint_base

from zarr_fused._codecs import ChainKernel
from zarr_fused._filters import FilterChain

@disjoint_base
class ChunkLayout:
    ndim: int
    nbytes: int
    transposed: bool
    def __init__(
        self, shape: tuple[int, ...], itemsize: int, order: Sequence[int] | None = None
    ) -> None: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...

def read_again(path: bytes) -> bytes | None: ...

@disjoint_base
class TaskBatch:
    itemsize: int
    def __len__(self) -> int: ...
    def set_fill(self, pattern: bytes) -> None: ...
    def set_filters(
        self,
        filters: FilterChain,
        refuse: Callable[..., np.ndarray[Any, Any] | None] | None = None,
    ) -> None: ...

@disjoint_base
class DecodeBatch(TaskBatch):
    def __new__(
        cls,
        kernel: ChainKernel,
        capacity: int,
        max_ndim: int,
        describe: Callable[[Any], str] = ...,
    ) -> Self: ...
    def add(
        self,
        payload: Buffer,
        layout: ChunkLayout,
        chunk_selection: Any,
        out: np.ndarray[Any, Any],
        out_selection: Any,
        drop_axes: tuple[int, ...],
        key: Any,
    ) -> bool: ...
    def add_file(
        self,
        path: bytes,
        layout: ChunkLayout,
        chunk_selection: Any,
        out: np.ndarray[Any, Any],
        out_selection: Any,
        drop_axes: tuple[int, ...],
        key: Any,
    ) -> bool: ...
    def add_missing(self, out: np.ndarray[Any, Any], out_selection: Any, key: Any) -> bool: ...
    def run_range(self, start: int = 0, stop: int = -1) -> list[int]: ...
    def run(self) -> list[int]: ...

@disjoint_base
class EncodeBatch(TaskBatch):
    def __new__(
        cls,
        kernel: ChainKernel,
        capacity: int,
        max_ndim: int,
        describe: Callable[[Any], str] = ...,
        arena: np.ndarray[Any, np.dtype[np.uint8]] | None = None,
    ) -> Self: ...
    def add(
        self,
        chunk: np.ndarray[Any, Any],
        layout: ChunkLayout,
        swap: bool,
        key: Any,
        path: bytes | None = None,
        skip_fill: bool = False,
    ) -> int: ...
    def encoded_bound(self, nbytes: int) -> int: ...
    def run_range(self, start: int = 0, stop: int = -1) -> None: ...
    def results(self) -> list[np.ndarray[Any, np.dtype[np.uint8]] | None | bool]: ...
    def run(self) -> list[np.ndarray[Any, np.dtype[np.uint8]] | None | bool]: ...
