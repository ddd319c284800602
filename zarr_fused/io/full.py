"""A full disk: a write retried with fewer files in flight before it fails.

Every file zarr_fused stores on a `zarr.storage.LocalStore` goes to a
temporary file first, which then replaces the old one: until that rename
the old and the new file both take space. zarr's own pipelines store one
file at a time per request in flight; zarr_fused keeps as many in flight as
it has compute threads writing their own files (``max_workers``) or IO
threads storing them (`zarr_fused.io.engine.write_window`), so on a disk
with room for one and a half chunks a write that zarr gets through
(writing and renaming one file after another, each rename freeing an old
one) would fail with ``ENOSPC`` here.

`write_with_fewer_in_flight` runs a write; when it fails because the disk
(``ENOSPC``) or the user's quota (``EDQUOT``, what HPC filesystems give) is
full, it runs the write again with half the compute threads and no IO
threads, then half again, down to one file at a time, as zarr writes.
Only a failure then is raised: the same ``OSError`` (errno ``ENOSPC`` or
``EDQUOT``, naming the key) zarr would raise.

Why running the batch again is right: a failed store leaves the key's old
file (the temporary file is removed, `zarr_fused._localio`), and storing a
batch is idempotent: a chunk written in part merges the value into what
is stored, which gives the same bytes whether or not the first attempt
had already stored it. Files the failed attempt stored are written again
(the error path pays that, so the write path needs no bookkeeping).
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING, Final

from zarr_fused.io.engine import io_concurrency_at_most

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["DISK_FULL", "disk_full", "write_with_fewer_in_flight"]

logger = logging.getLogger("zarr_fused")

#: errnos of a full disk or quota: worth a retry with fewer files in flight
DISK_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk or the quota is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def write_with_fewer_in_flight(write: Callable[[int], None], max_workers: int) -> None:
    """Run ``write(max_workers)``; while it fails on a full disk, run
    ``write(workers)`` again with half the workers (at least one) and no IO
    threads (`zarr_fused.io.engine.io_concurrency_at_most`), until one
    file at a time has failed too, which raises its error."""
    workers, io_cap = max_workers, None  # first with the configured io_concurrency
    while True:
        try:
            if io_cap is None:
                write(workers)
            else:
                with io_concurrency_at_most(io_cap):
                    write(workers)
            return
        except OSError as exc:
            if not disk_full(exc):
                raise
            if workers <= 1 and io_cap == 1:
                exc.add_note("(the write was retried with one file in flight at a time)")
                raise
            logger.debug(
                "write failed on a full disk (%s) with %d worker(s)%s; retrying with %d "
                "and no IO threads",
                errno.errorcode.get(exc.errno or 0, exc.errno),
                workers,
                "" if io_cap == 1 else " and the configured IO threads",
                max(1, workers // 2),
            )
        workers, io_cap = max(1, workers // 2), 1
