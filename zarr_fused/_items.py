"""What every path shares about one batch item: its type, its outcome, its
name in errors.

A batch is what zarr hands a codec pipeline: one item per chunk (or shard),
``(byte_getter, chunk_spec, chunk_selection, out_selection, is_complete)``.
`ReadItem` and `WriteItem` name that tuple. They stay zarr's plain tuples
rather than a NamedTuple built at the pipeline's edge: every path unpacks
an item once, by name (``getter, spec, chunk_selection, out_selection,
is_complete = item``), never by position, so a wrapper would only add a
per-chunk allocation to the hot path.

A read reports one `zarr.abc.codec.GetResult` per item: `PRESENT` when the
chunk was stored, `MISSING` when its fill value was written instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zarr.abc.codec import GetResult

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.indexing import SelectorTuple

    #: ``(byte_getter, chunk_spec, chunk_selection, out_selection, is_complete)``
    ReadItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]
    #: ``(byte_setter, chunk_spec, chunk_selection, out_selection, is_complete)``
    WriteItem = tuple[Any, ArraySpec, SelectorTuple, SelectorTuple, bool]

__all__ = ["MISSING", "PRESENT", "describe_chunk", "describe_key"]

PRESENT = GetResult(status="present")
MISSING = GetResult(status="missing")


def describe_key(key: Any, noun: str = "") -> str:
    """A readable name of the store key behind a byte getter/setter, for
    error messages; ``noun`` (e.g. "chunk") goes before it, and alone names
    an unknown key (None)."""
    if key is None and noun:
        return noun
    path = getattr(key, "path", None)
    if path is not None:
        store = getattr(key, "store", None)
        name = f"{path!r} in {store}" if store is not None else repr(path)
    else:
        coords = getattr(key, "chunk_coords", None)
        name = f"inner chunk {coords}" if coords is not None else repr(key)
    return f"{noun} {name}" if noun else name


def describe_chunk(key: Any) -> str:
    """`describe_key` with the noun "chunk": how the native batches name the
    chunk an error is about."""
    return describe_key(key, "chunk")
