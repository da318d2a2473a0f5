"""The monitor's own wait for a CPU (``rltperf_tui.live.own_wait``), against the wall
clock: a thread that never sleeps, pinned to one core beside two busy processes pinned
there too, spends its wall time either running (its own CPU clock) or waiting; and the
top bar that shows it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from rltperf_tui.live.own_wait import SHOW_WAIT_S, SHOWN_EVERY_S, OwnWait, main_thread_wait_s
from rltperf_tui.tui.widgets.status_bar import StatusBar, StatusInfo

pytestmark = pytest.mark.skipif(main_thread_wait_s() is None, reason="needs Linux /proc/self/schedstat")


def test_the_wait_is_the_wall_time_the_spinning_thread_did_not_run() -> None:
    """Run in a thread of its own whose schedstat is read the same way (the main thread of
    a pytest worker may be pinned or busy otherwise); the truth: wall - thread CPU."""
    out: dict[str, float] = {}

    def spin() -> None:
        tid = threading.get_native_id()
        w = OwnWait(read=lambda: main_thread_wait_s(f"/proc/self/task/{tid}/schedstat"))
        os.sched_setaffinity(0, {0})  # this thread only
        w.sample()
        c0, t0 = time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < 1.5:
            pass
        out["waited"] = w.sample() or 0.0
        out["wall"], out["cpu"] = time.monotonic() - t0, time.thread_time() - c0

    hogs = [
        subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"]) for _ in range(2)
    ]
    try:
        time.sleep(0.3)  # both spinning
        t = threading.Thread(target=spin)
        t.start()
        t.join(30)
    finally:
        for h in hogs:
            h.kill()
            h.wait(10)
    truth = out["wall"] - out["cpu"]
    # three runnable on one core: this thread runs about a third of the time
    assert truth > 0.5, out
    assert out["waited"] == pytest.approx(truth, abs=0.15), out


def test_the_span_keeps_the_last_seconds_only() -> None:
    now = [0.0]
    counter = [0.0]
    w = OwnWait(span_s=10.0, read=lambda: counter[0], clock=lambda: now[0])
    assert w.sample() == 0.0
    for _ in range(30):  # 0.2 s of wait a second for 30 s
        now[0] += 1.0
        counter[0] += 0.2
        got = w.sample()
    assert got == pytest.approx(2.0)  # the last 10 s, not 6 s since the start
    now[0] += 1.0  # a quiet second
    assert w.sample() == pytest.approx(1.8)
    assert OwnWait(read=lambda: None).sample() is None  # no schedstat: nothing said


def test_the_bar_says_it_only_from_the_threshold() -> None:
    bar = StatusBar()
    bar.info = StatusInfo(cpu_wait_s=2.4)
    text = "".join(t for t, _ in bar.rows()[0])
    assert "late: CPU wait 2.4 s in 10 s" in text, text
    bar.info = StatusInfo()
    assert "late" not in "".join(t for t, _ in bar.rows()[0])
    now = [0.0]
    counter = [0.0]
    w = OwnWait(read=lambda: counter[0], clock=lambda: now[0])
    w.shown()
    now[0], counter[0] = 10.0, SHOW_WAIT_S - 0.01
    assert w.shown() is None
    now[0], counter[0] = 11.0, SHOW_WAIT_S + 0.5
    assert w.shown() == round(SHOW_WAIT_S + 0.5, 1)


def test_the_bar_reads_the_counter_at_most_once_a_second() -> None:
    """The status bar asks at every render tick; ``shown`` reads ``/proc`` once per
    ``SHOWN_EVERY_S`` and answers as before in between, then takes the new reading."""
    now = [0.0]
    counter = [0.0]
    reads = []

    def read() -> float:
        reads.append(now[0])
        return counter[0]

    w = OwnWait(read=read, clock=lambda: now[0])
    assert w.shown() is None and reads == [0.0]
    counter[0] = 3.0  # a long wait, not yet read
    for t in (0.5, 0.9):  # render ticks within the second
        now[0] = t
        assert w.shown() is None
    assert reads == [0.0]
    now[0] = SHOWN_EVERY_S
    assert w.shown() == 3.0 and reads == [0.0, SHOWN_EVERY_S]
    now[0] = SHOWN_EVERY_S + 0.5
    counter[0] = 0.0  # (a counter never falls: only to show the answer is not read again)
    assert w.shown() == 3.0 and len(reads) == 2
