"""The real-data chains on the storage users read them from: S3, zip files
and Dask workers.

tests/test_real_chains.py checks every chain of the catalogue on a local
and a memory store. Here one chain of each kernel family
(`zarr_fused_testing.chains.KERNEL_FAMILIES`), unsharded and sharded, goes
through moto's S3 server (zarr's ``ObjectStore`` over obstore, and
``FsspecStore`` over s3fs: zarr_fused's object-store path, not its file
reads) and through a ``ZipStore``, in strict mode: the values and the stored
bytes must be those of zarr's `BatchedCodecPipeline`, and zarr must read
back what zarr_fused wrote. Last, a ``distributed.LocalCluster`` reads a
filtered chain through ``dask.array.from_zarr`` with strict mode set in its
workers, so a task that left the native path fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import Store
from zarr.storage import LocalStore, ZipStore
from zarr_fused_testing.chains import (
    CHAINS,
    CHECK_CHUNKS,
    CHECK_INNER,
    CHECK_SHAPE,
    KERNEL_FAMILIES,
    NOT_NATIVE,
    chain_values,
    create_chain_array,
    shardings,
    without_gzip_mtime,
)
from zarr_fused_testing.cluster import local_cluster
from zarr_fused_testing.s3 import MotoServer

from helpers import BATCHED, METADATA_KEYS, STRICT, assert_same_values, chunk_items
from helpers.s3_stores import new_prefix, open_store, stored

ORACLE = {"codec_pipeline.path": BATCHED}

#: the rows a one-write store leaves at the fill value: whole chunks not stored
FILL_ROWS = slice(CHECK_CHUNKS[0] * 2, None)
SELECTION = (slice(2, 35, 3), slice(1, None))

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")


#: the families s3fs reads too: the store client changes the requests, not
#: the kernels, so a filter, a deflate stream, variable-length items and a
#: format-2 chain (each a path of its own from the bytes to the values)
S3FS_FAMILIES = ("delta", "deflate", "vlen", "v2")


def _params(families: Any = KERNEL_FAMILIES) -> list[Any]:
    params = []
    for family in families:
        name = KERNEL_FAMILIES[family]
        for sharded in shardings(CHAINS[name]):
            assert (name, sharded) not in NOT_NATIVE, name
            label = f"{family}-{name}-{'sharded' if sharded else 'unsharded'}"
            params.append(pytest.param(name, sharded, id=label))
    return params


def _create(store: Store, name: str, sharded: bool) -> Any:
    case = CHAINS[name]
    if case["requires"]:
        pytest.importorskip(case["requires"])
    return create_chain_array(
        store, case, CHECK_SHAPE, CHECK_CHUNKS, CHECK_INNER if sharded else None
    )


def _write(store: Store, name: str, sharded: bool) -> np.ndarray:
    """Whole, then a partial overwrite, then whole chunks of the fill value
    (deleted); the array read back whole."""
    case = CHAINS[name]
    array = _create(store, name, sharded)
    array[:] = chain_values(case, CHECK_SHAPE, 0)
    array[3:8, 6:23] = chain_values(case, (5, 17), 1)
    array[FILL_ROWS, :] = case["fill"]
    return array[:]


def _write_once(store: Store, name: str, sharded: bool) -> None:
    """One whole write, its last rows at the fill value: a zip file is
    written once, never rewritten in place."""
    case = CHAINS[name]
    value = chain_values(case, CHECK_SHAPE, 0)
    value[FILL_ROWS, :] = case["fill"]
    _create(store, name, sharded)[:] = value


def _same_stored(ours: dict[str, bytes], theirs: dict[str, bytes]) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, expected in theirs.items():
        assert without_gzip_mtime(ours[key]) == without_gzip_mtime(expected), key


def _stored_chunks(moto: MotoServer, prefix: str) -> dict[str, bytes]:
    return {
        k: v for k, v in stored(moto, prefix).items() if k.rsplit("/", 1)[-1] not in METADATA_KEYS
    }


# -- S3 ---------------------------------------------------------------------------------


def _s3_params() -> list[Any]:
    return [
        pytest.param(kind, *p.values, id=f"{kind}-{p.id}", marks=p.marks)
        for kind, families in (("obstore", KERNEL_FAMILIES), ("s3fs", S3FS_FAMILIES))
        for p in _params(families)
    ]


@pytest.mark.parametrize(("store_kind", "name", "sharded"), _s3_params())
def test_chain_on_s3_like_zarr(
    moto: MotoServer, proxy: Any, store_kind: str, name: str, sharded: bool
) -> None:
    if store_kind == "obstore":
        pytest.importorskip("obstore.store")
    else:
        pytest.importorskip("s3fs")
    prefixes = {who: new_prefix() for who in ("fused", "zarr")}
    with zarr.config.set(ORACLE):
        expected = _write(open_store(store_kind, proxy, prefixes["zarr"]), name, sharded)
    # s3fs has no conditional PUT: strict mode refuses a partial shard write
    # there unless the user says no other writer shares the shard (one here)
    unlocked = {"codec_pipeline.shard_write_lock": False} if store_kind == "s3fs" else {}
    with zarr.config.set({**STRICT, **unlocked}):
        store = open_store(store_kind, proxy, prefixes["fused"])
        got = _write(store, name, sharded)
        reread = zarr.open_array(store, mode="r")[SELECTION]
        # zarr_fused reads what zarr wrote, through a store of its own
        theirs = zarr.open_array(open_store(store_kind, proxy, prefixes["zarr"]), mode="r")[:]
    assert_same_values(got, expected)
    assert_same_values(reread, expected[SELECTION])
    assert_same_values(theirs, expected)
    _same_stored(_stored_chunks(moto, prefixes["fused"]), _stored_chunks(moto, prefixes["zarr"]))
    with zarr.config.set(ORACLE):
        store = open_store(store_kind, proxy, prefixes["fused"])
        assert_same_values(zarr.open_array(store, mode="r")[:], expected)


# -- zip --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sharded"), _params())
def test_chain_in_zip_like_zarr(tmp_path: Path, name: str, sharded: bool) -> None:
    for who, config in (("fused", STRICT), ("zarr", ORACLE)):
        with zarr.config.set(config):
            store = ZipStore(tmp_path / f"{who}.zip", mode="w")
            _write_once(store, name, sharded)
            store.close()
    stores = {who: ZipStore(tmp_path / f"{who}.zip", mode="r") for who in ("fused", "zarr")}
    _same_stored(chunk_items(stores["fused"]), chunk_items(stores["zarr"]))
    with zarr.config.set(ORACLE):
        expected = zarr.open_array(stores["zarr"], mode="r")[:]
        assert_same_values(zarr.open_array(stores["fused"], mode="r")[:], expected)
    with zarr.config.set(STRICT):
        array = zarr.open_array(stores["zarr"], mode="r")
        assert_same_values(array[:], expected)
        assert_same_values(array[SELECTION], expected[SELECTION])


# -- Dask -------------------------------------------------------------------------------

#: the chain the Dask workers read: a filter the grouped reads run natively
DASK_CHAIN = "delta-i4-zstd"
DASK_SHAPE, DASK_CHUNKS, DASK_INNER = (96, 80), (32, 40), (16, 20)


@pytest.fixture(scope="module")
def strict_client() -> Iterator[Any]:
    """A client of a LocalCluster whose workers run zarr_fused in strict mode."""
    distributed = pytest.importorskip("distributed")
    import zarr_fused.dask

    # distributed's nannies set OMP_NUM_THREADS and friends in this process's
    # environment for the workers they spawn; later tests must not inherit them
    saved = dict(os.environ)
    cluster = local_cluster()
    try:
        with distributed.Client(cluster) as client:
            zarr_fused.dask.register(client, strict=True)
            yield client
    finally:
        cluster.close(timeout=30)
        zarr.config.set({"codec_pipeline.path": BATCHED, "codec_pipeline.strict": False})
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore:.*[Pp]ort .* is already in use.*:UserWarning")
@pytest.mark.parametrize("sharded", [False, True], ids=["unsharded", "sharded"])
def test_dask_workers_read_a_filtered_chain_natively(
    strict_client: Any, tmp_path: Path, sharded: bool
) -> None:
    da = pytest.importorskip("dask.array")
    case = CHAINS[DASK_CHAIN]
    path = tmp_path / "a.zarr"
    value = chain_values(case, DASK_SHAPE, 3)
    with zarr.config.set(ORACLE):
        inner = DASK_INNER if sharded else None
        create_chain_array(LocalStore(path), case, DASK_SHAPE, DASK_CHUNKS, inner)[:] = value
        expected = zarr.open_array(LocalStore(path), mode="r")[:]
    strict = strict_client.run(lambda: zarr.config.get("codec_pipeline.strict"))
    assert set(strict.values()) == {True}, strict
    x = da.from_zarr(str(path))  # opened through FsspecStore, in every worker
    assert_same_values(x.compute(), expected)
    assert x[5:90:7, 3].compute().tolist() == expected[5:90:7, 3].tolist()
    assert int(x.sum(dtype="i8").compute()) == int(expected.sum(dtype="i8"))
