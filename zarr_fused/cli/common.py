"""What every verb of the command line shares: the program name, exit
statuses, the one error type, and how an exception is shown on one line.

Standard library only, so ``zarr-fused --help`` imports nothing heavy.
"""

from __future__ import annotations

PROG = "zarr-fused"

#: Exit statuses.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

#: What ``bench`` can compare, in table order; the first is the reference.
BENCH_PIPELINES = ("zarr-batched", "zarr-fused", "zarr_fused", "zarrs", "tensorstore")
#: codec_pipeline.path of each zarr-python pipeline (tensorstore is not one).
ZARR_PIPELINES = {
    "zarr-batched": "zarr.core.codec_pipeline.BatchedCodecPipeline",
    "zarr-fused": "zarr.core.codec_pipeline.FusedCodecPipeline",
    "zarr_fused": "zarr_fused.FusedCodecPipeline",
    "zarrs": "zarrs.ZarrsCodecPipeline",
}
#: The pipeline the others are compared with, and that opens arrays for metadata.
REFERENCE = "zarr-batched"


class CliError(Exception):
    """An error to report as one ``zarr-fused: ...`` line, with an exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's whitespace folded to single spaces."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def short(text: str, limit: int = 200) -> str:
    """``text`` without tensorstore's spec dump, at most ``limit`` characters."""
    text = text.split(" [tensorstore_spec=", 1)[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def human(nbytes: float) -> str:
    """``1536`` as ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable: GiB ends the loop")
