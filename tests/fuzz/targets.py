"""Fuzz targets: the entry points of zarr_fused that parse untrusted bytes.

Each target is a function of one ``bytes`` input that returns an outcome
name when zarr_fused behaved, and raises `Violation` when it did not. The
invariant, for every input:

* zarr_fused returns the same values as zarr's own pipeline
  (``BatchedCodecPipeline``) on the same stored bytes, or
* zarr_fused raises a typed error (`zarr_fused.errors.ZarrFusedError`)
  whose message names the store key;

and never crashes, hangs, or allocates more than `ALLOC_BOUND` bytes
(tracemalloc, which sees numpy's buffers and every Python object; the
instrumented build caps every single allocation, native ones included, with
ASan's ``max_allocation_size_mb``: one above it fails as MemoryError). The stored values are tiny (a few hundred bytes decoded), so
an allocation sized from a corrupt length field stands out at once.

Targets
-------
``index``
    `zarr_fused._shard_index.parse_index` on its own, checked against a
    pure-Python reading of the shard index rules (`reference_index`).
``chunk-<codecs>``
    The stored bytes of one chunk of an unsharded array whose codecs are
    ``bytes`` then ``<codecs>``; the whole chunk and a part of it are read.
``shard-whole`` / ``shard-partial``
    The stored bytes of one shard of a sharded array over a MemoryStore: the
    whole shard (one get, every inner chunk), or single inner chunks and a
    column of them (the index, then byte ranges). The first input byte picks
    the inner codecs, the index location and the index codecs.

Inputs run through zarr's public API: a `MemoryStore` whose dict holds the
input at the chunk's key, opened once with each pipeline.
"""

from __future__ import annotations

import itertools
import struct
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    ZstdCodec,
)
from zarr.core.buffer import cpu
from zarr.storage import MemoryStore

from zarr_fused._shard_index import parse_index
from zarr_fused.errors import CorruptShardError, ZarrFusedError

FUSED = "zarr_fused.FusedCodecPipeline"
ZARR = "zarr.core.codec_pipeline.BatchedCodecPipeline"

#: Peak traced allocation allowed for one zarr_fused read. Fixed costs (the
#: shard buffer pool hands out at least 64 KiB, zarr's indexers, numpy
#: temporaries) stay far below it; a buffer sized from a corrupt length
#: (megabytes to 2**64) does not.
ALLOC_BOUND = 4 << 20


MISSING = 2**64 - 1


class Violation(AssertionError):
    """zarr_fused broke the invariant on this input."""


# -- the shard index on its own ---------------------------------------------------


def reference_index(
    raw: bytes, n: int, *, checksum: bool, big_endian: bool, shard_len: int, index_start: int
) -> list[tuple[int, int]] | str:
    """The (offset, nbytes) pairs of a valid index, or why it is invalid.

    Written from the sharding specification and zarr_fused's documented
    checks, independently of `parse_index`: a pair is missing (both
    2**64-1) or a byte range that ends inside the shard, lies outside the
    index and overlaps no other range (empty ranges overlap nothing).
    """
    from zarr_fused._codecs import crc32c

    if len(raw) != 16 * n + (4 if checksum else 0):
        return "length"
    if checksum and struct.unpack("<I", raw[16 * n :])[0] != crc32c(raw[: 16 * n]):
        return "crc"
    pairs = list(struct.iter_unpack(">QQ" if big_endian else "<QQ", raw[: 16 * n]))
    index_end = index_start + len(raw)
    used = []
    for off, size in pairs:
        if (off, size) == (MISSING, MISSING):
            continue
        if MISSING in (off, size):
            return "half-missing"
        if off + size >= 2**64:
            return "overflow"
        if shard_len >= 0:
            if off + size > shard_len:
                return "past-end"
            if size and off < index_end and off + size > index_start:
                return "into-index"
        if size:
            used.append((off, off + size))
    used.sort()
    if any(b[0] < a[1] for a, b in itertools.pairwise(used)):
        return "overlap"
    return pairs


