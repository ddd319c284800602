"""Concurrent partial-shard writes lose nothing (`zarr_fused.io.shard_lock`).

Writers in several processes (spawned) or threads each own some inner
chunks of one shard and update them with writes smaller than the shard:
every update must survive. Readers in other processes see whole shards
only. Writes that cover whole shards take no hold, the off switch takes
none and creates no lock file, a forked child starts with no hold of its
parent's, a failed write leaves the old shard and no hold, and zarr's
features that list a store ignore the lock file.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import threading
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import ShardingCodec, TransposeCodec
from zarr.errors import ZarrUserWarning
from zarr.storage import LocalStore

import zarr_fused.shard.write as shard_write
from zarr_fused.config import SHARD_WRITE_LOCK_KEY
from zarr_fused.io import shard_lock
from zarr_fused.io.shard_lock import LOCK_FILE, lock_offset, shard_locks

from helpers import BATCHED, FUSED, make_store
from helpers.shard_writers import INNER, SHARD, TIMEOUT, create_shared, owned, run_writers

FORK = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
FORK_WARNING = "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"
STORES = [pytest.param("local", id="local"), pytest.param("memory", id="memory")]


def lock_files(root: Path) -> list[Path]:
    return sorted(root.rglob(LOCK_FILE))


def inner(r: int, c: int) -> tuple[slice, slice]:
    return slice(r * INNER, (r + 1) * INNER), slice(c * INNER, (c + 1) * INNER)


def run_threads(fn: Any, n: int) -> None:
    """``fn(0..n-1)`` on ``n`` threads started together; fails instead of hanging."""
    start = threading.Barrier(n, timeout=TIMEOUT)
    errors: list[BaseException] = []

    def task(i: int) -> None:
        try:
            start.wait()
            fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a writer thread hangs"
    if errors:
        raise errors[0]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[Any]:
    """Every hold taken, counted by key (the module's test seam)."""
    holds: Counter[Any] = Counter()
    monkeypatch.setattr(shard_lock, "on_hold", lambda key: holds.update([key]))
    return holds


# -- the scenario ------------------------------------------------------------------


def test_eight_processes_lose_no_inner_chunk(tmp_path: Path) -> None:
    """8 spawned processes, each updating its own 8 of the 64 inner chunks
    of one shard (one write per inner chunk), 10 rounds: none lost."""
    path = str(tmp_path / "shared.zarr")
    create_shared(path)
    lost = run_writers(path, processes=8, rounds=10, config={"codec_pipeline.path": FUSED})
    assert lost == {rank: [0] * 10 for rank in range(8)}
    assert [p.name for p in lock_files(tmp_path)] == [LOCK_FILE]
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        final = zarr.open_array(LocalStore(path), mode="r")[...]
    for rank in range(8):
        for r, c in owned(rank, 8):
            assert np.all(final[inner(r, c)] == 1000 * 10 + rank), (rank, r, c)


# -- threads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "io_concurrency", [pytest.param(None, id="io"), pytest.param(1, id="no-io")]
)
@pytest.mark.parametrize("store_kind", STORES)
def test_threads_lose_no_inner_chunk(
    fused: None, tmp_path: Path, store_kind: str, io_concurrency: int | None
) -> None:
    """8 threads, each updating its own inner chunks of one shard one by one,
    4 rounds: every thread's last value is stored."""
    config = {"codec_pipeline.max_workers": 2, "codec_pipeline.io_concurrency": io_concurrency}
    with zarr.config.set(config):
        arr = zarr.create_array(
            make_store(store_kind, tmp_path),
            shape=(SHARD, SHARD),
            chunks=(INNER, INNER),
            shards=(SHARD, SHARD),
            dtype="int32",
            fill_value=-1,
        )

        def writer(rank: int) -> None:
            rng = np.random.default_rng(50 + rank)
            cells = owned(rank, 8)
            for round_ in range(4):
                for k in rng.permutation(len(cells)):
                    arr[inner(*cells[int(k)])] = 1000 * round_ + rank

        run_threads(writer, 8)
        final = arr[...]
    for rank in range(8):
        for r, c in owned(rank, 8):
            assert np.all(final[inner(r, c)] == 3000 + rank), (rank, r, c)


