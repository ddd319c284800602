"""The light static S3 server of the benchmarks (`zarr_fused_testing.s3_static`) read by a
real S3 client (obstore's ``S3Store``): whole objects, single ranges as zarr
asks for them, HEAD, and missing keys, with requests counted; and a sharded
array read through zarr's ``ObjectStore`` with our pipeline."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr_fused_testing.s3 import obstore_s3
from zarr_fused_testing.s3_static import StaticS3Server, parse_range

from helpers import FUSED

obstore = pytest.importorskip("obstore")

BUCKET = "static-bucket"
SIZE = 5000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StaticS3Server, bytes]]:
    root = tmp_path_factory.mktemp("static-s3")
    data = np.random.default_rng(15).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (root / BUCKET / "dir").mkdir(parents=True)
    (root / BUCKET / "dir" / "obj").write_bytes(data)
    with StaticS3Server(root) as server:
        yield server, data


def s3(server: StaticS3Server, prefix: str | None = None) -> Any:
    return obstore_s3(BUCKET, server.endpoint, prefix)


@pytest.mark.parametrize(
    ("options", "span"),
    [
        pytest.param({}, slice(None), id="whole"),
        pytest.param({"range": (100, 250)}, slice(100, 250), id="range"),
        pytest.param({"range": {"offset": 4000}}, slice(4000, None), id="from-offset"),
        pytest.param({"range": {"suffix": 16}}, slice(-16, None), id="suffix"),
        pytest.param({"range": (4990, 6000)}, slice(4990, None), id="past-the-end"),
    ],
)
def test_get_serves_ranges(
    served: tuple[StaticS3Server, bytes], options: dict[str, Any], span: slice
) -> None:
    server, data = served
    server.reset()
    got = obstore.get(s3(server), "dir/obj", options=options).bytes()
    assert bytes(got) == data[span]
    stats = server.reset()
    assert stats.requests == {"GET": 1}
    assert stats.log[0].status == (200 if not options else 206)


def test_head_reports_size_and_etag(served: tuple[StaticS3Server, bytes]) -> None:
    server, data = served
    meta = obstore.head(s3(server), "dir/obj")
    assert meta["size"] == len(data)
    assert meta["e_tag"] and meta["e_tag"].startswith('"')


@pytest.mark.parametrize("key", [pytest.param("dir/nope", id="key"), pytest.param("x", id="top")])
def test_missing_key_is_file_not_found(served: tuple[StaticS3Server, bytes], key: str) -> None:
    server, _ = served
    with pytest.raises(FileNotFoundError):
        obstore.get(s3(server), key).bytes()


def test_escaping_the_root_is_not_found(served: tuple[StaticS3Server, bytes]) -> None:
    """A key with ``..`` segments (S3 clients refuse them; a raw request
    need not) never reaches a file outside the served directory."""
    server, data = served
    (server.root.parent / "outside-static").write_bytes(data)
    url = f"{server.endpoint}/{BUCKET}/%2E%2E/%2E%2E/outside-static"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 404


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("bytes=0-0", (0, 1), id="first-byte"),
        pytest.param("bytes=-0", None, id="empty-suffix"),
        pytest.param("bytes=10-5", None, id="reversed"),
        pytest.param("bytes=100-", None, id="from-the-end"),
        pytest.param("bytes=0-1,4-5", None, id="two-ranges"),
        pytest.param("items=0-1", None, id="other-unit"),
    ],
)
def test_parse_range(value: str, expected: tuple[int, int] | None) -> None:
    assert parse_range(value, 100) == expected


def test_sharded_array_reads_through_zarr(tmp_path: Path) -> None:
    from zarr.storage import LocalStore, ObjectStore

    data = np.random.default_rng(16).integers(0, 1000, (24, 40), dtype="int32")
    local = zarr.create_array(
        LocalStore(tmp_path / BUCKET / "arr"),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(4, 8),
        shards=(8, 16),
        fill_value=0,
    )
    local[...] = data
    with StaticS3Server(tmp_path) as server, zarr.config.set({"codec_pipeline.path": FUSED}):
        arr = zarr.open_array(ObjectStore(s3(server, "arr"), read_only=True), mode="r")
        np.testing.assert_array_equal(arr[3:21, 5:37], data[3:21, 5:37])
