"""The ``--selection`` of ``zarr-fused bench``: parsed, never evaluated.

A selection is resolved against the array's shape to explicit non-negative
indices before any pipeline sees it: tensorstore reads negative indices as
coordinates, not as counts from the end, so ``-1`` would mean different
things to different pipelines.
"""

from __future__ import annotations

import re
from typing import Any

from zarr_fused.cli.common import CliError

_INT = r"\s*([+-]?\d+)?\s*"
_SLICE = re.compile(rf"^{_INT}:{_INT}(?::{_INT})?$")
_INDEX = re.compile(r"^\s*([+-]?\d+)\s*$")

Token = Any  # Ellipsis, an int, or a (start, stop, step) tuple of int | None


def parse_selection(text: str) -> list[Token]:
    """Parse ``"0:100,:,5"`` into tokens, without looking at any array.

    Accepts integers, ``start:stop[:step]`` slices with any part omitted and
    at most one ``...``, separated by commas. Raises `CliError` (usage) for
    anything else.
    """
    tokens: list[Token] = []
    parts = text.split(",")
    for pos, part in enumerate(parts, 1):
        if part.strip() == "...":
            if Ellipsis in tokens:
                raise CliError(f"malformed --selection {text!r}: more than one '...'")
            tokens.append(Ellipsis)
            continue
        m = _INDEX.match(part)
        if m:
            tokens.append(int(m.group(1)))
            continue
        m = _SLICE.match(part)
        if m:
            tokens.append(tuple(None if g is None else int(g) for g in m.groups()))
            continue
        what = "empty index" if not part.strip() else f"{part.strip()!r}"
        raise CliError(
            f"malformed --selection {text!r}: {what} at position {pos} (expected an integer, "
            "start:stop[:step] or '...', comma-separated)"
        )
    return tokens


def resolve_selection(
    tokens: list[Token], shape: tuple[int, ...], text: str
) -> tuple[int | slice, ...]:
    """Resolve parsed tokens against ``shape``: explicit, in range, non-empty.

    Integers and slice bounds may count from the end (negative); unlike
    NumPy, bounds outside the axis are an error rather than clipped, since a
    benchmark of a clipped region is rarely what was meant.
    """
    explicit = [t for t in tokens if t is not Ellipsis]
    if len(explicit) > len(shape):
        raise CliError(
            f"--selection {text!r} has {len(explicit)} indices but the array has "
            f"{len(shape)} dimension{'s' if len(shape) != 1 else ''} (shape {shape})"
        )
    full = (None, None, None)
    fill = [full] * (len(shape) - len(explicit))
    if Ellipsis in tokens:
        i = tokens.index(Ellipsis)
        expanded = tokens[:i] + fill + tokens[i + 1 :]
    else:
        expanded = tokens + fill
    return tuple(
        _resolve_index(tok, axis, size, text)
        if isinstance(tok, int)
        else _resolve_slice(tok, axis, shape, text)
        for axis, (tok, size) in enumerate(zip(expanded, shape))
    )


def _resolve_index(tok: int, axis: int, size: int, text: str) -> int:
    if not -size <= tok < size:
        raise CliError(
            f"--selection {text!r}: index {tok} is out of range for axis {axis} of size {size}"
        )
    return tok + size if tok < 0 else tok


def _resolve_slice(
    tok: tuple[int | None, int | None, int | None], axis: int, shape: tuple[int, ...], text: str
) -> slice:
    size = shape[axis]
    start, stop, step = tok
    step = 1 if step is None else step
    if step < 1:
        raise CliError(f"--selection {text!r}: step {step} on axis {axis} must be >= 1")
    bounds = []
    for value, default in ((start, 0), (stop, size)):
        if value is None:
            value = default
        elif not -size <= value <= size:
            raise CliError(
                f"--selection {text!r}: bound {value} is out of range for axis {axis} "
                f"of size {size}"
            )
        bounds.append(value + size if value < 0 else value)
    if bounds[0] >= bounds[1]:
        if not text:
            raise CliError(f"nothing to read: the array is empty along axis {axis} (shape {shape})")
        raise CliError(f"--selection {text!r} selects nothing along axis {axis}")
    return slice(bounds[0], bounds[1], step)


def format_selection(sel: tuple[int | slice, ...]) -> str:
    """``(slice(0, 10, 1), 5)`` as ``"0:10, 5"`` (``"()"`` for a 0-d array)."""

    def one(s: int | slice) -> str:
        if isinstance(s, int):
            return str(s)
        return f"{s.start}:{s.stop}" + (f":{s.step}" if s.step != 1 else "")

    return ", ".join(map(one, sel)) if sel else "()"


def selection_shape(sel: tuple[int | slice, ...]) -> tuple[int, ...]:
    """The shape of what ``sel`` reads (integers drop their axis)."""
    return tuple(len(range(s.start, s.stop, s.step)) for s in sel if isinstance(s, slice))
