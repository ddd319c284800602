"""Configuration keys read by zarr_fused.

zarr_fused is configured through zarr's own configuration object
(``zarr.config``), so every key can also be set by environment variable
(``ZARR_`` + the key in upper case with ``__`` for dots):

``codec_pipeline.path``
    ``"zarr_fused.FusedCodecPipeline"`` selects zarr_fused
    (``ZARR_CODEC_PIPELINE__PATH``).
``codec_pipeline.max_workers``
    Threads used to decode and encode the chunks of one read or write.
    ``None`` (default): the CPUs this process may run on (its affinity mask,
    capped by a cgroup CPU quota). ``1``: everything runs in the calling
    thread, no pool. An invalid value (not an integer, or < 1) warns with
    `zarr.errors.ZarrUserWarning` and uses the default; values above
    `MAX_WORKERS_CAP` warn and are clamped.
``codec_pipeline.io_concurrency``
    File requests (open, read) one process keeps in flight, on IO threads
    apart from the ``max_workers`` compute threads, for chunk files of a
    `zarr.storage.LocalStore` on a filesystem whose every call is a round
    trip (Lustre, GPFS, NFS, a cold disk). ``None`` (default): 32, whatever
    the CPU count (reasoning in `zarr_fused.io.engine`); raise it for
    latencies above ~1 ms. ``1``: no IO threads, the compute threads read
    their own files. Invalid values warn and use the default, as for
    ``max_workers``; values above 1024 are clamped.
``codec_pipeline.async_concurrency``
    Store requests (GET, PUT, DELETE) one read or write keeps in flight on a
    store without synchronous IO: zarr's ``ObjectStore`` and ``FsspecStore``
    (S3, GCS, HTTP), ``ZipStore``. ``None`` (default): zarr's own
    ``async.concurrency`` when it has been set, else 64
    (`zarr_fused.io.requests.DEFAULT_ASYNC_CONCURRENCY`; on an object store
    each request is a round trip of tens of ms, and 64 requests in flight read
    and write faster than zarr's 10, see the tuning guide). "Set" means a value
    other than zarr's default of 10 (by ``zarr.config.set``, a YAML file or
    ``ZARR_ASYNC__CONCURRENCY``), or ``ZARR_ASYNC__CONCURRENCY`` present in
    the environment; ``async.concurrency`` = ``None`` lifts the limit, as in
    zarr's pipelines. To hold zarr_fused to exactly 10, set this key to 10.
    An integer here wins over ``async.concurrency``. Invalid values (not an
    integer, or < 1) warn with `zarr.errors.ZarrUserWarning` and follow the
    default rule; values above 1024 warn and are clamped.
``codec_pipeline.strict``
    ``False`` (default): where a native path does not apply (a codec chain
    zarr_fused has no kernel for, missing compiled extensions), fall back to
    zarr's own code and log the reason at debug level on the ``zarr_fused``
    logger. ``True``: raise `zarr_fused.errors.UnsupportedError` instead.
    Accepted: ``True``/``False``, ``1``/``0``, and the strings ``true``,
    ``yes``, ``on``, ``1`` / ``false``, ``no``, ``off``, ``0``, ``""`` in any
    case (environment variables reach zarr's configuration as strings or,
    where Python's ``literal_eval`` parses them, as ``True``/``1``). Any other
    value warns with `zarr.errors.ZarrUserWarning` and counts as ``False``.
``codec_pipeline.shard_write_lock``
    ``True`` (default): a write that updates part of a shard (some of its
    inner chunks, not all) holds that shard exclusively from the read of
    the stored shard to the replacement of it, so concurrent writers in
    other threads, processes or hosts never lose each other's inner
    chunks: a POSIX record lock (``fcntl``) on `zarr.storage.LocalStore`
    files, which NFS, Lustre and GPFS honour across hosts; a conditional
    PUT (``If-Match`` / ``If-None-Match``) retried on conflict on object
    stores whose client supports it (obstore). Writes that cover whole
    shards take no lock. ``False``: no protection, for jobs that guarantee
    shard-aligned writes. Accepted values as for ``codec_pipeline.strict``;
    an invalid value warns and counts as ``True``.
``codec_pipeline.batch_size``
    Accepted for compatibility with zarr's pipelines; zarr_fused processes
    each read or write as one batch.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Final
from warnings import warn

from zarr.core.config import config as zarr_config
from zarr.errors import ZarrUserWarning

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "ASYNC_CONCURRENCY_KEY",
    "IO_CONCURRENCY_KEY",
    "MAX_WORKERS_CAP",
    "MAX_WORKERS_KEY",
    "SHARD_WRITE_LOCK_KEY",
    "STRICT_KEY",
    "int_setting",
    "shard_write_lock",
    "strict_mode",
]

ASYNC_CONCURRENCY_KEY: Final = "codec_pipeline.async_concurrency"
IO_CONCURRENCY_KEY: Final = "codec_pipeline.io_concurrency"
MAX_WORKERS_KEY: Final = "codec_pipeline.max_workers"
SHARD_WRITE_LOCK_KEY: Final = "codec_pipeline.shard_write_lock"
STRICT_KEY: Final = "codec_pipeline.strict"
MAX_WORKERS_CAP: Final = 256

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def strict_mode() -> bool:
    """Whether ``codec_pipeline.strict`` is set (see the module docstring)."""
    return _flag(STRICT_KEY, default=False, invalid="Strict mode stays off.")


def shard_write_lock() -> bool:
    """Whether partial-shard writes are protected against concurrent
    writers (``codec_pipeline.shard_write_lock``, see the module docstring)."""
    return _flag(SHARD_WRITE_LOCK_KEY, default=True, invalid="Shard writes stay protected.")


def _flag(key: str, *, default: bool, invalid: str) -> bool:
    """A boolean setting, read on every call; an invalid value warns with
    `ZarrUserWarning` and gives ``default``."""
    value = zarr_config.get(key, default=default)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    warn(
        f"Ignoring invalid `{key}` config value {value!r}; expected a boolean. {invalid}",
        category=ZarrUserWarning,
        stacklevel=4,
    )
    return default


def int_setting[D](key: str, *, cap: int, default: Callable[[], D], stacklevel: int = 1) -> int | D:
    """A count setting (``max_workers``, ``io_concurrency``,
    ``async_concurrency``), read on every call: an integer in ``[1, cap]``.

    ``None`` (unset) gives ``default()``. An integer, a NumPy integer or a
    string of one (an environment variable; surrounding blanks allowed) is
    taken; anything else (not an integer, a bool, < 1) warns with
    `ZarrUserWarning` and gives ``default()`` (named "the default rule" in
    the warning when it is None); a value above ``cap`` warns and gives
    ``cap``. Never raises: the value often comes from an environment
    variable, and a typo there must not break reads. ``stacklevel`` is
    where the warning points, counted from the caller (1: the call of
    this function).
    """
    value = zarr_config.get(key, default=None)
    if value is None:
        return default()
    # a plain int (the usual case, read on every batch) skips the parse
    parsed = value if type(value) is int else _integer(value)
    if parsed is not None and 1 <= parsed <= cap:
        return parsed
    # one more frame between the caller and the warning
    return _refused(key, value, parsed, cap, default, stacklevel + 1)


def _refused[D](
    key: str, value: Any, parsed: int | None, cap: int, default: Callable[[], D], stacklevel: int
) -> int | D:
    """What `int_setting` gives for a value it does not take as it is,
    with the warning that says so (``stacklevel`` as there)."""
    if parsed is not None and parsed > cap:
        warn(
            f"`{key}` = {parsed} is above the cap of {cap}; using {cap}.",
            category=ZarrUserWarning,
            stacklevel=stacklevel + 1,
        )
        return cap
    fallback = default()
    using = "the default rule" if fallback is None else fallback
    warn(
        f"Ignoring invalid `{key}` config value {value!r} (expected an "
        f"integer >= 1 or None); using {using}.",
        category=ZarrUserWarning,
        stacklevel=stacklevel + 1,
    )
    return fallback


def _integer(value: Any) -> int | None:
    """``value`` as an int: a string from an environment variable, an int or
    a NumPy integer (never a bool); None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        return int(value.strip()) if isinstance(value, str) else operator.index(value)
    except (TypeError, ValueError):
        return None
