"""Exceptions and warnings raised by zarr_fused.

Every exception zarr_fused raises on purpose derives from `ZarrFusedError`.
Errors about stored data also derive from `ValueError`, so callers that catch
the errors zarr itself raises for bad data keep working.
"""

from __future__ import annotations

from zarr.errors import ZarrUserWarning

__all__ = [
    "ChecksumError",
    "ChunkSizeError",
    "CorruptChunkError",
    "CorruptShardError",
    "DecompressionError",
    "NativeExtensionError",
    "UnprotectedWriteWarning",
    "UnsupportedError",
    "WriteConflictError",
    "ZarrFusedError",
    "ZarrFusedWarning",
]


class ZarrFusedError(Exception):
    """Base class of every exception raised by zarr_fused."""


class UnsupportedError(ZarrFusedError):
    """A native path does not apply and strict mode forbids the fallback.

    Raised only with ``codec_pipeline.strict`` set; otherwise zarr_fused falls
    back to zarr's own code for that chunk chain and logs the reason at debug
    level on the ``zarr_fused`` logger.
    """


class WriteConflictError(ZarrFusedError, OSError):
    """A conditional write (``If-Match`` / ``If-None-Match``) found the
    stored object replaced by another writer since it was read. The
    read-modify-write retries on its own; this reaches the caller only when
    every attempt allowed was pre-empted. The message names the store key."""


class NativeExtensionError(ZarrFusedError, ImportError):
    """The compiled extensions of zarr_fused could not be imported."""


class CorruptChunkError(ZarrFusedError, ValueError):
    """Stored bytes of a chunk or shard are invalid (wrong size, bad checksum,
    corrupt frame). The message names the store key."""


class ChecksumError(CorruptChunkError):
    """A stored crc32c checksum does not match the bytes it protects."""


class ChunkSizeError(CorruptChunkError):
    """A chunk decodes to more or fewer bytes than its shape and data type need
    (including a compressed frame that claims a different size)."""


class DecompressionError(CorruptChunkError, RuntimeError):
    """A compressed frame is corrupt or truncated. Also a `RuntimeError`, which
    is what numcodecs raises for the same condition."""


class CorruptShardError(CorruptChunkError):
    """A shard's index is invalid: truncated, failing its crc32c, or pointing
    outside the shard, into its own index, or at overlapping byte ranges."""

    @classmethod
    def truncated(cls, where: object, got: int | None, expected: int) -> CorruptShardError:
        """A shard too short for its index, in zarr's words (its tests match
        "too short to hold its index"); ``got`` None when unknown."""
        read = "" if got is None else f"read {got} bytes of index, "
        return cls(
            f"{where}: the stored shard is too short to hold its index: {read}"
            f"expected {expected}. The shard is truncated or corrupt."
        )


class ZarrFusedWarning(UserWarning):
    """Something about this installation degrades zarr_fused (for example, the
    compiled extensions are missing and the pure-Python path is in use)."""


class UnprotectedWriteWarning(ZarrUserWarning):
    """A write that updates part of a shard or chunk runs unprotected
    against concurrent writers: the store cannot make it conditional and
    ``codec_pipeline.shard_write_lock`` is on. Given once per process; a
    `zarr.errors.ZarrUserWarning`, so filters on zarr's warnings apply."""
