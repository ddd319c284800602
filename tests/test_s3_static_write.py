"""The light static S3 server with writes (`zarr_fused_testing.s3_static`,
``writable=True``), as the write benchmarks use it: zarr arrays written
through zarr's ``ObjectStore`` (obstore) and ``FsspecStore`` (s3fs) by our
pipeline land as the same objects, with the same PUTs, as zarr's
BatchedCodecPipeline writes; and the S3 answers the clients rely on."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr_fused_testing.s3 import BUCKET, obstore_s3
from zarr_fused_testing.s3_static import StaticS3Server

from helpers import BATCHED, FUSED, assert_same_values
from helpers.s3_stores import open_store

obstore = pytest.importorskip("obstore")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticS3Server]:
    root = tmp_path_factory.mktemp("static-s3-write")
    (root / BUCKET).mkdir()
    with StaticS3Server(root, writable=True) as served:
        yield served


def objects(server: StaticS3Server, prefix: str) -> dict[str, bytes]:
    """The files stored under ``prefix``, keyed relative to it."""
    top = server.root / BUCKET / prefix
    return {p.relative_to(top).as_posix(): p.read_bytes() for p in top.rglob("*") if p.is_file()}


def write(
    server: StaticS3Server, kind: str, prefix: str, pipeline: str, shards: Any, data: np.ndarray
) -> tuple[dict[str, int], np.ndarray]:
    """``data`` written by ``pipeline`` into a new array: the requests of
    the write alone, and the values zarr's Batched pipeline reads back."""
    store = open_store(kind, server, prefix)  # type: ignore[arg-type]  # duck-typed endpoint
    with zarr.config.set({"codec_pipeline.path": pipeline}):
        arr = zarr.create_array(
            store, shape=data.shape, dtype=data.dtype, chunks=(8, 16), shards=shards, fill_value=0
        )
        server.reset()
        arr[...] = data
        requests = server.reset().requests
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        return dict(requests), zarr.open_array(store, mode="r")[...]


@pytest.mark.parametrize(
    ("kind", "shards"),
    [
        pytest.param("obstore", None, id="obstore-unsharded"),
        pytest.param("obstore", (16, 32), id="obstore-sharded"),
        pytest.param("s3fs", None, id="s3fs-unsharded"),
        pytest.param("s3fs", (16, 32), id="s3fs-sharded"),
    ],
)
def test_writes_match_zarr(server: StaticS3Server, kind: str, shards: Any) -> None:
    """Our pipeline's write: the objects zarr's Batched pipeline stores
    (byte for byte), read back to the same values, with as many PUTs."""
    data = np.random.default_rng(17).normal(size=(40, 64)).astype("float32")
    data[:8] = 0  # one row of chunks (a shard row) holds fill values only: not stored
    name = f"{kind}-{'sharded' if shards else 'unsharded'}"
    ours, got = write(server, kind, f"{name}-fused", FUSED, shards, data)
    theirs, expected = write(server, kind, f"{name}-batched", BATCHED, shards, data)
    assert_same_values(got, expected)
    assert_same_values(got, data)
    assert objects(server, f"{name}-fused") == objects(server, f"{name}-batched")
    assert ours["PUT"] == theirs["PUT"] > 0


