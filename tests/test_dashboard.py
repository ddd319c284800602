"""The published asv dashboard renders in a real headless browser.

Run with ``make dashboard-test`` after ``make dashboard`` (kept out of the
default test run for time: building three commits takes minutes). It
serves ``.asv/html`` over HTTP, loads the index and one benchmark's graph
page in Debian's Chromium, and fails on any console message (asv's pages
log nothing when they work) or a graph without data.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.dashboard

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / ".asv" / "html"
GRAPH = "read.ReadAll.time_read_all"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium: apt-get install chromium")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if not (HTML / "index.html").is_file():
        pytest.fail(f"no dashboard in {HTML}: run `make dashboard` first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(HTML),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _render(url: str) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and its console messages."""
    out = subprocess.run(
        [
            _chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    return out.stdout, console


def test_index_lists_benchmarks_with_plots(server: str) -> None:
    dom, console = _render(f"{server}/index.html")
    assert console == [], console
    assert "dependencies of airspeed velocity failed to load" not in dom
    assert dom.count('class="btn benchmark-container"') >= 5
    assert GRAPH in dom
    assert dom.count('class="flot-base"') >= 1


def test_graph_page_has_data(server: str) -> None:
    dom, console = _render(f"{server}/index.html#{GRAPH}")
    assert console == [], console
    assert 'class="flot-base"' in dom
    labels = re.findall(r'<td class="legendLabel">([^<]+)', dom)
    assert any("zarr_fused" in label for label in labels), labels
    assert len(re.findall(r'class="flot-tick-label', dom)) >= 2


def test_history_spans_three_commits() -> None:
    graphs = list((HTML / "graphs").rglob(f"{GRAPH}.json"))
    graphs = [g for g in graphs if "summary" not in g.parts]
    assert graphs, "no graph data published"
    points = json.loads(graphs[0].read_text())
    assert len(points) >= 3, f"only {len(points)} commits measured"
