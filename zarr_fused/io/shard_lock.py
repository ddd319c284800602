"""Exclusive holds on shards while a write updates part of them.

A write that changes some inner chunks of a shard, not all, reads the
stored shard, merges, and replaces it (temporary file + rename). Two
writers doing that at once to one shard each replace it with their own
merge, and the last rename wins: the other writer's inner chunks are lost,
with no error. `ShardLocks.hold` makes the whole read-merge-replace of one
shard exclusive: across the threads of a process and, on a
`zarr.storage.LocalStore`, across processes and hosts. Writes that cover
every inner chunk of a shard read nothing and take no lock, and
``codec_pipeline.shard_write_lock`` = ``False`` turns the protection off
(`zarr_fused.config.shard_write_lock`, read on every write).

Across processes: POSIX record locks
------------------------------------
``fcntl`` byte-range locks (``F_SETLKW``) are what NFS (through its lock
manager or NFSv4 state), Lustre and GPFS honour across hosts; ``flock`` is
not (NFS emulates it with record locks, others ignore it). The lock cannot
sit on the shard file itself: each write replaces that file by a rename,
so two writers could lock two different files of the same name. It sits
on a stable file instead, never unlinked by zarr_fused (unlinking a lock
file after unlocking it lets a third writer lock a fresh file while a
second still holds the old one, and NFS makes that window wide).

One lock file per shard would double the files of an array, and file
creation is what a Lustre or GPFS metadata server is slowest at. So each
directory that holds shards gets one lock file, `LOCK_FILE`
(``.zarr_fused.lock``, empty: locks beyond the end of a file are valid),
and each shard locks one byte of it at an offset from a stable 62-bit hash
of its file name (`lock_offset`). Two names that collide only serialise
their two shards; exclusion never breaks. The name starts with a dot and is
neither a chunk key nor a metadata document, so zarr's listings
(``nchunks_initialized``, ``Group.members``, ``nbytes_stored``: the file is
empty) see nothing new, and deleting an array's directory deletes it too.

Record locks belong to the process, which brings three rules:

- threads of one process do not exclude each other through them, so a
  per-range exclusion inside the process (`_Registry.held`) is taken first,
  and only the thread holding it touches that range with ``fcntl``;
- closing *any* descriptor of a file drops all of the process's locks on
  it, so a process keeps one descriptor per lock file (several spellings of
  one path share it: the entries are keyed by device and inode), and
  closes one (beyond `MAX_OPEN_FILES`) only while no thread uses it;
- a forked child holds none of its parent's locks: the registry is
  replaced in the child (``os.register_at_fork``, with a pid check as the
  backstop, as in `zarr_fused._pool`).

The kernel's deadlock detection sees processes, not threads: thread A of
process P waiting for a range that Q holds while thread B of P holds a
range Q's thread waits for looks like a cycle, and ``F_SETLKW`` fails with
``EDEADLK`` although both holders will release. Such a wait is retried
after a short sleep. A filesystem without record locks (``ENOLCK``: NFS
mounted with ``nolock`` or without a lock manager) or a lock file this user
may not open for writing (another user's, in a shared directory) gets a
`zarr.errors.ZarrUserWarning` once per filesystem and the in-process
exclusion only.

If the lock file was replaced while a writer waited or kept it open (the
array deleted and created again), the writer finds, once the lock is
granted, that its file has no link left or is not the file at the path,
and locks the new file instead.

Other stores
------------
A store other than an exact `zarr.storage.LocalStore` (`MemoryStore`,
`LocalStore` subclasses, whose keys may not map to files under ``root``,
any other store with synchronous IO) gets the in-process exclusion only,
keyed by its store (the dict of a `MemoryStore`) and the shard's key: it
protects the threads of one process, which is all a `MemoryStore` has.

Why this cannot deadlock
------------------------
A thread takes one shard's hold at a time, and takes it only where it holds
no other (the write paths hold it around one shard's update, in the thread
that runs that update). While holding it, a thread waits only for file IO
and for pool work that takes no hold (the encodes of that one shard,
spread over the compute threads by `zarr_fused._pool.run_parallel`, whose
caller works too and cancels what has not started). Hence no thread that
holds a hold ever waits, directly or through the pools, for a thread that
waits for a hold, and there is no cycle. Holds are released in
``finally``, so an error leaves none behind.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from warnings import warn

from zarr.errors import ZarrUserWarning
from zarr.storage import LocalStore, MemoryStore, StorePath

from zarr_fused._zarr_compat import memory_store_dict
from zarr_fused.config import SHARD_WRITE_LOCK_KEY, shard_write_lock

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterator, Sequence

__all__ = ["LOCK_FILE", "MAX_OPEN_FILES", "Hold", "ShardLocks", "lock_offset", "shard_locks"]

#: the lock file in each directory that holds shards
LOCK_FILE: Final = ".zarr_fused.lock"
#: lock files a process keeps open while no thread uses them
MAX_OPEN_FILES: Final = 64
#: errors of ``fcntl`` that mean "no record locks here"
_UNSUPPORTED: Final = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
#: longest sleep between retries of a wait the kernel took for a deadlock
_MAX_BACKOFF: Final = 0.05

#: a counting seam for tests: called with the key of every hold taken
on_hold: Callable[[Hashable], None] | None = None


def lock_offset(name: bytes) -> int:
    """The byte of the lock file that the shard file ``name`` (its base
    name) locks: a stable 62-bit hash, the same in every process and on
    every host (Python's ``hash`` is salted per process)."""
    digest = hashlib.blake2b(name, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@dataclass(eq=False)
class _LockFile:
    """One open lock file of this process."""

    fd: int
    #: ``(st_dev, st_ino)``: the file, however its path was spelt
    ident: tuple[int, int]
    #: the paths that led to it
    paths: list[bytes] = field(default_factory=list)
    #: descriptors of other spellings of its path, closed with ``fd`` (closing
    #: one earlier would drop the locks held through ``fd``)
    spare: list[int] = field(default_factory=list)
    #: threads between `_Registry.enter` and `_Registry.leave`
    users: int = 0
    #: no longer the file at its path; closed when its last user leaves
    stale: bool = False
    #: record locks fail on its filesystem (in-process exclusion only)
    unsupported: bool = False

    def close(self) -> None:
        for fd in (self.fd, *self.spare):
            os.close(fd)


class _Registry:
    """This process's lock files and in-process holds."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        #: guards ``files`` and ``by_ident`` and every entry's fields
        self.mutex = threading.Lock()
        self.files: OrderedDict[bytes, _LockFile] = OrderedDict()
        self.by_ident: dict[tuple[int, int], _LockFile] = {}
        #: the keys held by some thread of this process (guarded by ``cond``)
        self.held: set[Hashable] = set()
        self.cond = threading.Condition(threading.Lock())
        #: devices on which a warning about missing record locks was given
        self.warned: set[int] = set()

    # -- in-process exclusion -----------------------------------------------------------

    def take(self, key: Hashable, blocking: bool = True) -> bool:
        """Hold ``key`` in this process (False: held by another thread, and
        not ``blocking``)."""
        with self.cond:
            while key in self.held:
                if not blocking:
                    return False
                self.cond.wait()
            self.held.add(key)
        if on_hold is not None:
            on_hold(key)
        return True

    def give(self, key: Hashable) -> None:
        with self.cond:
            self.held.discard(key)
            self.cond.notify_all()

    # -- lock files ---------------------------------------------------------------------

    def enter(self, path: bytes) -> _LockFile:
        """The open lock file at ``path`` (opened or created if needed),
        counted as used until `leave`."""
        with self.mutex:
            entry = self.files.get(path)
            if entry is None:
                entry = self._open(path)
            else:
                self.files.move_to_end(path)
            entry.users += 1
            return entry

    def leave(self, entry: _LockFile) -> None:
        with self.mutex:
            entry.users -= 1
            if entry.stale and not entry.users:
                entry.close()
            elif len(self.files) > MAX_OPEN_FILES:
                self._evict()

    def forget(self, entry: _LockFile) -> None:
        """``entry`` is no longer the file at its paths (still in use)."""
        with self.mutex:
            self._drop(entry)
            entry.stale = True

    def _open(self, path: bytes) -> _LockFile:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        entry = self.by_ident.get(ident)
        if entry is None:
            entry = self.by_ident[ident] = _LockFile(fd, ident)
        else:
            entry.spare.append(fd)
        entry.paths.append(path)
        self.files[path] = entry
        return entry

    def _drop(self, entry: _LockFile) -> None:
        for path in entry.paths:
            if self.files.get(path) is entry:
                del self.files[path]
        if self.by_ident.get(entry.ident) is entry:
            del self.by_ident[entry.ident]

    def _evict(self) -> None:
        """Close the least recently used lock files nobody uses, down to
        `MAX_OPEN_FILES` (no thread of this process holds a lock on them)."""
        for entry in list(self.files.values()):
            if len(self.files) <= MAX_OPEN_FILES:
                return
            if not entry.users and not entry.stale:
                self._drop(entry)
                entry.close()

    def no_record_locks(self, entry: _LockFile, exc: OSError, path: bytes) -> None:
        """Record locks fail on ``entry``'s filesystem: warn once per device."""
        entry.unsupported = True
        self._warn(entry.ident[0], exc, path)

    def no_lock_file(self, exc: OSError, directory: bytes) -> None:
        """The lock file in ``directory`` cannot be opened for writing."""
        try:
            device = os.stat(directory).st_dev
        except OSError:
            device = -1
        self._warn(device, exc, os.path.join(directory, os.fsencode(LOCK_FILE)))

    def _warn(self, device: int, exc: OSError, path: bytes) -> None:
        with self.mutex:
            if device in self.warned:
                return
            self.warned.add(device)
        warn(
            f"zarr_fused cannot take a POSIX record lock on {os.fsdecode(path)!r} ({exc}); "
            f"partial shard writes on this filesystem are protected only between the threads "
            f"of one process. Set `{SHARD_WRITE_LOCK_KEY}` to False to silence this if your "
            f"writes are shard-aligned.",
            category=ZarrUserWarning,
            stacklevel=2,
        )


_registry = _Registry()


def _current() -> _Registry:
    """The registry of this process (a fresh one after a fork that bypassed
    ``os.register_at_fork``)."""
    if _registry.pid != os.getpid():
        _reset_after_fork()
    return _registry


def _reset_after_fork() -> None:
    """The child holds none of its parent's locks: start afresh. The
    inherited descriptors are closed (the child holds no lock through them,
    so this drops nothing of the parent's)."""
    global _registry
    old = _registry
    _registry = _Registry()
    for entry in set(old.by_ident.values()) | set(old.files.values()):
        try:
            entry.close()
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _lock_range(
    registry: _Registry, entry: _LockFile, offset: int, path: bytes, blocking: bool
) -> bool:
    """Lock byte ``offset`` of ``entry`` exclusively, waiting for other
    processes if ``blocking`` (else False when one holds it); retries a
    wait the kernel refused as a deadlock (see the module docstring)."""
    backoff = 0.001
    cmd = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
    while not entry.unsupported:
        try:
            fcntl.lockf(entry.fd, cmd, 1, offset, os.SEEK_SET)
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES) and not blocking:
                return False
            if exc.errno == errno.EDEADLK:
                time.sleep(backoff)
                backoff = min(2 * backoff, _MAX_BACKOFF)
            elif exc.errno in _UNSUPPORTED:
                registry.no_record_locks(entry, exc, path)
            else:
                raise
    return True


def _unlock_range(entry: _LockFile, offset: int) -> None:
    if not entry.unsupported:
        fcntl.lockf(entry.fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)


def _still_there(entry: _LockFile, path: bytes) -> bool:
    """Whether ``entry`` is still the file at ``path``: not unlinked (a new
    file at ``path`` may get the inode number of a deleted one), and the
    file that ``path`` names."""
    if os.fstat(entry.fd).st_nlink == 0:
        return False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == entry.ident


class Hold:
    """One shard held; `release` (idempotent, from any thread) lets it go."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def _lock_current(
    registry: _Registry, entry: _LockFile, offset: int, path: bytes, blocking: bool
) -> bool | None:
    """Lock byte ``offset`` of ``entry``: True once locked while ``entry``
    is still the file at ``path``, None when that file changed (unlocked
    again), False when another process holds it and not ``blocking``."""
    if not _lock_range(registry, entry, offset, path, blocking):
        return False
    try:
        if _still_there(entry, path):
            return True
    except BaseException:
        _unlock_range(entry, offset)
        raise
    _unlock_range(entry, offset)
    registry.forget(entry)
    return None


def _acquire(registry: _Registry, path: bytes, offset: int, blocking: bool) -> Hold | None:
    """Take the in-process hold and the record lock of byte ``offset`` of
    the lock file at ``path`` (None: held elsewhere, and not ``blocking``)."""
    while True:
        entry = registry.enter(path)
        try:
            key = (entry.ident, offset)
            if not registry.take(key, blocking):
                registry.leave(entry)
                return None
            try:
                locked = _lock_current(registry, entry, offset, path, blocking)
            except BaseException:
                registry.give(key)
                raise
            if locked:
                return Hold(functools.partial(_release_file, registry, entry, key, offset))
            registry.give(key)
            if locked is False:
                registry.leave(entry)
                return None
        except BaseException:
            registry.leave(entry)
            raise
        registry.leave(entry)  # the file at `path` changed: lock the new one


def _release_file(registry: _Registry, entry: _LockFile, key: Hashable, offset: int) -> None:
    try:
        _unlock_range(entry, offset)
    finally:
        registry.give(key)
        registry.leave(entry)


def _take_file(shard_path: bytes, blocking: bool) -> Hold | None:
    """Hold the shard at ``shard_path`` (a local file) exclusively, in this
    process and across processes."""
    directory, name = os.path.split(shard_path)
    path = os.path.join(directory, os.fsencode(LOCK_FILE))
    registry = _current()
    try:
        return _acquire(registry, path, lock_offset(name), blocking)
    except PermissionError as exc:  # a lock file this user may not write
        registry.no_lock_file(exc, directory)
        return _take_key((directory, name), blocking)


def _take_key(key: Hashable, blocking: bool) -> Hold | None:
    """Hold ``key`` exclusively among the threads of this process."""
    registry = _current()
    if not registry.take(key, blocking):
        return None
    return Hold(lambda: registry.give(key))


class ShardLocks:
    """The holds of one write's shards, all in one store (see `shard_locks`)."""

    __slots__ = ("prefix", "store_id")

    def __init__(self, prefix: bytes | None, store_id: int) -> None:
        #: the LocalStore's root as a path prefix, None for in-process holds
        self.prefix = prefix
        self.store_id = store_id

    def take(self, setter: Any, *, blocking: bool = True) -> Hold | None:
        """Hold the shard ``setter`` (a `StorePath` of this write's store)
        exclusively: waits for it, or returns None at once if it is held
        elsewhere and not ``blocking``."""
        if self.prefix is not None:
            return _take_file(self.prefix + os.fsencode(setter.path), blocking)
        return _take_key((self.store_id, setter.path), blocking)

    @contextmanager
    def hold(self, setter: Any) -> Iterator[None]:
        """Hold the shard ``setter`` while the context is entered."""
        hold = self.take(setter)
        assert hold is not None
        try:
            yield
        finally:
            hold.release()


def shard_locks(batch: Sequence[tuple[Any, ...]]) -> ShardLocks | None:
    """How the partial shard updates of a write batch are held, or None
    when they are not: ``codec_pipeline.shard_write_lock`` is off, the
    setters are not store paths (a shard inside a shard lives in memory), or
    the store is read-only (the write fails anyway)."""
    if not shard_write_lock():
        return None
    first, *_ = batch[0]
    if not isinstance(first, StorePath):
        return None
    store = first.store
    if store.read_only:
        return None
    if type(store) is LocalStore:
        return ShardLocks(os.fsencode(store.root) + b"/", id(store))
    if type(store) is MemoryStore:
        # two MemoryStore objects over one dict hold the same keys
        return ShardLocks(None, id(memory_store_dict(store)))
    return ShardLocks(None, id(store))
