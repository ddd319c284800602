"""Plan parts kept per process: exact keys, hits and misses, bounds, fork.

Two opens of the same metadata share the plan's chains and have readers of
their own; metadata that differ in any bit (a fill value's sign, a codec
parameter's type, the chunk shape) never share a plan, and read what zarr's
own pipeline reads.
"""

from __future__ import annotations

import gc
import multiprocessing
import weakref
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.codecs.numcodecs import FixedScaleOffset
from zarr.storage import LocalStore

from zarr_fused import _plan
from zarr_fused._plan_cache import PLAN_PARTS, PlanCache, Unkeyable, exact_key

from helpers import BATCHED, FUSED, assert_same_values, with_pipeline

FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"
NO_FORK = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork"
)


def _pipeline(array: zarr.Array) -> Any:
    return array._async_array.codec_pipeline


def _write(path: Path, **kwargs: Any) -> np.ndarray:
    kwargs.setdefault("shape", (20, 12))
    kwargs.setdefault("chunks", (8, 5))
    kwargs.setdefault("dtype", "<f4")
    data = np.random.default_rng(7).normal(size=kwargs["shape"]).astype(kwargs["dtype"])
    with with_pipeline(BATCHED):
        array = zarr.create_array(LocalStore(path), **kwargs)
        array[...] = data
    return data


def _open(path: Path, pipeline: str = FUSED) -> zarr.Array:
    with with_pipeline(pipeline):
        return zarr.open_array(LocalStore(path), mode="r")


# -- exact keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(0.0, -0.0, id="zero-sign"),
        pytest.param(1, 1.0, id="int-float"),
        pytest.param(1, True, id="int-bool"),
        pytest.param(np.float32(1), np.float64(1), id="numpy-widths"),
        pytest.param(np.float32(1), 1.0, id="numpy-python"),
        pytest.param(float("nan"), -float("nan"), id="nan-sign"),
        pytest.param((1, 2), [1, 2], id="tuple-list"),
        pytest.param({"a": 1}, {"a": 1.0}, id="dict-values"),
        pytest.param(np.dtype("<f4"), np.dtype(">f4"), id="dtype-order"),
        pytest.param(
            numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<f8"),
            numcodecs.FixedScaleOffset(offset=-0.0, scale=10, dtype="<f8"),
            id="numcodec-offset",
        ),
        pytest.param(BloscCodec(cname="zstd"), BloscCodec(cname="lz4"), id="codec-field"),
    ],
)
def test_exact_keys_differ(a: Any, b: Any) -> None:
    assert exact_key(a) != exact_key(b)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: {"b": 2.5, "a": (1, "x")}, id="dict-any-order"),
        pytest.param(lambda: np.float32(np.nan), id="numpy-nan"),
        pytest.param(lambda: BloscCodec(cname="zstd", clevel=3), id="codec"),
        pytest.param(lambda: numcodecs.BitRound(keepbits=10), id="numcodec"),
        pytest.param(lambda: np.arange(4), id="array"),
    ],
)
def test_exact_keys_of_equal_values_match(make: Any) -> None:
    assert exact_key(make()) == exact_key(make())
    hash(exact_key(make()))


def test_unknown_values_are_unkeyable() -> None:
    with pytest.raises(Unkeyable):
        exact_key(object())
    with pytest.raises(Unkeyable):
        exact_key({1: "a"})


# -- the cache itself -------------------------------------------------------------------


def test_cache_builds_once_per_key() -> None:
    cache = PlanCache(capacity=4)
    built: list[str] = []

    def build(name: str) -> Any:
        return lambda: built.append(name) or name

    assert cache.get("a", build("a")) == "a"
    assert cache.get("a", build("a-again")) == "a"
    assert built == ["a"]


def test_cache_drops_the_least_recently_used() -> None:
    cache = PlanCache(capacity=2)
    cache.get("a", lambda: 1)
    cache.get("b", lambda: 2)
    cache.get("a", lambda: -1)  # "a" used last: "b" goes first
    cache.get("c", lambda: 3)
    assert len(cache) == 2
    assert cache.get("a", lambda: -1) == 1
    assert cache.get("b", lambda: 20) == 20