def target_index(data: bytes) -> str:
    """``data``: a flags byte (bit 0 crc32c, bit 1 big-endian, bit 2 whole
    shard known, bit 3 index at the start), the chunk count - 1 (mod 8), two
    bytes of payload length, then the index bytes."""
    if len(data) < 4:
        return "short"
    flags, n = data[0], 1 + data[1] % 8
    checksum, big_endian = bool(flags & 1), bool(flags & 2)
    known, at_start = bool(flags & 4), bool(flags & 8)
    raw = data[4:]
    payload = int.from_bytes(data[2:4], "little")
    shard_len = payload + len(raw) if known else -1
    index_start = 0 if at_start or not known else payload
    expected = reference_index(
        raw,
        n,
        checksum=checksum,
        big_endian=big_endian,
        shard_len=shard_len,
        index_start=index_start,
    )
    try:
        got = parse_index(
            raw,
            n,
            checksum=checksum,
            big_endian=big_endian,
            shard_len=shard_len,
            index_start=index_start,
            where="'c/0/0'",
        )
    except CorruptShardError as exc:
        if not isinstance(expected, str):
            raise Violation(f"parse_index rejected a valid index: {exc}") from exc
        if "'c/0/0'" not in str(exc):
            raise Violation(f"the error does not name the shard: {exc}") from exc
        return "rejected"
    if isinstance(expected, str):
        raise Violation(f"parse_index accepted an index that is invalid ({expected})")
    if got.dtype != np.uint64 or got.shape != (n, 2) or got.tolist() != [list(p) for p in expected]:
        raise Violation(f"parse_index returned {got.tolist()}, expected {expected}")
    return "accepted"


# -- reads through both pipelines ------------------------------------------------


@dataclass
class Pair:
    """One array definition opened with zarr's pipeline and with zarr_fused's,
    over one MemoryStore whose dict the target writes the input into."""

    store_dict: dict[str, Any]
    zarr_array: zarr.Array
    fused_array: zarr.Array
    key: str


_PAIRS: dict[Any, Pair] = {}


def _pair(config: Any, create: Callable[[MemoryStore], zarr.Array], key: str) -> Pair:
    pair = _PAIRS.get(config)
    if pair is None:
        store_dict: dict[str, Any] = {}
        store = MemoryStore(store_dict)
        with zarr.config.set({"codec_pipeline.path": ZARR}):
            zarr_array = create(store)
        with zarr.config.set({"codec_pipeline.path": FUSED}):
            fused_array = zarr.open_array(store, mode="r")
        pair = _PAIRS[config] = Pair(store_dict, zarr_array, fused_array, key)
    return pair


def _read(array: zarr.Array, selection: Any) -> Any:
    if isinstance(selection, tuple) and any(isinstance(s, list) for s in selection):
        return array.oindex[selection]
    return array[selection]


def _compare(pair: Pair, data: bytes, selections: list[Any]) -> str:
    """Store ``data`` at the pair's key, read ``selections`` both ways,
    check the invariant; returns the outcome of the last selection ("same",
    or "rejected" when zarr_fused raised its typed error).

    zarr_fused reads first, and zarr's pipeline is asked only about bytes
    zarr_fused accepted: numcodecs' bundled c-blosc crashes (SEGV in
    ``blosc_d``) on some crafted frames, which must not end a fuzz run that
    is about zarr_fused. A typed error naming the key meets the invariant
    whatever zarr would have said."""
    pair.store_dict[pair.key] = cpu.Buffer.from_bytes(data)
    outcome = "same"
    for selection in selections:
        tracing = tracemalloc.is_tracing()  # someone else's trace is left running
        if not tracing:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            try:
                got: Any = _read(pair.fused_array, selection)
            except ZarrFusedError as exc:
                got = exc
            except MemoryError as exc:
                raise Violation(f"{selection}: MemoryError instead of a typed error") from exc
            except Exception as exc:
                raise Violation(f"{selection}: untyped {type(exc).__name__}: {exc}") from exc
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            if not tracing:
                tracemalloc.stop()
        if peak > ALLOC_BOUND:
            raise Violation(
                f"{selection}: zarr_fused allocated {peak} bytes at peak (bound {ALLOC_BOUND})"
            )
        if isinstance(got, Exception):
            if pair.key not in str(got):
                raise Violation(f"{selection}: the error does not name {pair.key!r}: {got}")
            outcome = "rejected"
            continue
        try:
            expected: Any = _read(pair.zarr_array, selection)
        except Exception as exc:  # zarr's own verdict on these bytes
            raise Violation(
                f"{selection}: zarr_fused read values where zarr raised {type(exc).__name__}: {exc}"
            ) from exc
        if got.dtype != expected.dtype or not np.array_equal(got, expected):
            raise Violation(f"{selection}: zarr_fused read {got!r}, zarr read {expected!r}")
    return outcome


