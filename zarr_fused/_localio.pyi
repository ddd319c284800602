"""Typed interface of the compiled `zarr_fused._localio` (see _localio.pyx)."""

import os
from collections.abc import Buffer, Sequence
from typing import Any, Literal

import numpy as np

type _Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]

type _ReplaceMode = Literal["new", "existed", "rename"]

def replace_mode(mode: _ReplaceMode | None = None) -> _ReplaceMode: ...
def read_whole(path: _Path) -> bytes | None: ...
def write_parts(path: _Path, parts: Sequence[Buffer]) -> None: ...
def write_whole(path: _Path, data: Buffer) -> None: ...
def read_into(path: _Path, out: np.ndarray[Any, np.dtype[np.uint8]]) -> int | None: ...
