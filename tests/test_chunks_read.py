"""How the unsharded chunk readers judge their files (`zarr_fused.chunks.read`,
`zarr_fused.chunks.pipelined`): CPU waits are not file latency, and reads
spaced out in time are not all probes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused.chunks import read as chunk_read
from zarr_fused.chunks.pipelined import PipelinedChunkReader
from zarr_fused.io.probe import FAST_FILE, PROBE_INTERVAL, PROBE_READS, per_file_latency

from helpers import BATCHED, FUSED, assert_same_values, with_pipeline


def test_group_that_did_not_block_is_judged_by_its_cpu_time() -> None:
    # 1 s of wall time, 64 ms of CPU, 2 blocking waits for 64 files: it
    # waited for a CPU, not for its files
    before, after = (10.0, 3.0, 100), (11.0, 3.064, 102)
    assert chunk_read.group_seconds_per_file(before, after, range(64)) == pytest.approx(1e-3)


def test_group_that_blocked_per_file_is_judged_by_its_wall_time() -> None:
    before, after = (10.0, 3.0, 100), (11.0, 3.064, 164)
    assert chunk_read.group_seconds_per_file(before, after, range(64)) == pytest.approx(1 / 64)


def test_group_without_a_count_of_blocking_waits_is_judged_by_its_wall_time() -> None:
    before, after = (10.0, 3.0, -1), (11.0, 3.064, -1)  # not Linux: no count
    assert chunk_read.group_seconds_per_file(before, after, range(64)) == pytest.approx(1 / 64)


@pytest.mark.skipif(chunk_read.THREAD_USAGE is None, reason="no per-thread rusage here")
def test_group_clock_counts_blocking_waits() -> None:
    before = chunk_read._group_clock()
    for _ in range(3):
        time.sleep(0.002)
    after = chunk_read._group_clock()
    assert after[2] - before[2] >= 3
    assert after[0] - before[0] >= 0.006
    assert after[1] - before[1] < after[0] - before[0]


def test_large_files_from_the_page_cache_count_as_fast() -> None:
    # 64 uncompressed chunk files of 512 KiB in 5.8 ms (90 us each): the
    # copy of their bytes, not a round trip per file
    assert per_file_latency(5.8e-3, 64, 64 * (512 << 10)) < FAST_FILE


def test_small_files_at_the_same_pace_count_as_slow() -> None:
    # 64 files of 16 KiB at 90 us each: a filesystem round trip per file
    assert per_file_latency(5.8e-3, 64, 64 * (16 << 10)) > FAST_FILE


def test_missing_files_count_as_empty_ones() -> None:
    assert per_file_latency(6.4e-3, 64, 0) == pytest.approx(1e-4)


@pytest.fixture
def chunked(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A 64 x 64 float32 array in 8 x 8 zstd chunk files (64 files)."""
    data = np.random.default_rng(3).normal(size=(64, 64)).astype("<f4")
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(tmp_path / "a"),
            shape=data.shape,
            chunks=(8, 8),
            dtype="<f4",
            compressors=zarr.codecs.ZstdCodec(level=1),
        )
        arr[...] = data
    return tmp_path / "a", data


def test_reads_after_the_probe_interval_stay_direct_for_probe_reads(
    chunked: tuple[Path, np.ndarray],
) -> None:
    """Reads spaced by more than `PROBE_INTERVAL` (other work in between):
    `PROBE_READS` of them read directly before the next probe."""
    root, data = chunked
    config = {"codec_pipeline.max_workers": 2, "codec_pipeline.io_concurrency": 4}
    with with_pipeline(FUSED), zarr.config.set(config):
        arr = zarr.open_array(LocalStore(root), mode="r")
        reader = arr._async_array.codec_pipeline.plan.reader
        assert isinstance(reader, PipelinedChunkReader)
        direct_counts = []
        for _ in range(PROBE_READS + 1):
            # files just seen fast, the last probe long ago
            reader.probe.latency = 1e-6
            reader.probe.probed = time.monotonic() - 10 * PROBE_INTERVAL
            reader.probe.slow_until = 0.0
            assert_same_values(arr[...], data)
            direct_counts.append(reader.probe.direct_reads)
    assert direct_counts == [*range(1, PROBE_READS + 1), 0]


@pytest.fixture
def delta_chunked(tmp_path: Path) -> Path:
    """A 64 x 64 int32 array in 16 x 16 delta -> zstd chunk files (a chain
    the `ChunkReader` reads); the chunk at (1, 1) never written."""
    data = np.cumsum(np.random.default_rng(5).integers(-3, 4, size=(64, 64)), axis=1)
    data = data.astype("<i4")
    data[16:32, 16:32] = 7  # the fill value: the chunk is not stored
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(tmp_path / "a"),
            shape=data.shape,
            chunks=(16, 16),
            dtype="<i4",
            fill_value=7,
            filters=[zarr.codecs.numcodecs.Delta(dtype="<i4")],
            compressors=zarr.codecs.ZstdCodec(level=1),
        )
        arr[...] = data
    return tmp_path / "a"


def _reads(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(zarr's read, ours) of the whole array, through the `ChunkReader`."""
    with with_pipeline(BATCHED):
        expected = zarr.open_array(LocalStore(root), mode="r")[...]
    with with_pipeline(FUSED):
        arr = zarr.open_array(LocalStore(root), mode="r")
        assert type(arr._async_array.codec_pipeline.plan.reader) is chunk_read.ChunkReader
        return expected, arr[...]


def test_chunk_reader_reads_local_files_itself(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files: list[bytes] = []
    read_file = chunk_read._read_file

    def spy(path: bytes, prototype: object) -> object:
        files.append(path)
        return read_file(path, prototype)  # type: ignore[arg-type]

    monkeypatch.setattr(chunk_read, "_read_file", spy)
    expected, got = _reads(delta_chunked)
    assert_same_values(got, expected)
    assert len(files) == 16  # the missing chunk's file asked for too
    assert not (delta_chunked / "c" / "1" / "1").exists()


def test_chunk_reader_treats_a_directory_at_a_chunk_key_as_missing(delta_chunked: Path) -> None:
    # LocalStore.get_sync returns None for it; so do we (fill value)
    (delta_chunked / "c" / "1" / "1").mkdir(parents=True)
    expected, got = _reads(delta_chunked)
    assert_same_values(got, expected)
    assert (got[16:32, 16:32] == 7).all()


def test_chunk_reader_leaves_counted_keys_to_their_store(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(path: bytes, prototype: object) -> object:
        raise AssertionError("a counted key read around its counter")

    expected, _ = _reads(delta_chunked)
    monkeypatch.setattr(chunk_read, "_read_file", fail)
    with with_pipeline(FUSED), zarr_fused.stats() as block:
        got = zarr.open_array(LocalStore(delta_chunked), mode="r")[...]
    assert_same_values(got, expected)
    assert block.requests["local", "get"] == 16