@pytest.mark.parametrize("store_kind", STORES)
def test_threads_through_the_fallback_lose_nothing(
    fused: None, tmp_path: Path, store_kind: str
) -> None:
    """Orthogonal selections (zarr's sharding codec writes them) from 8
    threads into one shard: every thread's rows are stored."""
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        arr = zarr.create_array(
            make_store(store_kind, tmp_path),
            shape=(SHARD, SHARD),
            chunks=(INNER, INNER),
            shards=(SHARD, SHARD),
            dtype="int32",
            fill_value=-1,
        )

        def writer(rank: int) -> None:
            for round_ in range(3):
                # rows rank, rank + 8, ...: a share of every inner chunk row
                arr.oindex[np.arange(rank, SHARD, 8), :] = 1000 * round_ + rank

        run_threads(writer, 8)
        final = arr[...]
    for rank in range(8):
        assert np.all(final[rank::8, :] == 2000 + rank), rank


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec:UserWarning")
@pytest.mark.parametrize("store_kind", STORES)
def test_threads_on_shards_behind_other_codecs_lose_nothing(
    fused: None, tmp_path: Path, store_kind: str
) -> None:
    """Sharding behind a transpose has no partial encode: each shard is
    read, merged and rewritten whole as one chunk, and still held."""
    with zarr.config.set({"codec_pipeline.max_workers": 2}):
        arr = zarr.create_array(
            make_store(store_kind, tmp_path),
            shape=(SHARD, SHARD),
            chunks=(SHARD, SHARD),
            serializer=ShardingCodec(chunk_shape=(INNER, INNER)),
            filters=[TransposeCodec(order=(1, 0))],
            dtype="int32",
            fill_value=-1,
        )
        assert type(arr._async_array.codec_pipeline.plan.writer).__name__ == "ChunkWriter"

        def writer(rank: int) -> None:
            cells = owned(rank, 8)
            for round_ in range(3):
                for r, c in cells:
                    arr[inner(r, c)] = 1000 * round_ + rank

        run_threads(writer, 8)
        final = arr[...]
    for rank in range(8):
        for r, c in owned(rank, 8):
            assert np.all(final[inner(r, c)] == 2000 + rank), (rank, r, c)


# -- readers in other processes ------------------------------------------------------------


def _read_loop(path: str, done: Any, results: Any) -> None:
    """A child: read the whole shard until ``done``; every inner chunk must
    hold one value, the fill value or one its owner wrote."""
    try:
        reads = 0
        with zarr.config.set({"codec_pipeline.path": FUSED}):
            arr = zarr.open_array(LocalStore(path), mode="r")
            while not done.is_set() or reads < 5:
                whole = arr[...]
                for rank in range(4):
                    for r, c in owned(rank, 4):
                        values = set(np.unique(whole[inner(r, c)]).tolist())
                        allowed = {-1} | {1000 * (k + 1) + rank for k in range(10)}
                        assert len(values) == 1 and values <= allowed, (rank, r, c, values)
                reads += 1
        results.put(("reader", reads))
    except BaseException:
        results.put(("reader", traceback.format_exc()))


def test_readers_in_other_processes_never_see_a_torn_shard(tmp_path: Path) -> None:
    """4 writer processes update their inner chunks for 10 rounds while 2
    reader processes read the whole shard over and over: each read holds
    whole inner chunks of written values, and the writers lose nothing."""
    path = str(tmp_path / "shared.zarr")
    create_shared(path)
    ctx = multiprocessing.get_context("spawn")
    done, results = ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=_read_loop, args=(path, done, results)) for _ in range(2)]
    for proc in readers:
        proc.start()
    try:
        lost = run_writers(path, processes=4, rounds=10, config={"codec_pipeline.path": FUSED})
        done.set()
        answers = [results.get(timeout=TIMEOUT) for _ in readers]
        for proc in readers:
            proc.join(TIMEOUT)
    finally:
        done.set()
        for proc in readers:
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [reads for _, reads in answers if isinstance(reads, str)]
    assert not errors, errors[0]
    assert all(reads >= 5 for _, reads in answers), answers
    assert lost == {rank: [0] * 10 for rank in range(4)}


# -- when a hold is taken ------------------------------------------------------------------


def sharded(store: Any, **kwargs: Any) -> zarr.Array:
    return zarr.create_array(
        store,
        shape=(128, 64),
        chunks=(8, 8),
        shards=(SHARD, SHARD),
        dtype="uint16",
        fill_value=0,
        **kwargs,
    )


@pytest.mark.parametrize("store_kind", STORES)
def test_whole_shard_writes_take_no_hold(
    fused: None, tmp_path: Path, store_kind: str, counted: Counter[Any]
) -> None:
    arr = sharded(make_store(store_kind, tmp_path))
    data = np.random.default_rng(3).integers(0, 2**16, size=(128, 64), dtype="uint16")
    arr[...] = data
    arr[64:128, :] = 7
    np.testing.assert_array_equal(arr[:64], data[:64], strict=True)
    assert not counted
    if store_kind == "local":
        assert lock_files(tmp_path) == []


@pytest.mark.parametrize("store_kind", STORES)
def test_partial_writes_hold_each_shard_once(
    fused: None, tmp_path: Path, store_kind: str, counted: Counter[Any]
) -> None:
    """A write over part of both shards holds each of them once (the seam
    the previous test relies on does count)."""
    arr = sharded(make_store(store_kind, tmp_path))
    arr[8:72, 0:8] = 5
    assert len(counted) == 2 and set(counted.values()) == {1}
    assert np.all(arr[8:72, 0:8] == 5) and np.all(arr[:8] == 0)


