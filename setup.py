"""Build script for zarr_fused's Cython extensions.

All extensions are described once in ``EXTENSIONS`` and compiled by a single
``cythonize`` call. No CPU-specific flags are taken from the build machine:
the wheels must run on any x86-64/aarch64 host, and kernels that want special
instructions select them at run time.

``ZARR_FUSED_EXTENSIONS=_scatter,_codecs`` restricts an in-place build to the
named extensions, for a fast edit loop.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# name, sources, extra .pxd dependencies, C libraries to link
EXTENSIONS: list[dict] = [
    {
        "name": "zarr_fused._scatter",
        "sources": ["zarr_fused/_scatter.pyx"],
        "depends": ["zarr_fused/_scatter.pxd"],
        "libraries": [],
    },
]

NUMPY_MACROS = [("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")]


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


def _extensions() -> list[Extension]:
    exts = []
    for spec in _selected(EXTENSIONS):
        exts.append(
            Extension(
                spec["name"],
                sources=spec["sources"],
                depends=spec["depends"],
                libraries=spec["libraries"],
                include_dirs=[np.get_include(), "zarr_fused"],
                define_macros=NUMPY_MACROS,
                extra_compile_args=["-O3"] if sys.platform != "win32" else [],
            )
        )
    return exts


setup(
    ext_modules=cythonize(
        _extensions(),
        nthreads=os.cpu_count() or 1,
        build_dir="build",
        compiler_directives={"language_level": 3, "embedsignature": True},
    ),
)
