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
