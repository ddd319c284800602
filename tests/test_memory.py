"""Memory bounds: whole-array reads and writes, and decompression bombs.

Each measurement runs in a fresh child process (a test process's heap,
grown and freed by earlier tests, would hide growth). The child warms up
(one small read and write, so libraries, pools and codec contexts exist),
resets its peak resident size (``echo 5 > /proc/self/clear_refs``), runs
the operation and reports how far the peak (``VmHWM``) rose above the
resident size before it.

Bounds (docs/reliability.md): a whole-array read of an N-byte array grows
the peak by at most N plus SLACK; a whole-array write by at most SLACK
(here: 16 MiB arrays, chunks and shards of at most 2 MiB, two workers;
SLACK is half the array, so one extra copy of it fails the bound).
A stored chunk that decompresses, or claims to decompress, to far more than
its chunk holds raises a `CorruptChunkError` naming the key after growing
the peak by at most SLACK, however big the bomb is.
"""

from __future__ import annotations

import functools
import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
from shims import FaultyChild, child_env, communicate
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec
from zarr.storage import LocalStore

from helpers import FUSED, with_pipeline

TIMEOUT = 120.0
MIB = 1 << 20
SLACK = 8 * MIB
SHAPE = (1024, 4096)  # int32: 16 MiB
LAYOUTS = {
    "chunked": {"chunks": (256, 1024), "compressors": ZstdCodec(level=1)},  # 1 MiB chunks
    "sharded": {"chunks": (64, 256), "shards": (128, 4096), "compressors": ZstdCodec(level=1)},
}

# Run with ``args`` given, leaves its outcome in ``result``.
MEASURE = r"""
import numpy as np, zarr
from zarr.storage import LocalStore

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)

result = {}
config = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
          "codec_pipeline.max_workers": 2}
with zarr.config.set(config):
    arr = zarr.open_array(LocalStore(args["root"]), mode="r+")
    pipeline = type(arr._async_array.codec_pipeline)
    result["pipeline"] = pipeline.__module__ + "." + pipeline.__qualname__
    warm = tuple(slice(a, b) for a, b in args["warm"])
    arr[warm] = arr[warm]
    value = values = None
    if args["op"] == "write":
        rng = np.random.default_rng(args["seed"])
        value = rng.integers(0, 1000, size=arr.shape, dtype=arr.dtype)
    sel = tuple(slice(a, b) for a, b in args["selection"])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    try:
        if args["op"] == "write":
            arr[sel] = value
        else:
            values = arr[sel]
        result["ok"] = True
    except Exception as e:
        result.update(ok=False, mro=[c.__name__ for c in type(e).__mro__], message=str(e))
    result["growth"] = status("VmHWM") - before
    if values is not None:
        result["nbytes"] = values.nbytes
        result["checksum"] = int(values.astype(np.int64).sum())
"""
# the same in a fresh process
FRESH = (
    "import json, sys\nargs = json.loads(sys.argv[1])\n" + MEASURE + "print(json.dumps(result))\n"
)


def clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not clear_refs_works(),
    reason="needs Linux's /proc/self/clear_refs to reset the peak resident size",
)


def measure_args(
    root: Path, op: str, selection: tuple[slice, ...], warm: tuple[slice, ...], seed: int = 0
) -> dict[str, Any]:
    return {
        "root": str(root),
        "op": op,
        "seed": seed,
        "selection": [(s.start, s.stop) for s in selection],
        "warm": [(s.start, s.stop) for s in warm],
    }


