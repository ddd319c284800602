"""zarr_fused's own file IO for LocalStore keeps LocalStore's semantics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.errors import ChunkNotFoundError
from zarr.storage import LocalStore

from zarr_fused import _localio

from helpers import BATCHED, FUSED, assert_same_values, with_pipeline


def test_read_whole_matches_file(tmp_path: Path) -> None:
    data = np.random.default_rng(0).bytes(100_001)
    (tmp_path / "f").write_bytes(data)
    assert _localio.read_whole(tmp_path / "f") == data
    (tmp_path / "empty").write_bytes(b"")
    assert _localio.read_whole(tmp_path / "empty") == b""


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(1, id="one-byte"),
        pytest.param((64 << 10) - 1, id="first-buffer-less-one"),
        pytest.param(64 << 10, id="first-buffer-exactly"),
        pytest.param((64 << 10) + 1, id="first-buffer-plus-one"),
        pytest.param(128 << 10, id="grown-buffer-exactly"),
        pytest.param(700_001, id="grown-three-times"),
    ],
)
def test_read_whole_reads_to_the_end_without_a_size(tmp_path: Path, size: int) -> None:
    """Files are read until ``read`` returns 0 into a buffer that doubles
    when full, not to a size taken with ``fstat``: every byte, at the
    buffer's boundaries too."""
    data = np.random.default_rng(size).bytes(size)
    (tmp_path / "f").write_bytes(data)
    assert _localio.read_whole(tmp_path / "f") == data


@pytest.mark.parametrize(
    "chunk",
    [pytest.param((128, 128), id="one-128KiB-chunk"), pytest.param((8, 8), id="512B-chunks")],
)
def test_chunk_files_of_any_size_decode_like_zarr(tmp_path: Path, chunk: tuple[int, int]) -> None:
    """Uncompressed float64 chunk files larger and smaller than a thread's
    first read buffer, read by the decode kernel itself (no ``fstat``)."""
    data = np.random.default_rng(7).normal(size=(256, 256))
    with with_pipeline(BATCHED):
        arr = zarr.create_array(
            LocalStore(tmp_path / "a"),
            shape=data.shape,
            chunks=chunk,
            dtype="<f8",
            compressors=None,
        )
        arr[...] = data
        expected = arr[3:250, 1:255]
    with with_pipeline(FUSED):
        got = zarr.open_array(LocalStore(tmp_path / "a"), mode="r")[3:250, 1:255]
    assert_same_values(got, expected)


@pytest.mark.parametrize("kind", ["absent", "directory", "through-a-file"])
def test_read_whole_missing_like_localstore(tmp_path: Path, kind: str) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    path = {
        "absent": tmp_path / "nope",
        "directory": tmp_path / "dir",
        "through-a-file": tmp_path / "file" / "below",
    }[kind]
    assert _localio.read_whole(path) is None
    assert LocalStore(tmp_path).get_sync(str(path.relative_to(tmp_path))) is None


