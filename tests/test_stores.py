"""zarr_fused.io.stores: fsspec's local filesystem served as a LocalStore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.storage import FsspecStore, LocalStore

from zarr_fused.io.stores import local_store_for

from helpers import BATCHED, FUSED, assert_same_values, chunk_items, with_pipeline

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem

LAYOUTS = {
    "chunks": {"chunks": (4, 5)},
    "shards": {"chunks": (4, 5), "shards": (8, 10)},
}


def _fsspec_store(path: Path, auto_mkdir: bool = True, **kwargs: Any) -> FsspecStore:
    path.mkdir(exist_ok=True)
    return FsspecStore.from_url(str(path), storage_options={"auto_mkdir": auto_mkdir}, **kwargs)


def test_local_filesystem_maps_to_a_local_store(tmp_path: Path) -> None:
    store = _fsspec_store(tmp_path / "a")
    local = local_store_for(store)
    assert type(local) is LocalStore and Path(local.root) == tmp_path / "a"
    assert local_store_for(store) is local  # decided once per store
    assert local_store_for(_fsspec_store(tmp_path / "b", read_only=True)).read_only
    # writes create directories only where fsspec would
    no_mkdir = _fsspec_store(tmp_path / "c", auto_mkdir=False)
    assert local_store_for(no_mkdir) is not None
    assert local_store_for(no_mkdir, write=True) is None
    assert local_store_for(store, write=True) is local


def test_other_filesystems_keep_their_own_io(tmp_path: Path) -> None:
    class Tracing(LocalFileSystem):  # a subclass may add behaviour
        pass

    assert local_store_for(FsspecStore.from_url("memory://x")) is None
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

    traced = FsspecStore(
        fs=AsyncFileSystemWrapper(Tracing(), asynchronous=True), path=str(tmp_path)
    )
    assert local_store_for(traced) is None
    assert local_store_for(LocalStore(tmp_path)) is None
    assert local_store_for(zarr.storage.MemoryStore()) is None


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reads_and_writes_match_zarr_through_fsspec(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = np.arange(12 * 10, dtype="<f4").reshape(12, 10)
    stores = {}
    for name, path in (("ours", FUSED), ("zarr", BATCHED)):
        store = _fsspec_store(tmp_path / name)
        with with_pipeline(path):
            arr = zarr.create_array(
                store,
                shape=data.shape,
                dtype=data.dtype,
                fill_value=-1,
                config={"write_empty_chunks": False},
                **LAYOUTS[layout],
            )
            arr[...] = data
            arr[1:6, 2:7] = 7
            arr[8:, :] = -1  # all fill value: deleted, like zarr
        stores[name] = store
    assert chunk_items(stores["ours"]) == chunk_items(stores["zarr"])
    # the native engine served it: its reader sees a LocalStore
    # (the pipelined reader, which a busy host's file timings may pick,
    # reads through the IO threads without calling the native reader)
    from zarr_fused.chunks import pipelined as _pipelined
    from zarr_fused.chunks import read as _read
    from zarr_fused.shard import read as _read_sharded

    seen: list[Any] = []
    for module, cls in (
        (_read, "NativeChunkReader"),
        (_pipelined, "PipelinedChunkReader"),
        (_read_sharded, "ShardReader"),
    ):
        klass = getattr(module, cls)
        original = klass.read

        def spy(self: Any, batch: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(type(batch[0][0].store))
            return _original(self, batch, *args, **kwargs)

        monkeypatch.setattr(klass, "read", spy)
    expected = data.copy()
    expected[1:6, 2:7] = 7
    expected[8:, :] = -1
    with with_pipeline(FUSED):
        ours = zarr.open_array(stores["ours"], mode="r")
        assert_same_values(ours[...], expected)
        assert_same_values(ours.oindex[[0, 9], [1, 8]], expected[np.ix_([0, 9], [1, 8])])
    assert seen and set(seen) == {LocalStore}


def test_read_only_fsspec_store_refuses_writes_like_zarr(tmp_path: Path) -> None:
    with with_pipeline(FUSED):
        zarr.create_array(_fsspec_store(tmp_path / "a"), shape=(4,), chunks=(2,), dtype="i4")
        arr = zarr.open_array(_fsspec_store(tmp_path / "a", read_only=True), mode="r")
        with pytest.raises(ValueError, match="read-only"):
            arr[...] = 1
