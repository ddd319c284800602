"""Split shards on the IO threads (`zarr_fused.shard.pipelined`): each part
of a shard decodes on its own (`_shard_local.decode_part`), and shards split
only while file calls are slow."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore, StorePath

from zarr_fused import _shard_local
from zarr_fused.io.local import local_files
from zarr_fused.io.probe import FAST_CALL, PROBE_INTERVAL
from zarr_fused.shard import pipelined

from helpers import FUSED, with_pipeline

SHAPE, SHARD, INNER = (32, 64, 64), (16, 32, 32), (8, 8, 8)


def _array(tmp_path: Path) -> np.ndarray:
    data = np.random.default_rng(14).integers(0, 4000, SHAPE, dtype="uint16")
    arr = zarr.create_array(
        LocalStore(tmp_path / "a"),
        shape=SHAPE,
        dtype="uint16",
        chunks=INNER,
        shards=SHARD,
        compressors=ZstdCodec(level=1),
        fill_value=0,
    )
    arr[...] = data
    return data


def _spy_parts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    real = _shard_local.decode_part

    def spy(batch: Any, first: int, stop: int, entries: Any, payload: Any) -> None:
        calls.append((first, stop))
        real(batch, first, stop, entries, payload)

    monkeypatch.setattr(pipelined.shard_local_kernels, "decode_part", spy)
    return calls


@pytest.mark.parametrize(
    ("seen", "split"),
    [pytest.param(None, True, id="first-read"), pytest.param(1e-6, False, id="fast-calls")],
)
def test_thin_slab_splits_shards_only_while_calls_are_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: float | None, split: bool
) -> None:
    data = _array(tmp_path)
    calls = _spy_parts(monkeypatch)
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": 1, "codec_pipeline.io_concurrency": 8}),
    ):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        shard_io = reader._async_array.codec_pipeline.plan.reader.io
        shard_io.probe.latency = seen
        shard_io.probe.probed = 0.0  # look afresh: a pipelined read
        got = reader[3:4]
    np.testing.assert_array_equal(got, data[3:4])
    assert bool(calls) == split


def test_decode_part_rejects_tasks_beyond_the_batch(tmp_path: Path) -> None:
    _array(tmp_path)
    with with_pipeline(FUSED):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        chain = reader._async_array.codec_pipeline.plan.reader.chain
    batch = chain.decode_batch(1, 3)
    entries = np.zeros((4, 2), dtype=np.uint64)
    with pytest.raises(IndexError, match="no such tasks"):
        _shard_local.decode_part(batch, 0, 1, entries, np.empty(0, dtype=np.uint8))


def _evict(root: Path) -> None:
    """Drop ``root``'s files from the page cache (those files only)."""
    for f in root.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@pytest.mark.parametrize("cold", [pytest.param(False, id="hot"), pytest.param(True, id="cold")])
def test_direct_read_of_a_cold_cache_pipelines_the_next(tmp_path: Path, cold: bool) -> None:
    """A direct read that had to go to the disk makes the next read
    pipelined (the probe's latency forgotten); a hot one keeps it."""
    if pipelined.storage_read_bytes() is None or not hasattr(os, "posix_fadvise"):
        pytest.skip("no block-device read accounting here")
    data = _array(tmp_path)
    os.sync()  # written pages are evicted only once clean
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": 1, "codec_pipeline.io_concurrency": 8}),
    ):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        shard_io = reader._async_array.codec_pipeline.plan.reader.io
        shard_io.probe.latency = 1e-6  # the files answered fast, just now
        shard_io.probe.probed = time.monotonic()
        before = pipelined.storage_read_bytes()
        if cold:
            _evict(tmp_path / "a" / "c")
        got = reader[...]
        if cold and pipelined.storage_read_bytes() == before:
            pytest.skip("evicted files were not read from a block device (tmpfs?)")
    np.testing.assert_array_equal(got, data)
    assert (shard_io.probe.latency is None) == cold