def measure(
    root: Path, op: str, selection: tuple[slice, ...], warm: tuple[slice, ...], seed: int = 0
) -> dict[str, Any]:
    """Measured in a fresh process."""
    args = measure_args(root, op, selection, warm, seed)
    proc = subprocess.Popen(
        [sys.executable, "-c", FRESH, json.dumps(args)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = communicate(proc, TIMEOUT)
    assert proc.returncode == 0, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["pipeline"] == FUSED
    return result


# -- whole arrays ----------------------------------------------------------------------

ALL = (slice(None), slice(None))
WARM = (slice(0, 256), slice(0, 4096))  # a few chunks or shards, whole


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    data = (np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE) % 1009).astype("int32")
    out = {}
    for layout, kwargs in LAYOUTS.items():
        root = tmp_path_factory.mktemp("memory") / layout
        with with_pipeline(FUSED):
            arr = zarr.create_array(LocalStore(root), shape=SHAPE, dtype="int32", **kwargs)
            arr[...] = data
        out[layout] = (root, data)
    return out


@pytest.mark.parametrize("layout", [pytest.param(k, id=k) for k in LAYOUTS])
def test_whole_array_read_grows_memory_by_its_output_only(
    stored: dict[str, tuple[Path, np.ndarray]], layout: str
) -> None:
    root, data = stored[layout]
    result = measure(root, "read", ALL, WARM)
    assert result["ok"], result
    assert result["checksum"] == int(data.astype(np.int64).sum())
    assert result["nbytes"] == data.nbytes
    assert result["growth"] <= data.nbytes + SLACK, (
        f"peak grew by {result['growth'] / MIB:.1f} MiB for a {data.nbytes / MIB:.0f} MiB read"
    )


@pytest.mark.parametrize("layout", [pytest.param(k, id=k) for k in LAYOUTS])
def test_whole_array_write_needs_no_copy_of_its_input(
    tmp_path: Path, stored: dict[str, tuple[Path, np.ndarray]], layout: str
) -> None:
    _, data = stored[layout]
    root = tmp_path / layout
    with with_pipeline(FUSED):  # a copy of the stored array to overwrite
        zarr.create_array(LocalStore(root), shape=SHAPE, dtype="int32", **LAYOUTS[layout])[...] = (
            data
        )
    result = measure(root, "write", ALL, WARM, seed=3)
    assert result["ok"], result
    assert result["growth"] <= SLACK, (
        f"peak grew by {result['growth'] / MIB:.1f} MiB writing {np.prod(SHAPE) * 4 / MIB:.0f} MiB"
    )
    expected = np.random.default_rng(3).integers(0, 1000, size=SHAPE, dtype="int32")
    with with_pipeline(FUSED):
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], expected)


# -- decompression bombs ---------------------------------------------------------------

BOMB_SHAPE = (256, 128)
BOMB_CHUNKS = (64, 64)  # int32: 16 KiB decoded
GIB = 1 << 30


