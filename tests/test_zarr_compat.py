"""`zarr_fused._zarr_compat`, the one seam to zarr's private API: each shim
against the zarr installed, and no private zarr name anywhere else in the
package."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.abc.codec import ArrayBytesCodec
from zarr.abc.store import RangeByteRequest
from zarr.codecs import BytesCodec, ShardingCodec
from zarr.core.array_spec import ArrayConfig, ArraySpec
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.dtype import parse_dtype
from zarr.storage import LocalStore, MemoryStore

from zarr_fused import _zarr_compat as compat

PACKAGE = Path(compat.__file__).parent
ZARR = Path(zarr.__file__).parent


def _spec(shape: tuple[int, ...], dtype: str, fill_value: object) -> ArraySpec:
    return ArraySpec(
        shape=shape,
        dtype=parse_dtype(dtype, zarr_format=3),
        fill_value=fill_value,
        config=ArrayConfig(order="C", write_empty_chunks=False),
        prototype=default_buffer_prototype(),
    )


def _sharding_codec() -> ShardingCodec:
    return ShardingCodec(chunk_shape=(4, 4))


def test_inner_chunk_spec_is_the_inner_chunk_shape() -> None:
    shard_spec = _spec((8, 8), "uint16", 7)
    inner = compat.inner_chunk_spec(_sharding_codec(), shard_spec)
    assert inner.shape == (4, 4)
    assert inner.dtype == shard_spec.dtype
    assert inner.fill_value == 7


@pytest.mark.parametrize(
    ("shards", "grid_chunks"),
    [pytest.param((8, 6), (8, 6), id="sharded"), pytest.param(None, (4, 3), id="unsharded")],
)
def test_array_chunk_grid_is_the_grid_of_stored_keys(
    shards: tuple[int, ...] | None, grid_chunks: tuple[int, ...]
) -> None:
    arr = zarr.create_array({}, shape=(16, 12), chunks=(4, 3), shards=shards, dtype="uint8")
    grid = compat.array_chunk_grid(arr)
    assert grid.is_regular
    assert tuple(grid.chunk_shape) == grid_chunks


def test_partial_codecs_are_found_on_the_sharding_codec() -> None:
    codec = _sharding_codec()
    assert compat.has_partial_decode(codec)
    assert compat.has_partial_encode(codec)
    assert callable(compat.decode_partial_sync(codec))
    assert callable(compat.encode_partial_sync(codec))


def test_codecs_without_partial_codecs_are_told_apart() -> None:
    assert not compat.has_partial_decode(BytesCodec())
    assert not compat.has_partial_encode(BytesCodec())


def test_merge_chunk_array_writes_the_selection_into_the_existing_chunk() -> None:
    nd = default_buffer_prototype().nd_buffer
    existing = nd.from_numpy_array(np.arange(4, dtype="int32"))
    value = nd.from_numpy_array(np.array([40, 50], dtype="int32"))
    merged = compat.merge_chunk_array(
        existing, value, (slice(0, 2),), _spec((4,), "int32", 0), (slice(1, 3),), False, ()
    )
    np.testing.assert_array_equal(merged.as_numpy_array(), [0, 40, 50, 3])


def test_store_supports_sync_io(tmp_path: Path) -> None:
    assert compat.store_supports_sync_io(LocalStore(tmp_path))
    assert compat.store_supports_sync_io(MemoryStore())


def test_memory_store_dict_is_shared_by_stores_over_one_dict() -> None:
    values: dict[str, Buffer] = {}
    assert compat.memory_store_dict(MemoryStore(values)) is values


def test_coalesce_ranges_merges_near_ranges_and_leaves_far_ones() -> None:
    requests = [RangeByteRequest(0, 10), RangeByteRequest(12, 20), RangeByteRequest(10_000, 10_010)]
    groups, alone = compat.coalesce_ranges(requests, max_gap_bytes=4, max_coalesced_bytes=1 << 20)
    # the near pair is one fetch; the far range is not merged into it
    assert [0, 1] in [[i for i, _ in g] for g in groups]
    assert all(2 not in [i for i, _ in g] or len(g) == 1 for g in groups) or [
        i for i, _ in alone
    ] == [2]


def test_object_absent_holds_file_not_found() -> None:
    assert FileNotFoundError in compat.OBJECT_ABSENT


def test_fsspec_store_module_is_zarrs_module_once_imported() -> None:
    import zarr.storage._fsspec as fsspec_module

    assert compat.fsspec_store_module() is fsspec_module


def test_v2_codec_is_the_array_bytes_codec_of_format_2_arrays() -> None:
    codec = compat.V2Codec(filters=None, compressor=None)
    assert isinstance(codec, ArrayBytesCodec)


def test_evolve_codecs_returns_codecs_for_the_spec() -> None:
    evolved = compat.evolve_codecs((BytesCodec(),), _spec((4,), "int32", 0))
    assert [type(c) for c in evolved] == [BytesCodec]


def _private_names(node: ast.AST) -> list[str]:
    """The zarr-private names ``node`` imports or reaches."""
    found: list[str] = []
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "zarr":
        parts = (node.module or "").split(".")
        names = [a.name for a in node.names]
        if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
            found.append(f"from {node.module} import {', '.join(names)}")
    elif isinstance(node, ast.Attribute) and node.attr in ZARR_PRIVATE:
        found.append(node.attr)
    return found


def _zarr_private_attributes() -> set[str]:
    """Underscore names zarr defines on its classes (methods, attributes)."""
    names: set[str] = set()
    for path in ZARR.rglob("*.py"):
        if "testing" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and not node.name.startswith("__"):
                    names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return names


def _own_names() -> set[str]:
    """Underscore names zarr_fused defines itself (they are not zarr's)."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.AnnAssign)) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


ZARR_PRIVATE = _zarr_private_attributes() - _own_names()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, id=str(p.relative_to(PACKAGE)))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "_zarr_compat.py"
    ],
)
def test_no_module_but_the_seam_uses_zarr_private_names(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    used = [name for node in ast.walk(tree) for name in _private_names(node)]
    assert used == []


def test_the_private_name_check_finds_what_the_seam_uses() -> None:
    tree = ast.parse(Path(compat.__file__).read_text(encoding="utf-8"))
    used = {name for node in ast.walk(tree) for name in _private_names(node)}
    assert "_get_chunk_spec" in used
    assert "_store_dict" in used
    assert any(u.startswith("from zarr.core.chunk_utils import") for u in used)


def test_inner_write_order_covers_the_grid_once() -> None:
    coords = [tuple(c) for c in compat.inner_write_order(_sharding_codec(), (2, 3))]
    assert sorted(coords) == [(i, j) for i in range(2) for j in range(3)]


def test_codec_supports_sync() -> None:
    assert compat.codec_supports_sync(BytesCodec())


def test_open_local_store_refuses_writes_to_a_read_only_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, read_only=True)
    compat.open_local_store(store, write=False)
    with pytest.raises(ValueError, match="read-only"):
        compat.open_local_store(store, write=True)
