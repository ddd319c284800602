"""Typed interface of the compiled `zarr_fused._shard_local` (see _shard_local.pyx)."""

from collections.abc import Callable
from typing import Any, Required, TypedDict, Unpack

import numpy as np

from zarr_fused._codec_batch import DecodeBatch

type _Take = Callable[[int], np.ndarray[Any, np.dtype[np.uint8]]]
type _Give = Callable[[np.ndarray[Any, np.dtype[np.uint8]]], Any]

class _ReadSettings(TypedDict, total=False):
    """How a shard's index and chunks are read (the keywords both readers take)."""

    checksum: Required[bool]
    big_endian: Required[bool]
    at_start: Required[bool]
    max_gap: int
    max_coalesced: int
    size_hint: int
    grid: tuple[int, ...] | None
    where: str | Callable[[], str]
    prefetch: bool

def fetch_partial_local(
    path: bytes,
    n_chunks: int,
    touched: np.ndarray[Any, np.dtype[np.intp]],
    take: _Take,
    *,
    give: _Give | None = None,
    decode: DecodeBatch | None = None,
    first: int = 0,
    **settings: Unpack[_ReadSettings],
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
    **settings: Unpack[_ReadSettings],
) -> bool: ...
def decode_part(
    batch: DecodeBatch,
    first: int,
    stop: int,
    entries: np.ndarray[Any, np.dtype[np.uint64]],
    payload: np.ndarray[Any, np.dtype[np.uint8]],
) -> None: ...
