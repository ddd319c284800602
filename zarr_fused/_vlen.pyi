"""Typed interface of the compiled `zarr_fused._vlen` (see _vlen.pyx)."""

from collections.abc import Buffer
from typing import Any

import numpy as np

from zarr_fused._codecs import ChainKernel

def decode(
    kernel: ChainKernel,
    payload: Buffer,
    count: int,
    utf8: bool,
    where: object = "payload",
    out: np.ndarray[Any, np.dtype[np.object_]] | None = None,
) -> np.ndarray[Any, np.dtype[np.object_]]: ...
def encode(
    kernel: ChainKernel,
    values: np.ndarray[Any, np.dtype[np.object_]],
    utf8: bool,
    where: object = "chunk",
) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
def decode_strings(
    kernel: ChainKernel, payload: Buffer, out: np.ndarray[Any, Any], where: object = "payload"
) -> np.ndarray[Any, Any]: ...
def encode_strings(
    kernel: ChainKernel, values: np.ndarray[Any, Any], where: object = "chunk"
) -> np.ndarray[Any, np.dtype[np.uint8]]: ...
