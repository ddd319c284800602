"""Small tmpfs mounts: a real filesystem that runs out of room, for the
full-disk tests (`test_io_faults`, `test_enospc`).

Mounting needs root on Linux; elsewhere, or where ``mount`` refuses (a
container without the capability), the test is skipped. Import
`tmpfs_fixture` into the test module and ask for ``tmpfs``: pytest finds
fixtures among a module's names, and the fixture's own name keeps the
test's argument from shadowing the import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

__all__ = ["SIZE", "fill_disk", "free_bytes", "tmpfs_fixture"]

#: the size of each mount (tmpfs rounds it to whole pages)
SIZE = "1m"


@pytest.fixture(name="tmpfs")
def tmpfs_fixture(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """A function that mounts a fresh tmpfs of `SIZE` at ``tmp_path / name``
    and returns its path; every mount is unmounted after the test."""
    if not sys.platform.startswith("linux"):
        pytest.skip("tmpfs is Linux")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(name: str) -> Path:
        mnt = tmp_path / name
        mnt.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            _unmount(mnt)


def _unmount(mnt: Path) -> None:
    # lazily when busy: a child that still has a file open there must not
    # leave the mount behind
    if subprocess.run(
        ["umount", str(mnt)], capture_output=True, timeout=30, check=False
    ).returncode:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30, check=False)


def free_bytes(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def fill_disk(mnt: Path, room: int) -> None:
    """Leave ``room`` bytes free on the tmpfs at ``mnt`` (a file ``filler``)."""
    spare = free_bytes(mnt) - room
    assert spare > 0
    (mnt / "filler").write_bytes(b"\1" * spare)
