"""Helpers and constants shared by the test modules.

Import them with ``from helpers import ...`` (pytest puts ``tests/`` on
``sys.path``: the tests directory is not a package, rootdir-relative
"prepend" import mode). Fixtures stay in ``conftest.py``; submodules hold
the helpers of one area (e.g. ``differential``: the differential test's case
strategies; ``gil``: the GIL-release probe).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.dtype import get_data_type_from_native_dtype
from zarr.storage import LocalStore, MemoryStore, WrapperStore, ZipStore

from zarr_fused.io.shard_lock import LOCK_FILE

FUSED = "zarr_fused.FusedCodecPipeline"
BATCHED = "zarr.core.codec_pipeline.BatchedCodecPipeline"
ZARR_FUSED = "zarr.core.codec_pipeline.FusedCodecPipeline"
#: zarr_fused, raising where its native path does not apply
STRICT = {"codec_pipeline.path": FUSED, "codec_pipeline.strict": True}

METADATA_KEYS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")

# The bytes -> bytes codecs after `bytes` in the side-by-side tests (chunks
# decoded or gathered together): every compressor, and crc32c after, before
# (decoded one by one) or without one.
SIDE_BY_SIDE_CODECS = {
    "raw": [],
    "zstd": [ZstdCodec(level=1)],
    "gzip": [GzipCodec(level=1)],
    "blosc": [BloscCodec(cname="lz4", clevel=1)],
    "zstd-crc": [ZstdCodec(level=1), Crc32cCodec()],
    "crc-zstd": [Crc32cCodec(), ZstdCodec(level=1)],
    "crc": [Crc32cCodec()],
}


class NoSyncIOStore(WrapperStore[Store]):
    """A real store that advertises no synchronous IO, like a remote store:
    pipelines must take their async path on it."""

    @property
    def _supports_sync_io(self) -> bool:
        return False


def make_store(kind: str, tmp_path: Path, name: str = "data") -> Store:
    """A fresh store of ``kind``: memory, local, zip (async-only) or nosync."""
    if kind == "memory":
        return MemoryStore()
    if kind == "local":
        return LocalStore(tmp_path / name)
    if kind == "zip":
        return ZipStore(tmp_path / f"{name}.zip", mode="w")
    if kind == "nosync":
        return NoSyncIOStore(MemoryStore())
    raise AssertionError(kind)


def chunk_items(store: Store) -> dict[str, bytes]:
    """Every stored chunk or shard (no metadata), by key."""

    async def collect() -> dict[str, bytes]:
        out = {}
        async for key in store.list():
            name = key.rsplit("/", 1)[-1]
            # the lock file of partial shard writes (`zarr_fused.io.shard_lock`)
            # is no chunk: empty, and zarr's pipelines make none
            if name in METADATA_KEYS or name == LOCK_FILE:
                continue
            buf = await store.get(key, prototype=default_buffer_prototype())
            assert buf is not None
            out[key] = buf.to_bytes()
        return out

    return asyncio.run(collect())


def run_in_python(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """This interpreter run with ``args`` (``"-c", script`` or ``"-m",
    module, ...``) in a fresh process: its output captured as text, the run
    bounded at 120 s; ``env``, ``cwd`` and ``check`` as for `subprocess.run`."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=check,
    )


def with_pipeline(path: str) -> Any:
    return zarr.config.set({"codec_pipeline.path": path})


def assert_same_values(actual: Any, expected: Any, *, byte_order: bool = True) -> None:
    """Equal values, dtype and shape (NaN == NaN). With ``byte_order=False``
    the dtypes may differ in byte order only (zarr v3 metadata does not record
    the in-memory byte order, so a reopened array reads in native order)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape
    if not byte_order:
        actual = actual.astype(actual.dtype.newbyteorder("="))
        expected = expected.astype(expected.dtype.newbyteorder("="))
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected, strict=True)


def read_both(store: Any, selection: Any) -> tuple[Any, Any]:
    """``selection`` of the array in ``store`` read by zarr_fused in strict
    mode and by zarr's `BatchedCodecPipeline`: (ours, zarr's)."""
    with zarr.config.set(STRICT):
        got = zarr.open_array(store, mode="r")[selection]
    with zarr.config.set({"codec_pipeline.path": BATCHED}):
        expected = zarr.open_array(store, mode="r")[selection]
    return got, expected


def assert_same_read(got: Any, expected: Any) -> None:
    """`assert_same_values`, and of a read of one item the same wrapping
    as zarr's: zarr returns an object item as ``bytes``/``str``, a 0-d array
    of it, or a 0-d array holding such a 0-d array (NumPy stores a 0-d
    array assigned into a 0-d object array as the element itself), and a
    caller sees which."""
    while np.ndim(expected) == 0 and isinstance(expected, np.ndarray):
        assert type(got) is np.ndarray and got.shape == () and got.dtype == expected.dtype
        got, expected = got[()], expected[()]
    if isinstance(expected, np.ndarray):
        assert_same_values(got, expected)
        return
    assert type(got) is type(expected) and got == expected


def chunk_spec(shape: tuple[int, ...], dtype: Any) -> ArraySpec:
    """The spec of one chunk of ``shape`` and NumPy ``dtype`` (default fill
    value, C order, CPU buffers), as codecs receive it."""
    zdtype = get_data_type_from_native_dtype(np.dtype(dtype))
    return ArraySpec(
        shape=shape,
        dtype=zdtype,
        fill_value=zdtype.default_scalar(),
        config=ArrayConfig(order="C", write_empty_chunks=True),
        prototype=default_buffer_prototype(),
    )


def grouped_chain(array: Any) -> Any:
    """The `FilteredChain` whose batch kernels read ``array``'s unsharded
    local chunk files in groups (through the IO threads or directly), or
    None when its chunks are read one by one through its plan's chain."""
    from zarr_fused._hybrid import FilteredChain

    chain = getattr(array._async_array.codec_pipeline.plan.reader, "chain", None)
    return chain if isinstance(chain, FilteredChain) else None