# -- one unsharded chunk ------------------------------------------------------------

CHUNK_CODECS: dict[str, Callable[[], list[Any]]] = {
    "zstd": lambda: [ZstdCodec(level=1)],
    "gzip": lambda: [GzipCodec(level=1)],
    "blosc": lambda: [BloscCodec(cname="lz4", clevel=1, typesize=2, shuffle="shuffle")],
    "crc32c": lambda: [Crc32cCodec()],
    "zstd-crc32c": lambda: [ZstdCodec(level=1), Crc32cCodec()],
    "crc32c-zstd": lambda: [Crc32cCodec(), ZstdCodec(level=1)],
}

CHUNK_SHAPE = (6, 5)
CHUNK_DTYPE = "<u2"
CHUNK_SELECTIONS = [Ellipsis, (slice(1, 4), slice(2, 5)), ([0, 5], [1, 3])]


def _chunk_array(name: str) -> Callable[[MemoryStore], zarr.Array]:
    def create(store: MemoryStore) -> zarr.Array:
        return zarr.create_array(
            store,
            shape=CHUNK_SHAPE,
            chunks=CHUNK_SHAPE,
            dtype=CHUNK_DTYPE,
            serializer=BytesCodec(),
            compressors=CHUNK_CODECS[name](),
            fill_value=7,
        )

    return create


def with_crc(body: bytes) -> bytes:
    """``body`` and its crc32c, as the crc32c codec stores it."""
    from zarr_fused._codecs import crc32c

    return body + struct.pack("<I", crc32c(body))


def chunk_target(name: str) -> Callable[[bytes], str]:
    """``data``: a flags byte, then the stored chunk. When the chain ends
    in crc32c and flag bit 0 is set, the last four bytes are replaced by the
    crc32c of the others, so mutations reach the codecs behind the checksum."""
    fix_crc = name.endswith("crc32c")

    def target(data: bytes) -> str:
        if not data:
            return "short"
        flags, stored = data[0], data[1:]
        if fix_crc and flags & 1 and len(stored) >= 4:
            stored = with_crc(stored[:-4])
        pair = _pair(("chunk", name), _chunk_array(name), "c/0/0")
        return _compare(pair, stored, CHUNK_SELECTIONS)

    target.__name__ = f"target_chunk_{name.replace('-', '_')}"
    return target


def chunk_seed(name: str) -> bytes:
    """The stored bytes of a valid chunk, for the seed corpus."""
    store_dict: dict[str, Any] = {}
    with zarr.config.set({"codec_pipeline.path": ZARR}):
        arr = _chunk_array(name)(MemoryStore(store_dict))
        arr[...] = np.arange(30, dtype=CHUNK_DTYPE).reshape(CHUNK_SHAPE) * 257
    return b"\x01" + store_dict["c/0/0"].to_bytes()


# -- one shard ------------------------------------------------------------------------

SHARD_SHAPE = (8, 6)
INNER_SHAPE = (4, 3)
SHARD_DTYPE = "<i2"
INNER_CODECS: list[Callable[[], list[Any]]] = [
    lambda: [BytesCodec()],
    lambda: [BytesCodec(), ZstdCodec(level=1)],
    lambda: [BytesCodec(), Crc32cCodec()],
    lambda: [BytesCodec(), GzipCodec(level=1)],
    lambda: [BytesCodec(), BloscCodec(cname="lz4", clevel=1, typesize=2)],
    lambda: [BytesCodec(), ZstdCodec(level=1), Crc32cCodec()],
]


