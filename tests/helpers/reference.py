"""Pure-NumPy implementations of zarr_fused's kernels.

For testing and reference, not production (so it lives with the tests,
outside the installed package): every native kernel with a
simple equivalent is checked against the function here (and the pipeline as
a whole against zarr's own pipelines). Each one is written to be obviously
correct, not fast: NumPy for the element moves, numcodecs and the standard
library for the compressors, google_crc32c (zarr's own dependency) for the
checksums, and no code of zarr_fused's extensions.

=====================  ==============================================  =====
reference              kernel                                          tests
=====================  ==============================================  =====
`scatter`, `fill`      `zarr_fused._scatter.scatter` / ``.fill``       test_scatter
`decode_chunk`         a native chain's decode (`_codecs.ChainKernel`  test_native_chain
                       with `_codec_batch.DecodeBatch`)
`encode_chunk`         a native chain's encode (``EncodeBatch``)       test_native_chain
`parse_index`          `zarr_fused._shard_index.parse_index`           test_shard_read
`shard_index`          the index of a whole shard (slice + parse)      test_shard_read
`assemble_shard`       `zarr_fused._shard_index.assemble_shard`        test_shard_write
=====================  ==============================================  =====

Signatures follow the kernels; errors are the same exception classes (and,
for the shard index, name the same inner chunks).
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zarr_fused.errors import ChecksumError, ChunkSizeError, CorruptShardError, DecompressionError

__all__ = [
    "MISSING",
    "assemble_shard",
    "decode_chunk",
    "encode_chunk",
    "fill",
    "parse_index",
    "scatter",
    "shard_index",
]


def _view(out: np.ndarray, selection: Any) -> np.ndarray:
    if selection is None:
        return out
    if not isinstance(selection, tuple):
        selection = (selection,)
    for s in selection:
        # a Python bool is an int, but numpy takes it as a mask (a copy)
        if isinstance(s, bool) or not (isinstance(s, (slice, int, np.integer)) or s is Ellipsis):
            raise TypeError(
                f"scatter/fill take basic selections (slices and integers), got {type(s).__name__}"
            )
    if Ellipsis not in selection:
        selection = (*selection, Ellipsis)
    return out[selection]


def scatter(
    src: np.ndarray, out: np.ndarray | None = None, selection: Any = None, *, swap: bool = False
) -> np.ndarray:
    """Reference of `zarr_fused._scatter.scatter`."""
    if not isinstance(src, np.ndarray):
        raise TypeError(f"src must be a numpy.ndarray, got {type(src).__name__}")
    if src.dtype.hasobject:
        raise TypeError("scatter cannot copy object arrays")
    if swap and src.dtype.fields is not None:
        raise TypeError("scatter cannot swap the byte order of structured elements")
    want = src.dtype.newbyteorder() if swap else src.dtype
    if out is None:
        if selection is not None:
            raise ValueError("selection needs an out array")
        out = np.empty(src.shape, dtype=want)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    view = _view(out, selection)
    if view.shape != src.shape:
        raise ValueError(f"destination shape {view.shape} does not match source shape {src.shape}")
    if view.dtype != want:
        raise TypeError(f"destination dtype {view.dtype} does not match {want} (swap={swap})")
    if np.may_share_memory(src, view):
        raise ValueError("src and out overlap")
    # with swap, ``want`` is src's dtype in the opposite byte order, so the
    # value-preserving assignment is exactly a per-element byte reversal
    view[...] = src
    return out


def fill(out: np.ndarray, value: Any, selection: Any = None) -> np.ndarray:
    """Reference of `zarr_fused._scatter.fill`."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype.hasobject:
        raise TypeError("fill cannot write object arrays")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    _view(out, selection)[...] = value
    return out


# -- codec chains ----------------------------------------------------------------------
#
# The chains the native kernels run (see `zarr_fused._chain.native_chain_params`):
# ``[transpose...] -> bytes(endian) -> bytes->bytes codecs`` where the last
# are any of crc32c, zstd, gzip and blosc (at most one compressor). The
# functions take the codecs as zarr holds them for one chunk (after
# `zarr.core.chunk_utils.evolve_codecs`, so blosc's typesize is set) and the
# chunk's `ArraySpec`, like `zarr_fused._chain.Chain`.


