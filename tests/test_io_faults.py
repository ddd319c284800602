"""Failing disks: IO errors, short and interrupted transfers, a full disk.

Faults are injected in a long-lived child process by the faultfs shim
(``tests/shims/faultfs.c``, preloaded with ``LD_PRELOAD``), which wraps the
libc calls zarr_fused's file IO makes (``open``, ``read``, ``pread``,
``preadv``, ``writev``, ``close``, ``rename``; ``_localio.pyx``) and those
CPython makes for zarr's LocalStore, on the files of one chunk or shard
only. A full disk is a real one: a small tmpfs, mounted where the test runs
as root.

Each fault must end the same way: an ``OSError`` carrying the errno and
naming the key, no chunk torn (each reads back whole, old or new), no
temporary file left, and the data written before still readable.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from shims import FaultyChild, build_faultfs
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

from helpers import BATCHED, FUSED, with_pipeline
from helpers.tmpfs import fill_disk, tmpfs_fixture  # noqa: F401 (the fixture tmpfs)

TIMEOUT = 60.0
SHAPE = (16, 16)
TARGET = "c/1/0"  # the key whose files the shim touches (rows 8:16, columns 0:8)
# the other keys of SHAPE in both layouts (chunks or shards of 8 x 8)
KEYS = ("c/0/0", "c/0/1", "c/1/0", "c/1/1")

LAYOUTS = {
    "chunked": {"chunks": (8, 8), "compressors": ZstdCodec(level=1)},
    "sharded": {"chunks": (4, 4), "shards": (8, 8), "compressors": ZstdCodec(level=1)},
    "chunked-raw": {"chunks": (8, 8), "compressors": None},
}

# Runs in the long-lived child, with the shim preloaded: one read or one
# write through zarr_fused.
CASE = r"""
import numpy as np, zarr
from zarr.storage import LocalStore

sel = tuple(slice(a, b) for a, b in args["selection"])
config = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
          "codec_pipeline.max_workers": args["workers"]}
with zarr.config.set(config):
    arr = zarr.open_array(LocalStore(args["root"]), mode="r+")
    pipeline = type(arr._async_array.codec_pipeline)
    assert pipeline.__module__ + "." + pipeline.__qualname__ == args["pipeline"], pipeline
    if args["op"] == "write":
        arr[sel] = np.load(args["value"])
    else:
        np.save(args["result"], arr[sel])
"""


@pytest.fixture(scope="module")
def faulty_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyChild]:
    with FaultyChild(build_faultfs(tmp_path_factory.mktemp("faultfs")), timeout=TIMEOUT) as child:
        yield child


def old_and_new(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    old = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    return old, old + rng.integers(1, 1000, size=SHAPE, dtype="int32")


def make_array(root: Path, layout: str, data: np.ndarray) -> None:
    with with_pipeline(FUSED):
        arr = zarr.create_array(LocalStore(root), shape=SHAPE, dtype=data.dtype, **LAYOUTS[layout])
        arr[...] = data


def key_region(key: str) -> tuple[slice, slice]:
    i, j = (int(p) for p in key.split("/")[1:])
    return slice(8 * i, 8 * i + 8), slice(8 * j, 8 * j + 8)


def run_child(
    child: FaultyChild,
    tmp_path: Path,
    root: Path,
    op: str,
    selection: tuple[slice, ...],
    value: np.ndarray | None = None,
    workers: int = 2,
    **faults: object,
) -> tuple[dict[str, Any], list[str]]:
    """One read or write in the child with faults on TARGET's files: its
    outcome, and the shim's log (a line per fault or short transfer)."""
    log = tmp_path / "faultfs.log"
    log.unlink(missing_ok=True)
    args: dict[str, Any] = {
        "root": str(root),
        "op": op,
        "workers": workers,
        "pipeline": FUSED,
        "selection": [(s.start, s.stop) for s in selection],
        "result": str(tmp_path / "result.npy"),
        "value": str(tmp_path / "value.npy"),
    }
    if value is not None:
        np.save(args["value"], value)
    result = child.run(CASE, args, marker=root / TARGET, log=log, **faults)
    lines = log.read_text().splitlines() if log.exists() else []
    return result, lines