def test_off_switch_takes_no_hold_and_creates_no_lock_file(
    fused: None, tmp_path: Path, counted: Counter[Any]
) -> None:
    arr = sharded(LocalStore(tmp_path / "data"))
    with zarr.config.set({SHARD_WRITE_LOCK_KEY: False}):
        arr[8:72, 0:8] = 5
        arr.oindex[[1, 3], :] = 6
    assert not counted
    assert lock_files(tmp_path) == []
    assert np.all(arr[8:72, 0:8] == 5) and np.all(arr[[1, 3], :] == 6)


def test_lock_file_sits_beside_the_shards(fused: None, tmp_path: Path) -> None:
    arr = sharded(LocalStore(tmp_path / "data"))
    arr[8:72, 0:8] = 5  # part of shards c/0/0 and c/1/0
    directories = [tmp_path / "data" / "c" / row for row in ("0", "1")]
    assert lock_files(tmp_path) == [d / LOCK_FILE for d in directories]
    assert all((d / LOCK_FILE).stat().st_size == 0 for d in directories)


def test_lock_offsets_are_stable_and_in_range() -> None:
    # the same in every process and host: a fixed hash, not Python's salted one
    assert lock_offset(b"0") == lock_offset(b"0")
    offsets = {lock_offset(str(k).encode()) for k in range(4096)}
    assert len(offsets) == 4096
    assert all(0 <= off < 2**62 for off in offsets)


# -- failures --------------------------------------------------------------------------------


