"""The IO of `zarr_fused.read_regions`: the fan-out read's shards fetched on
the IO threads (as on slow files) or by the compute threads, each shard and
each touched inner chunk once; on files slowed by the faultfs shim and on S3
(moto). zarr's own BatchedCodecPipeline is the oracle of the values."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from shims import build_faultfs, child_env
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.errors import ChunkNotFoundError
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import regions as regions_module
from zarr_fused.shard.pipelined import ShardIO
from zarr_fused.shard.read import ShardReader

from helpers import BATCHED, FUSED, assert_same_values, run_in_python, with_pipeline
from helpers.s3_stores import new_prefix, open_store

SHAPE = (48, 24, 20)
SHARDS = (8, 12, 10)
INNER = (4, 4, 5)
#: rows from here on are never written: whole shards missing
WRITTEN = 32


def _create(store: Any) -> Any:
    """A sharded uint16 array of 6 x 2 x 2 shards of 2 x 3 x 2 inner chunks,
    each inner chunk checksummed; rows from `WRITTEN` on missing, and one
    inner chunk of fill value (not stored) inside a written shard."""
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store,
            shape=SHAPE,
            dtype="uint16",
            chunks=SHARDS,
            serializer=ShardingCodec(
                chunk_shape=INNER,
                codecs=[BytesCodec(), ZstdCodec(level=1), Crc32cCodec()],
                index_codecs=[BytesCodec(), Crc32cCodec()],
            ),
            compressors=None,
            fill_value=5,
        )
        data = np.random.default_rng(71).integers(0, 60000, size=SHAPE).astype("uint16")
        data[:4, :4, :5] = 5
        arr[:WRITTEN] = data[:WRITTEN]
    return arr


def _boxes(n: int, seed: int) -> list[tuple[slice, ...]]:
    """``n`` small unaligned boxes over the whole array (many in shared
    inner chunks, some in missing shards), then the first three again."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        start = [int(rng.integers(0, s)) for s in SHAPE]
        out.append(
            tuple(
                slice(a, min(s, a + int(rng.integers(1, 9))))
                for a, s in zip(start, SHAPE, strict=True)
            )
        )
    return out + out[:3]


def _expected(store: Any, selections: list[Any]) -> list[Any]:
    with with_pipeline(BATCHED):
        oracle = zarr.open_array(store, mode="r")
    return [oracle[sel] for sel in selections]


