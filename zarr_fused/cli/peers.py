"""The pipelines ``zarr-fused bench`` compares: which can run here, one
runner per pipeline with the same ``read(selection)``, and the comparison of
what they read.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import numpy as np
import zarr

from zarr_fused.cli.common import ZARR_PIPELINES, one_line, short
from zarr_fused.cli.source import Source

#: pipeline -> the module it needs that may not be installed
_OPTIONAL = {"zarrs": "zarrs", "tensorstore": "tensorstore"}


@contextlib.contextmanager
def warnings_as_notes(name: str, notes: list[str]) -> Iterator[None]:
    """Turn the warnings a pipeline emits into notes under the table (once each),
    instead of multi-line warnings in the middle of the output."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        note = f"{name} warned: {short(' '.join(str(w.message).split()))}"
        if note not in notes:
            notes.append(note)


def _importable(module: str) -> str | None:
    """None when ``module`` imports, else why not."""
    try:
        __import__(module)
    except ImportError as exc:
        return one_line(exc)
    return None


def not_installed(name: str) -> str | None:
    """Why pipeline (or peer) ``name`` is not installed here, None when it
    is; the asv benchmarks ask this too (``asv_bench/benchmarks/_peers.py``)."""
    module = _OPTIONAL.get(name)
    return None if module is None else _importable(module)


def why_not(name: str, source: Source) -> str | None:
    """Why pipeline ``name`` cannot read ``source`` here (None: it can)."""
    missing = not_installed(name)
    if missing:
        return f"not installed ({missing})"
    if name == "tensorstore":
        if source.local_dir is None:
            return "it is driven here on local directories only, not on zip files"
        if source.array.metadata.zarr_format != 3:
            return "this is a zarr v2 array; it is driven here through its zarr3 driver only"
    return None


class ZarrRunner:
    """Reads through one zarr-python codec pipeline."""

    def __init__(self, name: str, source: Source) -> None:
        self.name = name
        self.pipeline_path = ZARR_PIPELINES[name]
        self._config = {"codec_pipeline.path": self.pipeline_path}
        with zarr.config.set(self._config):
            self.array = zarr.open_array(source.store, mode="r", path=source.array_path)
        used = type(self.array.async_array.codec_pipeline)
        self.note = None
        if used.__name__ != self.pipeline_path.rsplit(".", 1)[1]:
            self.note = (
                f"{name}: zarr used {used.__module__}.{used.__qualname__} for this "
                "array (the pipeline fell back)"
            )

    def read(self, sel: tuple[int | slice, ...]) -> np.ndarray:
        with zarr.config.set(self._config):
            return np.asarray(self.array[sel])


class TensorstoreRunner:
    """Reads through tensorstore's zarr3 driver on a file kvstore."""

    pipeline_path = None
    note = None

    def __init__(self, name: str, source: Source) -> None:
        import tensorstore as ts

        self.name = name
        assert source.local_dir is not None
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(source.local_dir)}}
        self.handle = ts.open(spec, read=True).result()

    def read(self, sel: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.handle[sel].read().result())


Runner = ZarrRunner | TensorstoreRunner


def make_runner(name: str, source: Source) -> Runner:
    return TensorstoreRunner(name, source) if name == "tensorstore" else ZarrRunner(name, source)


def compare(got: np.ndarray, ref: np.ndarray) -> str | None:
    """None when ``got`` equals ``ref`` (values, shape, dtype; NaN == NaN), else how not."""
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype} instead of {ref.dtype}"
    if got.shape != ref.shape:
        return f"shape {got.shape} instead of {ref.shape}"
    equal_nan = ref.dtype.kind in "fcmM"
    if np.array_equal(got, ref, equal_nan=equal_nan):
        return None
    same = got == ref
    if equal_nan:
        same |= np.isnan(got) & np.isnan(ref)
    return f"{np.size(same) - np.count_nonzero(same)} of {ref.size} elements differ"
