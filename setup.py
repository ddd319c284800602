"""Build script for zarr_fused's Cython extensions.

All extensions are described once in ``EXTENSIONS`` and compiled by a single
``cythonize`` call. No CPU-specific flags are taken from the build machine:
the wheels must run on any x86-64/aarch64 host, and kernels that want special
instructions select them at run time.

``ZARR_FUSED_EXTENSIONS=_scatter,_codecs`` restricts an in-place build to the
named extensions, for a fast edit loop.

``ZARR_FUSED_EXTRA_CFLAGS`` and ``ZARR_FUSED_EXTRA_LDFLAGS`` (whitespace
separated) are added to the compile and link of every extension, and to
nothing else: the sanitizer and fuzzing builds of ``tests/fuzz/build.sh`` pass
``-fsanitize=...`` this way, so the library checks below still link plain
programs. They are for instrumentation, not for tuning to the build host.

The C libraries (libzstd, zlib, libdeflate, c-blosc, liblz4) are linked from the system by
default: the developer path. ``ZARR_FUSED_BUNDLED_LIBS=PREFIX`` links the
static archives under ``PREFIX/lib`` (headers in ``PREFIX/include``)
into the extensions instead, their symbols kept out of the extensions'
exports: the portable wheel (``make wheel``, ``tools/bundled_libs.py``
builds the archives), which needs no C library beyond glibc at run time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# name, sources, extra .pxd dependencies, C libraries to link. Each module
# depends on its own .pxd (Cython reads it implicitly) and on the .pxd files
# of the modules it cimports; listing them rebuilds it when they change.
EXTENSIONS: list[dict] = [
    {
        "name": "zarr_fused._scatter",
        "sources": ["zarr_fused/_scatter.pyx"],
        "depends": ["zarr_fused/_scatter.pxd", "zarr_fused/_ndindex.pxd"],
        "libraries": [],
    },
    {
        "name": "zarr_fused._cast_value",
        "sources": ["zarr_fused/_cast_value.pyx"],
        "depends": ["zarr_fused/_cast_value.pxd", "zarr_fused/_item_types.pxd"],
        "libraries": [],
    },
    {
        "name": "zarr_fused._filters",
        "sources": ["zarr_fused/_filters.pyx"],
        "depends": [
            "zarr_fused/_filters.pxd",
            "zarr_fused/_cast_value.pxd",
            "zarr_fused/_item_types.pxd",
        ],
        "libraries": [],
    },
    {
        "name": "zarr_fused._localio",
        "sources": ["zarr_fused/_localio.pyx"],
        "depends": ["zarr_fused/_localio.pxd"],
        "libraries": [],
    },
    {
        "name": "zarr_fused._fileio",
        "sources": ["zarr_fused/_fileio.pyx"],
        "depends": ["zarr_fused/_localio.pxd"],
        "libraries": [],
    },
    {
        "name": "zarr_fused._codecs",
        "sources": ["zarr_fused/_codecs.pyx"],
        "depends": [
            "zarr_fused/_codecs.pxd",
            "zarr_fused/_deflate.pxd",
            "zarr_fused/_phase_times.pxd",
            "zarr_fused/_scatter.pxd",
            "zarr_fused/_localio.pxd",
            "zarr_fused/_zstd.pxd",
            "zarr_fused/_zlib.pxd",
            "zarr_fused/_blosc.pxd",
            "zarr_fused/_lz4.pxd",
            "zarr_fused/_le32.pxd",
            "zarr_fused/_crc32c.pxd",
            "zarr_fused/_crc32c.h",
        ],
        "libraries": ["zstd", "z", "deflate", "blosc", "lz4"],
    },
    {
        "name": "zarr_fused._vlen",
        "sources": ["zarr_fused/_vlen.pyx"],
        "depends": [
            "zarr_fused/_codecs.pxd",
            "zarr_fused/_deflate.pxd",
            "zarr_fused/_phase_times.pxd",
            "zarr_fused/_zstd.pxd",
            "zarr_fused/_zlib.pxd",
            "zarr_fused/_le32.pxd",
            "zarr_fused/_shard_index.pxd",
        ],
        "libraries": ["zstd"],
    },
    {
        "name": "zarr_fused._codec_batch",
        "sources": ["zarr_fused/_codec_batch.pyx"],
        "depends": [
            "zarr_fused/_codec_batch.pxd",
            "zarr_fused/_codecs.pxd",
            "zarr_fused/_deflate.pxd",
            "zarr_fused/_phase_times.pxd",
            "zarr_fused/_filters.pxd",
            "zarr_fused/_cast_value.pxd",
            "zarr_fused/_scatter.pxd",
            "zarr_fused/_zstd.pxd",
            "zarr_fused/_zlib.pxd",
        ],
        "libraries": [],
    },
    {
        "name": "zarr_fused._region_plan",
        "sources": ["zarr_fused/_region_plan.pyx"],
        "depends": [],
        "libraries": [],
    },
    {
        "name": "zarr_fused._shard_index",
        "sources": ["zarr_fused/_shard_index.pyx"],
        "depends": [
            "zarr_fused/_shard_index.pxd",
            "zarr_fused/_crc32c.pxd",
            "zarr_fused/_crc32c.h",
        ],
        "libraries": [],
    },
    {
        "name": "zarr_fused._shard",
        "sources": ["zarr_fused/_shard.pyx"],
        "depends": [
            "zarr_fused/_codec_batch.pxd",
            "zarr_fused/_codecs.pxd",
            "zarr_fused/_deflate.pxd",
            "zarr_fused/_phase_times.pxd",
            "zarr_fused/_filters.pxd",
            "zarr_fused/_cast_value.pxd",
            "zarr_fused/_ndindex.pxd",
            "zarr_fused/_scatter.pxd",
            "zarr_fused/_shard_index.pxd",
            "zarr_fused/_zstd.pxd",
            "zarr_fused/_zlib.pxd",
        ],
        "libraries": [],
    },
    {
        "name": "zarr_fused._shard_local",
        "sources": ["zarr_fused/_shard_local.pyx"],
        "depends": [
            "zarr_fused/_codec_batch.pxd",
            "zarr_fused/_codecs.pxd",
            "zarr_fused/_deflate.pxd",
            "zarr_fused/_phase_times.pxd",
            "zarr_fused/_filters.pxd",
            "zarr_fused/_cast_value.pxd",
            "zarr_fused/_localio.pxd",
            "zarr_fused/_scatter.pxd",
            "zarr_fused/_shard_index.pxd",
            "zarr_fused/_zstd.pxd",
            "zarr_fused/_zlib.pxd",
        ],
        "libraries": [],
    },
]

NUMPY_MACROS = [("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")]

# C libraries linked from the system: library -> (header, a function, packages)
SYSTEM_LIBRARIES = {
    "zstd": ("zstd.h", "ZSTD_versionNumber", "libzstd-dev (Debian/Ubuntu), zstd (conda)"),
    "z": ("zlib.h", "zlibVersion", "zlib1g-dev (Debian/Ubuntu), zlib (conda)"),
    "deflate": (
        "libdeflate.h",
        "libdeflate_alloc_decompressor",
        "libdeflate-dev (Debian/Ubuntu), libdeflate (conda)",
    ),
    "blosc": (
        "blosc.h",
        "blosc_get_version_string",
        "libblosc-dev (Debian/Ubuntu), c-blosc (conda)",
    ),
    "lz4": ("lz4.h", "LZ4_versionNumber", "liblz4-dev (Debian/Ubuntu), lz4-c (conda)"),
}


# the static archives a bundled build links, in link order (c-blosc needs
# lz4, zstd and zlib after it), for the extensions that link any library
BUNDLED_ARCHIVES = ["libblosc.a", "liblz4.a", "libzstd.a", "libz.a", "libdeflate.a"]


def _bundled_prefix() -> Path | None:
    prefix = os.environ.get("ZARR_FUSED_BUNDLED_LIBS")
    if not prefix:
        return None
    root = Path(prefix).resolve()
    missing = [a for a in BUNDLED_ARCHIVES if not (root / "lib" / a).is_file()]
    missing += [
        f"include/{h}"
        for h in ("blosc.h", "lz4.h", "libdeflate.h")
        if not (root / "include" / h).is_file()
    ]
    if missing:
        sys.exit(
            f"ZARR_FUSED_BUNDLED_LIBS={prefix}: no static libraries there "
            f"(missing: {', '.join(missing)}); "
            "tools/bundled_libs.py builds them"
        )
    return root


def _exports_map() -> str:
    """A linker version script that exports the module's init function
    only: the archives' symbols stay local to the extension, so they cannot
    clash with another copy of zlib or libzstd loaded into the process."""
    path = Path("build") / "bundled-exports.map"
    path.parent.mkdir(exist_ok=True)
    path.write_text("{ global: PyInit_*; local: *; };\n")
    return str(path.resolve())


def _link_spec(spec: dict) -> dict:
    """Compile and link arguments for ``spec``'s C libraries: the system's
    by name, or the bundled archives."""
    bundled = _bundled_prefix()
    if bundled is None:
        return {
            "libraries": spec["libraries"],
            "include_dirs": [],
            "extra_objects": [],
            "extra_link_args": [],
            "define_macros": [],
        }
    if not spec["libraries"]:  # the headers still (a .pxd cimported declares them)
        return {
            "libraries": [],
            "include_dirs": [str(bundled / "include")],
            "extra_objects": [],
            "extra_link_args": [],
            "define_macros": [],
        }
    return {
        "libraries": [],
        "include_dirs": [str(bundled / "include")],
        "extra_objects": [str(bundled / "lib" / a) for a in BUNDLED_ARCHIVES],
        "extra_link_args": (
            ["-Wl,-exported_symbol,_PyInit_*"]
            if sys.platform == "darwin"
            else [f"-Wl,--version-script={_exports_map()}"]
        ),
        "define_macros": [("ZF_BUNDLED_LIBS", "1")],
    }


@contextlib.contextmanager
def _quiet_stderr():
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _missing_libraries(libraries: set[str]) -> list[str]:
    """The needed system libraries that do not compile and link here."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    missing = []
    for lib in sorted(libraries & set(SYSTEM_LIBRARIES)):
        header, function, packages = SYSTEM_LIBRARIES[lib]
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "check.c"
            source.write_text(
                f"#include <{header}>\nint main(void) {{ (void){function}(); return 0; }}\n"
            )
            try:
                with _quiet_stderr():
                    objects = compiler.compile([str(source)], output_dir=tmp)
                    compiler.link_executable(objects, "check", output_dir=tmp, libraries=[lib])
            except Exception:
                missing.append(f"lib{lib} ({header}): install {packages}")
    return missing


