"""How the unsharded chunk readers judge their files (`zarr_fused.chunks.read`,
`zarr_fused.chunks.pipelined`): CPU waits are not file latency, and reads
spaced out in time are not all probes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import LocalStore

import zarr_fused
from zarr_fused import _codec_batch
from zarr_fused._batch import ReadTarget
from zarr_fused._hybrid import FilteredChain
from zarr_fused.chunks import pipelined as chunk_pipelined
from zarr_fused.chunks import read as chunk_read
from zarr_fused.chunks.pipelined import PipelinedChunkReader
from zarr_fused.io.local import local_files
from zarr_fused.io.probe import (
    FAST_FILE,
    PROBE_INTERVAL,
    PROBE_READS,
    STORE_LATENCIES,
    per_file_latency,
    slow_direct,
)

from helpers import BATCHED, FUSED, assert_same_values, grouped_chain, with_pipeline


def test_group_that_did_not_block_waited_for_no_file() -> None:
    # 1 s of wall time, 64 ms of CPU, 2 blocking waits for 64 files: it
    # waited for a CPU, not for its files
    before, after = (10.0, 3.0, 100), (11.0, 3.064, 102)
    assert chunk_read.group_wait_per_file(before, after, range(64)) == 0.0


def test_group_that_blocked_per_file_waited_what_its_cpu_time_leaves() -> None:
    before, after = (10.0, 3.0, 100), (11.0, 3.064, 164)
    assert chunk_read.group_wait_per_file(before, after, range(64)) == pytest.approx(0.936 / 64)


def test_slow_decoding_is_not_waiting_for_files() -> None:
    # a hot cache of gzip chunks: 320 us of CPU per chunk, a GIL wait per file
    before, after = (10.0, 3.0, 100), (10.0205, 3.0204, 164)
    wait = chunk_read.group_wait_per_file(before, after, range(64))
    assert wait == pytest.approx(0.0001 / 64)
    assert not slow_direct(wait, 128 << 10)


def test_group_without_a_count_of_blocking_waits_is_judged_by_its_wall_time() -> None:
    before, after = (10.0, 3.0, -1), (11.0, 3.064, -1)  # not Linux: no count
    assert chunk_read.group_wait_per_file(before, after, range(64)) == pytest.approx(1 / 64)


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


def _stored(path: Path, data: np.ndarray, chunks: tuple[int, ...], **codecs: Any) -> Path:
    """``data`` written by zarr's pipeline to a local array at ``path``, in
    zstd chunk files of ``chunks`` (``codecs``: filters, a fill value)."""
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(path),
            shape=data.shape,
            chunks=chunks,
            dtype=data.dtype,
            compressors=zarr.codecs.ZstdCodec(level=1),
            **codecs,
        )
        arr[...] = data
    return path


@pytest.fixture
def chunked(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A 64 x 64 float32 array in 8 x 8 zstd chunk files (64 files)."""
    data = np.random.default_rng(3).normal(size=(64, 64)).astype("<f4")
    return _stored(tmp_path / "a", data, (8, 8)), data


@contextmanager
def _pipelined(root: Path) -> Iterator[tuple[Any, PipelinedChunkReader]]:
    """The array at ``root`` opened through zarr_fused with IO threads
    (the config held while the caller reads), and its chunk reader."""
    config = {"codec_pipeline.max_workers": 2, "codec_pipeline.io_concurrency": 4}
    with with_pipeline(FUSED), zarr.config.set(config):
        arr = zarr.open_array(LocalStore(root), mode="r")
        reader = arr._async_array.codec_pipeline.plan.reader
        assert isinstance(reader, PipelinedChunkReader)
        yield arr, reader


def _pipelined_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of chunks of each pipelined read from now on, as they run."""
    pipelined: list[int] = []
    run = chunk_pipelined.run_pipelined

    def spy(groups: Any, *args: Any, **kwargs: Any) -> None:
        pipelined.append(sum(len(g) for g in groups))
        run(groups, *args, **kwargs)

    monkeypatch.setattr(chunk_pipelined, "run_pipelined", spy)
    return pipelined


def _held_on_io_threads(arr: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Hold ``arr``'s reads on the IO threads (files found slow); see
    `_pipelined_reads`."""
    arr._async_array.codec_pipeline.plan.reader.probe.found_slow(hold=3600.0)
    return _pipelined_reads(monkeypatch)