def leftovers(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.partial"))


def stored_by_zarr(root: Path) -> np.ndarray:
    """The array as zarr's own pipeline reads it (the oracle)."""
    with with_pipeline(BATCHED):
        return zarr.open_array(LocalStore(root), mode="r")[...]


def assert_old_error(result: dict[str, Any], code: int, key: str = TARGET) -> None:
    assert not result["ok"], "the fault did not surface"
    assert result["type"] != "AssertionError", result["traceback"]
    assert result["oserror"], result
    assert result["errno"] == code, result
    assert key in result["message"], result


# -- errors ----------------------------------------------------------------------------

# (calls faulted, errno): the temporary file's creation, its writes, its
# close (an error reported by close, as NFS does), the rename over the key
WRITE_FAULTS = [
    pytest.param("create", "EIO", id="create-EIO"),
    pytest.param("create", "EACCES", id="create-EACCES"),
    pytest.param("write", "EIO", id="writev-EIO"),
    pytest.param("write", "ENOSPC", id="writev-ENOSPC"),
    pytest.param("close", "EIO", id="close-EIO"),
    pytest.param("rename", "EACCES", id="rename-EACCES"),
]


@pytest.mark.parametrize(
    "layout", [pytest.param("chunked", id="chunked"), pytest.param("sharded", id="sharded")]
)
@pytest.mark.parametrize(("ops", "code"), WRITE_FAULTS)
def test_write_fault_raises_and_keeps_the_old_chunk(
    tmp_path: Path, faulty_child: FaultyChild, layout: str, ops: str, code: str
) -> None:
    root = tmp_path / "arr"
    old, new = old_and_new(seed=11)
    make_array(root, layout, old)

    result, log = run_child(
        faulty_child,
        tmp_path,
        root,
        "write",
        (slice(None), slice(None)),
        value=new,
        ops=ops,
        errno=code,
    )

    assert log, "the shim injected no fault"
    assert_old_error(result, getattr(errno, code))
    assert leftovers(root) == []
    stored = stored_by_zarr(root)
    for key in KEYS:
        region = key_region(key)
        if key == TARGET:
            np.testing.assert_array_equal(stored[region], old[region], err_msg=key)
        else:  # written before or after the failure, or not at all: whole either way
            assert np.array_equal(stored[region], old[region]) or np.array_equal(
                stored[region], new[region]
            ), key
    with with_pipeline(FUSED):
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], stored)


@pytest.mark.parametrize(
    "layout", [pytest.param("chunked", id="chunked"), pytest.param("sharded", id="sharded")]
)
@pytest.mark.parametrize("code", [pytest.param(k, id=k) for k in ("ENOSPC", "EDQUOT")])
def test_one_full_disk_error_is_retried_and_the_write_goes_through(
    tmp_path: Path, faulty_child: FaultyChild, layout: str, code: str
) -> None:
    """The first write of the key's temporary file fails as on a full disk;
    the write is retried with fewer files in flight and succeeds."""
    root = tmp_path / "arr"
    old, new = old_and_new(seed=17)
    make_array(root, layout, old)

    result, log = run_child(
        faulty_child,
        tmp_path,
        root,
        "write",
        (slice(None), slice(None)),
        value=new,
        ops="write",
        errno=getattr(errno, code),  # EDQUOT by number: the shim knows few names
        count=1,
    )

    assert len(log) == 1, log
    assert result["ok"], result.get("traceback")
    np.testing.assert_array_equal(stored_by_zarr(root), new)
    assert leftovers(root) == []


READ_FAULTS = [
    pytest.param("open", "EIO", id="open-EIO"),
    pytest.param("open", "EACCES", id="open-EACCES"),
    pytest.param("read", "EIO", id="read-EIO"),
]
# the whole array, and a few elements of one inner chunk (a ranged read of a shard)
READ_SELECTIONS = [
    pytest.param((slice(None), slice(None)), id="whole"),
    pytest.param((slice(9, 11), slice(1, 3)), id="small"),
]