def _spy_prefetch(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    from zarr_fused.io import local as _local_io

    seen: list[bool] = []
    kernels = _local_io.shard_local_kernels
    for name in ("fetch_partial_local", "read_shard_local"):
        real = getattr(kernels, name)

        def spy(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(kwargs["prefetch"])
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, spy)
    return seen


@pytest.mark.parametrize(
    ("seen", "prefetch"),
    [pytest.param(None, True, id="pipelined"), pytest.param(1e-6, False, id="direct")],
)
def test_pipelined_reads_ask_for_ranges_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: float | None, prefetch: bool
) -> None:
    """The IO threads (slow or cold files) have the kernel read all of a
    shard's touched ranges at once; the direct path (fast files) does not
    spend the calls."""
    data = _array(tmp_path)
    calls = _spy_prefetch(monkeypatch)
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": 1, "codec_pipeline.io_concurrency": 8}),
    ):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        shard_io = reader._async_array.codec_pipeline.plan.reader.io
        shard_io.probe.latency = seen
        shard_io.probe.probed = time.monotonic()
        got = reader[3:4]
    np.testing.assert_array_equal(got, data[3:4])
    assert calls and set(calls) == {prefetch}


@pytest.mark.parametrize(
    "cold", [pytest.param(False, id="page-cache"), pytest.param(True, id="block-device")]
)
def test_shards_split_only_where_the_kernel_does_not_prefetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: bool
) -> None:
    """After a pipelined read that came from a block device (where the
    kernel reads a request's ranges at once), slow calls no longer split
    shards; after one served by the page cache (or a filesystem whose
    latency the advice does not hide) they still do."""
    if pipelined.storage_read_bytes() is None or not hasattr(os, "posix_fadvise"):
        pytest.skip("no block-device read accounting here")
    data = _array(tmp_path)
    os.sync()  # written pages are evicted only once clean
    calls = _spy_parts(monkeypatch)
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": 1, "codec_pipeline.io_concurrency": 8}),
    ):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        shard_io = reader._async_array.codec_pipeline.plan.reader.io
        if cold:
            _evict(tmp_path / "a" / "c")
        np.testing.assert_array_equal(reader[3:4], data[3:4])  # the first read: pipelined
        if shard_io.from_device != cold:
            pytest.skip("evicted files were not read from a block device (tmpfs?)")
        calls.clear()
        shard_io.probe.latency = 1e-3  # slow calls: split, unless prefetched
        shard_io.probe.probed = 0.0
        got = reader[3:4]
    np.testing.assert_array_equal(got, data[3:4])
    assert bool(calls) != cold


def _spy_pipelined(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shard count of every batch read on the IO threads."""
    runs: list[int] = []
    real = pipelined.ShardIO.run

    def spy(self: Any, read: Any, *args: Any) -> None:
        runs.append(len(read.shards))
        real(self, read, *args)

    monkeypatch.setattr(pipelined.ShardIO, "run", spy)
    return runs


@pytest.mark.parametrize(
    ("seen", "age", "lent"),
    [
        pytest.param(None, 0.0, False, id="store-unknown"),
        pytest.param(FAST_CALL / 2, 0.0, True, id="store-fast-just-now"),
        pytest.param(FAST_CALL / 2, 2 * PROBE_INTERVAL, False, id="store-fast-long-ago"),
        pytest.param(1e-3, 0.0, False, id="store-slow-just-now"),
    ],
)
def test_a_new_arrays_first_read_follows_its_stores_shard_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: float | None, age: float, lent: bool
) -> None:
    """An array just opened (a new reader, no measurement of its own) reads
    its shards directly while another reader measured the store's shard
    calls fast within `PROBE_INTERVAL`; otherwise on the IO threads, which
    measure them for the store's next readers."""
    data = _array(tmp_path)
    runs = _spy_pipelined(monkeypatch)
    with (
        with_pipeline(FUSED),
        zarr.config.set({"codec_pipeline.max_workers": 1, "codec_pipeline.io_concurrency": 8}),
    ):
        reader = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")
        root = local_files([(StorePath(reader.store, "zarr.json"),)], shard_io=True)
        assert root is not None
        pipelined.SHARD_CALLS.forget(root)
        if seen is not None:
            pipelined.SHARD_CALLS.seen[root] = (seen, time.monotonic() - age)
        got = reader[...]
        probe = reader._async_array.codec_pipeline.plan.reader.io.probe
    np.testing.assert_array_equal(got, data)
    assert runs == ([] if lent else [8])
    # the store keeps what this reader measured (or was lent) for the next
    assert pipelined.SHARD_CALLS.seen[root][0] == probe.latency
