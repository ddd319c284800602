"""pytest plugin loaded into zarr's own test suite by `run.py`.

It does three things, driven by environment variables that `run.py` sets:

``ZF_CONFORMANCE_RUN``
    the name of the run; the strict xfails listed for it in
    `expected_failures.EXPECTED` are applied, and an entry that matches no
    collected test is an error (the list must not rot).
``ZF_CONFORMANCE_ALIAS=1``
    map zarr's own ``zarr.core.codec_pipeline.FusedCodecPipeline`` to
    zarr_fused's class, both in zarr's pipeline registry (for tests that
    select it by path) and as the module attribute (for tests that import
    and instantiate it), so zarr's Fused-specific suites test zarr_fused.
``ZF_CONFORMANCE_REPORT``
    a JSON file receiving the outcome counts of the run.

In the run driven by ``ZARR_CODEC_PIPELINE__PATH`` this plugin imports
nothing from zarr_fused, so that zarr must find the pipeline through its
entry point alone.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from expected_failures import EXPECTED

RUN = os.environ.get("ZF_CONFORMANCE_RUN", "")
ZARR_FUSED_PATH = "zarr.core.codec_pipeline.FusedCodecPipeline"

if os.environ.get("ZF_CONFORMANCE_ALIAS") == "1":
    import zarr.core.codec_pipeline as _cp
    import zarr.registry as _registry

    from zarr_fused import FusedCodecPipeline as _ZarrFused

    _registry._pipeline_registry.lazy_load()
    _registry._pipeline_registry[ZARR_FUSED_PATH] = _ZarrFused
    _cp.FusedCodecPipeline = _ZarrFused


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"zarr_fused conformance run: {RUN or '(unnamed)'}"]
    if os.environ.get("ZF_CONFORMANCE_ALIAS") == "1":
        lines.append(f"{ZARR_FUSED_PATH} is mapped to zarr_fused.FusedCodecPipeline")
    if "ZARR_CODEC_PIPELINE__PATH" in os.environ:
        lines.append(f"ZARR_CODEC_PIPELINE__PATH={os.environ['ZARR_CODEC_PIPELINE__PATH']}")
    return lines


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    expected = EXPECTED.get(RUN, {})
    seen: set[str] = set()
    for item in items:
        reason = expected.get(item.nodeid)
        if reason is not None:
            seen.add(item.nodeid)
            item.add_marker(pytest.mark.xfail(reason=f"zarr_fused: {reason}", strict=True))
    # Only when the whole run is collected: a -k/nodeid subset legitimately
    # misses entries.
    if not config.getoption("keyword") and not config.getoption("markexpr"):
        stale = sorted(set(expected) - seen)
        if stale and os.environ.get("ZF_CONFORMANCE_FULL") == "1":
            raise pytest.UsageError(
                "expected_failures.py lists tests that were not collected in run "
                f"{RUN!r}: {stale}"
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
