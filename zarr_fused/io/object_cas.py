"""Conditional writes on object stores: a read-modify-write of one object
that loses nothing to concurrent writers.

A write that updates part of a stored object (some inner chunks of a
shard) reads the object, merges its own part into it and
writes the whole object back. Two writers doing so at once each write back
what they read plus their own part, and the last one erases the other's.
S3, GCS, Azure and obstore's in-memory store accept a write only if the
object is still the version that was read: a PUT with ``If-Match: <ETag>``
(``If-None-Match: *`` where there was no object) fails with 412 when another
writer has replaced (or created) it in between. The writer then reads it
again, merges again and retries, after a pause (`Backoff`).

This module is the store-facing half: which stores take conditional writes
(`conditional_store`), a GET that returns the object's version with its
bytes (`get_versioned`), the conditional PUT (`put_if_unchanged`, raising
`zarr_fused.errors.WriteConflictError`), and what happens on a store that
cannot (`unprotected`). The loop itself is `Requests.update` in
`zarr_fused.io.requests`, which holds a request slot for each request and
none while merging.

A shard left empty by a write is deleted, as zarr deletes it.
obstore has no conditional DELETE, so that DELETE is unconditional: a
concurrent writer that stored into the object after this writer read it
loses its part. Only a write that leaves the whole object at the fill value
can do this.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Final
from warnings import warn

from zarr.storage import ObjectStore, StorePath

from zarr_fused.config import SHARD_WRITE_LOCK_KEY, strict_mode
from zarr_fused.errors import UnprotectedWriteWarning, UnsupportedError, WriteConflictError

if TYPE_CHECKING:
    from collections.abc import Buffer as BufferLike

__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_START",
    "MAX_ATTEMPTS",
    "NOTHING",
    "Backoff",
    "Outcome",
    "Versioned",
    "conditional_store",
    "get_versioned",
    "put_if_unchanged",
    "unprotected",
]

#: attempts of one read-modify-write before it gives up (with the pauses
#: below, at most about 45 s of back-off). Generous: every other writer of
#: the shard whose PUT lands between this one's GET and PUT pre-empts it,
#: and on a loaded server that window is hundreds of milliseconds
MAX_ATTEMPTS: Final = 50
#: the first pause after a conflict, in seconds; it doubles up to `BACKOFF_CAP`
BACKOFF_START: Final = 0.01
BACKOFF_CAP: Final = 1.0

# obstore's stores whose PUT takes ``mode={"e_tag": ...}`` and "create":
# its LocalStore refuses the update mode (NotImplementedError), HTTPStore
# has neither
_CONDITIONAL_STORES: Final = frozenset({"S3Store", "GCSStore", "AzureStore", "MemoryStore"})


class Outcome(Enum):
    """What a merge returns when there is nothing to store (the write is
    handed to other code)."""

    NOTHING = "nothing"


NOTHING: Final = Outcome.NOTHING


@dataclass(frozen=True, slots=True)
class Versioned:
    """A stored object as read: its bytes (None when there is none) and
    the version a conditional PUT must find to replace it."""

    data: Any | None  # obstore's Bytes (a buffer)
    e_tag: str | None = None
    version: str | None = None

    @property
    def conditional(self) -> bool:
        """Whether a PUT can be made conditional on this version: no object,
        or one the store gave an ETag or a version (S3-compatible servers
        that give neither exist)."""
        return self.data is None or bool(self.e_tag or self.version)


def conditional_store(setter: Any) -> Any | None:
    """The obstore store below ``setter`` when a conditional PUT to it is
    possible: a key of zarr's ``ObjectStore`` exactly (a subclass may change
    what ``set`` does), writable, over an obstore store that supports
    conditional PUTs; else None."""
    if type(setter) is not StorePath:
        return None
    store = setter.store
    if type(store) is not ObjectStore or store.read_only:
        return None
    inner = store.store
    return inner if type(inner).__name__ in _CONDITIONAL_STORES else None


async def get_versioned(store: Any, path: str) -> Versioned:
    """``path`` of the obstore ``store`` with its ETag and version (the
    GET ``ObjectStore.get`` makes; a missing key read as absent, as zarr
    reads it)."""
    import obstore

    try:
        response = await obstore.get_async(store, path)
    except FileNotFoundError:
        return Versioned(None)
    data = await response.bytes_async()
    meta = response.meta
    return Versioned(data, meta.get("e_tag"), meta.get("version"))


async def put_if_unchanged(store: Any, path: str, data: BufferLike, seen: Versioned) -> None:
    """Store ``data`` at ``path`` only if the object there is still ``seen``
    (absent, if it was); `WriteConflictError` naming the key when another
    writer has replaced, created or deleted it since."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    assert seen.conditional
    mode: Any = "create"
    if seen.data is not None:
        mode = {k: v for k, v in (("e_tag", seen.e_tag), ("version", seen.version)) if v}
    try:
        await obstore.put_async(store, path, data, mode=mode)
    except (PreconditionError, AlreadyExistsError) as exc:
        raise WriteConflictError(f"{path!r} was changed by another writer") from exc


class Backoff:
    """Pauses between the attempts of one read-modify-write: `BACKOFF_START`
    doubling up to `BACKOFF_CAP`, each drawn between half and all of that
    (writers that conflicted together do not retry together), at most
    `MAX_ATTEMPTS` attempts."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.attempts = 0
        self.waited = 0.0

    async def after(self, conflict: WriteConflictError) -> None:
        """Pause after a conflict; raise `WriteConflictError` naming the
        key when that was the last attempt allowed."""
        self.attempts += 1
        if self.attempts >= MAX_ATTEMPTS:
            raise WriteConflictError(
                f"{self.key}: gave up after {self.attempts} conditional writes, each "
                f"replaced by another writer first ({self.waited:.2f} s of back-off)"
            ) from conflict
        ceiling = min(BACKOFF_CAP, BACKOFF_START * 2 ** (self.attempts - 1))
        delay = random.uniform(ceiling / 2, ceiling)
        self.waited += delay
        await asyncio.sleep(delay)


_warned = threading.Event()


def unprotected(setter: Any, describe: str) -> None:
    """A partial update of ``setter``'s object on a store without
    conditional writes, with protection on: `UnsupportedError` in strict
    mode, else one warning per process. A ``ZipStore`` passes silently: a
    zip file is written by one process at a time anyway (threads of that
    process writing one shard at once are not protected there)."""
    from zarr.storage import ZipStore

    store = getattr(setter, "store", None)
    if isinstance(store, ZipStore) or getattr(store, "read_only", False):
        return  # a read-only store refuses the write itself
    kind = type(getattr(setter, "store", setter)).__name__
    message = (
        f"{describe} is a read-modify-write that a {kind} cannot make "
        "conditional: writers updating the same shard at once (other processes, "
        "tasks or hosts) can erase each other's data, the last write winning. Write "
        f"whole shards, use zarr's ObjectStore over obstore, or set `{SHARD_WRITE_LOCK_KEY}` "
        "to False if your writers never share a shard (which silences this)."
    )
    if strict_mode():
        raise UnsupportedError(message)
    if not _warned.is_set():
        _warned.set()
        warn(message, category=UnprotectedWriteWarning, stacklevel=2)
