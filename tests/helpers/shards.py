"""Shard indexes taken apart and put back, for crafting bad shards.

A sharded array's index is ``n`` (offset, nbytes) little-endian uint64
pairs, by default followed by their crc32c, at the end or the start of the
shard; `MISSING` in both fields marks an inner chunk that is not stored.
"""

from __future__ import annotations

import struct

MISSING = 2**64 - 1


def index_entries(shard: bytes, n: int, location: str = "end") -> list[tuple[int, int]]:
    """The ``n`` (offset, nbytes) entries of ``shard``'s checksummed index."""
    size = 16 * n + 4
    index = shard[:size] if location == "start" else shard[-size:]
    return [struct.unpack_from("<QQ", index, 16 * i) for i in range(n)]


def with_index(
    shard: bytes, entries: list[tuple[int, int]], *, location: str = "end", crc: bool = True
) -> bytes:
    """``shard`` with its index replaced by ``entries`` (crc recomputed)."""
    from zarr_fused._codecs import crc32c

    n = len(entries)
    size = 16 * n + (4 if crc else 0)
    body = shard[size:] if location == "start" else shard[: len(shard) - size]
    index = b"".join(struct.pack("<QQ", o, s) for o, s in entries)
    if crc:
        index += struct.pack("<I", crc32c(index))
    return index + body if location == "start" else body + index
