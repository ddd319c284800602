"""Conditional writes on object stores (`zarr_fused.io.object_cas` and the
read-modify-write loop of `zarr_fused.io.requests`): concurrent partial
writes of one shard lose nothing on moto's S3 server through obstore.

Conflicts are forced deterministically through a seam: the GET of the
stored shard is wrapped so that, once it has returned, another writer's
shard is stored in its place (bytes written beforehand by zarr's own
pipeline under another prefix), as a concurrent writer would. The stored
bytes after the retry are compared with zarr's `BatchedCodecPipeline`
writing the same writes one after the other. Real concurrency: spawned
processes writing disjoint inner chunks of one shard.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.storage import ObjectStore
from zarr_fused_testing.s3 import BUCKET, LatencyProxy, MotoServer, obstore_s3

from zarr_fused.errors import UnprotectedWriteWarning, UnsupportedError, WriteConflictError
from zarr_fused.io import object_cas

from helpers import BATCHED, FUSED, with_pipeline
from helpers.s3_stores import new_prefix, open_store, stored

SHAPE = (64, 64)  # one shard
INNER = (8, 8)
SHARD_KEY = "c/0/0"
PROCESSES = 8
ROUNDS = 10
JOIN_TIMEOUT = 300.0  # seconds, for every process of the spawned test


def create(store: Any) -> zarr.Array:
    return zarr.create_array(
        store,
        shape=SHAPE,
        chunks=SHAPE,
        dtype="<u2",
        serializer=ShardingCodec(
            chunk_shape=INNER, codecs=[BytesCodec(), ZstdCodec(level=1), Crc32cCodec()]
        ),
        compressors=None,
        fill_value=0,
    )


def block(row: int, col: int) -> tuple[slice, slice]:
    """The inner chunk (row, col) of the shard."""
    return slice(row * 8, row * 8 + 8), slice(col * 8, col * 8 + 8)


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60000, INNER).astype("<u2")


#: the writes of the tests: an inner chunk and its values
FIRST = (block(0, 0), values(2801))  # stored before the write under test
THEIRS = (block(3, 5), values(2802))  # the concurrent writer's
THEIRS_TOO = (block(3, 5), values(2803))
OURS = (block(6, 1), values(2804))  # the write under test


def write(arr: zarr.Array, *writes: tuple[Any, np.ndarray]) -> None:
    for selection, data in writes:
        arr[selection] = data


def zarr_shard(moto: MotoServer, proxy: LatencyProxy, *writes: tuple[Any, np.ndarray]) -> bytes:
    """The shard zarr's own pipeline stores for ``writes``, one after the
    other, on a fresh array."""
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("obstore", proxy, prefix)), *writes)
    return stored(moto, prefix)[SHARD_KEY]


@pytest.fixture
def racing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The seam: after each GET of the shard, the next of these bytes (when
    any is left) is stored in its place by another writer."""
    queue: list[bytes] = []
    real = object_cas.get_versioned

    async def get_then_race(store: Any, path: str) -> object_cas.Versioned:
        seen = await real(store, path)
        if queue:
            await obstore.put_async(store, path, queue.pop(0))
        return seen

    monkeypatch.setattr(object_cas, "get_versioned", get_then_race)
    yield queue


@pytest.mark.parametrize(
    "first",
    [
        # the shard exists: the conditional PUT carries If-Match
        pytest.param(True, id="existing-shard"),
        # no shard yet, created by the other writer in between: If-None-Match
        pytest.param(False, id="new-shard"),
    ],
)
def test_conflict_is_retried_and_loses_nothing(
    moto: MotoServer, proxy: LatencyProxy, racing: list[bytes], first: bool
) -> None:
    before = (FIRST,) if first else ()
    racing.append(zarr_shard(moto, proxy, *before, THEIRS))
    expected = zarr_shard(moto, proxy, *before, THEIRS, OURS)
    prefix = new_prefix()
    arr = create(open_store("obstore", proxy, prefix))
    with with_pipeline(BATCHED):
        write(zarr.open_array(open_store("obstore", proxy, prefix)), *before)
    proxy.reset()

    with with_pipeline(FUSED):
        write(zarr.open_array(arr.store), OURS)

    assert not racing, "the seam never raced"
    assert stored(moto, prefix)[SHARD_KEY] == expected
    log = [r for r in proxy.stats.log if r.key.endswith(SHARD_KEY)]
    # GET, the other writer's PUT, ours refused (412), GET again, ours stored
    assert [(r.kind, r.status) for r in log] == [
        ("GET", 200 if first else 404),
        ("PUT", 200),
        ("PUT", 412),
        ("GET", 200),
        ("PUT", 200),
    ]


