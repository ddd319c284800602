"""Access to the compiled extensions, which may be missing.

zarr loads every ``zarr.codec_pipeline`` entry point when it first looks a
pipeline up, so an ImportError escaping from here would break every zarr
array in the process, including those that never use zarr_fused. The
extensions are therefore imported defensively: without them zarr_fused keeps
working on zarr's pure-Python code. This module only reports what imported;
what to do about a missing extension (warn once, or raise in strict mode)
is the pipeline's decision (`zarr_fused.pipeline`). It imports nothing else
of zarr_fused, so every module can sit above it.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

_EXTENSIONS = (
    "_scatter",
    "_localio",
    "_fileio",
    "_codecs",
    "_codec_batch",
    "_shard_index",
    "_shard",
    "_shard_local",
    "_cast_value",
    "_filters",
    "_vlen",
    "_region_plan",
)

_modules: dict[str, ModuleType] = {}
_errors: dict[str, ImportError] = {}
for _name in _EXTENSIONS:
    try:
        _modules[_name] = __import__(f"zarr_fused.{_name}", fromlist=["_"])
    except ImportError as _exc:  # missing or built for another interpreter
        _errors[_name] = _exc
# The paths use kernels of several extensions each (a native chain needs
# _codecs and _codec_batch, the shard engine four more), and they test one
# handle before using the others: with a partial set a path would pass its
# check and fail inside. So the handles are all or nothing.
_usable = {} if _errors else _modules

if TYPE_CHECKING:
    # mypy checks the calls into each extension against its .pyi stub; at
    # run time a handle is None when its extension did not import, which
    # the callers test before using it
    from zarr_fused import _cast_value as cast_kernels
    from zarr_fused import _codec_batch as batch_kernels
    from zarr_fused import _codecs as codec_kernels
    from zarr_fused import _fileio as fileio_kernels
    from zarr_fused import _filters as filter_kernels
    from zarr_fused import _localio as io_kernels
    from zarr_fused import _region_plan as region_kernels
    from zarr_fused import _scatter as scatter_kernels
    from zarr_fused import _shard as shard_kernels
    from zarr_fused import _shard_index as index_kernels
    from zarr_fused import _shard_local as shard_local_kernels
    from zarr_fused import _vlen as vlen_kernels
else:
    scatter_kernels = _usable.get("_scatter")
    codec_kernels = _usable.get("_codecs")
    batch_kernels = _usable.get("_codec_batch")
    index_kernels = _usable.get("_shard_index")
    shard_kernels = _usable.get("_shard")
    shard_local_kernels = _usable.get("_shard_local")
    io_kernels = _usable.get("_localio")
    fileio_kernels = _usable.get("_fileio")
    filter_kernels = _usable.get("_filters")
    cast_kernels = _usable.get("_cast_value")
    vlen_kernels = _usable.get("_vlen")
    region_kernels = _usable.get("_region_plan")


def missing_message() -> str:
    """Why the extensions are unusable and how to fix it ('' when they are fine)."""
    if not _errors:
        return ""
    details = "; ".join(f"zarr_fused.{k}: {v}" for k, v in sorted(_errors.items()))
    return (
        "zarr_fused's compiled extensions could not be imported "
        f"({details}). zarr_fused falls back to zarr's pure-Python code, which is "
        "correct but not faster. Build the extensions with `make build` in a source "
        "checkout, or reinstall with `pip install --force-reinstall --no-binary "
        "zarr-fused zarr-fused` (needs a C compiler and the Python headers)."
    )


def native_info() -> dict[str, object]:
    """What this build of zarr_fused runs natively.

    Returns
    -------
    dict
        ``extensions``: each compiled module and whether it imported;
        ``codecs``: the zarr codecs run by native kernels (an empty list
        when the extensions are missing); ``libraries``: versions of the
        linked C libraries and the crc32c implementation this CPU uses.
    """
    codecs: list[str] = []
    libraries: dict[str, object] = {}
    if scatter_kernels is not None and codec_kernels is not None:
        codecs = ["bytes", "transpose", "crc32c", "zstd", "gzip", "blosc"]
        codecs += ["numcodecs.zlib", "numcodecs.gzip", "numcodecs.lz4", "numcodecs.shuffle"]
        if filter_kernels is not None:
            # array->array filters: native stages of a hybrid chain
            codecs += [f"numcodecs.{n}" for n in ("delta", "fixedscaleoffset", "quantize")]
            codecs += ["numcodecs.bitround", "cast_value"]
        if vlen_kernels is not None:
            codecs += ["vlen-utf8", "vlen-bytes", "numcodecs.vlen-utf8", "numcodecs.vlen-bytes"]
        libraries = codec_kernels.library_versions()
    return {
        "extensions": {f"zarr_fused.{n}": n in _modules for n in _EXTENSIONS},
        "codecs": codecs,
        "libraries": libraries,
    }