@pytest.mark.parametrize("selection", READ_SELECTIONS)
@pytest.mark.parametrize(
    "layout", [pytest.param("chunked", id="chunked"), pytest.param("sharded", id="sharded")]
)
@pytest.mark.parametrize(("ops", "code"), READ_FAULTS)
def test_read_fault_raises_naming_the_key(
    tmp_path: Path,
    faulty_child: FaultyChild,
    layout: str,
    selection: tuple[slice, ...],
    ops: str,
    code: str,
) -> None:
    root = tmp_path / "arr"
    old, _ = old_and_new(seed=12)
    make_array(root, layout, old)

    result, log = run_child(faulty_child, tmp_path, root, "read", selection, ops=ops, errno=code)

    assert log, "the shim injected no fault"
    assert_old_error(result, getattr(errno, code))
    with with_pipeline(FUSED):  # nothing changed on disk
        np.testing.assert_array_equal(zarr.open_array(LocalStore(root), mode="r")[...], old)


# -- transfers that make partial progress or are interrupted ----------------------------

# short: every read and write moves at most 7 bytes (a shard's parts and
# ranges end mid-call); eintr: every other open, read and write on the
# key's files fails with EINTR first, as under a signal storm
TRANSFER_FAULTS = {
    "short": {"mode": "short", "short": 7, "ops": "read,write"},
    "eintr": {"ops": "open,create,read,write", "errno": "EINTR", "every": 2},
}
# cuts through the target's chunk (or several of its shard's inner chunks),
# so a write reads the old bytes first
REGION = (slice(5, 13), slice(3, 11))
TRANSFER_LAYOUTS = [pytest.param(k, id=k) for k in ("chunked-raw", "chunked", "sharded")]


@pytest.mark.parametrize("fault", [pytest.param(k, id=k) for k in TRANSFER_FAULTS])
@pytest.mark.parametrize("layout", TRANSFER_LAYOUTS)
def test_short_and_interrupted_writes_store_the_same(
    tmp_path: Path, faulty_child: FaultyChild, layout: str, fault: str
) -> None:
    root = tmp_path / "arr"
    old, new = old_and_new(seed=13)
    make_array(root, layout, old)

    result, log = run_child(
        faulty_child, tmp_path, root, "write", REGION, value=new[REGION], **TRANSFER_FAULTS[fault]
    )

    assert result["ok"], result.get("traceback")
    assert log, "the shim touched no call"
    expected = old.copy()
    expected[REGION] = new[REGION]
    np.testing.assert_array_equal(stored_by_zarr(root), expected)
    assert leftovers(root) == []


@pytest.mark.parametrize(
    "selection",
    [pytest.param((slice(None), slice(None)), id="whole"), pytest.param(REGION, id="region")],
)
@pytest.mark.parametrize("fault", [pytest.param(k, id=k) for k in TRANSFER_FAULTS])
@pytest.mark.parametrize("layout", TRANSFER_LAYOUTS)
def test_short_and_interrupted_reads_return_the_same(
    tmp_path: Path, faulty_child: FaultyChild, layout: str, fault: str, selection: tuple[slice, ...]
) -> None:
    root = tmp_path / "arr"
    old, _ = old_and_new(seed=14)
    make_array(root, layout, old)

    result, log = run_child(
        faulty_child, tmp_path, root, "read", selection, **TRANSFER_FAULTS[fault]
    )

    assert result["ok"], result.get("traceback")
    assert log, "the shim touched no call"
    np.testing.assert_array_equal(np.load(tmp_path / "result.npy"), old[selection])


# -- a full disk -----------------------------------------------------------------------

FULL_SHAPE = (64, 1024)  # int32, 256 KiB
FULL_LAYOUTS = {
    "chunked": {"chunks": (8, 1024), "compressors": None},  # 8 chunks of 32 KiB
    # 32 chunks of 8 KiB: more than the probe of a write stores itself, so
    # slow renames hand the rest to the IO threads
    "chunked-small": {"chunks": (2, 1024), "compressors": None},
    "sharded": {"chunks": (8, 1024), "shards": (16, 1024), "compressors": None},  # 4 x 64 KiB
}


@pytest.fixture
def small_tmpfs(tmpfs: Callable[[str], Path]) -> Path:
    """A 1 MiB tmpfs mounted for the test (root only), unmounted after."""
    return tmpfs("mnt")


