"""Typed interface of the compiled `zarr_fused._vlen` (see _vlen.pyx)."""

from collections.abc import Buffer, Callable, Sequence
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

class VlenRegion:
    """A shard's selected inner chunks, decoded into an output (see _vlen.pyx)."""

    n_tasks: int
    def __init__(
        self,
        kernel: ChainKernel,
        payload: Buffer,
        entries: np.ndarray[Any, np.dtype[np.uint64]],
        rows: np.ndarray[Any, np.dtype[np.intp]] | Sequence[tuple[int, int, int, int, int]],
        dim_rows: Sequence[int],
        out_axes: Sequence[int],
        inner_shape: Sequence[int],
        grid: Sequence[int],
        out: np.ndarray[Any, Any],
        utf8: bool,
        fill: object,
        key: object,
        describe: Callable[[Any], object],
        *,
        order: str = "C",
    ) -> None: ...
    def decode(self, first: int, last: int) -> None: ...
