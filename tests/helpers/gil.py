"""A probe that tells whether a call releases the GIL.

The calling thread reads a spinning thread's counter right before and right
after a call. Forced GIL switches are pushed out of reach (a switch interval
of `NO_FORCED_SWITCH` seconds, far longer than the whole probe), so between
those two reads the spinner can run only if the calling thread gives the GIL
up by itself, which a kernel does nowhere but inside a ``with nogil`` block.
A call that held the GIL leaves the counter exactly where it was; one that
releases it lets the spinner run its whole burst, and the caller gets the
GIL back when the burst ends. No clock is read, so a slow machine only makes
everything take longer; if the spinner was not scheduled before the call
finished, the call is simply made again.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable

__all__ = ["spins_during"]

NO_FORCED_SWITCH = 30.0
BURST = 100_000


class _Spinner:
    def __init__(self) -> None:
        self.count = 0
        self.stop = False
        self.ready = threading.Event()
        self.go = threading.Event()

    def run(self) -> None:
        self.ready.set()
        self.go.wait()
        while self.count < BURST and not self.stop:
            self.count += 1


def spins_during(call: Callable[[], object], attempts: int) -> int:
    """How far the spinner got between the two reads around ``call()``
    (0: the call held the GIL throughout, in each of ``attempts`` tries)."""
    spinner = _Spinner()
    thread = threading.Thread(target=spinner.run, name="gil-spinner", daemon=True)
    interval = sys.getswitchinterval()
    gc.collect()
    gc.disable()  # no finalizer may run, and maybe block, inside the window
    sys.setswitchinterval(NO_FORCED_SWITCH)
    spins = 0
    try:
        thread.start()
        spinner.ready.wait()
        spinner.go.set()
        for _ in range(attempts):
            before = spinner.count
            call()
            spins = spinner.count - before
            if spins:
                break
    finally:
        spinner.stop = True
        thread.join()
        sys.setswitchinterval(interval)
        gc.enable()
    return spins