def test_conflict_on_zarrs_sharding_codec_is_retried(
    moto: MotoServer, proxy: LatencyProxy, racing: list[bytes]
) -> None:
    """A selection the shard engine does not plan (an orthogonal one) goes
    to zarr's sharding codec through the async path's generic write, which
    is protected the same way."""
    rows, cols = [48, 50, 55], [8, 9, 15]
    ours = np.random.default_rng(2805).integers(1, 60000, (3, 3)).astype("<u2")
    racing.append(zarr_shard(moto, proxy, FIRST, THEIRS))
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        arr = create(open_store("obstore", proxy, prefix))
        write(arr, FIRST)
        reference = create(open_store("obstore", proxy, new_prefix()))
        write(reference, FIRST, THEIRS)
        reference.oindex[rows, cols] = ours

    with with_pipeline(FUSED):
        zarr.open_array(arr.store).oindex[rows, cols] = ours

    assert not racing, "the seam never raced"
    with with_pipeline(BATCHED):
        np.testing.assert_array_equal(zarr.open_array(arr.store)[...], reference[...])


def test_exhausted_retries_raise_naming_the_key(
    moto: MotoServer, proxy: LatencyProxy, racing: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_cas, "MAX_ATTEMPTS", 3)
    monkeypatch.setattr(object_cas, "BACKOFF_START", 0.001)
    theirs = [zarr_shard(moto, proxy, FIRST, THEIRS), zarr_shard(moto, proxy, FIRST, THEIRS_TOO)]
    racing.extend([theirs[0], theirs[1], theirs[0]])  # a new version after every GET
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("obstore", proxy, prefix)), FIRST)

    with with_pipeline(FUSED), pytest.raises(WriteConflictError, match="gave up after 3") as info:
        write(zarr.open_array(open_store("obstore", proxy, prefix)), OURS)

    assert f"'{SHARD_KEY}'" in str(info.value)
    assert f'prefix="{prefix}"' in str(info.value)
    assert not racing
    # the other writer's shard stands, whole
    assert stored(moto, prefix)[SHARD_KEY] == theirs[0]


@pytest.fixture
def put_modes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``mode`` of every obstore PUT (zarr's ``ObjectStore.set`` and
    ours both call ``obstore.put_async``)."""
    modes: list[Any] = []
    real = obstore.put_async

    async def spy(store: Any, path: str, data: Any, **kwargs: Any) -> Any:
        if path.endswith(SHARD_KEY):
            modes.append(kwargs.get("mode"))
        return await real(store, path, data, **kwargs)

    monkeypatch.setattr(obstore, "put_async", spy)
    return modes


@pytest.mark.parametrize(
    ("lock", "selection", "conditional"),
    [
        pytest.param(True, OURS[0], True, id="partial-protected"),
        pytest.param(False, OURS[0], False, id="partial-off"),
        # a write of the whole shard reads nothing and needs no condition
        pytest.param(True, (slice(None), slice(None)), False, id="whole-shard"),
    ],
)
def test_conditional_headers_only_where_needed(
    moto: MotoServer,
    proxy: LatencyProxy,
    put_modes: list[Any],
    lock: bool,
    selection: Any,
    conditional: bool,
) -> None:
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("obstore", proxy, prefix)), FIRST)
    data = np.random.default_rng(2806).integers(1, 60000, SHAPE).astype("<u2")[selection]
    etag = moto.client().head_object(Bucket=BUCKET, Key=f"{prefix}/{SHARD_KEY}")["ETag"]
    proxy.reset()
    put_modes.clear()

    with zarr.config.set({"codec_pipeline.path": FUSED, "codec_pipeline.shard_write_lock": lock}):
        zarr.open_array(open_store("obstore", proxy, prefix))[selection] = data

    # conditional on the version it replaced, or not at all
    assert put_modes == [{"e_tag": etag} if conditional else None]
    # of the shard: one GET for a partial write, none for a whole one; one PUT
    log = [r.kind for r in proxy.stats.log if r.key.endswith(SHARD_KEY)]
    assert log == (["PUT"] if data.shape == SHAPE else ["GET", "PUT"])


@pytest.fixture
def warn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process warning not yet given."""
    import threading

    monkeypatch.setattr(object_cas, "_warned", threading.Event())


def test_s3fs_strict_refuses_a_partial_shard_write(
    moto: MotoServer, proxy: LatencyProxy, warn_again: None
) -> None:
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("s3fs", proxy, prefix)), FIRST)
    settings = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}

    with zarr.config.set(settings), pytest.raises(UnsupportedError, match="shard_write_lock"):
        write(zarr.open_array(open_store("s3fs", proxy, prefix)), OURS)


