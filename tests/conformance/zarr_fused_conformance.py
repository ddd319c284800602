"""pytest plugin loaded into zarr's own test suite by `run.py`.

It does three things, driven by environment variables that `run.py` sets:

``ZF_CONFORMANCE_RUN``
    the name of the run; what `expected_failures` lists for it is applied
    (strict xfails, skips, skips when a host is unreachable), and an entry
    that matches no collected test is an error (the lists must not rot).
``ZF_CONFORMANCE_ALIAS=1``
    map zarr's own ``zarr.core.codec_pipeline.FusedCodecPipeline`` to
    zarr_fused's class, both in zarr's pipeline registry (for tests that
    select it by path) and as the module attribute (for tests that import
    and instantiate it), so zarr's Fused-specific tests test zarr_fused; and
    keep only the tests that name that pipeline (in their id, or in the
    source of their function or class): the rest run in the env run.
``ZF_CONFORMANCE_REPORT``
    a JSON file receiving the outcome counts of the run.

In the run driven by ``ZARR_CODEC_PIPELINE__PATH`` this plugin imports
nothing from zarr_fused, so that zarr must find the pipeline through its
entry point alone.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
from collections import Counter

import pytest
from expected_failures import CANNOT_SELECT_ZARR_FUSED, EXPECTED, KNOWN_BUGS, NEEDS_INTERNET

RUN = os.environ.get("ZF_CONFORMANCE_RUN", "")
ZARR_FUSED_PATH = "zarr.core.codec_pipeline.FusedCodecPipeline"

if os.environ.get("ZF_CONFORMANCE_ALIAS") == "1":
    import zarr.core.codec_pipeline as _cp
    import zarr.registry as _registry

    from zarr_fused import FusedCodecPipeline as _ZarrFused

    _registry._pipeline_registry.lazy_load()
    _registry._pipeline_registry[ZARR_FUSED_PATH] = _ZarrFused
    _cp.FusedCodecPipeline = _ZarrFused


def pytest_configure(config: pytest.Config) -> None:
    # zarr_fused warns once per process when a write updates part of a
    # shard on a store that cannot make it conditional (s3fs):
    # such writers can lose each other's data, in zarr's pipelines too,
    # which do not warn. zarr's tests run with warnings as errors and do
    # not expect it.
    config.addinivalue_line("filterwarnings", "ignore::zarr_fused.errors.UnprotectedWriteWarning")


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"zarr_fused conformance run: {RUN or '(unnamed)'}"]
    if os.environ.get("ZF_CONFORMANCE_ALIAS") == "1":
        lines.append(f"{ZARR_FUSED_PATH} is mapped to zarr_fused.FusedCodecPipeline")
    if "ZARR_CODEC_PIPELINE__PATH" in os.environ:
        lines.append(f"ZARR_CODEC_PIPELINE__PATH={os.environ['ZARR_CODEC_PIPELINE__PATH']}")
    return lines


@functools.cache
def unreachable(host: str) -> str | None:
    """Why ``host`` cannot be reached on port 443, or None when it can."""
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def marker_for(nodeid: str) -> pytest.MarkDecorator | None:
    """The marker `expected_failures` gives ``nodeid`` in this run, if any."""
    reason = EXPECTED.get(RUN, {}).get(nodeid)
    if reason is not None:
        return pytest.mark.xfail(reason=f"zarr_fused: {reason}", strict=True)
    reason = KNOWN_BUGS.get(RUN, {}).get(nodeid)
    if reason is not None:
        return pytest.mark.xfail(reason=f"zarr_fused {reason}", strict=True)
    reason = CANNOT_SELECT_ZARR_FUSED.get(RUN, {}).get(nodeid)
    if reason is not None:
        return pytest.mark.skip(reason=f"zarr_fused: {reason}")
    if nodeid in NEEDS_INTERNET.get(RUN, {}):
        host, reason = NEEDS_INTERNET[RUN][nodeid]
        error = unreachable(host)
        if error is not None:
            return pytest.mark.skip(reason=f"zarr_fused: {reason}; {host} unreachable ({error})")
    return None


def listed() -> set[str]:
    return {
        nodeid
        for table in (EXPECTED, KNOWN_BUGS, CANNOT_SELECT_ZARR_FUSED, NEEDS_INTERNET)
        for nodeid in table.get(RUN, {})
    }


def names_fused_pipeline(item: pytest.Item) -> bool:
    """Whether ``item`` names zarr's Fused pipeline: a parameter id such as
    ``zarr.core.codec_pipeline.FusedCodecPipeline`` or ``fused_full_threaded``,
    or its test function's or class's source."""
    if "fused" in item.nodeid.lower():
        return True
    for obj in (getattr(item, "function", None), getattr(item, "cls", None)):
        try:
            source = inspect.getsource(obj) if obj is not None else ""
        except (OSError, TypeError):
            continue
        if "fused" in source.lower():
            return True
    return False


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if os.environ.get("ZF_CONFORMANCE_ALIAS") == "1":
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            (keep if names_fused_pipeline(item) else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    wanted = listed()
    seen: set[str] = set()
    for item in items:
        if item.nodeid in wanted:
            seen.add(item.nodeid)
            marker = marker_for(item.nodeid)
            if marker is not None:
                item.add_marker(marker)
    # Only when the whole run is collected: a -k/nodeid subset legitimately
    # misses entries.
    if not config.getoption("keyword") and not config.getoption("markexpr"):
        stale = sorted(wanted - seen)
        if stale and os.environ.get("ZF_CONFORMANCE_FULL") == "1":
            raise pytest.UsageError(
                f"expected_failures.py lists tests that were not collected in run {RUN!r}: {stale}"
            )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    path = os.environ.get("ZF_CONFORMANCE_REPORT")
    if not path:
        return
    counts: Counter[str] = Counter()
    for key in ("passed", "failed", "skipped", "xfailed", "xpassed", "error"):
        counts[key] = len(terminalreporter.stats.get(key, []))
    with open(path, "w") as f:
        json.dump({"run": RUN, **counts}, f)