@pytest.mark.parametrize("layout", [pytest.param(k, id=k) for k in FULL_LAYOUTS])
def test_full_disk_raises_enospc_and_tears_nothing(small_tmpfs: Path, layout: str) -> None:
    root = small_tmpfs / "arr"
    rng = np.random.default_rng(15)
    old = rng.integers(-(2**30), 2**30, size=FULL_SHAPE, dtype="int32")
    new = old ^ 0x55
    half = FULL_SHAPE[0] // 2
    unit = FULL_LAYOUTS[layout].get("shards", FULL_LAYOUTS[layout]["chunks"])[0]
    keys = [f"c/{i}/0" for i in range(FULL_SHAPE[0] // unit)]
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 2}):
        arr = zarr.create_array(
            LocalStore(root), shape=FULL_SHAPE, dtype="int32", fill_value=0, **FULL_LAYOUTS[layout]
        )
        arr[:half] = old[:half]
        # fill the disk until one key's temporary file and a half fit
        unit_bytes = unit * FULL_SHAPE[1] * 4
        st = os.statvfs(small_tmpfs)
        spare = st.f_bavail * st.f_frsize - (3 * unit_bytes) // 2
        assert spare > 0
        (small_tmpfs / "filler").write_bytes(b"\1" * spare)

        with pytest.raises(OSError) as info:
            arr[...] = new

        assert info.value.errno == errno.ENOSPC
        failed = re.findall(r"c/\d+/0", str(info.value))
        assert failed and failed[0] in keys, str(info.value)
        assert leftovers(root) == []
        stored = stored_by_zarr(root)
        written = 0
        for i, key in enumerate(keys):
            rows = slice(i * unit, (i + 1) * unit)
            before = old[rows] if rows.start < half else np.zeros_like(old[rows])
            written += np.array_equal(stored[rows], new[rows])
            assert np.array_equal(stored[rows], before) or np.array_equal(
                stored[rows], new[rows]
            ), key
        assert written < len(keys)
        np.testing.assert_array_equal(arr[...], stored)

        # with room again, the same write goes through
        (small_tmpfs / "filler").unlink()
        arr[...] = new
    np.testing.assert_array_equal(stored_by_zarr(root), new)
    assert leftovers(root) == []


# Runs in the long-lived child: an overwrite of the whole array through
# zarr_fused with the debug records of the zarr_fused logger kept (they say
# whether the write was retried after a full disk).
OVERWRITE_LOGGED = r"""
import logging
import numpy as np, zarr
from zarr.storage import LocalStore

records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logger = logging.getLogger("zarr_fused")
logger.addHandler(handler)
level = logger.level
logger.setLevel(logging.DEBUG)
config = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
          "codec_pipeline.max_workers": args["workers"]}
try:
    with zarr.config.set(config):
        zarr.open_array(LocalStore(args["root"]), mode="r+")[...] = np.load(args["value"])
finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
    result = records
"""


def unit_bytes(layout: str) -> int:
    """The bytes of one chunk file (or shard) of FULL_LAYOUTS[layout]."""
    unit = FULL_LAYOUTS[layout].get("shards", FULL_LAYOUTS[layout]["chunks"])[0]
    return unit * FULL_SHAPE[1] * 4


# (layout, compute threads): one thread on the small chunks probes 4 files
# alone, then the IO threads get the rest (8 in flight); 4 threads write
# their files themselves (chunked) or hand shards to the IO threads
OVERWRITES = [
    pytest.param("chunked", 4, id="chunked-compute-threads"),
    pytest.param("chunked-small", 1, id="chunked-io-threads"),
    pytest.param("sharded", 4, id="sharded"),
]