def test_write_whole_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "chunk"
    _localio.write_whole(target, b"old")
    _localio.write_whole(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk"]  # no temporaries left


def test_write_whole_error_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "chunk"
    target.write_bytes(b"old")
    with pytest.raises(OSError):
        _localio.write_whole(tmp_path / "missing-dir" / "chunk", b"new")
    # the rename target is a directory: the write fails, nothing else changes
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "inner").write_bytes(b"keep")
    with pytest.raises(OSError):
        _localio.write_whole(tmp_path / "adir", b"new")
    assert target.read_bytes() == b"old"
    assert (tmp_path / "adir" / "inner").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "chunk"]


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param([], id="nothing"),
        pytest.param([5], id="one"),
        pytest.param([0, 3, 0, 0, 7, 0], id="empty-parts"),
        pytest.param([1] * 1500, id="more-parts-than-one-writev"),
        pytest.param([3 << 20, 17, 1 << 20], id="large"),
    ],
)
def test_write_parts_writes_the_concatenation(tmp_path: Path, sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    parts = [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]
    parts[::2] = [p.tobytes() for p in parts[::2]]  # bytes and arrays alike
    target = tmp_path / "shard"
    target.write_bytes(b"old")
    _localio.write_parts(target, parts)
    assert target.read_bytes() == b"".join(bytes(p) for p in parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]  # no temporaries left


def test_write_parts_error_leaves_old_file(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "inner").write_bytes(b"keep")
    with pytest.raises(OSError):
        _localio.write_parts(tmp_path / "adir", [b"new", b"parts"])
    with pytest.raises(OSError):
        _localio.write_parts(tmp_path / "missing-dir" / "shard", [b"new"])
    assert (tmp_path / "adir" / "inner").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


@pytest.mark.parametrize("compressors", [None, zarr.codecs.ZstdCodec(level=1)], ids=["raw", "zstd"])
def test_missing_chunk_files_report_missing(tmp_path: Path, compressors: object) -> None:
    store = LocalStore(tmp_path / "a")
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store,
            shape=(8, 8),
            chunks=(4, 4),
            dtype="<i4",
            fill_value=-1,
            compressors=compressors,
            config={"read_missing_chunks": False},
        )
        arr[:4, :4] = 1
        assert_same_values(arr[:4, :4], np.ones((4, 4), "<i4"))
        with pytest.raises(ChunkNotFoundError):
            arr[...]
        # a directory where a chunk file should be reads as missing, like LocalStore
        (tmp_path / "a" / "c" / "1" / "1").mkdir(parents=True)
        with pytest.raises(ChunkNotFoundError):
            arr[4:, 4:]
    with with_pipeline(FUSED):
        relaxed = zarr.open_array(store, mode="r")
        expected = np.full((8, 8), -1, "<i4")
        expected[:4, :4] = 1
        assert_same_values(relaxed[...], expected)


def test_unreadable_chunk_raises_oserror_naming_key(tmp_path: Path) -> None:
    """An IO error other than a missing file propagates, as from LocalStore
    (here a symlink loop, which even root cannot read)."""
    store = LocalStore(tmp_path / "a")
    with with_pipeline(FUSED):
        arr = zarr.create_array(store, shape=(8,), chunks=(4,), dtype="<i4", compressors=None)
        arr[:] = 1
        chunk = tmp_path / "a" / "c" / "1"
        chunk.unlink()
        chunk.symlink_to(chunk)
        with pytest.raises(OSError, match="c/1") as info:
            arr[:]
        assert info.value.errno is not None
    with with_pipeline(BATCHED), pytest.raises(OSError):
        zarr.open_array(store, mode="r")[:]


def test_failed_write_keeps_previous_chunk(tmp_path: Path) -> None:
    """A chunk whose rename target became a directory cannot be replaced:
    the write raises, naming the key, the old chunks stay readable, and no
    temporary file is left behind."""
    store = LocalStore(tmp_path / "a")
    data = np.arange(16, dtype="<i4")
    with with_pipeline(FUSED):
        arr = zarr.create_array(store, shape=(16,), chunks=(4,), dtype="<i4", compressors=None)
        arr[...] = data
        blocker = tmp_path / "a" / "c" / "2"
        blocker.unlink()
        blocker.mkdir()
        (blocker / "x").write_bytes(b"")
        with pytest.raises(OSError, match="c/2"):
            arr[...] = data + 100
        got = arr[...]
    # chunks written before or after the failure hold either old or new data,
    # whole; the blocked chunk reads as missing (a directory)
    for i in (0, 1, 3):
        assert np.array_equal(got[4 * i : 4 * i + 4], data[4 * i : 4 * i + 4]) or np.array_equal(
            got[4 * i : 4 * i + 4], data[4 * i : 4 * i + 4] + 100
        )
    leftovers = [p for p in (tmp_path / "a").rglob("*.partial")]
    assert leftovers == []