def _assert_all(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_same_values(g, e)


def _fused(store: Any) -> Any:
    with with_pipeline(FUSED):
        return zarr.open_array(store, mode="r")


def _no_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the staging read fail, so a test shows the fan-out read ran."""

    def staging(*args: Any) -> None:
        raise AssertionError("the staging read ran")

    monkeypatch.setattr(regions_module, "_read_planned", staging)


def _io_path(monkeypatch: pytest.MonkeyPatch, pipelined: bool) -> list[int]:
    """Send the fan-out's shards to the IO threads (``pipelined``) or to
    the compute threads, whatever the files' speed; returns a list that
    gets one entry per pipelined run."""
    runs: list[int] = []
    run = ShardIO.run

    def counted(self: ShardIO, read: Any, io_concurrency: int, max_workers: int) -> None:
        runs.append(len(read.shards))
        run(self, read, io_concurrency, max_workers)

    monkeypatch.setattr(ShardIO, "applies", lambda self, n, w, local: 4 if pipelined else 0)
    monkeypatch.setattr(ShardIO, "run", counted)
    return runs


def _touched(selections: list[tuple[slice, ...]]) -> dict[str, set[int]]:
    """The inner chunks (linear index in their shard) the boxes overlap, by
    shard key."""
    per_shard = tuple(s // i for s, i in zip(SHARDS, INNER, strict=True))
    out: dict[str, set[int]] = collections.defaultdict(set)
    for sel in selections:
        ranges = [
            range(s.start // i, (s.stop - 1) // i + 1) for s, i in zip(sel, INNER, strict=True)
        ]
        for coords in np.ndindex(*(len(r) for r in ranges)):
            unit = [r[c] for r, c in zip(ranges, coords, strict=True)]
            shard = "/".join(str(u // p) for u, p in zip(unit, per_shard, strict=True))
            lin = np.ravel_multi_index(
                tuple(u % p for u, p in zip(unit, per_shard, strict=True)), per_shard
            )
            out[f"c/{shard}"].add(int(lin))
    return out


@pytest.mark.parametrize("pipelined", [pytest.param(p, id=str(p)) for p in ("io", "direct")])
def test_fan_out_equals_zarr_on_either_io_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipelined: str
) -> None:
    store = LocalStore(tmp_path / "a")
    _create(store)
    selections = _boxes(60, seed=72)
    expected = _expected(store, selections)
    arr = _fused(store)
    _no_staging(monkeypatch)
    runs = _io_path(monkeypatch, pipelined == "io")
    _assert_all(zarr_fused.read_regions(arr, selections), expected)
    assert runs == ([len(_touched(selections))] if pipelined == "io" else [])


def test_pipelined_fan_out_fetches_each_shard_and_inner_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fetch per touched shard, asking for exactly the inner chunks the
    regions overlap, each once (or for the whole shard when all are)."""
    store = LocalStore(tmp_path / "a")
    _create(store)
    selections = _boxes(40, seed=73)
    arr = _fused(store)
    _io_path(monkeypatch, pipelined=True)
    fetches: list[tuple[str, Any]] = []
    fetch = ShardReader._fetch

    def counted(self: ShardReader, getter: Any, spec: Any, touched: Any, *args: Any) -> None:
        fetches.append((getter.path, None if touched is None else touched.tolist()))
        fetch(self, getter, spec, touched, *args)

    monkeypatch.setattr(ShardReader, "_fetch", counted)
    _assert_all(zarr_fused.read_regions(arr, selections), _expected(store, selections))
    expected = _touched(selections)
    n_inner = int(np.prod([s // i for s, i in zip(SHARDS, INNER, strict=True)]))
    assert sorted(path for path, _ in fetches) == sorted(expected)
    for path, touched in fetches:
        want = sorted(expected[path])
        assert (touched is None and len(want) == n_inner) or touched == want


def test_pipelined_fan_out_missing_shard_raises_when_zarr_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "a")
    _create(store)
    _io_path(monkeypatch, pipelined=True)
    with zarr.config.set({"array.read_missing_chunks": False}):
        arr = _fused(store)
        selections = [(slice(0, 3),), (slice(WRITTEN + 1, WRITTEN + 3), 0), *_boxes(6, seed=74)]
        with pytest.raises(ChunkNotFoundError, match=f"c/{WRITTEN // SHARDS[0]}/0/0"):
            zarr_fused.read_regions(arr, selections)
        # a missing inner chunk in a stored shard reads as the fill value
        inside = [(slice(0, 4), slice(0, 4), slice(0, 5)), (slice(1, 9), slice(2, 13), 3)]
        _assert_all(zarr_fused.read_regions(arr, inside), _expected(store, inside))


def test_pipelined_fan_out_corrupt_inner_chunk_names_its_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "a")
    _create(store)
    path = tmp_path / "a" / "c" / "1" / "0" / "1"
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0xFF  # inside the first stored inner chunk
    path.write_bytes(bytes(raw))
    arr = _fused(store)
    _io_path(monkeypatch, pipelined=True)
    with pytest.raises(Exception, match=r"shard .*c/1/0/1"):
        zarr_fused.read_regions(arr, [(slice(8, 16), slice(0, 12), slice(10, 20)), *_boxes(8, 75)])


# -- slow files: the faultfs shim's delay in a child process ------------------------------

SLOW_READ = r"""
import json, sys
import numpy as np, zarr
from zarr.storage import LocalStore
import zarr_fused
from zarr_fused.shard.pipelined import ShardIO

runs = []
run = ShardIO.run
def counted(self, read, io_concurrency, max_workers):
    runs.append(len(read.shards))
    run(self, read, io_concurrency, max_workers)
ShardIO.run = counted

selections = [tuple(slice(*b) for b in box) for box in json.loads(sys.argv[2])]
with zarr.config.set({"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
                      "codec_pipeline.max_workers": 2}):
    arr = zarr.open_array(LocalStore(sys.argv[1]), mode="r")
    got = zarr_fused.read_regions(arr, selections)
    again = zarr_fused.read_regions(arr, selections)
with zarr.config.set({"codec_pipeline.path": "zarr.core.codec_pipeline.BatchedCodecPipeline"}):
    whole = zarr.open_array(LocalStore(sys.argv[1]), mode="r")[...]
equal = all(np.array_equal(g, whole[s]) and np.array_equal(a, whole[s])
            for g, a, s in zip(got, again, selections))
print(json.dumps({"equal": equal, "runs": runs}))
"""


def test_fan_out_on_slow_files_goes_through_the_io_threads(tmp_path: Path) -> None:
    """Every open and read of the array's files waits 2 ms (a network
    filesystem's round trip): the fan-out's shards are fetched on the IO
    threads, and the values are zarr's."""
    shim = build_faultfs(tmp_path)
    root = tmp_path / "a"
    _create(LocalStore(root))
    selections = _boxes(30, seed=76)
    env = child_env(shim, marker=root, ops="open,read", mode="delay", delay_us=2000)
    boxes = json.dumps([[(s.start, s.stop) for s in sel] for sel in selections])
    done = run_in_python("-c", SLOW_READ, str(root), boxes, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["equal"]
    # slow files keep both reads on the IO threads (zarr_fused.io.probe)
    assert result["runs"] == [len(_touched(selections))] * 2


# -- S3 (moto) ---------------------------------------------------------------------------


def test_regions_on_s3_fetch_each_range_once(proxy: Any) -> None:
    """On an object store (the staging read): the values are zarr's, each
    shard's index is fetched once and no byte range twice."""
    pytest.importorskip("obstore.store")
    store = open_store("obstore", proxy, new_prefix())
    _create(store)
    selections = _boxes(40, seed=77)
    expected = _expected(store, selections)
    arr = _fused(store)
    proxy.reset()
    _assert_all(zarr_fused.read_regions(arr, selections), expected)
    gets = [(r.key, r.range) for r in proxy.reset().log if r.kind == "GET"]
    data_gets = [g for g in gets if not g[0].endswith("zarr.json")]
    assert len(data_gets) == len(set(data_gets))
    keys = {key.rsplit("/c/", 1)[-1] for key, _ in data_gets}
    assert keys == {k.removeprefix("c/") for k in _touched(selections)}