@pytest.mark.parametrize(("layout", "workers"), OVERWRITES)
def test_overwrite_with_room_for_one_and_a_half_files_succeeds(
    small_tmpfs: Path, faulty_child: FaultyChild, tmp_path: Path, layout: str, workers: int
) -> None:
    """As zarr writing one file at a time: each rename frees the old file
    before the next temporary file is written. The shim holds every rename
    for 20 ms, so the first attempt surely has several temporary files
    written at once and fills the disk; the retries go through."""
    root = small_tmpfs / "arr"
    rng = np.random.default_rng(18)
    old = rng.integers(-(2**30), 2**30, size=FULL_SHAPE, dtype="int32")
    new = old ^ 0x55
    with with_pipeline(FUSED):
        arr = zarr.create_array(
            LocalStore(root), shape=FULL_SHAPE, dtype="int32", fill_value=0, **FULL_LAYOUTS[layout]
        )
        arr[...] = old
    fill_disk(small_tmpfs, (3 * unit_bytes(layout)) // 2)
    np.save(tmp_path / "value.npy", new)

    result = faulty_child.run(
        OVERWRITE_LOGGED,
        {"root": str(root), "value": str(tmp_path / "value.npy"), "workers": workers},
        marker=root,
        ops="rename",
        mode="delay",
        delay_us=20_000,
    )

    assert result["ok"], result.get("traceback")
    assert any("full disk" in line for line in result["result"]), result["result"]
    np.testing.assert_array_equal(stored_by_zarr(root), new)
    assert leftovers(root) == []


@pytest.mark.parametrize("layout", [pytest.param(k, id=k) for k in FULL_LAYOUTS])
def test_overwrite_without_room_for_one_file_keeps_the_old_data(
    small_tmpfs: Path, layout: str
) -> None:
    """Half a file of room: zarr's one-at-a-time write fails too. The error
    is zarr's (ENOSPC), raised after the retries, and every key keeps its
    old bytes."""
    root = small_tmpfs / "arr"
    rng = np.random.default_rng(19)
    old = rng.integers(-(2**30), 2**30, size=FULL_SHAPE, dtype="int32")
    with with_pipeline(FUSED), zarr.config.set({"codec_pipeline.max_workers": 4}):
        arr = zarr.create_array(
            LocalStore(root), shape=FULL_SHAPE, dtype="int32", fill_value=0, **FULL_LAYOUTS[layout]
        )
        arr[...] = old
        fill_disk(small_tmpfs, unit_bytes(layout) // 2)

        with pytest.raises(OSError) as info:
            arr[...] = old ^ 0x55

    assert info.value.errno == errno.ENOSPC
    assert re.search(r"c/\d+/0", str(info.value)), str(info.value)
    assert any("one file in flight" in note for note in info.value.__notes__)
    assert leftovers(root) == []
    np.testing.assert_array_equal(stored_by_zarr(root), old)


@pytest.mark.parametrize(
    ("op", "selection"),
    [
        pytest.param("read", (slice(None), slice(None)), id="read-whole"),
        pytest.param("read", REGION, id="read-region"),
        pytest.param("write", REGION, id="partial-write"),
    ],
)
def test_sharded_io_error_filename_is_text(
    tmp_path: Path, faulty_child: FaultyChild, op: str, selection: tuple[slice, ...]
) -> None:
    root = tmp_path / "arr"
    old, new = old_and_new(seed=16)
    make_array(root, "sharded", old)

    result, log = run_child(
        faulty_child, tmp_path, root, op, selection, value=new[selection], ops="read", errno="EIO"
    )

    assert log, "the shim injected no fault"
    assert_old_error(result, errno.EIO)
    assert not result["filename"].startswith("b"), result["filename"]


# -- a file that shrinks under the reader ------------------------------------------------

FILE_GROUP_READ = r"""
import numpy as np
from zarr_fused import _fileio

path = args["path"].encode()
size = args["size"]
arena = np.zeros(size, dtype=np.uint8)
offsets = np.zeros(1, dtype=np.intp)
capacities = np.full(1, size, dtype=np.intp)
lengths = np.zeros(1, dtype=np.intp)
result = [_fileio.read_files_into([path], arena, offsets, capacities, lengths,
                                  np.zeros(1, dtype=np.uint8)), int(lengths[0])]
"""


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({}, id="none"),
        pytest.param({"mode": "eof", "ops": "read"}, id="ends-early"),
    ],
)
def test_file_groups_refuse_a_file_that_ends_before_its_size(
    tmp_path: Path, faulty_child: FaultyChild, fault: dict[str, str]
) -> None:
    """The IO threads' file-group read (`_fileio.read_files_into`): a file
    whose read ends before the size `fstat` gave (truncated by another
    process) is an EIO naming it, never its old length over stale bytes."""
    root = tmp_path / "files"
    root.mkdir()
    path = root / TARGET.replace("/", "_")
    path.write_bytes(bytes(range(256)) * 16)
    log = tmp_path / "faultfs.log"
    args = {"path": str(path), "size": 4096}
    result = faulty_child.run(FILE_GROUP_READ, args, marker=path, log=log, **fault)
    if not fault:
        assert result["ok"], result.get("traceback")
        assert result["result"] == [1, 4096]
        return
    assert log.exists(), "the shim touched no call"
    assert not result["ok"], f"read as {result.get('result')}"
    assert result["errno"] == errno.EIO, result
    assert path.name in result["message"], result
