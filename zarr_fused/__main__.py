"""Command line of zarr_fused: ``zarr-fused`` / ``python -m zarr_fused``.

The verbs live in `zarr_fused.cli`; this module is the entry point
(``[project.scripts]`` names ``zarr_fused.__main__:main``).
"""

from __future__ import annotations

import sys

from zarr_fused.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
