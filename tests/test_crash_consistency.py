"""A writer killed at any moment leaves every key old or new, never a mix.

zarr's LocalStore writes a value to a temporary file next to the key
(``<key>.<uuid hex>.partial``) and renames it over the key; zarr_fused does
the same in C (``<key>.<salt>-<pid>-<counter>.partial``, ``_localio.pyx``).
Neither calls fsync: the promise is about a process that dies (SIGKILL, a
crash), not about a machine that loses power. A process killed between
creating the temporary file and the rename leaves that file behind;
neither zarr nor zarr_fused removes it later or hides it from
``store.list()``, and reads never look at it, as it is no chunk key.

The writer runs in a child process writing generation after generation
(generation ``g`` stores ``BASE + g`` in the region it writes), killed with
SIGKILL after a seeded random delay, or, deterministically, by the faultfs
shim (``tests/shims/faultfs.c``) inside its N-th ``writev`` (half of the
bytes written) or just before its N-th rename. Afterwards zarr's own
pipeline reads every key: each must decode, and hold one generation whole.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from shims import build_faultfs, child_env, communicate
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

from zarr_fused.io.shard_lock import LOCK_FILE

from helpers import BATCHED, FUSED, with_pipeline

TIMEOUT = 60.0
SHAPE = (512, 512)  # int32: 1 MiB a generation when the whole array is written
LAYOUTS = {
    "chunked-raw": {"chunks": (128, 128), "compressors": None},
    "chunked-zstd": {"chunks": (128, 128), "compressors": ZstdCodec(level=1)},
    "sharded-raw": {"chunks": (64, 64), "shards": (256, 256), "compressors": None},
    "sharded-zstd": {"chunks": (64, 64), "shards": (256, 256), "compressors": ZstdCodec(level=1)},
}
WHOLE = (slice(0, 512), slice(0, 512))
# cuts through chunks and shards on both axes: every key it touches is
# read, merged and rewritten
REGION = (slice(40, 300), slice(100, 470))

WRITER = r"""
import json, sys, time
import numpy as np, zarr
from zarr.storage import LocalStore

args = json.loads(sys.argv[1])
sel = tuple(slice(a, b) for a, b in args["selection"])
base = np.load(args["base"])
config = {"codec_pipeline.path": args["pipeline"], "codec_pipeline.max_workers": 2}
with zarr.config.set(config):
    arr = zarr.open_array(LocalStore(args["root"]), mode="r+")
    pipeline = type(arr._async_array.codec_pipeline)
    assert pipeline.__module__ + "." + pipeline.__qualname__ == args["pipeline"], pipeline
    print("ready", flush=True)
    deadline = time.monotonic() + args["seconds"]
    for g in range(1, args["generations"] + 1):
        arr[sel] = (base + g)[sel]
        if time.monotonic() > deadline:
            break
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def faultfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_faultfs(tmp_path_factory.mktemp("faultfs"))


