"""What the benchmarks compare: pipelines, peers and sample arrays.

Shared by the asv benchmark modules and by ``side_by_side.py``. Every timed
read is checked against the data written (once per setup, untimed), so no
benchmark ever times a wrong answer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore, MemoryStore

from zarr_fused.cli.common import ZARR_PIPELINES
from zarr_fused.cli.peers import not_installed

# ZARR_FUSED_BENCH_QUICK=1 trims every parameter grid to a few points (the
# quick run in CI checks that the benchmarks work, in seconds)
QUICK = os.environ.get("ZARR_FUSED_BENCH_QUICK") == "1"


def choose(full: list[Any], quick: list[Any]) -> list[Any]:
    return quick if QUICK else full


#: the zarr pipelines, as ``zarr-fused bench`` names them
PIPELINES = ZARR_PIPELINES
PEERS = choose([*PIPELINES, "tensorstore"], ["zarr_fused", "zarr-fused"])
STORES = choose(["local", "memory"], ["local"])
THREADS = choose([1, 2], [2])


def available(peer: str) -> bool:
    """Whether ``peer`` can run here (zarrs and tensorstore are optional)."""
    return not_installed(peer) is None


# the peers ``codec_pipeline.max_workers`` applies to (a ``threads`` param)
FUSED_PEERS = ("zarr_fused", "zarr-fused")


def require(peer: str, threads: int) -> None:
    """Skip (asv: ``NotImplementedError`` in ``setup``) a ``peer`` not
    installed here, or a thread count other than 2 for a peer the count
    does not apply to (it runs once, at its own default)."""
    if not available(peer):
        raise NotImplementedError(f"{peer} is not installed")
    if threads != 2 and peer not in FUSED_PEERS:
        raise NotImplementedError("the thread count applies to the Fused pipelines")


def enter_config(bench: Any, settings: dict[str, Any]) -> None:
    """zarr's config with ``settings`` from ``setup`` until `exit_config`
    (in ``teardown``): asv times the methods between the two."""
    import zarr

    bench._config = zarr.config.set(settings)
    bench._config.__enter__()


def exit_config(bench: Any) -> None:
    config = getattr(bench, "_config", None)
    if config is not None:
        config.__exit__(None, None, None)


def data_dir() -> Path:
    """The cache folder for benchmark data: ``ZARR_FUSED_BENCH_DIR``, default
    ``<tmp>/zarr_fused_bench``, one subfolder per scale."""
    root = Path(
        os.environ.get("ZARR_FUSED_BENCH_DIR", Path(tempfile.gettempdir()) / "zarr_fused_bench")
    )
    root = root / scale()
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class Layout:
    """A sample array: shape, dtype and zarr codec settings."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None = None
    compressors: Callable[[], Any] = field(default=lambda: None)
    #: zarr format 2 layouts take numcodecs compressors and an ``order``
    zarr_format: int = 3
    order: str = "C"

    @property
    def inner(self) -> tuple[int, ...]:
        """The chunks a reader decodes one by one (inner chunks when sharded)."""
        return self.chunks

    def create(self, store: Any) -> zarr.Array:
        extra = {"zarr_format": 2, "order": self.order} if self.zarr_format == 2 else {}
        return zarr.create_array(
            store,
            shape=self.shape,
            dtype=self.dtype,
            chunks=self.chunks,
            shards=self.shards,
            compressors=self.compressors(),
            fill_value=0,
            overwrite=True,
            **extra,
        )

    def sample(self) -> np.ndarray:
        """Smooth data with noise: compresses like measurements, not like zeros."""
        rng = np.random.default_rng(1234)
        grids = np.meshgrid(*(np.linspace(0, 8, s) for s in self.shape), indexing="ij", sparse=True)
        field_ = sum(np.sin(g * (i + 1)) for i, g in enumerate(grids))
        dtype = np.dtype(self.dtype)
        if dtype.kind == "f":
            return (field_ + rng.normal(0, 0.05, self.shape)).astype(dtype)
        info = np.iinfo(dtype)
        scaled = (field_ - field_.min()) / (np.ptp(field_) or 1) * min(info.max, 4000)
        return (scaled + rng.integers(0, 16, self.shape)).astype(dtype)


def _zstd1() -> Any:
    return zarr.codecs.ZstdCodec(level=1)


def _blosc_lz4() -> Any:
    return zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def _zstd1_crc() -> Any:
    return [zarr.codecs.ZstdCodec(level=1), zarr.codecs.Crc32cCodec()]


def _v2_blosc_lz4() -> Any:
    import numcodecs

    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


def _v2_zstd1() -> Any:
    import numcodecs

    return numcodecs.Zstd(level=1)


def scale() -> str:
    """``full`` (the sizes the issues name) or ``small`` (for quick runs):
    ``ZARR_FUSED_BENCH_SCALE``."""
    value = os.environ.get("ZARR_FUSED_BENCH_SCALE", "full")
    return value if value in ("full", "small") else "full"


def _layouts(size: str) -> dict[str, Layout]:
    cube, shard, inner = (512, 128, 32) if size == "full" else (64, 32, 8)
    side, chunk = (2048, 64) if size == "full" else (256, 32)
    sharded = {
        "shape": (cube,) * 3,
        "dtype": "uint16",
        "chunks": (inner,) * 3,
        "shards": (shard,) * 3,
    }
    flat = {"shape": (side, side), "dtype": "float32", "chunks": (chunk, chunk)}
    return {
        "sharded-zstd": Layout("sharded-zstd", compressors=_zstd1, **sharded),
        "sharded-raw": Layout("sharded-raw", **sharded),
        "sharded-zstd-crc": Layout("sharded-zstd-crc", compressors=_zstd1_crc, **sharded),
        "unsharded-blosc": Layout("unsharded-blosc", compressors=_blosc_lz4, **flat),
        "unsharded-zstd": Layout("unsharded-zstd", compressors=_zstd1, **flat),
        "unsharded-raw": Layout("unsharded-raw", **flat),
        "v2-blosc": Layout("v2-blosc", compressors=_v2_blosc_lz4, zarr_format=2, **flat),
        "v2-zstd": Layout("v2-zstd", compressors=_v2_zstd1, zarr_format=2, **flat),
        "v2-blosc-F": Layout(
            "v2-blosc-F", compressors=_v2_blosc_lz4, zarr_format=2, order="F", **flat
        ),
    }


