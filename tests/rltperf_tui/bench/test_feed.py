"""What the capture benches read (``rltperf_tui/bench/feed.py``), against a real probe.

The engine's own step ids are the truth: the probe numbers its steps one by one, so a
history that holds every step record it was sent has no hole in its ids.  Before the
fix, ``Feed.read(until=...)`` returned as soon as the capture's answer came and dropped
the step records after it in the same batch: a hole right after each capture's answer,
which ``rltperf bench capture --vllm-url`` counted as a stall of the engine (gaps of
355-808 ms after the bundle was sealed, on a server that had none).
"""

from __future__ import annotations

import itertools
from typing import Any

from engine_adapters.definitions.records import CaptureDone, CaptureFailed, Refused, Stats
from engine_adapters.monitor.tcp import ProbeAdapter
from rltperf_tui.bench.feed import Feed
from tests.conftest import EngineProc


def test_a_capture_answer_leaves_no_hole_in_the_step_history(loop_engine: EngineProc) -> None:
    feed = Feed(ProbeAdapter(loop_engine.target, reconnect=False).connect(), None)
    try:
        feed.read(1.0)
        answers: list[Any] = []
        for k in range(4):
            cid = feed.session.request_capture(2, "ops", f"feed{k}")

            def answer(r: Any, cid: str = cid) -> bool:
                return isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid

            answers.append(feed.read(60.0, answer))
            feed.read(0.3)
        stats: list[Stats] = []
        while not stats:  # the heartbeat (about 1 Hz) counts what the probe dropped (cumulative)
            stats = [r for r in feed.session.read(0.5) if isinstance(r, Stats)]
    finally:
        feed.session.close()
    assert all(isinstance(a, CaptureDone) for a in answers), answers
    # the probe dropped nothing for this reader: every step was sent
    assert stats[-1].ring_dropped == 0 and stats[-1].sub_dropped == 0, stats[-1]
    ids = [r.step_id for r in feed.history]
    holes = [(a, b) for a, b in itertools.pairwise(ids) if b != a + 1]
    assert len(ids) > 100 and not holes, f"{len(ids)} steps; holes after a capture's answer: {holes}"