def make_base(root: Path, layout: str, seed: int) -> tuple[np.ndarray, Path]:
    """Generation 0 stored at ``root``; the base values saved for the writer."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-(2**20), 2**20, size=SHAPE, dtype="int32")
    with with_pipeline(FUSED):
        arr = zarr.create_array(LocalStore(root), shape=SHAPE, dtype="int32", **LAYOUTS[layout])
        arr[...] = base
    path = root.parent / "base.npy"
    np.save(path, base)
    return base, path


def start_writer(
    root: Path,
    base_path: Path,
    selection: tuple[slice, ...],
    *,
    pipeline: str = FUSED,
    generations: int = 10_000,
    shim: Path | None = None,
    **faults: object,
) -> subprocess.Popen[str]:
    args = {
        "root": str(root),
        "base": str(base_path),
        "pipeline": pipeline,
        "selection": [(s.start, s.stop) for s in selection],
        "generations": generations,
        "seconds": TIMEOUT / 2,
    }
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, json.dumps(args)],
        env=child_env(shim, **faults),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    line = proc.stdout.readline() if ready else ""  # a whole line, or nothing: it died
    if line.strip() != expected:
        proc.kill()
        _, err = proc.communicate(timeout=TIMEOUT)
        pytest.fail(f"the writer did not start: {line!r}\n{err}")


def finish(proc: subprocess.Popen[str]) -> str:
    """Wait for the writer to end (killing it at the timeout); its stderr."""
    return communicate(proc, TIMEOUT)[1]


def grid_keys(layout: str) -> dict[str, tuple[slice, slice]]:
    """Each stored key of the layout and the region of the array it holds."""
    step = LAYOUTS[layout].get("shards", LAYOUTS[layout]["chunks"])
    return {
        f"c/{i}/{j}": (slice(i * step[0], (i + 1) * step[0]), slice(j * step[1], (j + 1) * step[1]))
        for i in range(SHAPE[0] // step[0])
        for j in range(SHAPE[1] // step[1])
    }


def touched_keys(layout: str, selection: tuple[slice, ...]) -> list[str]:
    inside = np.zeros(SHAPE, dtype=bool)
    inside[selection] = True
    return [key for key, region in grid_keys(layout).items() if inside[region].any()]


def generations_by_key(
    root: Path, layout: str, base: np.ndarray, selection: tuple[slice, ...]
) -> dict[str, int]:
    """The generation each key holds, read by zarr's own pipeline; fails on a
    key that does not decode or mixes generations."""
    inside = np.zeros(SHAPE, dtype=bool)
    inside[selection] = True
    found = {}
    with with_pipeline(BATCHED):
        arr = zarr.open_array(LocalStore(root), mode="r")
        for key, region in grid_keys(layout).items():
            try:
                values = arr[region]
            except Exception as e:  # a torn chunk or shard
                pytest.fail(f"{key} does not decode: {type(e).__name__}: {e}")
            offset = values.astype(np.int64) - base[region]
            written = offset[inside[region]]
            assert (offset[~inside[region]] == 0).all(), f"{key} changed outside the selection"
            if written.size:
                assert (written == written.flat[0]).all(), (
                    f"{key} mixes generations {sorted(set(np.unique(written).tolist()))}"
                )
                found[key] = int(written.flat[0])
    return found


def stray_files(root: Path, layout: str) -> tuple[list[str], list[str]]:
    """The temporary files left in the store, and any other file that is
    neither metadata nor a key of the layout (nor the lock file of partial
    shard updates, kept by design: zarr_fused.io.shard_lock)."""
    keys = grid_keys(layout)
    temporaries, unknown = [], []
    for path in root.rglob("*"):
        if path.is_dir() or path.name == LOCK_FILE:
            continue
        name = path.relative_to(root).as_posix()
        if name == "zarr.json" or name in keys:
            continue
        match = re.fullmatch(r"(c/\d+/\d+)\.[^/]+\.partial", name)
        (temporaries if match and match.group(1) in keys else unknown).append(name)
    return sorted(temporaries), sorted(unknown)


def check_store_after_crash(
    root: Path, layout: str, base: np.ndarray, selection: tuple[slice, ...], last: int
) -> dict[str, int]:
    found = generations_by_key(root, layout, base, selection)
    assert all(0 <= g <= last for g in found.values()), found
    temporaries, unknown = stray_files(root, layout)
    assert unknown == []
    # a writer that comes after the crash neither trips over nor removes
    # what the killed one left, as with zarr's LocalStore
    fresh = (base + last + 1)[selection]
    with with_pipeline(FUSED):
        arr = zarr.open_array(LocalStore(root), mode="r+")
        arr[selection] = fresh
        np.testing.assert_array_equal(arr[selection], fresh)
    assert stray_files(root, layout) == (temporaries, [])
    return found


# -- killed at a random moment ---------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "selection", "seed"),
    [
        pytest.param("chunked-raw", WHOLE, 1, id="chunked-raw-whole"),
        pytest.param("chunked-raw", REGION, 2, id="chunked-raw-region"),
        pytest.param("chunked-zstd", WHOLE, 3, id="chunked-zstd-whole"),
        pytest.param("sharded-raw", WHOLE, 4, id="sharded-raw-whole"),
        pytest.param("sharded-zstd", WHOLE, 5, id="sharded-zstd-whole"),
        pytest.param("sharded-zstd", REGION, 6, id="sharded-zstd-region"),
    ],
)
def test_sigkill_at_a_random_moment_leaves_each_key_old_or_new(
    tmp_path: Path, layout: str, selection: tuple[slice, ...], seed: int
) -> None:
    root = tmp_path / "arr"
    base, base_path = make_base(root, layout, seed)
    delay = np.random.default_rng(seed).uniform(0.05, 0.4)
    proc = start_writer(root, base_path, selection)
    try:
        wait_for_line(proc, "ready")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        err = finish(proc)
    assert proc.returncode == -signal.SIGKILL, f"the writer ended before the kill:\n{err}"
    check_store_after_crash(root, layout, base, selection, last=10_000)


# -- killed inside a chosen call ---------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "ops", "seed"),
    [
        pytest.param("chunked-raw", "write", 11, id="chunked-raw-in-writev"),
        pytest.param("chunked-zstd", "write", 12, id="chunked-zstd-in-writev"),
        pytest.param("sharded-raw", "write", 13, id="sharded-raw-in-writev"),
        pytest.param("sharded-zstd", "write", 14, id="sharded-zstd-in-writev"),
        pytest.param("chunked-zstd", "rename", 15, id="chunked-zstd-before-rename"),
        pytest.param("sharded-zstd", "rename", 16, id="sharded-zstd-before-rename"),
    ],
)
def test_crash_inside_the_nth_call_leaves_each_key_old_or_new(
    tmp_path: Path, faultfs: Path, layout: str, ops: str, seed: int
) -> None:
    root = tmp_path / "arr"
    base, base_path = make_base(root, layout, seed)
    selection = REGION if seed % 2 else WHOLE
    # the N-th call among those of the write (at least one per key it touches)
    nth = int(np.random.default_rng(seed).integers(0, len(touched_keys(layout, selection))))
    log = tmp_path / "faultfs.log"
    proc = start_writer(
        root,
        base_path,
        selection,
        generations=1,
        shim=faultfs,
        marker=root / "c",
        mode="crash",
        ops=ops,
        skip=nth,
        count=1,
        log=log,
    )
    err = finish(proc)
    assert proc.returncode == -signal.SIGKILL, f"the writer was not stopped:\n{err}"
    assert log.read_text().count("\n") == 1
    found = check_store_after_crash(root, layout, base, selection, last=1)
    if ops == "rename":
        # the temporary file whose rename was stopped stays, under a name
        # that is no key; its key holds the old generation
        stopped = Path(log.read_text().split()[2]).relative_to(root).as_posix()
        assert stopped in stray_files(root, layout)[0]
        assert found[stopped.split(".")[0]] == 0


@pytest.mark.parametrize(
    "pipeline", [pytest.param(FUSED, id="fused"), pytest.param(BATCHED, id="zarr")]
)
def test_leftover_of_a_crash_before_rename_is_the_same_as_zarrs(
    tmp_path: Path, faultfs: Path, pipeline: str
) -> None:
    """The one trace a crash can leave, a complete temporary file next to
    the key, is left by zarr's pipeline and zarr_fused alike, named alike,
    and listed by the store alike."""
    root = tmp_path / "arr"
    layout = "chunked-zstd"
    base, base_path = make_base(root, layout, seed=21)
    key = "c/1/2"
    proc = start_writer(
        root,
        base_path,
        WHOLE,
        pipeline=pipeline,
        generations=1,
        shim=faultfs,
        marker=root / key,
        mode="crash",
        ops="rename",
        count=1,
    )
    err = finish(proc)
    assert proc.returncode == -signal.SIGKILL, f"the writer was not stopped:\n{err}"

    # other keys' writes in flight at the kill may have left theirs too
    temporaries, unknown = stray_files(root, layout)
    assert unknown == []
    (stopped,) = [name for name in temporaries if name.startswith(key + ".")]
    assert generations_by_key(root, layout, base, WHOLE)[key] == 0
    # the leftover holds the whole new chunk, as zarr would have stored it
    region = grid_keys(layout)[key]
    payload = numcodecs.Zstd().decode((root / stopped).read_bytes())
    np.testing.assert_array_equal(
        np.frombuffer(payload, "<i4").reshape(128, 128), (base + 1)[region]
    )
    assert set(temporaries) <= set(listed_keys(root))


def listed_keys(root: Path) -> list[str]:
    """What ``LocalStore.list()`` returns for the store at ``root``."""

    async def collect() -> list[str]:
        return [key async for key in LocalStore(root, read_only=True).list()]

    return asyncio.run(collect())