def ts_driver(path: Path) -> str:
    """tensorstore's driver for the array at ``path``: ``zarr`` (format 2) or ``zarr3``."""
    return "zarr" if (path / ".zarray").exists() else "zarr3"


LAYOUTS = _layouts(scale())


@contextlib.contextmanager
def pipeline(peer: str) -> Iterator[None]:
    if peer in PIPELINES:
        with zarr.config.set({"codec_pipeline.path": PIPELINES[peer]}):
            yield
    else:
        yield


def store_for(kind: str, path: Path) -> Any:
    return LocalStore(path) if kind == "local" else MemoryStore()


def write_reference(layout: Layout, path: Path) -> np.ndarray:
    """Write ``layout``'s sample to ``path`` with zarr's default pipeline
    (once: reused when present and complete)."""
    data = layout.sample()
    marker = path / ".complete"
    if not marker.exists():
        shutil.rmtree(path, ignore_errors=True)
        with pipeline("zarr-batched"):
            arr = layout.create(LocalStore(path))
            arr[...] = data
        marker.touch()
    return data


class Reader:
    """Reads a whole array through one peer, set up once."""

    def __init__(self, peer: str, path: Path, store_kind: str = "local") -> None:
        self.peer = peer
        if peer == "tensorstore":
            import tensorstore as ts

            driver = ts_driver(path)
            spec: dict[str, Any] = {
                "driver": driver,
                "kvstore": {"driver": "file", "path": str(path)},
            }
            if store_kind == "memory":
                # load the files into tensorstore's memory kvstore
                src = ts.open(spec).result()
                mem = ts.open(
                    {"driver": driver, "kvstore": {"driver": "memory"}},
                    create=True,
                    schema=src.schema,
                    codec=src.codec,
                ).result()
                mem.write(src.read().result()).result()
                self.handle = mem
            else:
                self.handle = ts.open(spec).result()
        else:
            with pipeline(peer):
                if store_kind == "memory":
                    mem = MemoryStore()
                    src = LocalStore(path)
                    zarr.core.sync.sync(_copy_store(src, mem))
                    self.handle = zarr.open_array(mem, mode="r")
                else:
                    self.handle = zarr.open_array(LocalStore(path), mode="r")

    def read(self, selection: Any = Ellipsis) -> np.ndarray:
        if self.peer == "tensorstore":
            return self.handle[selection].read().result()
        with pipeline(self.peer):
            return self.handle[selection]


async def _copy_store(src: Any, dst: Any) -> None:
    from zarr.core.buffer import default_buffer_prototype

    async for key in src.list():
        await dst.set(key, await src.get(key, prototype=default_buffer_prototype()))


class Writer:
    """Writes a whole array through one peer into a fresh empty array."""

    def __init__(self, peer: str, layout: Layout, path: Path, store_kind: str = "local") -> None:
        self.peer, self.layout, self.path, self.store_kind = peer, layout, path, store_kind

    def prepare(self) -> None:
        """Create the empty target (untimed)."""
        shutil.rmtree(self.path, ignore_errors=True)
        with pipeline("zarr-batched"):
            store = store_for(self.store_kind, self.path)
            arr = self.layout.create(store)
        self.store = store
        self._open(arr)

    def reopen(self) -> None:
        """A new handle on the array written before (untimed), whose chunks
        the next write replaces; then ``os.sync()``, so the old chunks are
        on disk, not dirty in the page cache (local stores only)."""
        with pipeline("zarr-batched"):
            self.store = store_for(self.store_kind, self.path)
            arr = zarr.open_array(self.store, mode="r")
        self._open(arr)
        os.sync()

    def _open(self, arr: zarr.Array) -> None:
        store = self.store
        if self.peer == "tensorstore":
            import tensorstore as ts

            driver = "zarr" if self.layout.zarr_format == 2 else "zarr3"
            if self.store_kind == "memory":
                metadata = arr.metadata.to_dict()
                if driver == "zarr":  # the .zarray document, as tensorstore reads it
                    metadata = {k: v for k, v in metadata.items() if k != "attributes"}
                self.handle = ts.open(
                    {"driver": driver, "kvstore": {"driver": "memory"}, "metadata": metadata},
                    create=True,
                ).result()
            else:
                self.handle = ts.open(
                    {"driver": driver, "kvstore": {"driver": "file", "path": str(self.path)}}
                ).result()
        else:
            with pipeline(self.peer):
                self.handle = zarr.open_array(store, mode="r+")

    def write(self, data: np.ndarray) -> None:
        if self.peer == "tensorstore":
            self.handle.write(data).result()
        else:
            with pipeline(self.peer):
                self.handle[...] = data

    def read_back(self) -> np.ndarray:
        """What was written, read by zarr's default pipeline (tensorstore's
        memory store is only readable through tensorstore)."""
        if self.peer == "tensorstore" and self.store_kind == "memory":
            return self.handle.read().result()
        with pipeline("zarr-batched"):
            return zarr.open_array(self.store, mode="r")[...]
