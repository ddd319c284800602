"""Which stored bytes equal zarr's: the one statement of zarr_fused's
byte-identity claim, `byte_identical` (the docs and the tests follow it).

zarr encodes with numcodecs, which bundles its own libzstd and c-blosc
(with its own lz4, zlib and zstd inside); zarr_fused links the system's
(a developer build) or, in a portable wheel, the very versions numcodecs
bundles (`_NUMCODECS_BLOSC`, tools/bundled_libs.py). The same call with the
same parameters on the same library version gives the same bytes, so where
the versions match, every level is identical.
Where they differ, compressors still agree at the levels whose code did
not change between the two versions; those were found by comparing every
level on varied data, and are claimed only for the exact set of versions
they were measured on (`_MEASURED_ON`). tests/test_codecs.py checks every
claim on every run. gzip: see `byte_identical`.

It sits with the command line because ``zarr-fused demo`` is what uses it
at run time (to say whether the stores it wrote must match zarr's byte for
byte); no read or write path asks it anything. The tests import it too.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from zarr.codecs.blosc import BloscCodec
from zarr.codecs.gzip import GzipCodec
from zarr.codecs.numcodecs import LZ4 as NumcodecsLZ4
from zarr.codecs.numcodecs import GZip as NumcodecsGZip
from zarr.codecs.numcodecs import Zlib as NumcodecsZlib
from zarr.codecs.zstd import ZstdCodec

from zarr_fused._native import codec_kernels
from zarr_fused._v2 import V2Codec, v2_byte_identical
from zarr_fused._zarr_compat import numcodec_inside

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zarr.abc.codec import Codec

__all__ = ["byte_identical"]

#: the library versions the tables below were measured with: ours, then numcodecs'
_MEASURED_ON = {
    "zstd": "1.5.4",
    "blosc": "1.21.3",
    "blosc_complibs": {
        "blosclz": "2.5.1",
        "lz4": "1.9.4",
        "lz4hc": "1.9.4",
        "zlib": "1.2.13",
        "zstd": "1.5.2",
    },
    "numcodecs": "0.17.1",
    "numcodecs_zstd": "1.5.6",
    "numcodecs_blosc": "1.21.7.dev",
}
#: the c-blosc numcodecs bundles, by numcodecs release, with the versions of
#: the compressors inside it (numcodecs reports only c-blosc's): a portable
#: wheel of zarr_fused links these (tools/bundled_libs.py)
_NUMCODECS_BLOSC = {
    "0.17.1": {
        "blosc": "1.21.7.dev",
        "blosc_complibs": {
            "blosclz": "2.5.1",
            "lz4": "1.10.0",
            "lz4hc": "1.10.0",
            "zlib": "1.3.1",
            "zstd": "1.5.6",
        },
    },
}
#: zstd levels whose frames match across libzstd 1.5.4 and 1.5.6: those that
#: use the "fast" and "dfast" strategies at every input size (level 0 is 3)
_MEASURED_ZSTD_LEVELS = range(-(2**17), 4)
#: (ours, numcodecs') liblz4 versions whose LZ4 blocks (LZ4_compress_fast)
#: matched at every acceleration compared (-3 to 70000, on random, smooth
#: and zero data up to 1 MiB)
_MEASURED_LZ4 = {("1.9.4", "1.10.0")}
#: blosc clevels whose frames match, per cname (clevel 0 stores the data as
#: is): lz4 1.10 changed lz4hc levels 1 and 2; blosc's zstd clevel c runs
#: zstd level 2c-1, so clevel 3 and up is zstd level 5 and up
_MEASURED_BLOSC_CLEVELS = {
    "blosclz": range(10),
    "lz4": range(10),
    "lz4hc": (0, *range(3, 10)),
    "zlib": range(10),
    "zstd": range(3),
}


@cache
def _versions() -> dict[str, Any]:
    """Our library versions and numcodecs', keyed as `_MEASURED_ON` (fixed
    for the life of the process)."""
    import zlib

    import numcodecs
    import numcodecs.blosc
    import numcodecs.lz4
    import numcodecs.zstd

    ours = codec_kernels.library_versions()
    return {
        "zstd": ours["zstd"],
        "zlib": ours["zlib"],
        "blosc": ours["blosc"],
        "blosc_complibs": {
            k: ours["blosc_complibs"][k]
            for k in _MEASURED_ON["blosc_complibs"]
            if k in ours["blosc_complibs"]
        },
        "blosc_compressors": ours["blosc_compressors"],
        "numcodecs": numcodecs.__version__,
        "numcodecs_zstd": numcodecs.zstd.__version__,
        "numcodecs_blosc": numcodecs.blosc.VERSION_STRING,
        "lz4": ours["lz4"],
        "numcodecs_lz4": numcodecs.lz4.VERSION_STRING,
        # numcodecs' GZip is Python's gzip module, on Python's zlib
        "python_zlib": zlib.ZLIB_RUNTIME_VERSION,
    }


def _codec_identical(
    codec: Codec, versions: dict[str, Any], measured: bool, gzip_mtime_zero: bool
) -> bool:
    from zarr.codecs.sharding import ShardingCodec

    if isinstance(codec, ShardingCodec):
        return all(
            _codec_identical(c, versions, measured, gzip_mtime_zero)
            for c in (*codec.codecs, *codec.index_codecs)
        )
    if type(codec) is V2Codec:  # zarr format 2
        return v2_byte_identical(
            codec, versions, lambda c: _codec_identical(c, versions, measured, gzip_mtime_zero)
        )
    if type(codec) is ZstdCodec:
        level = codec.level
        return versions["zstd"] == versions["numcodecs_zstd"] or (
            measured and level in _MEASURED_ZSTD_LEVELS
        )
    if type(codec) is GzipCodec:
        # levels 1-9 only: at level 0 the stored blocks follow the size of
        # the output buffer, which Python's zlib module grows in steps
        return (
            gzip_mtime_zero
            and versions["zlib"] == versions["python_zlib"]
            and 1 <= codec.level <= 9
        )
    if type(codec) in (NumcodecsGZip, NumcodecsZlib):
        numcodec = numcodec_inside(codec)
        if type(codec) is NumcodecsGZip:  # the codec zarr's gzip runs
            gzip = GzipCodec(level=numcodec.level)
            return _codec_identical(gzip, versions, measured, gzip_mtime_zero)
        # levels 1-9, as for gzip
        return versions["zlib"] == versions["python_zlib"] and 1 <= numcodec.level <= 9
    if type(codec) is NumcodecsLZ4:
        pair = (versions["lz4"], versions["numcodecs_lz4"])
        return pair[0] == pair[1] or pair in _MEASURED_LZ4
    if type(codec) is BloscCodec:
        if codec.cname not in versions["blosc_compressors"]:
            return True  # zarr's own code encodes it
        return same_blosc(versions) or (
            measured and codec.clevel in _MEASURED_BLOSC_CLEVELS.get(codec.cname, ())
        )
    return True  # bytes, transpose, crc32c, and codecs zarr's own code runs


def same_blosc(versions: dict[str, Any]) -> bool:
    """Whether our c-blosc and the compressors inside it are those of
    numcodecs' c-blosc (``versions`` as `_versions` gives them)."""
    theirs = _NUMCODECS_BLOSC.get(versions["numcodecs"])
    return theirs is not None and theirs == {
        "blosc": versions["blosc"],
        "blosc_complibs": versions["blosc_complibs"],
    }


