"""Native helpers for the reliability tests, built on demand.

`build_faultfs` compiles ``faultfs.c`` (an LD_PRELOAD shim that injects
file-system faults on marked paths) with the system C compiler into a
directory the caller owns. Tests that need it skip, saying why, where no
compiler is found or the build fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Self

import pytest

SOURCE = Path(__file__).with_name("faultfs.c")


def communicate(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout=...)``, killing the child if it is still
    running when that returns or raises (a hang never outlives the test)."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def build_faultfs(directory: Path) -> Path:
    """The shim compiled into ``directory``; skips the test when it cannot be."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the faultfs shim needs Linux (LD_PRELOAD, glibc symbol names)")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the faultfs shim")
    target = directory / "faultfs.so"
    result = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(target), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"the faultfs shim did not build: {result.stderr.strip()[:400]}")
    return target


def child_env(shim: Path | None = None, **faults: object) -> dict[str, str]:
    """The environment of a test's child process: this zarr_fused first on
    the path (so a child imports the same build as the test), no inherited
    fault settings, and ``FAULTFS_*`` from ``faults`` (``marker=...`` becomes
    ``FAULTFS_MARKER``) with the shim preloaded when given."""
    import zarr_fused

    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTFS_")}
    env.pop("LD_PRELOAD", None)
    env.pop("ZARR_CODEC_PIPELINE__PATH", None)
    package_root = str(Path(zarr_fused.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    for name, value in faults.items():
        env[f"FAULTFS_{name.upper()}"] = str(value)
    return env


# A long-lived child with the shim preloaded: it runs one case per line of
# JSON on stdin (``faults``: FAULTFS_* variables, set for that case only,
# then ``code`` run with ``args``) and answers each with a JSON line: the
# value of ``result`` the code left, or the exception it raised.
WORKER = r"""
import ctypes, json, os, sys, traceback
shim = ctypes.CDLL(os.environ["LD_PRELOAD"]) if os.environ.get("LD_PRELOAD") else None

def faults(values):
    for name in [k for k in os.environ if k.startswith("FAULTFS_")]:
        del os.environ[name]
    os.environ.update(values)
    if shim is not None:
        shim.faultfs_reload()

for line in sys.stdin:
    case = json.loads(line)
    scope = {"args": case["args"], "result": None}
    faults(case["faults"])
    try:
        exec(case["code"], scope)
        out = {"ok": True, "result": scope["result"]}
    except Exception as e:
        out = {"ok": False, "type": type(e).__name__, "oserror": isinstance(e, OSError),
               "errno": getattr(e, "errno", None), "message": str(e),
               "filename": repr(getattr(e, "filename", None)),
               "traceback": traceback.format_exc()}
    finally:
        faults({})
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


class FaultyChild:
    """A child process with the faultfs shim preloaded (or, with ``shim``
    None, none), running cases one after another (started on first use,
    again after it died or hung); as a context manager, closed at the end."""

    def __init__(self, shim: Path | None, timeout: float = 60.0) -> None:
        self.shim = shim
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, code: str, args: dict[str, object], **faults: object) -> dict[str, object]:
        import json
        import select
        import time

        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", WORKER],
                env=child_env(self.shim),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
        values = {f"FAULTFS_{k.upper()}": str(v) for k, v in faults.items()}
        line = json.dumps({"faults": values, "code": code, "args": args}) + "\n"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        answer = b""
        try:
            self.proc.stdin.write(line.encode())
            deadline = time.monotonic() + self.timeout
            while not answer.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                    raise TimeoutError(f"the faulty child did not answer in {self.timeout} s")
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise RuntimeError(f"the faulty child died (exit {self.proc.wait()})")
                answer += chunk
        except BaseException:
            self.close()
            raise
        return json.loads(answer)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None
