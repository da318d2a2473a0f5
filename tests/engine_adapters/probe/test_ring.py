"""The step ring's reader API, and a capture as a step observer (no slot changes class).

The ring is the real ``StepRing`` the probe uses; the capture runs through a real probe,
a real socket client and torch's profiler.
"""

from __future__ import annotations

import time

from engine_adapters.definitions.records import FLAG_PROFILED, CaptureDone, CaptureFailed, Refused, StepRecord
from engine_adapters.monitor.tcp import ProbeAdapter
from engine_adapters.probe.ring import ObservedStep, StepRing, StepSlot


def _steps(ring: StepRing, n: int, kind: str = "decode") -> None:
    for _ in range(n):
        with ring.begin(kind, 1, 1) as st:
            st.mark("forward")


def test_read_since_returns_what_is_intact_and_counts_what_the_ring_went_past():
    ring = StepRing(16)
    _steps(ring, 40)
    got, cursor, lost = ring.read_since(0, lambda sl, sid: (sid, sl.step_id, sl.kind))
    assert cursor == 40 and lost == 40 - 15
    assert [g[0] for g in got] == list(range(25, 40)) and all(a == b for a, b, _ in got)
    assert ring.read_since(cursor, lambda sl, sid: sid) == ([], 40, 0)


def test_a_slot_overwritten_while_it_is_read_is_lost_not_corrupted():
    ring = StepRing(16)
    _steps(ring, 10)
    calls = []

    def convert(sl: StepSlot, sid: int) -> int:
        if not calls:
            _steps(ring, 16, "late")  # the engine laps the reader during the copy
        calls.append(sid)
        return sid

    got, cursor, lost = ring.read_since(0, convert)
    assert got == [] and cursor == 10 and lost == 10 and calls == list(range(10))
    got, cursor, lost = ring.read_since(cursor, lambda sl, sid: (sid, sl.kind))
    assert cursor == 26 and lost == 1 and got == [(i, "late") for i in range(11, 26)]


def test_in_step_since_is_the_open_steps_start():
    ring = StepRing(16)
    assert ring.in_step_since() == 0
    st = ring.begin("decode", 1, 1)
    assert ring.in_step_since() == st.start > 0
    st.finish()
    assert ring.in_step_since() == 0 and ring.w == 1


def test_a_capture_observes_steps_without_changing_any_slots_class(tmp_path):
    import torch

    from engine_adapters.probe import Probe

    probe = Probe("127.0.0.1:0", {"name": "ring", "random_weights": True}, snapshot_root=str(tmp_path),
                  sample_devices=False)  # fmt: skip
    ring = probe.ring
    x, w = torch.randn(16, 64), torch.randn(64, 64)
    seen: list[type] = []
    classes_ok = True
    s = ProbeAdapter(f"tcp://{probe.address}", reconnect=False).connect()
    recs: list[StepRecord] = []
    done = None
    step = probe.step  # bound before the capture is armed, as a hot loop would
    try:
        cid = s.request_capture(3, "ops")
        deadline = time.monotonic() + 120
        while done is None and time.monotonic() < deadline:
            with step("decode", 4, 4) as st:
                seen.append(type(st))
                st.mark("forward")
                (x @ w).relu()
                with st.stage("sample"):
                    x.sum()
                # set late, as vLLM's hooks do
                st.kind = "prefill" if isinstance(st, ObservedStep) else "decode"
            classes_ok = classes_ok and all(type(sl) is StepSlot for sl in ring.slots)
            for r in s.read(0.005):
                if isinstance(r, StepRecord):
                    recs.append(r)
                elif isinstance(r, (CaptureDone, CaptureFailed, Refused)) and r.capture_id == cid:
                    done = r
        for _ in range(5):  # after the window: plain slots again, straight from the ring
            with probe.step() as st:
                assert type(st) is StepSlot and st is ring.slots[st.step_id & ring.mask]
        assert ring.observer is None
        t_end = time.monotonic() + 0.5  # control replies overtake data: read the last steps
        while time.monotonic() < t_end:
            recs += [r for r in s.read(0.05) if isinstance(r, StepRecord)]
    finally:
        s.close()
        probe.close()
    assert isinstance(done, CaptureDone) and done.steps_captured == 3, done
    assert classes_ok
    assert seen.count(ObservedStep) == 4  # the profiler's warm-up step and the 3 captured
    profiled = [r for r in recs if r.flags & FLAG_PROFILED]
    assert len(profiled) == 4
    names = probe.stage_names
    for r in profiled:  # the marks and stages went into the ring slot; the late kind too
        assert r.kind == "prefill"
        assert r.stage_ns[names.index("forward")] > 0 and r.stage_ns[names.index("sample")] > 0
    assert all(r.kind == "decode" for r in recs if not r.flags & FLAG_PROFILED)


def test_a_read_slot_lets_go_of_its_steps_facts():
    """Every slot once held its last step's facts (``set``'s dict and the lists in it)
    until the ring came round: in the reference engine ~11 MB held for nothing, the
    engine's RSS creeping for its first 50-75 s.  Once a step is read intact, its record
    holds them and the slot none; the steps not read yet keep theirs.  (A reader more
    than half a ring behind leaves them: the engine could reuse the slot meanwhile.)"""
    ring = StepRing(64)
    for i in range(12):
        with ring.begin("decode", 1, 1) as st:
            st.set(exit_hist=[i, 1], busy_ns=i)
    got, cursor, lost = ring.read_since(0, lambda sl, sid: dict(sl.extras or {}))
    assert cursor == 12 and lost == 0 and [g["exit_hist"] for g in got] == [[i, 1] for i in range(12)]
    assert all(sl.extras is None for sl in ring.slots)
    for i in range(12, 20):  # the engine goes on; nothing read yet
        with ring.begin("decode", 1, 1) as st:
            st.set(busy_ns=i)
    assert sorted(sl.extras["busy_ns"] for sl in ring.slots if sl.extras) == list(range(12, 20))
