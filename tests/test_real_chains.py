"""The codec chains real datasets use, each in strict mode.

One table of chains as climate archives, microscopy and zarr's own docs
write them (filters, serializer, compressors, dtype), format 3 unsharded
and as the inner chain of a shard, and format 2. Every chain is written
(whole, then a partial overwrite, then whole chunks of the fill value) and
read through zarr_fused with ``codec_pipeline.strict`` on, so a chain that
is not native fails with `UnsupportedError`, and through zarr's
`BatchedCodecPipeline`: the stored chunks and shards must be zarr's bytes,
and the values zarr's. Chains that are not native yet are listed in
`NOT_NATIVE`, each with the reason; they are strict xfails, so one that
becomes native fails here until it leaves the list.

The detailed tests of each codec are in their own files (test_filters,
test_sharded_filters, test_lz4_shuffle, test_vlen, test_v2): this file is
the checklist, not the coverage. The chains themselves, their values and
their arrays are in `zarr_fused_testing.chains`, which
asv_bench/real_chains_side_by_side.py times as well.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr_fused_testing.chains import (
    CHAINS,
    CHECK_CHUNKS,
    CHECK_INNER,
    CHECK_SHAPE,
    NOT_NATIVE,
    chain_values,
    create_chain_array,
    shardings,
)

from zarr_fused.errors import CorruptChunkError

from helpers import BATCHED, STRICT, assert_same_values, chunk_items, make_store

ORACLE = {"codec_pipeline.path": BATCHED}


#: a gzip member's header up to its time (magic, deflate, any flags)
_GZIP_HEADER = re.compile(rb"(\x1f\x8b\x08[\x00-\xff])[\x00-\xff]{4}", re.DOTALL)


def _write(store: Any, case: dict[str, Any], sharded: bool) -> np.ndarray:
    """Whole, then a partial overwrite, then whole chunks of the fill value
    (not stored); the array read back whole."""
    if case["requires"]:
        pytest.importorskip(case["requires"])
    array = create_chain_array(
        store, case, CHECK_SHAPE, CHECK_CHUNKS, CHECK_INNER if sharded else None
    )
    array[:] = chain_values(case, CHECK_SHAPE, 0)
    array[3:8, 6:23] = chain_values(case, (5, 17), 1)
    array[CHECK_CHUNKS[0] * 2 :, :] = case["fill"]
    return array[:]


def _without_mtime(stored: bytes) -> bytes:
    """``stored`` with the time in every gzip member's header zeroed (gzip
    writes the clock there, so two runs of one codec differ; a shard holds a
    member per inner chunk)."""
    return _GZIP_HEADER.sub(lambda m: m.group(1) + bytes(4), stored)


def _same_stored(ours: dict[str, bytes], theirs: dict[str, bytes]) -> None:
    assert sorted(ours) == sorted(theirs)
    for key, expected in theirs.items():
        assert _without_mtime(ours[key]) == _without_mtime(expected), key


def _params() -> list[Any]:
    params = []
    for name, case in CHAINS.items():
        for sharded in shardings(case):
            marks = []
            reason = NOT_NATIVE.get((name, sharded))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            label = f"{name}-{'sharded' if sharded else 'unsharded'}"
            params.append(pytest.param(name, sharded, id=label, marks=marks))
    return params


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize(("name", "sharded"), _params())
@pytest.mark.parametrize("store_kind", ["local", "memory"])
def test_chain_strict_like_zarr(tmp_path: Path, name: str, sharded: bool, store_kind: str) -> None:
    case = CHAINS[name]
    with zarr.config.set(ORACLE):
        oracle_store = make_store(store_kind, tmp_path, "zarr")
        expected = _write(oracle_store, case, sharded)
    with zarr.config.set(STRICT):
        store = make_store(store_kind, tmp_path, "fused")
        got = _write(store, case, sharded)
        reread = zarr.open_array(store, mode="r")[2:35:3, 1:]
    assert_same_values(got, expected)
    assert_same_values(reread, expected[2:35:3, 1:])
    _same_stored(chunk_items(store), chunk_items(oracle_store))
    # zarr reads what zarr_fused wrote
    with zarr.config.set(ORACLE):
        assert_same_values(zarr.open_array(store, mode="r")[:], expected)


# -- a damaged zlib or gzip chunk ------------------------------------------------
#
# libdeflate reads what it decodes whole and hands the rest to zlib, whose
# error names the chunk (unsharded) or the shard (sharded) that holds it.

#: chain -> the numcodecs codec that writes its streams
DEFLATE_CHAINS = {
    "zlib-i2": lambda: numcodecs.Zlib(level=1),
    "gzip-f4": lambda: numcodecs.GZip(level=5),
    "zarr-gzip-u2": lambda: numcodecs.GZip(level=1),
    "v2-zlib-i2": lambda: numcodecs.Zlib(level=1),
    "v2-gzip-f8-F": lambda: numcodecs.GZip(level=6),
}


def _damage(raw: bytes, how: str, name: str) -> bytes:
    if how == "truncate":
        return raw[: len(raw) // 2]
    if how == "flip":  # the second quarter: stream bytes, before a shard's index
        out = bytearray(raw)
        for i in range(len(out) // 4, len(out) // 2):
            out[i] ^= 0x5A
        return bytes(out)
    # a sound stream of one byte more than the chunk holds
    size = int(np.prod(CHECK_CHUNKS)) * np.dtype(CHAINS[name]["dtype"]).itemsize + 1
    return bytes(DEFLATE_CHAINS[name]().encode(bytes(size)))


def _deflate_params() -> list[Any]:
    params = []
    for name in DEFLATE_CHAINS:
        for sharded in shardings(CHAINS[name]):
            for how in ("flip",) if sharded else ("truncate", "flip", "longer"):
                label = f"{name}-{'sharded' if sharded else 'unsharded'}-{how}"
                params.append(pytest.param(name, sharded, how, id=label))
    return params


@pytest.mark.parametrize(("name", "sharded", "how"), _deflate_params())
def test_damaged_deflate_chunk_names_its_key(
    tmp_path: Path, name: str, sharded: bool, how: str
) -> None:
    case = CHAINS[name]
    store = make_store("local", tmp_path, "fused")
    with zarr.config.set(STRICT):
        _write(store, case, sharded)
    stored = chunk_items(store)
    key = min(stored)
    (tmp_path / "fused" / key).write_bytes(_damage(stored[key], how, name))
    with zarr.config.set(STRICT), pytest.raises(CorruptChunkError, match=re.escape(key)):
        zarr.open_array(store, mode="r")[:]