def byte_identical(codecs: Iterable[Codec], *, gzip_mtime_zero: bool = False) -> bool:
    """Whether zarr_fused stores exactly the bytes zarr does for ``codecs``.

    The one statement of zarr_fused's byte-identity claim (the docs and the
    tests follow it). True for chains without a compressor; for zstd, blosc
    and gzip it depends on the library versions at hand (see the comment
    above this function and docs/limitations.md). A sharding codec is
    identical when its inner and index codecs are.

    Parameters
    ----------
    codecs : iterable of zarr codecs
        A chain as configured on an array (array->array, array->bytes,
        bytes->bytes codecs; a `ShardingCodec` is looked into).
    gzip_mtime_zero : bool
        zarr writes the current time into every gzip header (MTIME, bytes
        4-7), zarr_fused writes 0, so gzip chunks are never identical as
        stored. With True, answer for zarr's bytes written at MTIME 0 (as
        with its clock at 0): then gzip at levels 1-9 is identical when
        both use the same zlib.

    Returns
    -------
    bool
        True where identity is claimed. False does not mean the bytes
        differ, only that zarr_fused does not promise they are the same.
    """
    versions = _versions()
    measured = {k: versions[k] for k in _MEASURED_ON} == _MEASURED_ON
    return all(_codec_identical(c, versions, measured, gzip_mtime_zero) for c in codecs)
