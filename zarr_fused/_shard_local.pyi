"""Typed interface of the compiled `zarr_fused._shard_local` (see _shard_local.pyx)."""

from collections.abc import Callable
from typing import Any

import numpy as np

from zarr_fused._codec_batch import DecodeBatch

type _Take = Callable[[int], np.ndarray[Any, np.dtype[np.uint8]]]
type _Give = Callable[[np.ndarray[Any, np.dtype[np.uint8]]], Any]

def fetch_partial_local(
    path: bytes,
    n_chunks: int,
    touched: np.ndarray[Any, np.dtype[np.intp]],
    take: _Take,
    *,
    checksum: bool,
    big_endian: bool,
    at_start: bool,
    max_gap: int = ...,
    max_coalesced: int = ...,
    size_hint: int = 0,
    give: _Give | None = None,
    grid: tuple[int, ...] | None = None,
    where: str | Callable[[], str] = "shard",
    decode: DecodeBatch | None = None,
    first: int = 0,
    prefetch: bool = False,
) -> (
    tuple[
        np.ndarray[Any, np.dtype[np.uint64]],
        np.ndarray[Any, np.dtype[np.uint8]],
        np.ndarray[Any, np.dtype[np.uint8]],
    ]
    | None
): ...
def read_shard_local(
    batch: DecodeBatch,
    first: int,
    path: bytes,
    n_chunks: int,
    touched: np.ndarray[Any, np.dtype[np.intp]],
    take: _Take,
    give: _Give,
    *,
    checksum: bool,
    big_endian: bool,
    at_start: bool,
    max_gap: int = ...,
    max_coalesced: int = ...,
    size_hint: int = 0,
    grid: tuple[int, ...] | None = None,
    where: str | Callable[[], str] = "shard",
    prefetch: bool = False,
) -> bool: ...
def decode_part(
    batch: DecodeBatch,
    first: int,
    stop: int,
    entries: np.ndarray[Any, np.dtype[np.uint64]],
    payload: np.ndarray[Any, np.dtype[np.uint8]],
) -> None: ...
