"""Shard-sized byte buffers, reused across shard reads and writes, and the
view the shard readers hand a native chain.

A fresh multi-megabyte allocation faults in every page on first touch,
which costs about as much as reading the shard; keeping a few buffers
between reads (and the writes' encode arenas) avoids that. The pool is
bounded while idle so huge shards do not leave gigabytes behind.
"""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["BufferPool", "RawBuffer", "buffers"]


class BufferPool:
    """Byte buffers to take and give back; while idle, at most ``keep``
    buffers and ``max_bytes`` bytes are held."""

    def __init__(self, keep: int = 4, max_bytes: int = 256 << 20) -> None:
        self.keep = keep
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> np.ndarray:
        """The smallest free buffer of at least ``size`` bytes, or a new one."""
        with self._lock:
            best = -1
            for i, b in enumerate(self._free):
                if b.nbytes >= size and (best < 0 or b.nbytes < self._free[best].nbytes):
                    best = i
            if best >= 0:
                return self._free.pop(best)
        return np.empty(max(size, 1 << 16), dtype=np.uint8)

    def give(self, buf: np.ndarray | None) -> None:
        """Hand ``buf`` back (None: nothing), dropping the smallest buffer
        beyond ``keep`` and the largest beyond ``max_bytes``."""
        if buf is None:
            return
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:
                smallest = min(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                self._free.pop(smallest)
            held = sum(b.nbytes for b in self._free)
            while held > self.max_bytes:
                largest = max(range(len(self._free)), key=lambda i: self._free[i].nbytes)
                held -= self._free.pop(largest).nbytes


class RawBuffer:
    """The one Buffer method `NativeChain.decode_array` uses, over a view.

    The shard readers (sync and async) hand the chain inner chunks sliced
    out of a fetched shard; this stands in for a zarr `Buffer` around each.
    """

    __slots__ = ("data",)

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def as_numpy_array(self) -> np.ndarray:
        return self.data


#: the pool the chunk and shard paths share
buffers = BufferPool()

if hasattr(os, "register_at_fork"):  # the lock may be held by a thread the child lacks
    os.register_at_fork(after_in_child=lambda: setattr(buffers, "_lock", threading.Lock()))