# -- plans of arrays ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"compressors": ZstdCodec(level=1)}, id="native"),
        pytest.param(
            {
                "filters": [FixedScaleOffset(offset=1.5, scale=100, dtype="<f4", astype="<i4")],
                "compressors": ZstdCodec(level=1),
            },
            id="filtered",
        ),
        pytest.param({"compressors": ZstdCodec(level=1), "shards": (16, 10)}, id="sharded"),
        pytest.param(
            {
                "zarr_format": 2,
                "filters": [numcodecs.BitRound(keepbits=10)],
                "compressors": numcodecs.Blosc("zstd", 3, 1),
            },
            id="v2-bitround-blosc",
        ),
    ],
)
def test_second_open_shares_the_chains_not_the_readers(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    _write(tmp_path / "a", **kwargs)
    first, second = _open(tmp_path / "a"), _open(tmp_path / "a")
    plan1, plan2 = _pipeline(first).plan, _pipeline(second).plan
    assert plan1.chain is not None
    assert plan2.chain is plan1.chain
    assert plan2.reader is not plan1.reader
    assert plan2.writer is not plan1.writer
    # lossy filters: zarr's own read is the oracle
    expected = _open(tmp_path / "a", BATCHED)[...]
    assert_same_values(first[...], expected)
    assert_same_values(second[...], expected)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param({"fill_value": 0.0}, {"fill_value": -0.0}, id="fill-sign"),
        pytest.param({"chunks": (8, 5)}, {"chunks": (5, 8)}, id="chunk-shape"),
        pytest.param({"dtype": "<f4"}, {"dtype": "<f8"}, id="dtype"),
        pytest.param(
            {"compressors": ZstdCodec(level=1)}, {"compressors": ZstdCodec(level=2)}, id="level"
        ),
        pytest.param(
            {"filters": [FixedScaleOffset(offset=0, scale=10, dtype="<f4", astype="<i4")]},
            {"filters": [FixedScaleOffset(offset=0.0, scale=10, dtype="<f4", astype="<i4")]},
            id="offset-type",
        ),
        pytest.param(
            {"zarr_format": 2, "order": "C"}, {"zarr_format": 2, "order": "F"}, id="v2-order"
        ),
    ],
)
def test_distinct_metadata_never_share_a_plan(
    tmp_path: Path, a: dict[str, Any], b: dict[str, Any]
) -> None:
    arrays = []
    for name, kwargs in (("a", a), ("b", b)):
        v2 = kwargs.get("zarr_format") == 2
        compressor = numcodecs.Zstd(level=1) if v2 else ZstdCodec(level=1)
        _write(tmp_path / name, **{"compressors": compressor, **kwargs})
        arrays.append(_open(tmp_path / name))
    assert _pipeline(arrays[0]).plan.chain is not _pipeline(arrays[1]).plan.chain
    for name, array in zip("ab", arrays, strict=True):
        assert_same_values(array[...], _open(tmp_path / name, BATCHED)[...])


def test_unkeyable_metadata_builds_its_own_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unkeyable(value: Any) -> Any:
        raise Unkeyable("test")

    monkeypatch.setattr(_plan, "exact_key", unkeyable)
    data = _write(tmp_path / "a", compressors=ZstdCodec(level=1))
    first, second = _open(tmp_path / "a"), _open(tmp_path / "a")
    assert _pipeline(first).plan.chain is not _pipeline(second).plan.chain
    assert_same_values(second[...], data)


def test_cache_keeps_no_store(tmp_path: Path) -> None:
    _write(tmp_path / "a", compressors=ZstdCodec(level=1))
    store = LocalStore(tmp_path / "a")
    with with_pipeline(FUSED):
        array = zarr.open_array(store, mode="r")
        array[...]
    gone = weakref.ref(store)
    del array, store
    gc.collect()
    assert gone() is None


def _child_reads(path: Path, conn: Any) -> None:
    try:
        empty = len(PLAN_PARTS) == 0
        with with_pipeline(FUSED):
            values = zarr.open_array(LocalStore(path), mode="r")[...]
        conn.send((empty, values))
    except BaseException as exc:  # reported to the parent
        conn.send((False, repr(exc)))
    finally:
        conn.close()


@NO_FORK
@pytest.mark.filterwarnings(FORK_WARNING)
def test_forked_child_starts_with_no_plans(tmp_path: Path) -> None:
    data = _write(tmp_path / "a", compressors=ZstdCodec(level=1))
    _open(tmp_path / "a")[...]
    assert len(PLAN_PARTS) > 0
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_reads, args=(tmp_path / "a", child_end))
    proc.start()
    child_end.close()
    assert parent_end.poll(60), "the forked child hung"
    empty, values = parent_end.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert empty
    assert_same_values(values, data)
