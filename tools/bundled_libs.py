"""Build the C libraries a portable wheel links statically: libzstd, zlib,
c-blosc and lz4, at exactly the versions numcodecs bundles, and libdeflate.

zarr encodes with the libraries numcodecs vendors; linking the same
versions makes zarr_fused's stored bytes equal to zarr's at every zstd and
blosc level. Their sources come from the numcodecs sdist on PyPI (its
``c-blosc/`` folder: c-blosc with lz4, zlib and zstd in
``internal-complibs/``). libdeflate, which only reads (zlib and gzip
streams; zlib writes them), comes from the sdist of ``deflate``, its Python
binding, which vendors it in ``libdeflate/``: only its decompressors are
compiled. Each sdist is fetched with pip, checked against a pinned sha256
and cached under ``.cache/wheel/`` (never committed).

Each library is compiled position-independent, without CPU-specific flags
(c-blosc's SSE2 and AVX2 shuffles are compiled as separate files and
picked at run time by c-blosc itself, as numcodecs does), by the C compiler
given (``--cc``, default ``cc``; ``tools/build_wheel.sh`` passes zig's,
targeting an old glibc), into ``PREFIX/lib/lib*.a`` with the headers the
extensions include in ``PREFIX/include``. ``setup.py`` links them when
``ZARR_FUSED_BUNDLED_LIBS=PREFIX``.

    python tools/bundled_libs.py --prefix .cache/wheel/libs --cc "zig cc"
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "wheel"

#: the sdists the sources come from: version, sha256 (PyPI's) and the
#: folder of C sources inside
SDISTS = {
    "numcodecs": (
        "0.17.1",
        "5069dc01b0087c6135cbb3b043707aaf927c992fcd325248d15d907c51dd3747",
        "c-blosc",
    ),
    "deflate": (
        "0.9.0",
        "962e0a6f1ea3a94b900a8ea0ce138fa92bfcbafda5b86367104a259ffcd3462b",
        "libdeflate",
    ),
}
#: the versions inside them (numcodecs 0.17.1 reports the first four;
#: deflate 0.9.0's libdeflate.h says 1.26)
VERSIONS = {
    "c-blosc": "1.21.7.dev",
    "zstd": "1.5.6",
    "lz4": "1.10.0",
    "zlib": "1.3.1",
    "libdeflate": "1.26",
}

BASE_FLAGS = ["-O3", "-DNDEBUG", "-fPIC", "-std=gnu11", "-pthread"]


@dataclass
class Library:
    """One static archive: its sources (relative to the source folder of
    the sdist ``sdist``), include folders, defines, extra flags per source,
    and the headers it installs."""

    archive: str
    sources: list[str]
    sdist: str = "numcodecs"
    includes: list[str] = field(default_factory=list)
    defines: list[str] = field(default_factory=list)
    per_file: dict[str, list[str]] = field(default_factory=dict)
    headers: list[str] = field(default_factory=list)


def _x86_64(target: str) -> bool:
    return target.startswith("x86_64")


def libraries(src: Path, target: str) -> list[Library]:
    """What to compile for ``target`` (an architecture-os-abi triple);
    ``src`` is numcodecs' source folder."""
    zstd = f"internal-complibs/zstd-{VERSIONS['zstd']}"
    lz4 = f"internal-complibs/lz4-{VERSIONS['lz4']}"
    zlib = f"internal-complibs/zlib-{VERSIONS['zlib']}"
    zstd_sources = sorted(
        str(p.relative_to(src))
        for part in ("common", "compress", "decompress", "dictBuilder")
        for p in (src / zstd / part).glob("*.c")
    )
    if _x86_64(target):  # zstd's assembly Huffman decoder (x86-64 only)
        zstd_sources.append(f"{zstd}/decompress/huf_decompress_amd64.S")
    zlib_sources = [
        f"{zlib}/{n}.c"
        for n in [
            "adler32",
            "compress",
            "crc32",
            "deflate",
            "gzclose",
            "gzlib",
            "gzread",
            "gzwrite",
            "infback",
            "inffast",
            "inflate",
            "inftrees",
            "trees",
            "uncompr",
            "zutil",
        ]
    ]
    blosc_sources = [
        f"blosc/{n}.c"
        for n in [
            "blosc",
            "blosclz",
            "fastcopy",
            "shuffle",
            "shuffle-generic",
            "bitshuffle-generic",
        ]
    ]
    blosc_defines = ["-DHAVE_LZ4", "-DHAVE_ZLIB", "-DHAVE_ZSTD"]
    per_file: dict[str, list[str]] = {}
    if _x86_64(target):
        for simd, flag in (("sse2", "-msse2"), ("avx2", "-mavx2")):
            for kind in ("shuffle", "bitshuffle"):
                blosc_sources.append(f"blosc/{kind}-{simd}.c")
                per_file[f"blosc/{kind}-{simd}.c"] = [flag]
            blosc_defines.append(f"-DSHUFFLE_{simd.upper()}_ENABLED")
    return [
        Library(
            "libzstd.a",
            zstd_sources,
            includes=[zstd, f"{zstd}/common"],
            headers=[f"{zstd}/zstd.h", f"{zstd}/zstd_errors.h"],
        ),
        Library(
            "liblz4.a",
            [f"{lz4}/lz4.c", f"{lz4}/lz4hc.c"],
            includes=[lz4],
            headers=[f"{lz4}/lz4.h"],
        ),
        Library(
            "libz.a", zlib_sources, includes=[zlib], headers=[f"{zlib}/zlib.h", f"{zlib}/zconf.h"]
        ),
        Library(
            "libblosc.a",
            blosc_sources,
            includes=["blosc", lz4, zlib, zstd],
            defines=blosc_defines,
            per_file=per_file,
            headers=["blosc/blosc.h", "blosc/blosc-export.h"],
        ),
        # the decompressors alone; libdeflate picks its x86 and arm kernels
        # at run time (no CPU flags needed)
        Library(
            "libdeflate.a",
            [
                f"lib/{n}.c"
                for n in [
                    "utils",
                    "x86/cpu_features",
                    "arm/cpu_features",
                    "deflate_decompress",
                    "adler32",
                    "zlib_decompress",
                    "crc32",
                    "gzip_decompress",
                ]
            ],
            sdist="deflate",
            includes=["."],
            headers=["libdeflate.h"],
        ),
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sources(name: str) -> Path:
    """The source folder of the pinned sdist ``name`` (fetched with pip
    once, verified, unpacked under the cache)."""
    version, sha, folder = SDISTS[name]
    downloads = CACHE / "downloads"
    archive = downloads / f"{name}-{version}.tar.gz"
    if not archive.is_file() or _sha256(archive) != sha:
        downloads.mkdir(parents=True, exist_ok=True)
        print(f"bundled_libs: fetching the {name} {version} sdist with pip", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", name, "--disable-pip-version-check",
             "-d", str(downloads), f"{name}=={version}"],
            check=True,
        )  # fmt: skip
    got = _sha256(archive)
    if got != sha:
        sys.exit(f"bundled_libs: {archive} has sha256 {got}, expected {sha}")
    unpacked = CACHE / "src" / f"{name}-{version}"
    if not (unpacked / folder).is_dir():
        unpacked.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if f"/{folder}/" in m.name]
            tar.extractall(unpacked.parent, members=members, filter="data")
    return unpacked / folder