def _crc32c(data: bytes) -> int:
    import google_crc32c

    return int(google_crc32c.value(data))


def _split_chain(codecs: Sequence[Any]) -> tuple[list[tuple[int, ...]], Any, list[Any]]:
    """(transpose orders, the bytes codec, the bytes->bytes codecs)."""
    from zarr.codecs import BytesCodec, TransposeCodec

    orders = []
    index = 0
    while index < len(codecs) and type(codecs[index]) is TransposeCodec:
        orders.append(tuple(codecs[index].order))
        index += 1
    if index >= len(codecs) or type(codecs[index]) is not BytesCodec:
        names = " -> ".join(type(c).__name__ for c in codecs)
        raise ValueError(f"not a chain the native kernels run: {names}")
    return orders, codecs[index], list(codecs[index + 1 :])


def _stored_dtype(dtype: np.dtype[Any], endian: str | None) -> np.dtype[Any]:
    """``dtype`` in the byte order the bytes codec stores (a no-op for data
    types without one: bool, int8, S, V)."""
    if endian is None:
        return dtype
    return dtype.newbyteorder("<" if endian == "little" else ">")


def _bytes_codec(codec: Any) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """(encode, decode) of one bytes->bytes codec."""
    import numcodecs
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    kind = type(codec)
    if kind is Crc32cCodec:

        def crc_encode(data: bytes) -> bytes:
            return data + _crc32c(data).to_bytes(4, "little")

        def crc_decode(data: bytes) -> bytes:
            if len(data) < 4:
                raise ChecksumError(f"chunk: {len(data)} bytes cannot hold a crc32c checksum")
            stored = int.from_bytes(data[-4:], "little")
            computed = _crc32c(data[:-4])
            if stored != computed:
                raise ChecksumError(
                    f"chunk: crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )
            return data[:-4]

        return crc_encode, crc_decode
    if kind is ZstdCodec:
        zstd = numcodecs.Zstd(level=codec.level, checksum=codec.checksum)
        return (lambda data: bytes(zstd.encode(data))), (lambda data: bytes(zstd.decode(data)))
    if kind is GzipCodec:
        level = codec.level
        # MTIME 0, as zarr_fused writes it (zarr writes the current time)
        return ((lambda data: gzip.compress(data, compresslevel=level, mtime=0)), gzip.decompress)
    if kind is BloscCodec:
        shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[codec.shuffle]
        blosc = numcodecs.Blosc(
            cname=codec.cname,
            clevel=codec.clevel,
            shuffle=shuffle,
            blocksize=codec.blocksize,
            typesize=codec.typesize,
        )
        return (lambda data: bytes(blosc.encode(data))), (lambda data: bytes(blosc.decode(data)))
    raise ValueError(f"not a codec the native kernels run: {kind.__name__}")


def encode_chunk(chunk: np.ndarray, codecs: Sequence[Any], spec: Any) -> bytes:
    """Reference of a native chain's encode of one chunk.

    Parameters
    ----------
    chunk : numpy.ndarray
        The chunk, of shape ``spec.shape``, in any memory layout and byte
        order of the array's data type.
    codecs : sequence of zarr codecs
        ``[TransposeCodec...] BytesCodec [Crc32cCodec | ZstdCodec |
        GzipCodec | BloscCodec ...]``, evolved for ``spec``.
    spec : zarr.core.array_spec.ArraySpec
        The chunk's spec (shape and data type).

    Returns
    -------
    bytes
        What the chain stores.
    """
    orders, bytes_codec, tail = _split_chain(codecs)
    chunk = np.asarray(chunk)
    if chunk.shape != tuple(spec.shape):
        raise ValueError(f"chunk shape {chunk.shape} does not match the spec's {spec.shape}")
    for order in orders:
        chunk = chunk.transpose(order)
    stored = _stored_dtype(spec.dtype.to_native_dtype(), bytes_codec.endian)
    data = chunk.astype(stored).tobytes(order="C")
    for codec in tail:
        data = _bytes_codec(codec)[0](data)
    return data


def decode_chunk(payload: Any, codecs: Sequence[Any], spec: Any) -> np.ndarray:
    """Reference of a native chain's decode of one chunk.

    Parameters
    ----------
    payload : bytes-like
        The stored chunk.
    codecs, spec
        As for `encode_chunk`.

    Returns
    -------
    numpy.ndarray
        The chunk: shape ``spec.shape``, the array's data type in native
        byte order (``spec.dtype.to_native_dtype()``), C-contiguous.

    Raises
    ------
    ChecksumError
        A crc32c does not match (or the bytes are too short for one).
    DecompressionError
        A compressor rejects its frame.
    ChunkSizeError
        The bytes are not the chunk's size once decoded.
    """
    orders, bytes_codec, tail = _split_chain(codecs)
    data = bytes(memoryview(payload).cast("B"))
    for codec in reversed(tail):
        decode = _bytes_codec(codec)[1]
        try:
            data = decode(data)
        except ChecksumError:
            raise
        except (RuntimeError, ValueError, OSError, EOFError, zlib.error) as exc:
            raise DecompressionError(f"chunk: {type(codec).__name__}: {exc}") from exc
    dtype = spec.dtype.to_native_dtype()
    stored = _stored_dtype(dtype, bytes_codec.endian)
    shape = tuple(spec.shape)
    for order in orders:
        shape = tuple(shape[i] for i in order)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != nbytes:
        raise ChunkSizeError(f"chunk: decodes to {len(data)} bytes, the chunk needs {nbytes}")
    chunk = np.frombuffer(data, dtype=stored).reshape(shape)
    for order in reversed(orders):
        chunk = chunk.transpose(np.argsort(order))
    return chunk.astype(dtype, order="C")


# -- shards ----------------------------------------------------------------------------
#
# A shard is its present inner chunks' payloads back to back, with an index
# before or after them: per inner chunk (C order of the chunk grid) an
# (offset, nbytes) pair of 64-bit unsigned integers, both 2**64-1 for a
# missing chunk, encoded by ``index_codecs`` (``bytes`` in either byte
# order, then optionally ``crc32c``). Offsets count from the shard's start.

#: the index entry field of a missing inner chunk
MISSING = 2**64 - 1


def _index_size(n_chunks: int, checksum: bool) -> int:
    return 16 * n_chunks + (4 if checksum else 0)


def _name(i: int, grid: tuple[int, ...] | None) -> str:
    coords = np.unravel_index(i, grid) if grid is not None else (i,)
    return "inner chunk (" + ", ".join(str(int(c)) for c in coords) + ")"


def _entries_problem(
    entries: np.ndarray,
    shard_len: int,
    index_start: int,
    index_len: int,
    grid: tuple[int, ...] | None,
) -> str | None:
    """None when every entry is missing or a byte range inside the shard,
    outside its index, overlapping no other; else what is wrong with the
    first bad entry (in index order; an overlap names the later-starting
    chunk and the one it overlaps)."""
    spans = []
    for i, (off, size) in enumerate(entries.tolist()):
        if off == MISSING and size == MISSING:
            continue
        bad = _name(i, grid)
        if off == MISSING or size == MISSING:
            return f"{bad} has a half-missing entry ({off:#x}, {size:#x})"
        end = off + size
        if end > MISSING:
            return f"{bad} has a range that overflows ({off:#x}, {size:#x})"
        if shard_len >= 0:
            if end > shard_len:
                return f"{bad} ends at byte {end}, past the shard's {shard_len} bytes"
            if size and off < index_start + index_len and end > index_start:
                return f"{bad} lies in the shard index (bytes {off}..{end})"
        if size:
            spans.append((off, end, i))
    spans.sort(key=lambda span: span[0])
    for (_, prev_end, prev), (start, end, i) in itertools.pairwise(spans):
        if start < prev_end:
            return f"{_name(i, grid)} overlaps {_name(prev, grid)} (bytes {start}..{end})"
    return None


def parse_index(
    index: Any,
    n_chunks: int,
    *,
    checksum: bool,
    big_endian: bool,
    shard_len: int = -1,
    index_start: int = 0,
    grid: tuple[int, ...] | None = None,
    where: Any = "shard",
) -> np.ndarray:
    """Reference of `zarr_fused._shard_index.parse_index` (same parameters).

    Returns
    -------
    numpy.ndarray
        ``(n_chunks, 2)`` native uint64 (offset, nbytes); `MISSING` in both
        for a missing chunk.
    """
    raw = bytes(memoryview(index).cast("B"))
    expected = _index_size(n_chunks, checksum)
    if len(raw) != expected:
        raise CorruptShardError.truncated(where() if callable(where) else where, len(raw), expected)
    body = raw[: 16 * n_chunks]
    if checksum:
        stored = int.from_bytes(raw[16 * n_chunks :], "little")
        computed = _crc32c(body)
        if stored != computed:
            where = where() if callable(where) else where
            raise CorruptShardError(
                f"{where}: crc32c mismatch in the shard index "
                f"(stored {stored:#010x}, computed {computed:#010x})"
            )
    entries = np.frombuffer(body, dtype=">u8" if big_endian else "<u8").reshape(n_chunks, 2)
    entries = entries.astype(np.uint64)
    problem = _entries_problem(entries, shard_len, index_start, expected, grid)
    if problem is not None:
        raise CorruptShardError(f"{where() if callable(where) else where}: {problem}")
    return entries


def shard_index(
    shard: Any,
    n_chunks: int,
    *,
    at_start: bool,
    checksum: bool,
    big_endian: bool,
    grid: tuple[int, ...] | None = None,
    where: Any = "shard",
) -> np.ndarray:
    """The checked index of a whole stored shard: its first or last
    ``16 * n_chunks (+ 4)`` bytes, through `parse_index` with the shard's
    length and index position."""
    raw = bytes(memoryview(shard).cast("B"))
    size = _index_size(n_chunks, checksum)
    if len(raw) < size:
        raise CorruptShardError.truncated(where() if callable(where) else where, len(raw), size)
    start = 0 if at_start else len(raw) - size
    return parse_index(
        raw[start : start + size],
        n_chunks,
        checksum=checksum,
        big_endian=big_endian,
        shard_len=len(raw),
        index_start=start,
        grid=grid,
        where=where,
    )


def assemble_shard(
    order: Any, payloads: Sequence[Any], *, at_start: bool, checksum: bool, big_endian: bool
) -> bytes | None:
    """Reference of `zarr_fused._shard_index.assemble_shard`: the stored shard.

    Parameters
    ----------
    order : sequence of int
        Every inner chunk's linear index (C order of the chunk grid), once,
        in the order the payloads are stored.
    payloads : sequence
        Per linear index, the chunk's bytes, or None when it is missing (an
        empty payload is missing too, as in zarr).
    at_start, checksum, big_endian : bool
        Index location and codecs (``bytes`` in that byte order, then an
        optional ``crc32c``).

    Returns
    -------
    bytes or None
        None when no chunk is present (the shard is deleted).
    """
    n = len(payloads)
    order = [int(i) for i in order]
    if sorted(order) != list(range(n)):
        raise ValueError("order must list every inner chunk once")
    entries = np.full((n, 2), MISSING, dtype=np.uint64)
    pos = _index_size(n, checksum) if at_start else 0
    data = []
    for i in order:
        payload = payloads[i]
        if payload is None or len(payload) == 0:
            continue
        payload = bytes(memoryview(payload).cast("B"))
        entries[i] = (pos, len(payload))
        pos += len(payload)
        data.append(payload)
    if not data:
        return None
    index = entries.astype(">u8" if big_endian else "<u8").tobytes()
    if checksum:
        index += _crc32c(index).to_bytes(4, "little")
    return index + b"".join(data) if at_start else b"".join(data) + index
