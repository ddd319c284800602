"""Typed interface of the compiled `zarr_fused._shard` (see _shard.pyx)."""

from collections.abc import Buffer, Callable
from typing import Any

import numpy as np
from typing_extensions import disjoint_base

from zarr_fused._codec_batch import ChunkLayout, DecodeBatch, EncodeBatch
from zarr_fused._codecs import ChainKernel

@disjoint_base
class ShardPlan:
    ndim: int
    kept: int
    n_touched: int
    n_total: int
    @property
    def all_touched(self) -> bool: ...
    @property
    def out_shape(self) -> tuple[int, ...]: ...
    def items(self) -> list[tuple[int, tuple[Any, ...], tuple[slice, ...], bool]]: ...
    def touched(self) -> np.ndarray[Any, np.dtype[np.intp]]: ...

def plan_selection(
    shard_shape: tuple[int, ...], inner_shape: tuple[int, ...], selection: Any
) -> ShardPlan | None: ...
def add_shard(
    batch: DecodeBatch,
    payload: Buffer | None,
    entries: np.ndarray[Any, np.dtype[np.uint64]] | None,
    plan: ShardPlan,
    layout: ChunkLayout,
    out: np.ndarray[Any, Any],
    out_selection: Any,
    key: Any,
    *,
    defer: bool = False,
) -> bool: ...
def add_shard_encode(
    batch: EncodeBatch,
    value: np.ndarray[Any, Any],
    value_selection: Any,
    plan: ShardPlan,
    layout: ChunkLayout,
    key: Any,
    swap: bool,
    skip_fill: bool,
) -> np.ndarray[Any, np.dtype[np.intp]] | None: ...

@disjoint_base
class Destinations:
    ndim: int
    n: int
    itemsize: int
    def __init__(self, arrays: list[np.ndarray[Any, Any]], ndim: int, itemsize: int) -> None: ...

def fan_out(
    kernel: ChainKernel,
    layout: ChunkLayout,
    payload: Buffer | None,
    entries: np.ndarray[Any, np.dtype[np.uint64]] | None,
    units: np.ndarray[Any, np.dtype[np.intp]],
    starts: np.ndarray[Any, np.dtype[np.intp]],
    targets: np.ndarray[Any, np.dtype[np.intp]],
    dst: Destinations,
    fill: bytes,
    key: Any,
    describe: Callable[[Any], str],
) -> None: ...
