"""Object stores against real servers: moto's S3 server (through zarr's
`ObjectStore` over obstore's `S3Store`, and `FsspecStore` over s3fs) behind a
request-counting, fault-injecting proxy, and a read-only HTTP server with
byte ranges (`FsspecStore` over fsspec's `HTTPFileSystem`).

zarr_fused is checked against zarr's `BatchedCodecPipeline` (values and stored
bytes), against zarr's own `FusedCodecPipeline` for request counts (never more
GET/PUT/HEAD for the same operation), and under injected faults (a clear
error naming the key or a successful retry, no half-written object, no task
left running). The servers start once per module; each test works under its
own key prefix of one bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest, Store, SuffixByteRequest
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec
from zarr.core.buffer import Buffer
from zarr.storage import FsspecStore, LocalStore, WrapperStore
from zarr_fused_testing.s3 import (
    BUCKET,
    Fault,
    LatencyProxy,
    MotoServer,
    RangeServer,
    Stats,
)

from zarr_fused.errors import CorruptChunkError, CorruptShardError

from helpers import BATCHED, FUSED, ZARR_FUSED, assert_same_values, with_pipeline
from helpers.s3_stores import (
    assert_same_objects_and_values,
    new_prefix,
    open_store,
    started_or_skip,
    stored,
    under_fault,
)
from helpers.shards import ALWAYS_DETECTED, CORRUPTIONS, corrupt

pytest.importorskip("obstore.store")
pytest.importorskip("s3fs")

STORES = ["obstore", "s3fs"]


# -- the store matrix (servers: conftest's `moto` and `proxy`; stores: helpers.s3_stores) --


def cases(names: tuple[str, ...], *axes: list[str], s3fs: Callable[..., bool]) -> list[Any]:
    """The product of ``STORES`` and ``axes`` as pytest params (``names``:
    the test's argument names): every case over obstore, the cases
    ``s3fs(*values)`` keeps over s3fs (each s3fs request costs botocore's
    CPU; one store runs the whole matrix, the other a representative part)."""
    import itertools as it

    out = []
    for kind in STORES:
        for values in it.product(*axes):
            if kind == "obstore" or s3fs(*values):
                out.append(pytest.param(kind, *values, id="-".join((kind, *values))))
    assert len(names) == 1 + len(axes)
    return out


# -- arrays ------------------------------------------------------------------------------

SHAPE = (24, 30)
FILL = 7


@dataclass(frozen=True)
class Layout:
    name: str
    chunks: tuple[int, int]  # shards when sharded
    inner: tuple[int, int] | None = None
    location: str = "end"
    crc: bool = True

    @property
    def sharded(self) -> bool:
        return self.inner is not None

    def create(self, store: Store, **kwargs: Any) -> zarr.Array:
        if self.sharded:
            codecs = [BytesCodec(), ZstdCodec(level=1)] + ([Crc32cCodec()] if self.crc else [])
            serializer: Any = ShardingCodec(
                chunk_shape=self.inner, codecs=codecs, index_location=self.location
            )
            return zarr.create_array(
                store,
                shape=SHAPE,
                chunks=self.chunks,
                dtype="<u2",
                serializer=serializer,
                compressors=None,
                fill_value=FILL,
                **kwargs,
            )
        compressors = [ZstdCodec(level=1)] + ([Crc32cCodec()] if self.crc else [])
        return zarr.create_array(
            store,
            shape=SHAPE,
            chunks=self.chunks,
            dtype="<u2",
            compressors=compressors,
            fill_value=FILL,
            **kwargs,
        )


# 3 x 2 shards of 2 x 3 inner chunks; or 3 x 3 chunks
LAYOUTS = {
    "shard-end-zstd-crc": Layout("shard-end-zstd-crc", (8, 15), (4, 5), "end", True),
    "shard-start-zstd": Layout("shard-start-zstd", (8, 15), (4, 5), "start", False),
    "unsharded-zstd-crc": Layout("unsharded-zstd-crc", (8, 10)),
}


def sample() -> np.ndarray:
    """Data with a whole shard (1, 1) at the fill value (so never stored), an
    inner chunk (0, 1) of shard (0, 0) too (missing inside a stored shard),
    and for the unsharded layout the chunk (1, 2)."""
    data = np.random.default_rng(15).integers(0, 1000, SHAPE).astype("<u2")
    data[8:16, 15:30] = FILL
    data[0:4, 5:10] = FILL
    return data


def write_with(pipeline: str, store: Store, layout: Layout, data: np.ndarray | None) -> zarr.Array:
    with with_pipeline(pipeline):
        arr = layout.create(store)
        if data is not None:
            arr[...] = data
    return arr


# -- selections: every kind zarr has -----------------------------------------------------

_MASK = np.random.default_rng(16).random(SHAPE) < 0.1
_ROWS, _COLS = [0, 5, 9, 23], [1, 14, 15, 29]
_PTS = (np.array([0, 5, 9, 23, 12, 2]), np.array([1, 14, 15, 29, 20, 7]))


@dataclass(frozen=True)
class Selection:
    read: Callable[[zarr.Array], Any]
    expect: Callable[[np.ndarray], Any] | None  # None: zarr's pipeline is the only oracle


SELECTIONS = {
    "whole": Selection(lambda a: a[...], lambda d: d[...]),
    "basic": Selection(lambda a: a[3:21:2, 4:29], lambda d: d[3:21:2, 4:29]),
    "basic-int": Selection(lambda a: a[10, 2:27], lambda d: d[10, 2:27]),
    "orthogonal": Selection(lambda a: a.oindex[_ROWS, _COLS], lambda d: d[np.ix_(_ROWS, _COLS)]),
    "coordinate": Selection(lambda a: a.vindex[_PTS], lambda d: d[_PTS]),
    "mask": Selection(lambda a: a.vindex[_MASK], lambda d: d[_MASK]),
    "block": Selection(lambda a: a.blocks[1, 0:2], None),
    # part of shard (0, 0), its missing inner chunk (0, 1) included
    "partial-shard": Selection(lambda a: a[1:4, 0:12], lambda d: d[1:4, 0:12]),
}


# -- read and write correctness ----------------------------------------------------------


@pytest.fixture(scope="module")
def written(proxy_server: LatencyProxy) -> Callable[[str, str], str]:
    """The prefix of the sample array written by zarr's pipeline, once per
    (store, layout) in the module."""
    cache: dict[tuple[str, str], str] = {}

    def get(kind: str, layout: str) -> str:
        if (kind, layout) not in cache:
            prefix = new_prefix()
            write_with(BATCHED, open_store(kind, proxy_server, prefix), LAYOUTS[layout], sample())
            cache[kind, layout] = prefix
        return cache[kind, layout]

    return get


@pytest.mark.parametrize(
    ("kind", "layout", "selection"),
    cases(
        ("kind", "layout", "selection"),
        list(LAYOUTS),
        list(SELECTIONS),
        s3fs=lambda layout, selection: selection in ("whole", "orthogonal", "coordinate"),
    ),
)
def test_read_matches_zarr(
    proxy: LatencyProxy, written: Callable[[str, str], str], kind: str, layout: str, selection: str
) -> None:
    store = open_store(kind, proxy, written(kind, layout))
    sel = SELECTIONS[selection]
    with with_pipeline(BATCHED):
        expected = sel.read(zarr.open_array(store, mode="r"))
    if sel.expect is not None:
        assert_same_values(expected, sel.expect(sample()))
    with with_pipeline(FUSED):
        got = sel.read(zarr.open_array(store, mode="r"))
    assert_same_values(got, expected)


@pytest.mark.parametrize("selection", ["whole", "basic", "basic-int", "block", "partial-shard"])
@pytest.mark.parametrize("layout", ["shard-end-zstd-crc", "shard-start-zstd"])
def test_sharded_basic_reads_skip_zarrs_codec(
    monkeypatch: pytest.MonkeyPatch,
    proxy: LatencyProxy,
    written: Callable[[str, str], str],
    layout: str,
    selection: str,
) -> None:
    """Basic selections of natively readable shards go to the native engine
    over the async store, never to zarr's sharding codec."""
    store = open_store("obstore", proxy, written("obstore", layout))
    with with_pipeline(BATCHED):
        expected = SELECTIONS[selection].read(zarr.open_array(store, mode="r"))

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("zarr's sharding codec read a shard")

    monkeypatch.setattr(ShardingCodec, "_decode_partial_single", refuse)
    with with_pipeline(FUSED):
        got = SELECTIONS[selection].read(zarr.open_array(store, mode="r"))
    assert_same_values(got, expected)


# every shard read whole; every shard read in part (its index, then ranges)
@pytest.mark.parametrize("selection", ["whole", "rows"])
def test_sharded_reads_respect_async_concurrency(
    proxy: LatencyProxy, written: Callable[[str, str], str], selection: str
) -> None:
    """Every request of a sharded read (index, whole shard, merged range)
    counts against ``async.concurrency``."""
    store = open_store("obstore", proxy, written("obstore", "shard-end-zstd-crc"))
    with with_pipeline(FUSED), zarr.config.set({"async.concurrency": 2}):
        arr = zarr.open_array(store, mode="r")
        proxy.reset(latency=0.05)  # long enough for the requests to overlap
        got = arr[...] if selection == "whole" else arr[::8, :]
    stats = proxy.reset()
    assert stats.count("GET") > 2
    assert stats.max_in_flight <= 2, stats.summary()
    assert got.size > 0


class _ShardVanishes(WrapperStore[Store]):
    """Deletes the shard ``c/0/0`` as soon as its index has been read (a
    shard deleted by another writer between two requests of a read)."""

    async def get(
        self, key: str, prototype: Any, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        if key == "c/0/0" and isinstance(byte_range, SuffixByteRequest):
            await self._store.delete(key)
        return buf


def test_shard_deleted_mid_read_reads_as_missing(proxy: LatencyProxy) -> None:
    """A shard gone after its index was read reads as missing (as in zarr)."""
    store = open_store("obstore", proxy, new_prefix())
    write_with(BATCHED, store, LAYOUTS["shard-end-zstd-crc"], sample())
    with with_pipeline(FUSED):
        got = zarr.open_array(_ShardVanishes(store))[1:4, 0:12]
    assert proxy.stats.count("GET") > 0
    assert_same_values(got, np.full((3, 12), FILL, "<u2"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", STORES)
def test_unwritten_array_reads_fill(proxy: LatencyProxy, kind: str, layout: str) -> None:
    store = open_store(kind, proxy, new_prefix())
    write_with(BATCHED, store, LAYOUTS[layout], None)
    with with_pipeline(FUSED):
        got = zarr.open_array(store, mode="r")[2:20, 3:29]
    assert_same_values(got, np.full((18, 26), FILL, "<u2"))
    assert proxy.stats.count("GET") > 0  # the reads did go to the server


def _partial_values() -> np.ndarray:
    return np.random.default_rng(17).integers(0, 1000, (14, 19)).astype("<u2")


# name -> (data written first by zarr's pipeline or None, the write under test)
WRITES: dict[str, tuple[bool, Callable[[zarr.Array], None]]] = {
    "all": (False, lambda a: a.__setitem__(Ellipsis, sample())),
    "partial": (True, lambda a: a.__setitem__((slice(5, 19), slice(3, 22)), _partial_values())),
    "fill-a-shard": (True, lambda a: a.__setitem__((slice(0, 8), slice(0, 15)), FILL)),
    "orthogonal": (True, lambda a: a.set_orthogonal_selection(([1, 9, 22], [0, 16, 29]), 3)),
}


@pytest.mark.parametrize(
    ("kind", "layout", "write"),
    cases(
        ("kind", "layout", "write"),
        list(LAYOUTS),
        list(WRITES),
        s3fs=lambda layout, write: layout != "shard-start-zstd" and write in ("all", "partial"),
    ),
)
def test_write_matches_zarr_bytes(
    moto: MotoServer, proxy: LatencyProxy, kind: str, layout: str, write: str
) -> None:
    first, op = WRITES[write]
    results = {}
    for pipeline in (BATCHED, FUSED):
        prefix = new_prefix()
        store = open_store(kind, proxy, prefix)
        arr = write_with(BATCHED, store, LAYOUTS[layout], sample() if first else None)
        with with_pipeline(pipeline):
            op(zarr.open_array(store))
        with with_pipeline(BATCHED):
            values = zarr.open_array(store, mode="r")[...]
        results[pipeline] = (stored(moto, prefix), values)
        del arr
    assert_same_objects_and_values(results[FUSED], results[BATCHED])


# -- requests: never more than zarr's own FusedCodecPipeline ---------------------------

# name -> (array written first, operation)
OPERATIONS: dict[str, tuple[bool, Callable[[zarr.Array], Any]]] = {
    "read-whole": (True, lambda a: a[...]),
    "read-one-inner": (True, lambda a: a[4:8, 15:20]),
    "read-slab": (True, lambda a: a[10:11, :]),
    "read-missing-shard": (True, lambda a: a[8:16, 15:30]),
    "write-all": (False, lambda a: a.__setitem__(Ellipsis, sample())),
    "write-partial": (
        True,
        lambda a: a.__setitem__((slice(5, 19), slice(3, 22)), _partial_values()),
    ),
}


def _count(proxy: LatencyProxy, kind: str, layout: str, pipeline: str, operation: str) -> Stats:
    first, op = OPERATIONS[operation]
    store = open_store(kind, proxy, new_prefix())
    write_with(BATCHED, store, LAYOUTS[layout], sample() if first else None)
    arr = zarr.open_array(store)
    proxy.reset()
    with with_pipeline(pipeline):
        arr = zarr.open_array(store)  # a pipeline of the configured class
        proxy.reset()
        op(arr)
    return proxy.reset()


@pytest.mark.parametrize(
    ("kind", "layout", "operation"),
    cases(
        ("kind", "layout", "operation"),
        list(LAYOUTS),
        list(OPERATIONS),
        s3fs=lambda layout, op: op in ("read-whole", "read-slab", "write-partial"),
    ),
)
def test_requests_no_more_than_zarr(
    proxy: LatencyProxy, kind: str, layout: str, operation: str
) -> None:
    theirs = _count(proxy, kind, layout, ZARR_FUSED, operation)
    ours = _count(proxy, kind, layout, FUSED, operation)
    assert ours.count("GET", "PUT", "HEAD", "DELETE") > 0
    for method in ("GET", "PUT", "HEAD"):
        assert ours.requests[method] <= theirs.requests[method], (
            method,
            ours.summary(),
            theirs.summary(),
        )


# -- the read-only HTTP server -----------------------------------------------------------


@pytest.fixture(scope="module")
def http_arrays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    """Every layout written to local files by zarr's pipeline, served
    read-only over HTTP."""
    root = tmp_path_factory.mktemp("http")
    for name, layout in LAYOUTS.items():
        write_with(BATCHED, LocalStore(root / name), layout, sample())
    with started_or_skip(RangeServer(root)) as server:
        yield server


@pytest.mark.parametrize("selection", ["whole", "orthogonal", "mask"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_http_read_matches_zarr(http_arrays: RangeServer, layout: str, selection: str) -> None:
    pytest.importorskip("aiohttp")
    store = FsspecStore.from_url(f"{http_arrays.endpoint}/{layout}", read_only=True)
    sel = SELECTIONS[selection]
    with with_pipeline(FUSED):
        got = sel.read(zarr.open_array(store, mode="r"))
    assert sel.expect is not None
    assert_same_values(got, sel.expect(sample()))
    assert http_arrays.stats.count("GET") > 0


@pytest.mark.parametrize("operation", ["read-whole", "read-slab"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_http_requests_no_more_than_zarr(
    http_arrays: RangeServer, layout: str, operation: str
) -> None:
    pytest.importorskip("aiohttp")
    counts = {}
    for pipeline in (ZARR_FUSED, FUSED):
        with with_pipeline(pipeline):
            arr = zarr.open_array(
                FsspecStore.from_url(f"{http_arrays.endpoint}/{layout}", read_only=True), mode="r"
            )
            http_arrays.reset()
            OPERATIONS[operation][1](arr)
            counts[pipeline] = http_arrays.reset()
    assert counts[FUSED].count("GET") > 0
    for method in ("GET", "HEAD"):
        assert counts[FUSED].requests[method] <= counts[ZARR_FUSED].requests[method], (
            method,
            counts[FUSED].summary(),
            counts[ZARR_FUSED].summary(),
        )


# -- crafted bad shards ------------------------------------------------------------------

N_INNER = 6  # 2 x 3 inner chunks per shard
BAD_SELECTIONS = {
    "whole": (lambda a: a[...], lambda d: d),
    "one-inner": (lambda a: a[0:4, 0:5], lambda d: d[0:4, 0:5]),
}
BAD_CASES = [
    pytest.param(
        kind,
        location,
        corruption,
        selection,
        id=f"{kind}-{location}-{corruption}-{selection}",
    )
    for kind in STORES
    for location in ("end", "start")
    for corruption in CORRUPTIONS
    for selection in BAD_SELECTIONS
    # s3fs: whole reads of shards indexed at the end, index and entry damage
    if kind == "obstore"
    or (
        location == "end"
        and selection == "whole"
        and corruption in ("truncated", "index-crc", "past-end")
    )
]


@pytest.mark.parametrize(("kind", "location", "corruption", "selection"), BAD_CASES)
def test_bad_shard_raises_naming_the_key(
    moto: MotoServer, proxy: LatencyProxy, kind: str, location: str, corruption: str, selection: str
) -> None:
    prefix = new_prefix()
    store = open_store(kind, proxy, prefix)
    data = np.random.default_rng(18).integers(0, 1000, (16, 15)).astype("<u2")
    with with_pipeline(BATCHED):
        # 2 x 1 shards of 2 x 3 inner chunks
        serializer = ShardingCodec(
            chunk_shape=(4, 5), codecs=[BytesCodec(), ZstdCodec(level=1)], index_location=location
        )
        zarr.create_array(
            store,
            shape=data.shape,
            chunks=(8, 15),
            dtype="<u2",
            serializer=serializer,
            compressors=None,
            fill_value=FILL,
        )[...] = data
    client = moto.client()
    shard = client.get_object(Bucket=BUCKET, Key=f"{prefix}/c/0/0")["Body"].read()
    client.put_object(
        Bucket=BUCKET, Key=f"{prefix}/c/0/0", Body=corrupt(shard, N_INNER, corruption, location)
    )
    read, expect = BAD_SELECTIONS[selection]
    with with_pipeline(FUSED):
        arr = zarr.open_array(store, mode="r")
        try:
            got = read(arr)
        except CorruptChunkError as exc:
            assert "c/0/0" in str(exc)
            if corruption in ("truncated", "index-crc"):
                assert isinstance(exc, CorruptShardError)
        else:
            assert corruption not in ALWAYS_DETECTED, "a corrupt index was not detected"
            assert_same_values(got, expect(data))
        assert_same_values(arr[8:, :], data[8:, :])  # the other shard stays readable


# -- faults injected by the proxy ------------------------------------------------------

SHARD_KEY = r"c/0/1$"


@dataclass(frozen=True)
class FaultCase:
    fault: Fault
    outcome: str  # "retried": must succeed; "error": must fail naming the key; "either"


FAULTS = {
    "get-500": FaultCase(Fault("500", SHARD_KEY, "GET"), "error"),
    "get-503-once": FaultCase(Fault("503", SHARD_KEY, "GET", times=1), "retried"),
    "get-reset-once": FaultCase(Fault("reset", SHARD_KEY, "GET", times=1), "either"),
    "get-truncate-once": FaultCase(Fault("truncate", SHARD_KEY, "GET", times=1), "either"),
    "get-truncate-always": FaultCase(Fault("truncate", SHARD_KEY, "GET"), "error"),
    "put-500": FaultCase(Fault("500", SHARD_KEY, "PUT"), "error"),
    "put-503-once": FaultCase(Fault("503", SHARD_KEY, "PUT", times=1), "retried"),
    "put-reset-once": FaultCase(Fault("reset", SHARD_KEY, "PUT", times=1), "either"),
}


def _fault_cases() -> list[Any]:
    return cases(
        ("kind", "case", "layout"),
        list(FAULTS),
        ["shard-end-zstd-crc", "unsharded-zstd-crc"],
        s3fs=lambda case, layout: layout == "shard-end-zstd-crc",
    )


@pytest.mark.parametrize(("kind", "case", "layout"), _fault_cases())
def test_fault(moto: MotoServer, proxy: LatencyProxy, kind: str, case: str, layout: str) -> None:
    spec = FAULTS[case]
    lay = LAYOUTS[layout]
    old = sample()
    new = (old + 1).astype("<u2")
    # what a complete write of ``new`` stores, by zarr's pipeline
    reference = new_prefix()
    write_with(BATCHED, open_store(kind, proxy, reference), lay, new)
    prefix = new_prefix()
    store = open_store(kind, proxy, prefix)
    write_with(BATCHED, store, lay, old)
    before_objects = stored(moto, prefix)
    after_objects = stored(moto, reference)
    key = "c/0/1"
    writing = spec.fault.method == "PUT"
    with with_pipeline(FUSED):
        arr = zarr.open_array(store)

        def operation() -> Any:
            if writing:
                arr[...] = new
                return None
            return arr[...]

        got, error = under_fault(proxy, spec.fault, spec.outcome, operation)
    if error is None and not writing:
        assert_same_values(got, old)
    proxy.reset()
    objects = stored(moto, prefix)
    # nothing half-written: the object is the old one or the whole new one
    assert objects[key] in (before_objects[key], after_objects[key])
    if writing and error is None:
        assert objects == after_objects
    # every object decodes: the array reads, each chunk old or new
    with with_pipeline(BATCHED):
        after = zarr.open_array(store, mode="r")[...]
    assert np.all((after == old) | (after == new))
    if error is not None:
        assert key in str(error), f"the error does not name {key!r}: {error!r}"
