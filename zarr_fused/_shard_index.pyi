"""Typed interface of the compiled `zarr_fused._shard_index` (see _shard_index.pyx)."""

from collections.abc import Buffer, Callable
from typing import Any

import numpy as np

INDEX_ENTRY_NBYTES: int
INDEX_CHECKSUM_NBYTES: int
MISSING_ENTRY: int

def index_nbytes(n_chunks: int, checksum: bool) -> int: ...
def parse_index(
    index: Buffer,
    n_chunks: int,
    *,
    checksum: bool,
    big_endian: bool,
    shard_len: int = -1,
    index_start: int = 0,
    grid: tuple[int, ...] | None = None,
    where: str | Callable[[], str] = "shard",
) -> np.ndarray[Any, np.dtype[np.uint64]]: ...
def shard_parts(
    order: np.ndarray[Any, np.dtype[np.intp]],
    payloads: list[Any],
    *,
    at_start: bool,
    checksum: bool,
    big_endian: bool,
) -> list[Any] | None: ...
def assemble_shard(
    order: np.ndarray[Any, np.dtype[np.intp]],
    payloads: list[Any],
    *,
    at_start: bool,
    checksum: bool,
    big_endian: bool,
    take: Callable[[int], np.ndarray[Any, np.dtype[np.uint8]]] | None = None,
) -> np.ndarray[Any, np.dtype[np.uint8]] | None: ...
