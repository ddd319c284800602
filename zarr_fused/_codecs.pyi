"""Typed interface of the compiled `zarr_fused._codecs` (see _codecs.pyx)."""

from collections.abc import Buffer
from typing import Any, Literal

import numpy as np
from typing_extensions import disjoint_base

COMPRESSORS: dict[str | None, int]
BLOSC_SHUFFLES: dict[str, int]

def crc32c(data: Buffer, *, portable: bool = False) -> int: ...
def crc32c_implementation() -> str: ...
def library_versions() -> dict[str, Any]: ...
def fast_inflate(data: Buffer, nbytes: int, *, zlib_format: bool) -> bytes | None: ...

@disjoint_base
class Workspace:
    @property
    def scratch_bytes(self) -> int: ...

def workspace() -> Workspace: ...

@disjoint_base
class ChainKernel:
    compressor: int
    level: int
    checksum: bool
    cname: str
    clevel: int
    shuffle: int
    typesize: int
    blocksize: int
    acceleration: int
    byte_shuffle: int
    outer_crcs: int
    inner_crcs: int
    itemsize: int
    swap_unit: int
    def __init__(
        self,
        *,
        compressor: Literal["zstd", "gzip", "zlib", "blosc", "lz4"] | None = None,
        level: int = 0,
        checksum: bool = False,
        cname: str = "lz4",
        clevel: int = 5,
        shuffle: Literal["noshuffle", "shuffle", "bitshuffle"] = "noshuffle",
        typesize: int = 1,
        blocksize: int = 0,
        acceleration: int = 1,
        byte_shuffle: int = 0,
        outer_crcs: int = 0,
        inner_crcs: int = 0,
        itemsize: int = 1,
        swap_unit: int = 0,
    ) -> None: ...
    def max_encoded_size(self, nbytes: int) -> int: ...
    def decode(
        self, payload: Buffer, nbytes: int, out: Buffer | None = None
    ) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
    def encode(self, data: Buffer) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
