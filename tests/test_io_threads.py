"""The IO threads of a long-lived process after a burst of a high setting.

One read at ``io_concurrency=128`` starts many more IO threads than the
default keeps; idle for `zarr_fused._pool.IDLE_SECONDS` (the real period,
not shortened), those beyond `zarr_fused.io.engine.DEFAULT_IO_CONCURRENCY`
exit. Each case runs in a fresh interpreter, so the threads it counts
(by name in ``threading.enumerate()`` and in ``/proc/self/task``) are the
read's own; the wait is a bounded poll, and nothing is timed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from shims import build_faultfs, child_env

from helpers import run_in_python

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts the threads in /proc/self/task"
)

# Shared by the cases: an array of 1024 uncompressed chunk files, written
# and read through zarr_fused in a process whose opens of those files for
# reading take 2 ms each (the faultfs shim's delay, as a network
# filesystem's round trip), so a read at a setting of 128 keeps many IO
# threads waiting at once. (The first read of a new handle goes to the IO
# threads, and slow files keep later reads there: zarr_fused.io.probe.)
PRELUDE = r"""
import json, os, sys, threading, time
import numpy as np, zarr
from zarr.storage import LocalStore
from zarr_fused import _pool
from zarr_fused.io import engine

ROOT = sys.argv[1]
HIGH = 128
FUSED = {"codec_pipeline.path": "zarr_fused.FusedCodecPipeline",
         "codec_pipeline.max_workers": 2}
VALUE = np.arange(512 * 512, dtype="uint16").reshape(512, 512)


def io_threads():
    return sum(t.name.startswith("zarr_fused-fileio") for t in threading.enumerate())


def tasks():
    return len(os.listdir("/proc/self/task"))


def read(io_concurrency):
    with zarr.config.set({**FUSED, "codec_pipeline.io_concurrency": io_concurrency}):
        got = zarr.open_array(LocalStore(ROOT), mode="r")[...]
    assert np.array_equal(got, VALUE)


def settle():
    # bounded: the idle period and a generous margin for a busy host
    deadline = time.monotonic() + _pool.IDLE_SECONDS + 60
    while io_threads() > engine.DEFAULT_IO_CONCURRENCY and time.monotonic() < deadline:
        time.sleep(0.1)


with zarr.config.set(FUSED):
    arr = zarr.create_array(LocalStore(ROOT), shape=(512, 512), chunks=(16, 16),
                            dtype="uint16", compressors=None)
    arr[...] = VALUE
"""

RETIRE = r"""
before = {"io": io_threads(), "tasks": tasks()}
read(HIGH)
burst = {"io": io_threads(), "tasks": tasks()}
settle()
settled = {"io": io_threads(), "tasks": tasks()}
read(HIGH)  # the pool grows again after its threads retired
again = {"io": io_threads(), "tasks": tasks()}
print(json.dumps({"default": engine.DEFAULT_IO_CONCURRENCY, "before": before,
                  "burst": burst, "settled": settled, "again": again}))
"""

FORK = r"""
read(HIGH)
settle()
pid = os.fork()
if pid == 0:  # the child: none of the parent's threads, a pool made anew
    try:
        read(HIGH)
        code = 0 if io_threads() > 0 else 3
    except BaseException:
        code = 2
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "io": io_threads()}))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_faultfs(tmp_path_factory.mktemp("faultfs"))


def run_case(shim: Path, tmp_path: Path, body: str) -> dict[str, Any]:
    root = tmp_path / "arr"
    env = child_env(shim, marker=root, ops="open", mode="delay", delay_us=2000)
    done = run_in_python("-c", PRELUDE + body, str(root), env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_io_threads_return_to_the_default_after_a_high_setting(shim: Path, tmp_path: Path) -> None:
    counts = run_case(shim, tmp_path, RETIRE)
    default = counts["default"]
    burst, settled = counts["burst"], counts["settled"]

    assert counts["before"]["io"] <= default, counts
    assert burst["io"] > default, f"the read at 128 started no more IO threads: {counts}"
    assert settled["io"] == default, counts
    # the process as the kernel sees it: the retired threads are gone
    assert settled["tasks"] <= burst["tasks"] - (burst["io"] - default), counts
    assert counts["again"]["io"] > default, counts


def test_a_child_forked_after_the_threads_retired_reads_with_its_own(
    shim: Path, tmp_path: Path
) -> None:
    counts = run_case(shim, tmp_path, FORK)

    assert counts["child"] == 0, counts
    assert counts["io"] <= 32, counts
