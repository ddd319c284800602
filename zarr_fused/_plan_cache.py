"""What a plan derives from an array's metadata, kept per process.

zarr builds a new codec pipeline on every ``open_array``, so the plan
(`zarr_fused._plan`) would resolve the same codecs against the same chunk
spec again on every open: for a filter chain that is more work than zarr's
own pipeline does to open the array. The chains a plan derives depend only
on the evolved codecs and the chunk spec, and hold no array, store or
buffer, so arrays whose metadata match share them. The readers and writers,
which learn from the files they read, stay each plan's own.

Keys are *exact*: two codecs or specs share an entry only when every field
has the same type and the same bits (``0.0`` and ``-0.0``, ``1`` and
``1.0``, two NaN payloads all differ), because the kernels a plan builds
bake those values in. A value `exact_key` does not know makes the metadata
unkeyable, and its plan is built afresh, as without the cache.

The cache is bounded (least recently used entries go first) and emptied in
a forked child, whose copy of the lock may have been held by a thread that
does not exist there.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import struct
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
from numcodecs.abc import Codec as Numcodec

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

__all__ = ["PLAN_PARTS", "PlanCache", "Unkeyable", "exact_key"]

#: distinct array metadata a process keeps plans for (a few hundred bytes
#: of Python objects each, plus the layouts its chains cache)
CAPACITY = 128


class Unkeyable(TypeError):
    """A value whose identity `exact_key` cannot state."""


_SCALARS = (type(None), bool, int, str, bytes)


def exact_key(value: Any) -> Hashable:
    """A hashable key equal for values of the same types and bits only.

    Raises `Unkeyable` for a value it does not know how to describe."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, value)
    if kind is float:
        return (kind, struct.pack("<d", value))
    names = _field_names(kind)
    if names is not None:
        return (kind, tuple((name, exact_key(getattr(value, name))) for name in names))
    if isinstance(value, tuple | list):  # NamedTuples keep their own type
        return (kind, tuple(exact_key(v) for v in value))
    if isinstance(value, enum.Enum):
        return (kind, exact_key(value.value))
    if isinstance(value, type):
        return value  # classes are compared by identity
    if kind is complex:
        return (kind, struct.pack("<dd", value.real, value.imag))
    if isinstance(value, np.generic):
        return (kind, value.dtype.str, value.tobytes())
    if kind is np.ndarray:
        return (kind, value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.dtype):
        return (np.dtype, value.str, str(value.descr), value.isalignedstruct)
    if isinstance(value, set | frozenset):
        return (kind, frozenset(exact_key(v) for v in value))
    if kind is dict:
        return (kind, _dict_key(value))
    if isinstance(value, Numcodec):
        return (kind, _dict_key(value.get_config()))
    raise Unkeyable(f"no exact key for {kind.__name__}")


#: the field names of each dataclass type met, None for other types
#: (`dataclasses.fields` costs more than keying the values)
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}
_UNSEEN = ("",)


def _field_names(kind: type) -> tuple[str, ...] | None:
    names = _FIELD_NAMES.get(kind, _UNSEEN)
    if names is _UNSEEN:
        names = None
        if dataclasses.is_dataclass(kind) and not issubclass(kind, type):
            names = tuple(f.name for f in dataclasses.fields(kind))
        _FIELD_NAMES[kind] = names
    return names


def _dict_key(value: dict[Any, Any]) -> Hashable:
    if not all(type(k) is str for k in value):
        raise Unkeyable("a dict with other keys than strings")
    return tuple(sorted((k, exact_key(v)) for k, v in value.items()))


class PlanCache:
    """A bounded, thread-safe map from exact keys to plan parts."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The parts kept under ``key``, else ``build()``'s, kept. Two
        threads may both build a missing entry: equal parts, the last kept."""
        with self._lock:
            found = self._entries.get(key, self)
            if found is not self:
                self._entries.move_to_end(key)
                return found
        built = build()
        with self._lock:
            self._entries[key] = built
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return built

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def reset_after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may be held), no entries."""
        self._lock = threading.Lock()
        self._entries = OrderedDict()


#: the process's plan parts (`zarr_fused._plan`)
PLAN_PARTS = PlanCache()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=PLAN_PARTS.reset_after_fork)