def _compile(cc: list[str], src: Path, lib: Library, source: str, *, objdir: Path) -> Path:
    obj = objdir / (source.replace("/", "__") + ".o")
    flags = [*BASE_FLAGS, *lib.defines, *(f"-I{src / i}" for i in lib.includes)]
    flags += lib.per_file.get(source, [])
    subprocess.run([*cc, *flags, "-c", str(src / source), "-o", str(obj)], check=True)
    return obj


def build(
    srcs: dict[str, Path], prefix: Path, cc: list[str], ar: list[str], target: str, jobs: int
) -> None:
    """Compile every library of ``target`` into ``prefix``; ``srcs`` maps
    each sdist to its source folder."""
    objroot = prefix / "obj"
    for d in (prefix / "lib", prefix / "include", objroot):
        d.mkdir(parents=True, exist_ok=True)
    for lib in libraries(srcs["numcodecs"], target):
        src = srcs[lib.sdist]
        objdir = objroot / lib.archive
        objdir.mkdir(exist_ok=True)
        with ThreadPoolExecutor(jobs) as pool:
            objects = list(pool.map(partial(_compile, cc, src, lib, objdir=objdir), lib.sources))
        out = prefix / "lib" / lib.archive
        out.unlink(missing_ok=True)
        subprocess.run([*ar, "rcs", str(out), *map(str, objects)], check=True)
        for header in lib.headers:
            shutil.copy2(src / header, prefix / "include")
        print(f"bundled_libs: {out} ({len(objects)} objects)", flush=True)
    (prefix / "VERSIONS").write_text(_stamp(target))


def _stamp(target: str) -> str:
    """What a prefix's VERSIONS file says when it is up to date: the
    versions, the target and the installed headers (lz4.h joined them
    later: a prefix built before is built again)."""
    headers = sorted(Path(h).name for lib in libraries(Path("."), target) for h in lib.headers)
    versions = "".join(f"{k} {v}\n" for k, v in VERSIONS.items())
    return f"{versions}target {target}\nheaders {' '.join(headers)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"))
    parser.add_argument("--ar", default="ar")
    parser.add_argument(
        "--target", default=f"{platform.machine()}-linux-gnu", help="architecture-os-abi"
    )
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    prefix = args.prefix.resolve()
    stamp = prefix / "VERSIONS"
    if stamp.is_file() and stamp.read_text() == _stamp(args.target):
        print(f"bundled_libs: {prefix} is up to date")
        return
    srcs = {name: fetch_sources(name) for name in SDISTS}
    build(srcs, prefix, shlex.split(args.cc), shlex.split(args.ar), args.target, args.jobs)


if __name__ == "__main__":
    main()