def test_reads_after_the_probe_interval_stay_direct_for_probe_reads(
    chunked: tuple[Path, np.ndarray],
) -> None:
    """Reads spaced by more than `PROBE_INTERVAL` (other work in between):
    `PROBE_READS` of them read directly before the next probe."""
    root, data = chunked
    with _pipelined(root) as (arr, reader):
        direct_counts = []
        for _ in range(PROBE_READS + 1):
            # files just seen fast, the last probe long ago
            reader.probe.latency = 1e-6
            reader.probe.probed = time.monotonic() - 10 * PROBE_INTERVAL
            reader.probe.slow_until = 0.0
            assert_same_values(arr[...], data)
            direct_counts.append(reader.probe.direct_reads)
    # then none stands: the next read's first chunks measure the files anew
    assert direct_counts == [*range(1, PROBE_READS + 1), 1]


def _store_prefix(arr: Any) -> bytes:
    getter = zarr.storage.StorePath(arr.store, "zarr.json")
    prefix = local_files([(getter,)])
    assert prefix is not None
    return prefix


@pytest.mark.parametrize("measured", [True, False], ids=["store-measured", "store-unknown"])
def test_a_new_arrays_first_read_follows_its_stores_measurement(
    chunked: tuple[Path, np.ndarray], measured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An array just opened reads directly while its store's files were
    measured fast within `PROBE_INTERVAL` (by another array's reader);
    otherwise its first chunks, read directly, measure them (hot here).

    The files are hot, but a busy host (CI's ASan run) can make a hot read
    wait past `FAST_FILE` for a CPU: the scout's and the direct reads'
    thresholds are held generous, so what is tested is what the reader
    does with fast files, not how fast they were."""
    monkeypatch.setattr(chunk_pipelined, "FAST_FILE", 1.0)
    monkeypatch.setattr(chunk_pipelined, "slow_direct", lambda seconds, nbytes: False)
    root, data = chunked
    with _pipelined(root) as (arr, reader):
        prefix = _store_prefix(arr)
        STORE_LATENCIES.forget(prefix)
        if measured:
            STORE_LATENCIES.seen[prefix] = (FAST_FILE / 2, time.monotonic())
        assert_same_values(arr[...], data)
    if measured:  # lent: its age alone decides, as after PROBE_READS direct reads
        assert reader.probe.latency == FAST_FILE / 2
        assert reader.probe.direct_reads == PROBE_READS + 1
    else:  # scouted: its own measurement, lent to the next array opened
        assert reader.probe.latency is not None
        assert reader.probe.latency < 1.0
        assert reader.probe.direct_reads == 1
        assert STORE_LATENCIES.seen[prefix][0] == reader.probe.latency


@pytest.mark.parametrize("waited", [False, True], ids=["hot", "waited"])
def test_a_read_with_no_measurement_scouts_one_chunk_per_thread(
    chunked: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch, waited: bool
) -> None:
    """No measurement stands: one chunk per compute thread is read
    directly first; the rest directly too if those did not wait for their
    files, through the IO threads (which measure them) otherwise."""
    root, data = chunked
    pipelined = _pipelined_reads(monkeypatch)
    # as a network filesystem's first files would wait, or hot ones not
    # (held so: a busy host can make a hot read wait for a CPU)
    wait = 1e-3 if waited else 0.0
    monkeypatch.setattr(chunk_read, "group_wait_per_file", lambda *_: wait)
    with _pipelined(root) as (arr, reader):
        STORE_LATENCIES.forget(_store_prefix(arr))
        assert_same_values(arr[...], data)
    chunks = (64 // 8) ** 2
    if waited:  # the rest on the IO threads, which measured the files
        assert pipelined == [chunks - 2]
        assert reader.probe.direct_reads == 0
    else:
        assert pipelined == []
        assert reader.probe.direct_reads == 1
    assert reader.probe.latency is not None


@pytest.mark.parametrize("case", ["hot", "waited", "held-slow"])
def test_a_pipelined_read_builds_one_target_for_what_it_reads(
    chunked: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The pipelined reader builds an output target only for the chunks
    the IO threads read, once: none when all is read directly (the direct
    reader has its own), the scout's rest after a scout that waited, the
    whole batch while the files are held slow."""
    root, data = chunked
    built: list[int] = []

    class Spy:
        @staticmethod
        def native(chain: Any, batch: Any, request: Any) -> Any:
            built.append(len(batch))
            return ReadTarget.native(chain, batch, request)

    monkeypatch.setattr(chunk_pipelined, "ReadTarget", Spy)
    pipelined = _pipelined_reads(monkeypatch)
    wait = 1e-3 if case == "waited" else 0.0  # hot: held so on a busy host too
    monkeypatch.setattr(chunk_read, "group_wait_per_file", lambda *_: wait)
    with _pipelined(root) as (arr, reader):
        STORE_LATENCIES.forget(_store_prefix(arr))
        if case == "held-slow":
            reader.probe.found_slow(hold=3600.0)
        assert_same_values(arr[...], data)
    assert built == pipelined
    assert built == {"hot": [], "waited": [64 - 2], "held-slow": [64]}[case]


@pytest.fixture
def delta_chunked(tmp_path: Path) -> Path:
    """A 64 x 64 int32 array in 16 x 16 delta -> zstd chunk files (native
    filters over a native chain); the chunk at (1, 1) never written."""
    data = np.cumsum(np.random.default_rng(5).integers(-3, 4, size=(64, 64)), axis=1)
    data = data.astype("<i4")
    data[16:32, 16:32] = 7  # the fill value: the chunk is not stored
    filters = [zarr.codecs.numcodecs.Delta(dtype="<i4")]
    return _stored(tmp_path / "a", data, (16, 16), fill_value=7, filters=filters)


def _reads(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(zarr's read, ours) of the whole array, through the batch kernels of
    its `FilteredChain`."""
    with with_pipeline(BATCHED):
        expected = zarr.open_array(LocalStore(root), mode="r")[...]
    with with_pipeline(FUSED):
        arr = zarr.open_array(LocalStore(root), mode="r")
        assert grouped_chain(arr) is not None
        return expected, arr[...]


def test_grouped_kernels_read_local_files_themselves(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every filter has a kernel: the batch kernels read the chunk files
    (the missing one's too, filled), none is read in Python."""

    def fail(path: bytes) -> bytes | None:
        raise AssertionError("a chunk file read in Python")

    monkeypatch.setattr(chunk_read, "_read_bytes", fail)
    expected, got = _reads(delta_chunked)
    assert_same_values(got, expected)
    assert (got[16:32, 16:32] == 7).all()
    assert not (delta_chunked / "c" / "1" / "1").exists()


def test_chunk_reader_reads_local_files_itself(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output the batch kernels cannot write into: each chunk file is
    read here, then decoded through the chain."""
    files: list[bytes] = []
    read_bytes = chunk_read._read_bytes

    def spy(path: bytes) -> bytes | None:
        files.append(path)
        return read_bytes(path)

    monkeypatch.setattr(chunk_read, "_read_bytes", spy)
    monkeypatch.setattr(chunk_read.ReadTarget, "native", staticmethod(lambda *_: None))
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
    def fail(path: bytes) -> bytes | None:
        raise AssertionError("a counted key read around its counter")

    expected, _ = _reads(delta_chunked)
    monkeypatch.setattr(chunk_read, "_read_bytes", fail)
    with with_pipeline(FUSED), zarr_fused.stats() as block:
        got = zarr.open_array(LocalStore(delta_chunked), mode="r")[...]
    assert_same_values(got, expected)
    assert block.requests["local", "get"] == 16


def test_native_filters_read_local_files_in_groups(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every filter has a kernel: the batch kernels decode each group of
    files in one call, never the hybrid chain's per-chunk decode."""
    capacities: list[int] = []
    kernel_batch = FilteredChain.kernel_batch

    def spy(self: FilteredChain, capacity: int, ndim: int, *args: Any) -> Any:
        capacities.append(capacity)
        return kernel_batch(self, capacity, ndim, *args)

    def per_chunk(*args: object) -> bool:
        raise AssertionError("a chunk decoded on its own")

    monkeypatch.setattr(FilteredChain, "kernel_batch", spy)
    monkeypatch.setattr(chunk_read.ChunkReader, "_decode_into", per_chunk)
    # the kernels read the files, the missing one included
    monkeypatch.setattr(chunk_read, "_read_bytes", per_chunk)
    expected, got = _reads(delta_chunked)
    assert_same_values(got, expected)
    assert sum(capacities) == 16
    with with_pipeline(BATCHED):
        part = zarr.open_array(LocalStore(delta_chunked), mode="r")[3:50:5, 10:]
    with with_pipeline(FUSED):
        assert_same_values(zarr.open_array(LocalStore(delta_chunked), mode="r")[3:50:5, 10:], part)


@pytest.mark.parametrize("path", ["pipelined", "direct"])
def test_native_filters_read_through_the_io_threads_when_files_are_slow(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Files measured slow (a network filesystem): the IO threads fetch the
    filtered chain's files in groups, the compute threads decode them;
    measured fast: the compute threads read them in their decode calls.
    Either way zarr's values, the missing chunk filled."""
    with with_pipeline(BATCHED):
        expected = zarr.open_array(LocalStore(delta_chunked), mode="r")[...]
    with _pipelined(delta_chunked) as (arr, reader):
        assert isinstance(reader.chain, FilteredChain)
        pipelined = []
        if path == "pipelined":
            pipelined = _held_on_io_threads(arr, monkeypatch)
        else:
            reader.probe.measured(FAST_FILE / 2)
        assert_same_values(arr[...], expected)
        assert_same_values(arr[5:60:7, 3:], expected[5:60:7, 3:])
    assert pipelined == ([16, 16] if path == "pipelined" else [])


def test_native_filters_in_groups_refuse_as_zarr(tmp_path: Path) -> None:
    """A stored value the scale does not divide (written with another
    scale): the kernels refuse the chunk and zarr's code raises its error."""
    root = tmp_path / "s"
    with with_pipeline(BATCHED):
        for name, scale in (("a", 1), ("b", 3)):
            arr = zarr.create_array(
                LocalStore(root / name),
                shape=(32,),
                chunks=(8,),
                dtype="<i4",
                filters=[zarr.codecs.scale_offset.ScaleOffset(scale=scale)],
            )
            arr[:] = np.arange(32, dtype="<i4")
    (root / "b" / "c" / "2").write_bytes((root / "a" / "c" / "2").read_bytes())
    for pipeline in (BATCHED, FUSED):
        with with_pipeline(pipeline), pytest.raises(ValueError, match="non-zero remainder"):
            zarr.open_array(LocalStore(root / "b"), mode="r")[:]


@pytest.mark.parametrize("io", ["direct", "pipelined"])
def test_native_filters_in_groups_name_a_cut_chunk(
    delta_chunked: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    chunk = delta_chunked / "c" / "2" / "3"
    chunk.write_bytes(chunk.read_bytes()[:-5])
    with with_pipeline(FUSED):
        arr = zarr.open_array(LocalStore(delta_chunked), mode="r")
        pipelined = _held_on_io_threads(arr, monkeypatch) if io == "pipelined" else []
        with pytest.raises(Exception, match="c/2/3"):
            arr[:]
    assert pipelined == ([16] if io == "pipelined" else [])


# numcodecs' astype warns of the values int32 cannot hold, under both pipelines
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("io", ["direct", "pipelined"])
def test_native_filters_in_groups_hand_a_refused_file_to_zarr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str
) -> None:
    """A stored float astype cannot turn into int32 (written by another
    array): the kernels read the file (or the IO threads fetched it) and
    refuse the chunk, zarr's code decodes the file's bytes, as zarr reads
    them."""
    refused: list[bytes] = []
    decode_refused = FilteredChain.decode_refused

    def spy(self: FilteredChain, payload: np.ndarray, where: str) -> np.ndarray:
        refused.append(payload.tobytes())
        return decode_refused(self, payload, where)

    monkeypatch.setattr(FilteredChain, "decode_refused", spy)
    root = tmp_path / "s"
    with with_pipeline(BATCHED):
        zarr.create_array(
            LocalStore(root / "a"),
            shape=(32,),
            chunks=(8,),
            dtype="<i4",
            filters=[zarr.codecs.numcodecs.AsType(encode_dtype="<f8", decode_dtype="<i4")],
            compressors=zarr.codecs.ZstdCodec(level=1),
        )[:] = np.arange(32, dtype="<i4")
        zarr.create_array(
            LocalStore(root / "b"),
            shape=(32,),
            chunks=(8,),
            dtype="<f8",
            compressors=zarr.codecs.ZstdCodec(level=1),
        )[:] = np.linspace(-1e10, 1e10, 32)
    (root / "a" / "c" / "2").write_bytes((root / "b" / "c" / "2").read_bytes())
    with with_pipeline(BATCHED):
        expected = zarr.open_array(LocalStore(root / "a"), mode="r")[:]
    with with_pipeline(FUSED):
        arr = zarr.open_array(LocalStore(root / "a"), mode="r")
        assert grouped_chain(arr) is not None
        pipelined = _held_on_io_threads(arr, monkeypatch) if io == "pipelined" else []
        assert_same_values(arr[:], expected)
        assert_same_values(arr[5:30:3], expected[5:30:3])
    assert refused == [(root / "a" / "c" / "2").read_bytes()] * 2
    assert pipelined == ([4, 4] if io == "pipelined" else [])


def test_native_filters_in_groups_fill_a_refused_file_gone_before_its_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused chunk's file deleted between the kernels' read and the
    read again for zarr's code: the chunk is missing, filled as zarr reads
    it, not a FileNotFoundError."""
    root = tmp_path / "s"
    with with_pipeline(BATCHED):
        for name, scale in (("a", 1), ("b", 3)):
            zarr.create_array(
                LocalStore(root / name),
                shape=(32,),
                chunks=(8,),
                dtype="<i4",
                fill_value=-5,
                filters=[zarr.codecs.scale_offset.ScaleOffset(scale=scale)],
                compressors=zarr.codecs.ZstdCodec(level=1),
            )[:] = np.arange(32, dtype="<i4")
    refused = root / "b" / "c" / "2"
    refused.write_bytes((root / "a" / "c" / "2").read_bytes())  # a remainder of 3
    read_again = _codec_batch.read_again
    reread: list[bytes] = []

    def gone_first(path: bytes) -> bytes | None:
        reread.append(path)
        Path(os.fsdecode(path)).unlink(missing_ok=True)
        return read_again(path)

    monkeypatch.setattr(_codec_batch, "read_again", gone_first)
    # the compute threads read the files (IO threads would hand the
    # kernels the bytes they fetched, with no file to read again): without
    # this, a busy host's scout may find the files slow
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.io_concurrency": 1}):
        arr = zarr.open_array(LocalStore(root / "b"), mode="r")
        assert grouped_chain(arr) is not None
        got = arr[:]
    assert reread == [os.fsencode(refused)]
    with with_pipeline(BATCHED):
        expected = zarr.open_array(LocalStore(root / "b"), mode="r")[:]
    assert_same_values(got, expected)
    np.testing.assert_array_equal(got[16:24], -5)


ROW_FILTERS = {
    "scale_offset-i8-negate": (
        "<i8",
        lambda: [zarr.codecs.scale_offset.ScaleOffset(offset=1000, scale=-1)],
    ),
    "fixedscaleoffset-f8-i2": (
        "<f8",
        lambda: [
            zarr.codecs.numcodecs.FixedScaleOffset(offset=280, scale=100, dtype="<f8", astype="<i2")
        ],
    ),
}


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in ROW_FILTERS])
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
@pytest.mark.parametrize(
    "selection",
    [
        pytest.param((slice(None), slice(None)), id="all"),
        pytest.param((slice(3, 17), slice(5, 140)), id="part"),
        pytest.param((slice(None, None, 3), slice(10, None)), id="step"),
    ],
)
def test_elementwise_filters_write_rows_in_place_as_zarr(
    tmp_path: Path, name: str, sharded: bool, selection: tuple[slice, ...]
) -> None:
    """Chunk rows of 64 eight-byte values (the filter writes them straight
    into the output), edge chunks on both axes: values as zarr reads them."""
    dtype, filters = ROW_FILTERS[name]
    rng = np.random.default_rng(21)
    data = (280 + rng.standard_normal((20, 150))).astype(dtype)
    chunks = (8, 64)
    with with_pipeline(BATCHED):
        if sharded:
            arr = zarr.create_array(
                LocalStore(tmp_path / "a"),
                shape=data.shape,
                chunks=(16, 128),
                dtype=dtype,
                serializer=zarr.codecs.ShardingCodec(
                    chunk_shape=chunks,
                    codecs=[*filters(), zarr.codecs.BytesCodec(), zarr.codecs.ZstdCodec()],
                ),
                compressors=None,
            )
        else:
            arr = zarr.create_array(
                LocalStore(tmp_path / "a"),
                shape=data.shape,
                chunks=chunks,
                dtype=dtype,
                filters=filters(),
                compressors=zarr.codecs.ZstdCodec(),
            )
        arr[:] = data
        expected = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")[selection]
    with with_pipeline(FUSED):
        got = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")[selection]
    assert_same_values(got, expected)
