"""Write the seed corpus: valid stored bytes for every target, and a few
corrupt variants near the checks. Run from the repository root:

    python tests/fuzz/seeds.py

Seeds are written by zarr's own pipeline, so they stay valid only as long as
zarr's format does; the corpus replay test fails when a seed stops reading.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import targets
from targets import CHUNK_CODECS, ShardConfig, chunk_seed, shard_seed

CORPUS = HERE / "corpus"


def _index_of(seed: bytes, config: ShardConfig) -> tuple[bytes, int]:
    """The index bytes of a shard seed and the payload length around them."""
    shard = seed[1:]
    size = 64 + (4 if config.index_crc else 0)
    raw = shard[:size] if config.at_start else shard[len(shard) - size :]
    return raw, len(shard) - size


def tampered_blosc_chunk() -> bytes:
    """A stored (memcpyed) blosc chunk of the ``chunk-blosc`` array whose
    flags byte 0x33 (lz4, shuffle, stored, blocks not split) was changed to
    0x45 (snappy, byte and bit shuffle, compressed). Its 60 bytes are chosen
    so that they also read as one snappy block: a c-blosc built with snappy
    (Debian's) decodes the tampered chunk into other values without an
    error, where numcodecs' c-blosc (no snappy) raises."""
    snappy = bytes([60, 3 << 2]) + b"ABCD"  # 60 bytes: 4 literals, then copies
    snappy += bytes([((11 - 4) << 2) | 1, 4]) * 4 + bytes([((8 - 4) << 2) | 1, 4, 1, 4])
    body = struct.pack("<II", 20, len(snappy)) + snappy  # the block start, its size
    body += bytes(range(100, 100 + 60 - len(body)))
    return b"\x01" + struct.pack("<BBBBIII", 2, 1, 0x45, 2, 60, 60, 76) + body


def seeds() -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for name in CHUNK_CODECS:
        valid = chunk_seed(name)
        flipped = bytearray(valid)
        flipped[len(valid) // 2] ^= 0x40
        out[f"chunk-{name}"] = {
            "valid": valid,
            "flipped": bytes(flipped),
            "truncated": valid[: len(valid) * 2 // 3],
        }
    out["chunk-blosc"]["stored-flags-tampered"] = tampered_blosc_chunk()
    configs = [
        ShardConfig(0, False, True, False),
        ShardConfig(1, True, True, False),
        ShardConfig(2, False, False, True),
        ShardConfig(5, False, True, False),
    ]
    whole, partial, index = {}, {}, {}
    for c in configs:
        seed = shard_seed(c)
        tag = f"inner{c.inner}-{'start' if c.at_start else 'end'}"
        tag += ("-crc" if c.index_crc else "") + ("-be" if c.big_endian else "")
        whole[tag] = partial[tag] = seed
        raw, payload = _index_of(seed, c)
        flags = (
            (1 if c.index_crc else 0) | (2 if c.big_endian else 0) | 4 | (8 if c.at_start else 0)
        )
        index[tag] = bytes([flags, 3]) + struct.pack("<H", payload) + raw
    # entries pointing past the shard (the raw codecs, no index crc): one
    # too long, one of the right length that starts past the end (a reader
    # that trusted it would copy from beyond the shard's buffer)
    c = ShardConfig(0, False, False, False)
    seed = bytearray(shard_seed(c))
    struct.pack_into("<QQ", seed, len(seed) - 64, 0, 4096)
    whole["past-end"] = partial["past-end"] = bytes(seed)
    seed = bytearray(shard_seed(c))
    inner_nbytes = 4 * 3 * 2
    struct.pack_into("<QQ", seed, len(seed) - 64, len(seed) + 64, inner_nbytes)
    whole["starts-past-end"] = partial["starts-past-end"] = bytes(seed)
    out["shard-whole"], out["shard-partial"], out["index"] = whole, partial, index
    return out


def main() -> None:
    targets.configure()
    for target, files in seeds().items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"corpus: {total} bytes in {CORPUS}")


if __name__ == "__main__":
    main()