@dataclass(frozen=True)
class ShardConfig:
    """The first input byte of a shard target: bits 0-3 the inner codecs
    (mod the table), bit 4 the index at the start, bit 5 no index crc32c,
    bit 6 a big-endian index. Bit 7 (not part of the array definition):
    recompute the index crc32c, so mutated entries get past it."""

    inner: int
    at_start: bool
    index_crc: bool
    big_endian: bool

    @classmethod
    def from_byte(cls, b: int) -> ShardConfig:
        return cls((b & 0x0F) % len(INNER_CODECS), bool(b & 0x10), not b & 0x20, bool(b & 0x40))

    def to_byte(self, fix_crc: bool = False) -> int:
        return (
            self.inner
            | (0x10 if self.at_start else 0)
            | (0 if self.index_crc else 0x20)
            | (0x40 if self.big_endian else 0)
            | (0x80 if fix_crc else 0)
        )

    def fix_index_crc(self, shard: bytes) -> bytes:
        size = 16 * 4 + 4
        if not self.index_crc or len(shard) < size:
            return shard
        if self.at_start:
            return with_crc(shard[: size - 4]) + shard[size:]
        return shard[: len(shard) - size] + with_crc(shard[len(shard) - size : -4])

    def create(self, store: MemoryStore) -> zarr.Array:
        index_codecs = [BytesCodec(endian="big" if self.big_endian else "little")]
        if self.index_crc:
            index_codecs.append(Crc32cCodec())
        serializer = ShardingCodec(
            chunk_shape=INNER_SHAPE,
            codecs=INNER_CODECS[self.inner](),
            index_codecs=index_codecs,
            index_location="start" if self.at_start else "end",
        )
        return zarr.create_array(
            store,
            shape=SHARD_SHAPE,
            chunks=SHARD_SHAPE,
            dtype=SHARD_DTYPE,
            serializer=serializer,
            compressors=None,
            fill_value=-1,
        )


WHOLE_SELECTIONS = [Ellipsis, ([0, 7], [1, 5])]
PARTIAL_SELECTIONS = [
    (slice(0, 4), slice(0, 3)),
    (slice(None), slice(4, 6)),
    (slice(5, 6), slice(1, 2)),
]


def _shard_target(selections: list[Any], partial: bool) -> Callable[[bytes], str]:
    def target(data: bytes) -> str:
        if not data:
            return "short"
        config = ShardConfig.from_byte(data[0])
        pair = _pair(("shard", config), config.create, "c/0/0")
        shard = config.fix_index_crc(data[1:]) if data[0] & 0x80 else data[1:]
        return _compare(pair, shard, selections)

    return target


def shard_seed(config: ShardConfig, fix_crc: bool = True) -> bytes:
    store_dict: dict[str, Any] = {}
    with zarr.config.set({"codec_pipeline.path": ZARR}):
        arr = config.create(MemoryStore(store_dict))
        arr[...] = np.arange(48, dtype=SHARD_DTYPE).reshape(SHARD_SHAPE) * 3 - 20
    return bytes([config.to_byte(fix_crc)]) + store_dict["c/0/0"].to_bytes()


TARGETS: dict[str, Callable[[bytes], str]] = {
    "index": target_index,
    **{f"chunk-{name}": chunk_target(name) for name in CHUNK_CODECS},
    "shard-whole": _shard_target(WHOLE_SELECTIONS, partial=False),
    "shard-partial": _shard_target(PARTIAL_SELECTIONS, partial=True),
}


#: Settings every target runs under: one thread (decodes inline, so a crash
#: or a hang points at the input), strict mode (a fallback to zarr's code
#: would hide the native path).
SETTINGS = {"codec_pipeline.max_workers": 1, "codec_pipeline.strict": True}


def configure() -> None:
    """Apply `SETTINGS` for the rest of the process (the fuzz runner)."""
    zarr.config.set(SETTINGS)
    # zarr's own arithmetic on corrupt indexes overflows numpy scalars
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"zarr\.")