def test_s3fs_warns_once_and_writes(
    moto: MotoServer, proxy: LatencyProxy, warn_again: None
) -> None:
    prefix, reference = new_prefix(), new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("obstore", proxy, reference)), FIRST, THEIRS, OURS)
        write(create(open_store("s3fs", proxy, prefix)), FIRST)

    with with_pipeline(FUSED), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write(zarr.open_array(open_store("s3fs", proxy, prefix)), THEIRS, OURS)

    ours = [w for w in caught if issubclass(w.category, UnprotectedWriteWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "FsspecStore" in str(ours[0].message)
    assert "shard_write_lock" in str(ours[0].message)
    assert stored(moto, prefix)[SHARD_KEY] == stored(moto, reference)[SHARD_KEY]


# -- real concurrency: spawned processes -------------------------------------------------


def expected_block(round_: int, rank: int, col: int) -> np.ndarray:
    return values(100_000 + round_ * 1000 + rank * 10 + col)


def _writer_process(
    endpoint: str, prefixes: list[str], rank: int, lock: bool, barrier: Any, errors: Any
) -> None:
    """One of the spawned writers: in each round, after every writer is
    ready, its own row of inner chunks, one write per inner chunk."""
    try:
        settings = {
            "codec_pipeline.path": FUSED,
            "codec_pipeline.shard_write_lock": lock,
            "codec_pipeline.max_workers": 1,
        }
        with zarr.config.set(settings):
            for round_, prefix in enumerate(prefixes):
                arr = zarr.open_array(ObjectStore(obstore_s3(BUCKET, endpoint, prefix)))
                barrier.wait(JOIN_TIMEOUT)
                for col in range(SHAPE[1] // INNER[1]):
                    arr[block(rank, col)] = expected_block(round_, rank, col)
    except BaseException:
        errors.put(f"writer {rank}: {traceback.format_exc()}")
        raise
    # Leave without the interpreter's shutdown: on Python < 3.14 a tokio
    # thread of obstore still returning from the last PUT's completion
    # (``call_soon_threadsafe`` gives up the GIL to wake the loop) is ended
    # by ``pthread_exit`` once the shutdown has begun, and that aborts the
    # process through its Rust frames (core dumps seen: SIGABRT under
    # ``take_gil`` in ``pyo3_async_runtimes::set_result``; docs/limitations).
    # Every write has returned by now; the exit code is what the test reads.
    os._exit(0)


def lost_in_concurrent_writes(moto: MotoServer, lock: bool) -> list[int]:
    """`PROCESSES` spawned writers, each writing its own inner chunks of
    one shard for `ROUNDS` rounds: the inner chunks lost in each round."""
    prefixes = [new_prefix() for _ in range(ROUNDS)]
    with with_pipeline(BATCHED):
        arrays = [create(ObjectStore(obstore_s3(BUCKET, moto.endpoint, p))) for p in prefixes]
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(PROCESSES), ctx.SimpleQueue()
    procs = [
        ctx.Process(
            target=_writer_process, args=(moto.endpoint, prefixes, rank, lock, barrier, errors)
        )
        for rank in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(JOIN_TIMEOUT)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES, "\n".join(failures)
    lost = []
    with with_pipeline(BATCHED):
        for round_, arr in enumerate(arrays):
            data = arr[...]
            lost.append(
                sum(
                    not np.array_equal(data[block(rank, col)], expected_block(round_, rank, col))
                    for rank in range(PROCESSES)
                    for col in range(SHAPE[1] // INNER[1])
                )
            )
    return lost


def test_concurrent_processes_lose_no_inner_chunk(moto: MotoServer) -> None:
    assert lost_in_concurrent_writes(moto, lock=True) == [0] * ROUNDS


@pytest.mark.parametrize(
    "strict", [pytest.param(True, id="strict"), pytest.param(False, id="warns")]
)
def test_object_without_etag_is_not_written_blind(
    moto: MotoServer,
    proxy: LatencyProxy,
    monkeypatch: pytest.MonkeyPatch,
    warn_again: None,
    strict: bool,
) -> None:
    """A server that gives the stored shard no ETag: the write cannot be
    conditional; strict mode refuses it, otherwise it warns and writes."""
    real = object_cas.get_versioned

    async def without_etag(store: Any, path: str) -> object_cas.Versioned:
        return object_cas.Versioned((await real(store, path)).data)

    monkeypatch.setattr(object_cas, "get_versioned", without_etag)
    prefix = new_prefix()
    with with_pipeline(BATCHED):
        write(create(open_store("obstore", proxy, prefix)), FIRST)
    settings = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": strict}

    with zarr.config.set(settings), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arr = zarr.open_array(open_store("obstore", proxy, prefix))
        if strict:
            with pytest.raises(UnsupportedError, match="no ETag"):
                write(arr, OURS)
        else:
            write(arr, OURS)

    if not strict:
        assert [w.category for w in caught] == [UnprotectedWriteWarning]
        assert stored(moto, prefix)[SHARD_KEY] == zarr_shard(moto, proxy, FIRST, OURS)


def test_zipstore_partial_write_is_exempt(tmp_path: Path, warn_again: None) -> None:
    """A zip file is written by one process: a partial shard write there
    neither raises in strict mode nor warns."""
    from zarr.storage import ZipStore

    with ZipStore(tmp_path / "data.zip", mode="w") as store:
        with with_pipeline(BATCHED):
            write(create(store), FIRST)
        settings = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}
        with zarr.config.set(settings), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            arr = zarr.open_array(store)
            write(arr, OURS)
            got = arr[...]
    assert not [w for w in caught if issubclass(w.category, UnprotectedWriteWarning)]
    np.testing.assert_array_equal(got[OURS[0]], OURS[1])
    np.testing.assert_array_equal(got[FIRST[0]], FIRST[1])
