"""Unsharded reads from zarr's ``ObjectStore`` (obstore) by
`zarr_fused.chunks.async_read`: arrived chunks decoded in groups, the values
those of zarr's BatchedCodecPipeline (present, missing and general-selection
chunks), one GET per chunk, a corrupt chunk named in the error, and stores
the reader does not take (a subclass of ``ObjectStore``) left to the generic
path. Served by the light static server of the benchmarks (a real S3 client
over HTTP, files written by zarr's own pipeline)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore, ObjectStore
from zarr_fused_testing.s3 import ACCESS_KEY, REGION, SECRET_KEY
from zarr_fused_testing.s3_static import StaticS3Server

from zarr_fused.chunks import async_read
from zarr_fused.chunks.async_read import MAX_GROUP, group_target

from helpers import BATCHED, FUSED, assert_same_values

obstore_store = pytest.importorskip("obstore.store")

BUCKET = "object-reads"
SHAPE = (44, 36)  # 11 x 9 = 99 chunks: more than one group of MAX_GROUP
CHUNKS = (4, 4)
_names = itertools.count()


class _SubclassStore(ObjectStore[Any]):
    """A subclass may change what ``get`` does: not the reader's."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticS3Server]:
    with StaticS3Server(tmp_path_factory.mktemp("object-reads")) as s:
        yield s


def sample() -> np.ndarray:
    data = np.random.default_rng(1515).normal(0, 1, SHAPE).astype("<f4")
    data[8:16, 12:24] = 0  # whole chunks of the fill value: never stored (missing)
    return data


def served_array(server: StaticS3Server) -> str:
    """Write the sample with zarr's BatchedCodecPipeline under a new prefix
    of the server's directory; its prefix."""
    prefix = f"arr{next(_names)}"
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        arr = zarr.create_array(
            LocalStore(server.root / BUCKET / prefix),
            shape=SHAPE,
            chunks=CHUNKS,
            dtype="<f4",
            compressors=zarr.codecs.ZstdCodec(level=1),
            fill_value=0,
        )
        arr[...] = sample()
    return prefix


def open_array(server: StaticS3Server, prefix: str, pipeline: str, kind: type = ObjectStore) -> Any:
    s3 = obstore_store.S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        client_options={"allow_http": True},
    )
    with zarr.config.set({"codec_pipeline.path": pipeline}):
        return zarr.open_array(kind(s3, read_only=True), mode="r")


def read(arr: Any, selection: Any, pipeline: str, workers: int = 2) -> np.ndarray:
    config = {"codec_pipeline.path": pipeline, "codec_pipeline.max_workers": workers}
    with zarr.config.set(config):
        if isinstance(selection, list):
            return np.asarray(arr.oindex[tuple(selection)])
        return np.asarray(arr[selection])


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group the reader decodes."""
    sizes: list[int] = []
    decode = async_read._GroupedRead._decode

    def spy(self: Any, group: list[tuple[int, Any]]) -> None:
        sizes.append(len(group))
        decode(self, group)

    monkeypatch.setattr(async_read._GroupedRead, "_decode", spy)
    return sizes


SELECTIONS = {
    "whole": Ellipsis,
    "unaligned": (slice(3, 41), slice(5, 30)),
    "strided": (slice(1, 44, 3), slice(None, None, 2)),
    "orthogonal": [[0, 5, 17, 40], [2, 3, 35]],  # chunks the kernels do not place
}


@pytest.mark.parametrize("workers", [pytest.param(1, id="inline"), pytest.param(2, id="pool")])
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_grouped_reads_match_batched(
    server: StaticS3Server, groups: list[int], name: str, workers: int
) -> None:
    prefix = served_array(server)
    selection = SELECTIONS[name]
    expected = read(open_array(server, prefix, BATCHED), selection, BATCHED)
    arr = open_array(server, prefix, FUSED)
    server.reset()
    got = read(arr, selection, FUSED, workers)
    gets = server.reset().requests["GET"]
    assert_same_values(got, expected)
    # every chunk the selection touches went through the grouped decode,
    # each fetched once (missing ones too: their GET answers 404)
    assert sum(groups) == gets
    assert max(groups) <= MAX_GROUP
    target = group_target(gets)
    if workers == 1:  # on the loop: a group each time one is queued, then the rest
        assert groups == [target] * (gets // target) + [gets % target] * (gets % target > 0)
    else:  # never a hand-off to the pool for less than a group
        assert len(groups) <= gets // target + 1


def test_whole_read_no_more_gets_than_batched(server: StaticS3Server) -> None:
    prefix = served_array(server)
    counts = []
    for pipeline in (BATCHED, FUSED):
        arr = open_array(server, prefix, pipeline)
        server.reset()
        read(arr, Ellipsis, pipeline)
        counts.append(server.reset().requests)
    assert counts[1]["GET"] <= counts[0]["GET"]
    assert sum(counts[1].values()) <= sum(counts[0].values())


def test_subclass_of_object_store_takes_the_generic_path(
    server: StaticS3Server, groups: list[int]
) -> None:
    prefix = served_array(server)
    got = read(open_array(server, prefix, FUSED, _SubclassStore), Ellipsis, FUSED)
    assert_same_values(got, sample())
    assert groups == []


@pytest.mark.parametrize("workers", [pytest.param(1, id="inline"), pytest.param(2, id="pool")])
def test_corrupt_chunk_is_named(server: StaticS3Server, workers: int) -> None:
    prefix = served_array(server)
    chunk: Path = server.root / BUCKET / prefix / "c" / "5" / "7"
    chunk.write_bytes(b"not zstd at all" * 4)
    arr = open_array(server, prefix, FUSED)
    with pytest.raises(Exception, match=r"c/5/7"):
        read(arr, Ellipsis, FUSED, workers)