def test_localstore_subclass_keeps_its_own_io(tmp_path: Path) -> None:
    calls = []

    class CountingStore(LocalStore):
        def get_sync(self, key, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(key)
            return super().get_sync(key, **kwargs)

    store = CountingStore(tmp_path / "a")
    with with_pipeline(FUSED):
        arr = zarr.create_array(store, shape=(8,), chunks=(4,), dtype="<i4", compressors=None)
        arr[:] = 3
        assert_same_values(arr[:], np.full(8, 3, "<i4"))
    assert "c/0" in calls and "c/1" in calls


def test_written_files_read_by_zarr(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a")
    data = np.random.default_rng(2).random((30, 30)).astype(">f4")
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            store,
            shape=data.shape,
            chunks=(7, 8),
            dtype=data.dtype,
            compressors=zarr.codecs.BloscCodec(cname="zstd"),
        )
        arr[...] = data
        arr[3:20, 5:9] = 0.5
    data[3:20, 5:9] = 0.5
    with with_pipeline(BATCHED):
        assert_same_values(zarr.open_array(store, mode="r")[...], data, byte_order=False)
    assert [p for p in (tmp_path / "a").rglob("*.partial")] == []


# How a write replaces its target: rename without replacing (the target was
# new), exchange with the target and unlink the old file (it existed), or a
# plain rename (the kernel or filesystem refused the flags). The mode is a
# hint a wrong guess corrects; every mode must give rename's result.
REPLACE_MODES = [
    pytest.param("new", id="mode-new"),
    pytest.param("existed", id="mode-existed"),
    pytest.param("rename", id="mode-rename"),
]


@pytest.fixture
def replace_mode() -> Iterator[Callable[[str], None]]:
    """Sets the process's replace mode for one test, restored after it."""
    before = _localio.replace_mode()
    yield _localio.replace_mode
    _localio.replace_mode(before)


@pytest.mark.parametrize("mode", REPLACE_MODES)
def test_write_replaces_an_existing_file_in_every_mode(
    tmp_path: Path, replace_mode: Callable[[str], None], mode: str
) -> None:
    target = tmp_path / "chunk"
    target.write_bytes(b"old contents, longer than the new ones")
    old_inode = target.stat().st_ino
    with target.open("rb") as reader:  # a reader of the old file keeps it whole
        replace_mode(mode)
        _localio.write_whole(target, b"new contents")
        assert reader.read() == b"old contents, longer than the new ones"
    assert target.read_bytes() == b"new contents"
    assert target.stat().st_ino != old_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk"]  # no temporaries left


@pytest.mark.parametrize("mode", REPLACE_MODES)
def test_write_creates_a_new_file_in_every_mode(
    tmp_path: Path, replace_mode: Callable[[str], None], mode: str
) -> None:
    replace_mode(mode)
    _localio.write_whole(tmp_path / "chunk", b"new contents")
    assert (tmp_path / "chunk").read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk"]


@pytest.mark.parametrize("mode", REPLACE_MODES)
def test_write_over_a_directory_fails_and_keeps_it_in_every_mode(
    tmp_path: Path, replace_mode: Callable[[str], None], mode: str
) -> None:
    """An exchange would put the directory under the temporary name; it is
    put back, and the write fails as a rename over a directory does."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir" / "inner").write_bytes(b"keep")
    replace_mode(mode)
    with pytest.raises(IsADirectoryError):
        _localio.write_whole(tmp_path / "adir", b"new")
    assert (tmp_path / "adir" / "inner").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


@pytest.mark.parametrize(
    ("mode", "exists", "after"),
    [
        pytest.param("new", True, "existed", id="new-finds-a-target"),
        pytest.param("new", False, "new", id="new-finds-none"),
        pytest.param("existed", False, "new", id="existed-finds-none"),
        pytest.param("existed", True, "existed", id="existed-finds-a-target"),
        pytest.param("rename", True, "rename", id="rename-stays"),
    ],
)
def test_replace_mode_follows_what_the_last_write_found(
    tmp_path: Path, replace_mode: Callable[[str], None], mode: str, exists: bool, after: str
) -> None:
    """The next write is tried first the way the last one succeeded (on a
    filesystem with renameat2 flags: Linux tmp directories have them)."""
    if exists:
        (tmp_path / "chunk").write_bytes(b"old")
    replace_mode(mode)
    _localio.write_whole(tmp_path / "chunk", b"new")
    assert _localio.replace_mode() == after