def zstd_rle_frame(decoded: int, *, claim: int | None = None) -> bytes:
    """A valid zstd frame of RLE blocks (4 bytes for each 128 KiB of output):
    ``decoded`` bytes of 0x07, with a content size in its header only when
    ``claim`` is given (then that is the size it claims)."""
    block = 1 << 17
    if claim is None:  # no content size; a 128 KiB window
        out = bytearray(struct.pack("<I", 0xFD2FB528)) + bytes([0x00, 0x38])
    else:  # single segment, an 8-byte content size
        out = bytearray(struct.pack("<I", 0xFD2FB528)) + bytes([0xE0]) + struct.pack("<Q", claim)
    sizes = [block] * (decoded // block) + ([decoded % block] if decoded % block else [])
    for i, size in enumerate(sizes):
        header = (i == len(sizes) - 1) | (1 << 1) | (size << 3)
        out += header.to_bytes(3, "little") + b"\x07"
    return bytes(out)


@functools.cache
def gzip_of_zeros(decoded: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    parts = [compressor.compress(zeros) for _ in range(decoded // MIB)]
    return b"".join(parts) + compressor.flush()


@functools.cache
def blosc_of_zeros(decoded: int) -> bytes:
    import numcodecs

    blosc = numcodecs.Blosc(
        cname="zstd", clevel=5, shuffle=numcodecs.Blosc.NOSHUFFLE, blocksize=1 << 24
    )
    return bytes(blosc.encode(bytes(decoded)))


BOMBS = {
    # a frame that says it holds 1 TiB
    "zstd-claims-1TiB": (ZstdCodec(level=1), lambda: zstd_rle_frame(1 << 10, claim=1 << 40)),
    # a 32 KiB frame, no size in its header, that decodes to 1 GiB
    "zstd-decodes-1GiB": (ZstdCodec(level=1), lambda: zstd_rle_frame(GIB)),
    # 64 MiB of zeros in 64 KiB of gzip
    "gzip-decodes-64MiB": (GzipCodec(level=1), lambda: gzip_of_zeros(64 * MIB)),
    # 256 MiB of zeros in 9 KiB of blosc (its header says so)
    "blosc-holds-256MiB": (BloscCodec(cname="zstd", clevel=5), lambda: blosc_of_zeros(256 * MIB)),
}


def shard_with_inner(shard: bytes, inner: int, payload: bytes, n_inner: int) -> bytes:
    """``shard`` (index at the end: offset/length pairs and a crc32c) with
    inner chunk ``inner`` replaced by ``payload``, appended after the others."""
    index_size = 16 * n_inner + 4
    body, index = shard[:-index_size], shard[-index_size:]
    entries = np.frombuffer(index[:-4], "<u8").reshape(n_inner, 2).copy()
    assert struct.unpack("<I", index[-4:])[0] == google_crc32c.value(index[:-4])
    entries[inner] = (len(body), len(payload))
    new_index = entries.tobytes()
    return body + payload + new_index + struct.pack("<I", google_crc32c.value(new_index))


def plant_bomb(root: Path, bomb: str, sharded: bool) -> None:
    """An array whose chunk c/0/0 (or the first inner chunk of shard c/0/0)
    is the bomb; every other chunk valid."""
    codec, make = BOMBS[bomb]
    kwargs: dict[str, Any] = {"chunks": BOMB_CHUNKS, "compressors": codec}
    if sharded:
        kwargs["shards"] = (128, 128)
    data = np.arange(np.prod(BOMB_SHAPE), dtype="int32").reshape(BOMB_SHAPE)
    with with_pipeline(FUSED):
        zarr.create_array(LocalStore(root), shape=BOMB_SHAPE, dtype="int32", **kwargs)[...] = data
    path = root / "c" / "0" / "0"
    payload = make()
    if sharded:
        payload = shard_with_inner(path.read_bytes(), 0, payload, n_inner=4)
    path.write_bytes(payload)


@pytest.fixture(scope="module")
def reader() -> Iterator[FaultyChild]:
    """One child for the bombs: each case resets the peak before it reads,
    and no case frees enough for a bomb's growth to hide in."""
    with FaultyChild(None, timeout=TIMEOUT) as child:
        yield child


@pytest.mark.parametrize(
    ("sharded", "selection"),
    [
        pytest.param(False, ALL, id="chunk"),
        pytest.param(True, ALL, id="inner-chunk-whole"),
        # only the bomb's inner chunk, read by byte range
        pytest.param(True, (slice(1, 3), slice(2, 5)), id="inner-chunk-small"),
    ],
)
@pytest.mark.parametrize("bomb", [pytest.param(k, id=k) for k in BOMBS])
def test_decompression_bomb_raises_without_growing_memory(
    tmp_path: Path, reader: FaultyChild, bomb: str, sharded: bool, selection: tuple[slice, ...]
) -> None:
    root = tmp_path / "arr"
    plant_bomb(root, bomb, sharded)
    assert (root / "c" / "0" / "0").stat().st_size < 128 * 1024  # small on disk

    answer = reader.run(
        MEASURE, measure_args(root, "read", selection, warm=(slice(128, 256), slice(0, 128)))
    )

    assert answer["ok"], answer.get("traceback")
    result = answer["result"]
    assert result["pipeline"] == FUSED
    assert not result["ok"], "the bomb was decoded"
    assert "CorruptChunkError" in result["mro"], result
    assert "c/0/0" in result["message"], result
    assert result["growth"] <= SLACK, f"peak grew by {result['growth'] / MIB:.1f} MiB"


def test_the_bombs_are_what_they_claim() -> None:
    """The frames are valid where it matters: zarr's codecs decode smaller
    versions of them to exactly the bytes they say."""
    import numcodecs

    assert bytes(numcodecs.Zstd().decode(zstd_rle_frame(3 * (1 << 17) + 5))) == b"\x07" * (
        3 * (1 << 17) + 5
    )
    assert zlib.decompress(gzip_of_zeros(2 * MIB), 16 + zlib.MAX_WBITS) == bytes(2 * MIB)
    assert len(zstd_rle_frame(GIB)) < 33 * 1024
    assert len(gzip_of_zeros(64 * MIB)) < 128 * 1024
    assert numcodecs.Blosc().decode(blosc_of_zeros(2 * MIB)) == bytes(2 * MIB)
