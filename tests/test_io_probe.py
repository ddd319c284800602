"""The latency probe (`zarr_fused.io.probe`): its verdict from given
measurements and durations, on an injected clock (no timing here)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import numpy as np
import pytest

from zarr_fused.io.probe import (
    DECODE_BYTES,
    FAST_CALL,
    FAST_FILE,
    FAST_STORE,
    FILE_BYTES,
    PROBE_INTERVAL,
    PROBE_READS,
    PROBE_SPACING,
    SLOW_DIRECT,
    SLOW_HOLD,
    TOOK_DECAY,
    Fastest,
    LatencyProbe,
    StoreLatencies,
    per_call_latency,
    per_file_latency,
    slow_direct,
)

if TYPE_CHECKING:
    from collections.abc import Callable


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def chunk_probe(clock: Clock) -> LatencyProbe:
    """As `zarr_fused.chunks.pipelined.PipelinedChunkReader` makes it."""
    return LatencyProbe(FAST_FILE, reads_between=PROBE_READS, clock=clock)


def shard_probe(clock: Clock) -> LatencyProbe:
    """As `zarr_fused.shard.pipelined.ShardIO` makes it."""
    return LatencyProbe(FAST_CALL, clock=clock)


def write_probe(clock: Clock) -> LatencyProbe:
    """As `zarr_fused.chunks.write.NativeChunkWriter` makes it."""
    return LatencyProbe(FAST_STORE, clock=clock)


MAKERS = [
    pytest.param(chunk_probe, id="chunk-read"),
    pytest.param(shard_probe, id="shard-read"),
    pytest.param(write_probe, id="write"),
]


# -- the verdict -----------------------------------------------------------------------


@pytest.mark.parametrize("make", MAKERS)
def test_nothing_measured_asks_for_a_measurement(make: Callable[[Clock], LatencyProbe]) -> None:
    probe = make(Clock())
    assert probe.verdict() is None
    assert not probe.direct()
    assert not probe.seen_fast()


@pytest.mark.parametrize("make", MAKERS)
def test_fast_files_just_measured_go_direct(make: Callable[[Clock], LatencyProbe]) -> None:
    probe = make(Clock())
    probe.measured(probe.fast / 2)
    assert probe.verdict() is True
    assert probe.direct()


@pytest.mark.parametrize("make", MAKERS)
def test_files_at_the_threshold_count_as_slow(make: Callable[[Clock], LatencyProbe]) -> None:
    probe = make(Clock())
    probe.measured(probe.fast)
    assert probe.verdict() is False
    assert not probe.direct()


@pytest.mark.parametrize(
    ("age", "verdict"),
    [
        pytest.param(PROBE_INTERVAL * 0.99, True, id="within"),
        pytest.param(PROBE_INTERVAL, None, id="at-the-interval"),
        pytest.param(PROBE_INTERVAL * 5, None, id="long-after"),
    ],
)
def test_a_measurement_stands_for_the_probe_interval(age: float, verdict: bool | None) -> None:
    clock = Clock()
    probe = shard_probe(clock)
    probe.measured(FAST_CALL / 2)
    clock.now += age
    assert probe.verdict() is verdict


@pytest.mark.parametrize(
    ("age", "verdict"),
    [
        pytest.param(PROBE_SPACING * 0.1 * 0.99, True, id="within-the-spacing"),
        pytest.param(PROBE_SPACING * 0.1, None, id="at-the-spacing"),
    ],
)
def test_slow_reads_space_the_probes(age: float, verdict: bool | None) -> None:
    # reads of 0.1 s: the measurement stands for 20 x 0.1 = 2 s, not 1 s
    clock = Clock()
    probe = shard_probe(clock)
    probe.note_pipelined(0.1, FAST_CALL / 2)
    clock.now += age
    assert probe.verdict() is verdict


def test_recent_reads_duration_decays() -> None:
    probe = shard_probe(Clock())
    probe.note_direct(0.1)
    probe.note_direct(0.001)
    assert probe.took == pytest.approx(TOOK_DECAY * 0.1)
    probe.note_direct(0.5)
    assert probe.took == 0.5


def test_a_write_probe_ignores_no_duration() -> None:
    # a writer never notes durations: its measurement stands exactly
    # PROBE_INTERVAL, slow or fast
    clock = Clock()
    probe = write_probe(clock)
    probe.measured(FAST_STORE * 2)
    clock.now += PROBE_INTERVAL * 0.99
    assert probe.verdict() is False
    clock.now = probe.probed + PROBE_INTERVAL
    assert probe.verdict() is None


@pytest.mark.parametrize(
    ("direct_reads", "verdict"),
    [
        pytest.param(0, True, id="none-yet"),
        pytest.param(PROBE_READS - 1, True, id="one-short"),
        pytest.param(PROBE_READS, None, id="enough"),
    ],
)
def test_chunk_reads_probe_only_after_enough_direct_reads(
    direct_reads: int, verdict: bool | None
) -> None:
    # the measurement is long past its interval: only the count keeps it
    clock = Clock()
    probe = chunk_probe(clock)
    probe.note_pipelined(0.01, FAST_FILE / 2)
    clock.now += 10 * PROBE_INTERVAL
    for _ in range(direct_reads):
        probe.note_direct(0.01)
    assert probe.direct_reads == direct_reads
    assert probe.verdict() is verdict


def test_shard_reads_do_not_count_direct_reads() -> None:
    clock = Clock()
    probe = shard_probe(clock)
    probe.note_pipelined(0.01, FAST_CALL / 2)
    clock.now += 10 * PROBE_INTERVAL
    assert probe.verdict() is None


def test_a_pipelined_read_starts_the_count_afresh() -> None:
    clock = Clock()
    probe = chunk_probe(clock)
    probe.note_pipelined(0.01, FAST_FILE / 2)
    for _ in range(PROBE_READS):
        probe.note_direct(0.01)
    probe.note_pipelined(0.01, FAST_FILE / 2)
    assert probe.direct_reads == 0
    assert probe.probed == clock.now


def test_a_pipelined_read_that_timed_no_file_keeps_the_measurement() -> None:
    clock = Clock()
    probe = chunk_probe(clock)
    probe.note_pipelined(0.01, FAST_FILE / 2)
    probed = probe.probed
    clock.now += 0.5
    probe.note_pipelined(0.3, float("inf"))
    assert probe.latency == FAST_FILE / 2
    assert probe.probed == probed
    assert probe.took == 0.3
    assert probe.direct_reads == 0


# -- a direct read that found the files slow ---------------------------------------------


def test_found_slow_asks_for_a_measurement() -> None:
    clock = Clock()
    probe = shard_probe(clock)
    probe.measured(FAST_CALL / 2)
    probe.found_slow()
    assert probe.latency is None
    assert probe.verdict() is None


@pytest.mark.parametrize(
    ("after", "verdict"),
    [
        pytest.param(SLOW_HOLD * 0.5, False, id="held"),
        pytest.param(SLOW_HOLD, True, id="released"),
    ],
)
def test_found_slow_holds_chunk_reads_on_the_io_threads(after: float, verdict: bool | None) -> None:
    # a fast measurement within the hold (a few cached blocks of a cold
    # array) does not bring the reads back to the compute threads
    clock = Clock()
    probe = chunk_probe(clock)
    probe.found_slow(hold=SLOW_HOLD)
    clock.now += after
    probe.note_pipelined(0.01, FAST_FILE / 2)
    assert probe.verdict() is verdict


def test_the_last_measurement_decides_the_request_count_however_old() -> None:
    clock = Clock()
    probe = shard_probe(clock)
    probe.measured(FAST_CALL / 2)
    clock.now += 100 * PROBE_INTERVAL
    assert probe.verdict() is None
    assert probe.seen_fast()


# -- a store's measurement lent to a new reader's probe -----------------------------------

ROOT = b"/data/store/"


def measured_store(clock: Clock, latency: float) -> StoreLatencies:
    """A store whose files a reader measured at ``latency`` just now."""
    stores = StoreLatencies()
    first = chunk_probe(clock)
    first.note_pipelined(0.01, latency)
    stores.note(ROOT, first)
    return stores


@pytest.mark.parametrize(
    ("latency", "verdict"),
    [
        pytest.param(FAST_FILE / 2, True, id="fast"),
        pytest.param(FAST_FILE * 2, False, id="slow"),
    ],
)
def test_a_new_probe_takes_its_stores_measurement(latency: float, verdict: bool) -> None:
    clock = Clock()
    stores = measured_store(clock, latency)
    probe = chunk_probe(clock)
    stores.lend(ROOT, probe)
    assert probe.verdict() is verdict


@pytest.mark.parametrize(
    ("age", "verdict"),
    [
        pytest.param(PROBE_INTERVAL * 0.5, True, id="standing"),
        pytest.param(PROBE_INTERVAL, None, id="too-old-to-lend"),
    ],
)
def test_a_lent_measurement_stands_for_its_age_alone(age: float, verdict: bool | None) -> None:
    # lent at half its interval, it lapses with the interval: a new probe's
    # count of direct reads does not keep an old measurement standing
    clock = Clock()
    stores = measured_store(clock, FAST_FILE / 2)
    clock.now += age
    probe = chunk_probe(clock)
    stores.lend(ROOT, probe)
    assert probe.verdict() is verdict
    clock.now += PROBE_INTERVAL * 0.5
    assert probe.verdict() is None


def test_a_probe_keeps_its_own_measurement() -> None:
    clock = Clock()
    stores = measured_store(clock, FAST_FILE / 2)
    probe = chunk_probe(clock)
    probe.measured(FAST_FILE * 2)
    stores.lend(ROOT, probe)
    assert probe.verdict() is False


def test_a_held_probe_takes_no_measurement() -> None:
    clock = Clock()
    stores = measured_store(clock, FAST_FILE / 2)
    probe = chunk_probe(clock)
    probe.found_slow(hold=SLOW_HOLD)
    stores.lend(ROOT, probe)
    assert probe.latency is None
    assert not probe.direct()


def test_other_roots_and_forgotten_roots_lend_nothing() -> None:
    clock = Clock()
    stores = measured_store(clock, FAST_FILE / 2)
    other = chunk_probe(clock)
    stores.lend(b"/data/other/", other)
    assert other.verdict() is None
    stores.forget(ROOT)
    probe = chunk_probe(clock)
    stores.lend(ROOT, probe)
    assert probe.verdict() is None


def test_a_probe_with_nothing_measured_notes_nothing() -> None:
    stores = StoreLatencies()
    stores.note(ROOT, chunk_probe(Clock()))
    assert stores.seen == {}


def test_the_oldest_root_goes_past_the_capacity() -> None:
    clock = Clock()
    stores = StoreLatencies(capacity=2)
    probe = chunk_probe(clock)
    probe.measured(FAST_FILE / 2)
    for root in (b"/a/", b"/b/", b"/a/", b"/c/"):  # /a/ noted again: /b/ is the oldest
        stores.note(root, probe)
    assert list(stores.seen) == [b"/a/", b"/c/"]


# -- weighing large files ------------------------------------------------------------------


def test_a_file_counts_once_more_per_file_bytes() -> None:
    # 4 files of 2 x FILE_BYTES each: 4 + 8 "files" in 12 ms
    assert per_file_latency(12e-3, 4, 8 * FILE_BYTES) == pytest.approx(1e-3)


def test_shard_calls_count_whole_file_bytes_only() -> None:
    # 3 calls reading 1.5 x FILE_BYTES: one more call, not one and a half
    assert per_call_latency(4e-3, 3, FILE_BYTES + FILE_BYTES // 2) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("seconds", "decoded", "slow"),
    [
        pytest.param(float("inf"), 0, False, id="no-file-read"),
        pytest.param(SLOW_DIRECT, 0, False, id="at-the-threshold"),
        pytest.param(SLOW_DIRECT * 1.01, 0, True, id="above"),
        pytest.param(SLOW_DIRECT * 1.5, DECODE_BYTES, False, id="large-chunk"),
        pytest.param(SLOW_DIRECT * 2.01, DECODE_BYTES, True, id="large-chunk-above"),
    ],
)
def test_slow_direct(seconds: float, decoded: int, slow: bool) -> None:
    assert slow_direct(seconds, decoded) is slow


# -- the fastest timing of a pipelined read -------------------------------------------------


def test_fastest_keeps_the_least_of_what_threads_note() -> None:
    fastest = Fastest()
    assert fastest.seconds == float("inf")
    samples = np.random.default_rng(7).uniform(1e-6, 1e-3, size=(4, 200))
    threads = [
        threading.Thread(target=lambda row=row: [fastest.note(x) for x in row]) for row in samples
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fastest.seconds == samples.min()


# -- the store roots' measurements across a fork --------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
# the child only takes the lock and exits: the pool threads it lacks do not matter
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize(
    "module", [pytest.param("io", id="chunk-files"), pytest.param("shard", id="shard-calls")]
)
def test_store_latencies_lock_is_free_in_a_child_forked_while_it_was_held(module: str) -> None:
    """A child forked while a thread of the parent held a `StoreLatencies`
    lock can still note and lend (the at-fork hook gives every one a new
    lock); without it the child would wait forever."""
    from zarr_fused.io.probe import STORE_LATENCIES
    from zarr_fused.shard.pipelined import SHARD_CALLS

    latencies = STORE_LATENCIES if module == "io" else SHARD_CALLS
    with latencies.lock:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if the lock is free
            os._exit(0 if latencies.lock.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
