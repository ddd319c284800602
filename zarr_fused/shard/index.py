"""The shard index as zarr's sharding codec stores it, and reading a whole
shard through it.

The index holds one ``(offset, nbytes)`` pair of little- or big-endian
uint64 per inner chunk (16 bytes each), optionally followed by a crc32c
of those bytes (4), at the start or the end of the shard. An inner chunk
that is not stored has `MISSING_OFFSET` in both fields. Decoding and
checking the entries against the shard is native
(`zarr_fused._shard_index.parse_index`); this module is the one Python home of
the format's facts and of loading a shard with its index checked, which
the read and the write side share.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.codecs.bytes import BytesCodec
from zarr.codecs.crc32c_ import Crc32cCodec

from zarr_fused._buffers import buffers
from zarr_fused._items import describe_chunk, describe_key
from zarr_fused._native import index_kernels, io_kernels
from zarr_fused._zarr_compat import inner_write_order
from zarr_fused.errors import CorruptShardError
from zarr_fused.stats import note_local

if TYPE_CHECKING:
    from collections.abc import Callable

    from zarr.codecs.sharding import ShardingCodec
    from zarr.core.array_spec import ArraySpec

__all__ = [
    "MISSING_OFFSET",
    "IndexFormat",
    "ShardSide",
    "WholeShard",
    "index_format",
    "index_size",
    "inner_describer",
    "inner_grid",
    "planned_format",
    "read_whole_shard",
    "stored_payloads",
    "whole_shard",
]

# The index format's facts have one home, the index kernel (`_shard_index`):
# the sentinel a missing inner chunk has in both fields, and the index size.
#: the offset (and length) of an inner chunk that is not stored. Without the
#: extensions the shard engine never runs; the format's value (all bits set)
#: then only lets this module import.
MISSING_OFFSET = np.uint64(
    np.iinfo(np.uint64).max if index_kernels is None else index_kernels.MISSING_ENTRY
)


def index_size(n_chunks: int, checksum: bool) -> int:
    """Bytes of the index of a shard of ``n_chunks`` inner chunks."""
    return index_kernels.index_nbytes(n_chunks, checksum)


def inner_grid(spec: ArraySpec, inner_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Inner chunks per dimension of a shard of ``spec``."""
    return tuple(s // c for s, c in zip(spec.shape, inner_shape))


@functools.lru_cache(maxsize=64)
def inner_describer(grid: tuple[int, ...]) -> Callable[[Any], str]:
    """Names ``(shard key, linear inner chunk index)`` keys in errors."""

    def describe(key: Any) -> str:
        if isinstance(key, tuple) and len(key) == 2:
            getter, lin = key
            coords = tuple(int(c) for c in np.unravel_index(lin, grid))
            return f"inner chunk {coords} of shard {describe_key(getter)}"
        return describe_chunk(key)

    return describe


@dataclass(frozen=True)
class IndexFormat:
    """How one sharding codec stores its index."""

    checksum: bool
    big_endian: bool
    at_start: bool

    def size(self, n_chunks: int) -> int:
        return index_size(n_chunks, self.checksum)

    def layout_args(self) -> dict[str, bool]:
        """The index's layout as `_shard_index.assemble_shard` and
        ``shard_parts`` take it."""
        return {"at_start": self.at_start, "checksum": self.checksum, "big_endian": self.big_endian}

    def parse(
        self,
        raw: Any,
        n_chunks: int,
        grid: tuple[int, ...],
        key: Any,
        shard_len: int = -1,
        index_start: int = 0,
    ) -> np.ndarray:
        """The checked ``(n_chunks, 2)`` entries of the index bytes ``raw``
        (checked against the shard's length when it is known); errors name
        ``key``."""
        return index_kernels.parse_index(
            raw,
            n_chunks,
            checksum=self.checksum,
            big_endian=self.big_endian,
            shard_len=shard_len,
            index_start=index_start,
            grid=grid,
            where=lambda: describe_key(key),
        )


def index_format(codec: ShardingCodec) -> IndexFormat | None:
    """The index format of ``codec``, None when the native kernels do not
    read its index codecs (only bytes, optionally then crc32c)."""
    codecs = codec.index_codecs
    if not codecs or type(codecs[0]) is not BytesCodec:
        return None
    if len(codecs) == 2 and type(codecs[1]) is not Crc32cCodec or len(codecs) > 2:
        return None
    return IndexFormat(
        checksum=len(codecs) == 2,
        big_endian=codecs[0].endian == "big",
        at_start=codec.index_location == "start",
    )


def planned_format(codec: ShardingCodec) -> IndexFormat:
    """`index_format` of a codec the plan routed to a native shard path,
    which it does only for native index formats."""
    fmt = index_format(codec)
    assert fmt is not None, "the plan admits only native index formats"
    return fmt


class ShardSide:
    """What the native shard readers and writers all hold: the sharding
    codec, its inner codec chain, the path its fallback takes, the inner
    chunk shape and the index format (one the plan admitted)."""

    def __init__(self, codec: ShardingCodec, chain: Any, fallback: Any) -> None:
        self.codec = codec
        self.chain = chain
        self.fallback = fallback
        self.inner_shape = tuple(codec.chunk_shape)
        self.fmt = planned_format(codec)
        self._orders: dict[tuple[int, ...], np.ndarray] = {}
        self._lock = threading.Lock()

    def write_order(self, grid: tuple[int, ...]) -> np.ndarray:
        """Linear indices of the inner chunks in the codec's write order."""
        order = self._orders.get(grid)
        if order is None:
            coords = list(inner_write_order(self.codec, grid))
            order = np.array([np.ravel_multi_index(tuple(c), grid) for c in coords], dtype=np.intp)
            with self._lock:
                self._orders[grid] = order
        return order


@dataclass
class WholeShard:
    """A shard read whole, its index checked."""

    #: the shard's bytes
    data: np.ndarray
    #: ``(n_chunks, 2)`` offsets into ``data`` and lengths
    entries: np.ndarray
    #: the pooled buffer ``data`` lives in (give it back when done), if any
    buffer: np.ndarray | None


def read_whole_shard(
    key: Any,
    spec: ArraySpec,
    fmt: IndexFormat,
    grid: tuple[int, ...],
    prefix: bytes | None,
    size_hint: int = 0,
) -> WholeShard | None:
    """Read the shard at ``key`` in one get and check its index; None when
    it is not stored. ``prefix`` (see `zarr_fused.io.local.local_files`)
    reads the file natively into a pooled buffer, first one of
    ``size_hint`` bytes (at least four times the index)."""
    n = math.prod(grid)
    size = fmt.size(n)
    buffer = None
    if prefix is not None:
        # a first guess of the shard's size; a bigger shard is opened again
        # (a round trip more on a network filesystem: callers that read
        # many shards pass the largest they have seen)
        start = time.perf_counter()
        buffer, length = _read_file(prefix + os.fsencode(key.path), max(4 * size, size_hint))
        note_local(key, "get", 1, max(length, 0), time.perf_counter() - start)
        if length == -1:
            buffers.give(buffer)
            return None
        data = buffer[:length]
    else:
        raw = key.get_sync(prototype=spec.prototype)
        if raw is None:
            return None
        data = raw.as_numpy_array()
    return whole_shard(data, key, fmt, grid, buffer)


def whole_shard(
    data: np.ndarray,
    key: Any,
    fmt: IndexFormat,
    grid: tuple[int, ...],
    buffer: np.ndarray | None = None,
) -> WholeShard:
    """The shard ``data`` read whole from ``key``, its index checked (the
    pooled ``buffer`` it lives in is given back when it is corrupt)."""
    n = math.prod(grid)
    size = fmt.size(n)
    length = len(data)
    if length < size:
        buffers.give(buffer)
        raise CorruptShardError.truncated(describe_key(key), length, size)
    start = 0 if fmt.at_start else length - size
    entries = fmt.parse(data[start : start + size], n, grid, key, length, start)
    return WholeShard(data, entries, buffer)


def _read_file(path: bytes, size_hint: int) -> tuple[np.ndarray, int]:
    """Read the whole file at ``path`` into a pooled buffer (first one of
    ``size_hint`` bytes, then one of the file's size if that was too small).

    Returns the buffer and the file's length, -1 when the file is missing.
    """
    buffer = buffers.take(size_hint)
    length = io_kernels.read_into(path, buffer)
    while length is not None and length > len(buffer):  # too small: length is the size
        buffers.give(buffer)
        buffer = buffers.take(length)
        length = io_kernels.read_into(path, buffer)
    return buffer, -1 if length is None else length


def stored_payloads(
    whole: WholeShard | None, grid: tuple[int, ...]
) -> tuple[list[Any], np.ndarray | None]:
    """The stored payload of every inner chunk of ``whole`` by linear
    index (views, None for none), and the pooled buffer they live in."""
    payloads: list[Any] = [None] * math.prod(grid)
    if whole is None:
        return payloads, None
    entries, data = whole.entries, whole.data
    for lin in np.flatnonzero(entries[:, 0] != MISSING_OFFSET):
        off, length = int(entries[lin, 0]), int(entries[lin, 1])
        payloads[lin] = data[off : off + length]
    return payloads, whole.buffer