class checked_build_ext(build_ext):
    """Fails up front, saying what to install, when a C library is missing,
    and compiles the extensions in parallel (one per CPU) unless ``-j`` says
    otherwise: pip installing the sdist then takes a fraction of the time."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        needed = {lib for ext in self.extensions for lib in ext.libraries}
        missing = _missing_libraries(needed)
        if missing:
            sys.exit(
                "zarr_fused cannot be built: these C libraries (with their headers) are "
                "missing:\n  "
                + "\n  ".join(missing)
                + "\nOn Debian/Ubuntu: apt-get install libzstd-dev zlib1g-dev libblosc-dev liblz4-dev"
            )
        super().run()


def _selected(specs: list[dict]) -> list[dict]:
    wanted = os.environ.get("ZARR_FUSED_EXTENSIONS")
    if not wanted:
        return specs
    names = {w.strip() for w in wanted.split(",") if w.strip()}
    chosen = [s for s in specs if s["name"].rsplit(".", 1)[-1] in names]
    unknown = names - {s["name"].rsplit(".", 1)[-1] for s in specs}
    if unknown:
        sys.exit(f"ZARR_FUSED_EXTENSIONS names unknown extensions: {sorted(unknown)}")
    return chosen


def _env_flags(name: str) -> list[str]:
    return shlex.split(os.environ.get(name, ""))


def _extensions() -> list[Extension]:
    base_cflags = ["-O3"] if sys.platform != "win32" else []
    extra_cflags = _env_flags("ZARR_FUSED_EXTRA_CFLAGS")
    extra_ldflags = _env_flags("ZARR_FUSED_EXTRA_LDFLAGS")
    exts = []
    for spec in _selected(EXTENSIONS):
        link = _link_spec(spec)
        exts.append(
            Extension(
                spec["name"],
                sources=spec["sources"],
                depends=spec["depends"],
                libraries=link["libraries"],
                include_dirs=[*link["include_dirs"], np.get_include(), "zarr_fused"],
                define_macros=NUMPY_MACROS + link["define_macros"],
                extra_compile_args=base_cflags + extra_cflags,
                extra_objects=link["extra_objects"],
                extra_link_args=link["extra_link_args"] + extra_ldflags,
            )
        )
    return exts


setup(
    cmdclass={"build_ext": checked_build_ext},
    ext_modules=cythonize(
        _extensions(),
        nthreads=os.cpu_count() or 1,
        build_dir="build",
        compiler_directives={"language_level": 3, "embedsignature": True},
    ),
)