def test_failed_write_keeps_the_old_shard_and_releases_the_hold(
    fused: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arr = sharded(LocalStore(tmp_path / "data"))
    data = np.random.default_rng(4).integers(0, 2**16, size=(128, 64), dtype="uint16")
    arr[...] = data

    def broken(path: bytes, parts: Any) -> None:
        raise OSError(errno.EIO, "injected", os.fsdecode(path))

    with monkeypatch.context() as patch:
        patch.setattr(shard_write, "write_parts", broken)
        with pytest.raises(OSError, match="injected"):
            arr[8:16, 0:8] = 9
    np.testing.assert_array_equal(arr[...], data, strict=True)
    assert shard_lock._current().held == set()
    done = threading.Event()

    def write_again() -> None:
        arr[8:16, 0:8] = 9
        done.set()

    worker = threading.Thread(target=write_again, daemon=True)
    worker.start()
    worker.join(TIMEOUT)
    assert done.is_set(), "the shard stayed held after the failed write"
    assert np.all(arr[8:16, 0:8] == 9)


def test_edeadlk_is_retried(fused: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's process-level deadlock detection can refuse a wait that
    is no deadlock between threads: the lock is tried again."""
    real = shard_lock.fcntl.lockf
    refused = []

    def once(fd: int, cmd: int, *args: Any) -> Any:
        if cmd == shard_lock.fcntl.LOCK_EX and not refused:
            refused.append(fd)
            raise OSError(errno.EDEADLK, "Resource deadlock avoided")
        return real(fd, cmd, *args)

    arr = sharded(LocalStore(tmp_path / "data"))
    monkeypatch.setattr(shard_lock.fcntl, "lockf", once)
    arr[8:16, 0:8] = 9
    assert refused and np.all(arr[8:16, 0:8] == 9)


def test_filesystem_without_record_locks_warns_once(
    fused: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_locks(fd: int, cmd: int, *args: Any) -> Any:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(shard_lock, "_registry", shard_lock._Registry())
    monkeypatch.setattr(shard_lock.fcntl, "lockf", no_locks)
    arr = sharded(LocalStore(tmp_path / "data"))
    with pytest.warns(ZarrUserWarning, match="POSIX record lock"):
        arr[8:16, 0:8] = 9
    arr[72:80, 0:8] = 8  # the same filesystem: no second warning (errors under strict config)
    assert np.all(arr[8:16, 0:8] == 9) and np.all(arr[72:80, 0:8] == 8)


def test_lock_files_beyond_the_cap_are_closed(
    fused: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_lock, "_registry", shard_lock._Registry())
    monkeypatch.setattr(shard_lock, "MAX_OPEN_FILES", 1)
    arr = zarr.create_array(
        LocalStore(tmp_path / "data"),
        shape=(256, 8),
        chunks=(8, 8),
        shards=(SHARD, 8),
        dtype="uint16",
        fill_value=0,
    )
    for row in range(0, 256, SHARD):  # 4 shard directories c/0 .. c/3
        arr[row : row + 8, :] = row + 1
    assert len(lock_files(tmp_path)) == 4
    assert len(shard_lock._current().files) <= 1
    assert [int(arr[row, 0]) for row in range(0, 256, SHARD)] == [1, 65, 129, 193]


# -- fork -------------------------------------------------------------------------------------


def _child_write(arr: zarr.Array, conn: Any) -> None:
    try:
        with zarr.config.set({"codec_pipeline.path": FUSED}):
            arr[8:16, 0:8] = 11
        conn.send("ok")
    except BaseException:
        conn.send(traceback.format_exc())
    finally:
        conn.close()


@FORK
@pytest.mark.filterwarnings(FORK_WARNING)
def test_child_forked_while_the_parent_holds_a_shard(fused: None, tmp_path: Path) -> None:
    """The child starts with none of its parent's holds: its write to the
    shard the parent holds waits for the parent's record lock (not for an
    in-process hold nobody in the child will release), then lands."""
    arr = sharded(LocalStore(tmp_path / "data"))
    arr[0:8, 0:8] = 1  # the lock file is open in the parent
    ctx = multiprocessing.get_context("fork")
    read_end, write_end = ctx.Pipe(duplex=False)
    locks = shard_locks([(arr._async_array.store_path / "c/0/0",)])
    assert locks is not None
    with locks.hold(arr._async_array.store_path / "c/0/0"):
        proc = ctx.Process(target=_child_write, args=(arr, write_end))
        proc.start()
        write_end.close()
        # the child cannot finish while the parent holds the shard
        assert not read_end.poll(0.5)
    try:
        assert read_end.poll(TIMEOUT), "the forked child hangs"
        assert read_end.recv() == "ok"
        proc.join(TIMEOUT)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 0
    assert np.all(arr[8:16, 0:8] == 11) and np.all(arr[0:8, 0:8] == 1)


# -- zarr's features that list the store ------------------------------------------------------


@pytest.mark.parametrize(
    "encoding", [pytest.param("default", id="default"), pytest.param("v2", id="v2-keys")]
)
def test_nchunks_initialized_ignores_the_lock_file(
    fused: None, tmp_path: Path, encoding: str
) -> None:
    """The same as for a twin written by zarr's own pipeline (no lock file)."""
    arr = sharded(LocalStore(tmp_path / "data"), chunk_key_encoding={"name": encoding})
    arr[8:16, 0:8] = 5
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        twin = sharded(LocalStore(tmp_path / "twin"), chunk_key_encoding={"name": encoding})
        twin[8:16, 0:8] = 5
    assert lock_files(tmp_path) == [tmp_path / "data" / "c" / "0" / LOCK_FILE] or encoding == "v2"
    assert len(lock_files(tmp_path)) == 1
    assert arr.nchunks_initialized == twin.nchunks_initialized == 64
    assert arr.nbytes_stored() == twin.nbytes_stored()


def test_group_members_ignore_the_lock_file(fused: None, tmp_path: Path) -> None:
    group = zarr.open_group(LocalStore(tmp_path / "data"), mode="w")
    for name in ("a", "b"):
        arr = group.create_array(
            name,
            shape=(128, 64),
            chunks=(8, 8),
            shards=(SHARD, SHARD),
            dtype="uint16",
            chunk_key_encoding={"name": "v2"},
        )
        arr[8:16, 0:8] = 5
    assert len(lock_files(tmp_path)) == 2
    reopened = zarr.open_group(LocalStore(tmp_path / "data"), mode="r")
    assert sorted(name for name, _ in reopened.members()) == ["a", "b"]


def test_deleted_and_recreated_array_locks_its_new_lock_file(fused: None, tmp_path: Path) -> None:
    """Deleting an array deletes its lock files; this process's open
    descriptor of the old one is noticed and a new lock file is made."""
    group = zarr.open_group(LocalStore(tmp_path / "data"), mode="w")
    for value in (5, 6):
        arr = group.create_array(
            "a",
            shape=(128, 64),
            chunks=(8, 8),
            shards=(SHARD, SHARD),
            dtype="uint16",
            overwrite=True,
        )
        arr[8:16, 0:8] = value
        assert lock_files(tmp_path) == [tmp_path / "data" / "a" / "c" / "0" / LOCK_FILE]
        assert np.all(arr[8:16, 0:8] == value) and np.all(arr[:8] == 0)
        del group["a"]
        assert lock_files(tmp_path) == []


def test_resize_with_lock_files(fused: None, tmp_path: Path) -> None:
    arr = sharded(LocalStore(tmp_path / "data"))
    arr[8:16, 0:8] = 5
    arr[72:80, 0:8] = 6
    arr.resize((64, 64))
    assert arr.nchunks_initialized == 64  # inner chunks of the one shard left
    assert not (tmp_path / "data" / "c" / "1" / "0").exists()
    arr.resize((128, 64))
    assert np.all(arr[64:] == 0) and np.all(arr[8:16, 0:8] == 5)
