"""Shard indexes taken apart and put back, for crafting bad shards.

A sharded array's index is ``n`` (offset, nbytes) little-endian uint64
pairs, by default followed by their crc32c, at the end or the start of the
shard; `MISSING` in both fields marks an inner chunk that is not stored.
`corrupt` breaks a stored shard in each of the ways in `CORRUPTIONS`.
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


# the ways `corrupt` breaks a shard's index
CORRUPTIONS = [
    "truncated",
    "index-crc",
    "past-end",
    "huge-length",
    "overflow",
    "half-missing",
    "overlap",
    "into-index",
    "empty-entry",
]

# the corruptions every read must notice (the others may pass unnoticed by a
# partial read that does not touch the bad entry, never with wrong values)
ALWAYS_DETECTED = {
    "truncated",
    "index-crc",
    "overflow",
    "half-missing",
    "empty-entry",
    "huge-length",
}


def corrupt(shard: bytes, n: int, corruption: str, location: str) -> bytes:
    """``shard`` (``n`` inner chunks, at least two stored, a checksummed
    index at ``location``) broken as ``corruption`` says: the index cut in
    half or its checksum wrong, or one entry of the first stored inner chunk
    (``first``) rewritten with a valid checksum."""
    e = index_entries(shard, n, location)
    size = 16 * n + 4
    stored_at = [i for i, (o, _) in enumerate(e) if o != MISSING]
    first, last = stored_at[0], stored_at[-1]
    if corruption == "truncated":
        return shard[: size // 2]
    if corruption == "index-crc":
        return (
            shard[:-1] + bytes([shard[-1] ^ 1])
            if location == "end"
            else bytes([shard[0] ^ 1]) + shard[1:]
        )
    replace: dict[int, tuple[int, int]] = {
        "past-end": {first: (e[first][0], len(shard) * 2)},
        # ``first`` claims 1 TiB from where the last chunk was stored (now
        # missing, so no overlap gives it away): a partial read must not size
        # a buffer from that before the bytes arrive
        "huge-length": {first: (e[last][0], 2**40), last: (MISSING, MISSING)},
        "overflow": {first: (2**63, 2**63 + 5)},
        "half-missing": {first: (MISSING, 16)},
        # the second stored chunk starts inside the first
        "overlap": {stored_at[1]: (e[first][0] + 4, e[stored_at[1]][1])},
        "empty-entry": {first: (e[first][0] + 8, 0)},
        "into-index": {first: ((len(shard) - size) if location == "end" else 0, 16)},
    }[corruption]
    return with_index(shard, [replace.get(i, x) for i, x in enumerate(e)], location=location)