def _put(server: StaticS3Server, key: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(
        f"{server.endpoint}/{BUCKET}/{key}", data=body, method="PUT", headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_put_and_delete_through_obstore(server: StaticS3Server) -> None:
    """A PUT answers an ETag and lands whole (no temporary file is left or
    listed); DELETE answers for missing keys too; both are counted."""
    s3 = obstore_s3(BUCKET, server.endpoint, "raw")
    server.reset()
    put = obstore.put(s3, "a/b", b"x" * 1000)
    assert put["e_tag"] and put["e_tag"].startswith('"')
    assert bytes(obstore.get(s3, "a/b").bytes()) == b"x" * 1000
    assert [m["path"] for m in obstore.list(s3).collect()] == ["a/b"]
    assert sorted(p.name for p in (server.root / BUCKET / "raw" / "a").iterdir()) == ["b"]
    obstore.delete(s3, "a/b")
    obstore.delete(s3, "a/never-stored")
    with pytest.raises(FileNotFoundError):
        obstore.get(s3, "a/b").bytes()
    stats = server.reset()
    assert stats.count("PUT") == 1 and stats.bytes_sent["PUT"] == 1000
    assert stats.count("DELETE") == 2


def test_bad_checksum_is_refused(server: StaticS3Server) -> None:
    """A body that does not match its ``Content-MD5`` is refused and
    nothing is stored (S3's BadDigest)."""
    wrong = base64.b64encode(b"0" * 16).decode()
    assert _put(server, "bad/key", b"body", {"Content-MD5": wrong}) == 400
    assert not (server.root / BUCKET / "bad" / "key").exists()


def test_read_only_server_refuses_writes(tmp_path: Path) -> None:
    (tmp_path / BUCKET).mkdir()
    with StaticS3Server(tmp_path) as served:
        assert _put(served, "key", b"body", {}) == 405
    assert not (tmp_path / BUCKET / "key").exists()


def test_conditional_puts_through_obstore(server: StaticS3Server) -> None:
    """``If-None-Match: *`` and ``If-Match`` as S3 answers them: a PUT
    whose precondition does not hold is refused with 412 and stores
    nothing; the condition is recorded with the request."""
    s3 = obstore_s3(BUCKET, server.endpoint, "conditional")
    server.reset()
    first = obstore.put(s3, "k", b"first", mode="create")
    with pytest.raises(obstore.exceptions.AlreadyExistsError):
        obstore.put(s3, "k", b"again", mode="create")
    second = obstore.put(s3, "k", b"second", mode={"e_tag": first["e_tag"]})
    with pytest.raises(obstore.exceptions.PreconditionError):
        obstore.put(s3, "k", b"stale", mode={"e_tag": first["e_tag"]})
    assert bytes(obstore.get(s3, "k").bytes()) == b"second"
    puts = [(r.status, r.condition) for r in server.reset().log if r.kind == "PUT"]
    assert puts == [
        (200, "if-none-match: *"),
        (412, "if-none-match: *"),
        (200, f"if-match: {first['e_tag']}"),
        (412, f"if-match: {first['e_tag']}"),
    ]
    assert second["e_tag"] != first["e_tag"]


@pytest.mark.parametrize(
    ("lock", "condition"),
    [
        pytest.param(True, "if-match", id="protected"),
        pytest.param(False, None, id="off"),
    ],
)
def test_partial_shard_write_is_conditional_unless_turned_off(
    server: StaticS3Server, lock: bool, condition: str | None
) -> None:
    """A write of part of a stored shard through obstore: one GET, one PUT
    conditional on the shard read (``If-Match``), none with
    ``codec_pipeline.shard_write_lock`` off; the same object either way."""
    data = np.random.default_rng(29).normal(size=(16, 32)).astype("float32")
    prefix = f"partial-{lock}"
    store = open_store("obstore", server, prefix)  # type: ignore[arg-type]  # duck-typed endpoint
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        arr = zarr.create_array(
            store, shape=data.shape, dtype=data.dtype, chunks=(8, 16), shards=(16, 32)
        )
        arr[...] = data
    server.reset()
    settings = {"codec_pipeline.path": FUSED, "codec_pipeline.shard_write_lock": lock}
    with zarr.config.set(settings):
        zarr.open_array(store)[0:8, 0:16] = 7.0
    shard = [r for r in server.reset().log if r.key.endswith("c/0/0")]
    assert [r.kind for r in shard] == ["GET", "PUT"]
    assert [None if r.condition is None else r.condition.partition(":")[0] for r in shard] == [
        None,
        condition,
    ]
    data[0:8, 0:16] = 7.0
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        assert_same_values(zarr.open_array(store, mode="r")[...], data)
