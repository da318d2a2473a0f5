"""``--inject-stall 50@25``: the monitor's idle fraction over a recording rises as predicted.

One engine run, recorded through the real socket by ``rltperf record`` (another process,
as a monitor would be), alternates blocks without and with the injected stall, so that
the baseline is measured in the same run, right beside each stalled block (a shared
machine drifts).  For each stalled block the prediction is

    idle = 1 - (1 - idle_0) * (1 - stall_time / W)

with ``idle_0`` the idle fraction of the neighbouring blocks without stalls, ``W`` the
block's span and ``stall_time`` the stalls the engine injected in it (its own clock).
The aggregator's idle fraction of the stalled blocks, pooled, must match within
±1 percentage point, plus the share of those blocks and their neighbours that the
engine's thread spent waiting for a core (``run_queue_s``: other tenants' load, which
lands in a busy or an idle stretch and moves a block's fraction by that much at most),
up to 1 point more.  That share was ~0.05 pp on a quiet machine, 0.7-10 pp beside a
``-n 2`` run of the other tests (misses within ±0.4 pp) and 59 pp inside a whole
``.ci/run`` (a miss of +0.79 pp): uncapped, it would excuse anything there.

The prediction leaves out what a stall costs beyond its own time, and that is real: a
stalled step's prepare stage took ~0.3 ms longer and its forward ~1 ms longer (tiny
preset, 2 cores; ``stage_ns`` of stalled against other steps); CI, contended, once
missed by -1.76 and -1.30 pp with 20 ms every 10. Few large stalls (50 ms every 25
steps) weigh those after-effects 2.5 times less than 20 ms every 10 at the same share:
pooled misses of +0.2 to +0.35 pp here against +0.5 to +0.7 pp, and -0.1 to -0.3 pp
against -0.9 to +0.9 pp beside two flat-out engines. Each block's first step, which runs
across the switch, is in neither the block's window nor its stall count (counting its
stall while leaving it out of the window had made the prediction too high).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from engine_adapters.definitions.records import StepRecord
from engine_adapters.monitor.recording import read_all
from engine_adapters.probe import Probe
from engine_adapters.reference.engine import Engine, EngineConfig
from rltperf_tui.live.aggregator import TargetStats
from tests.conftest import run_queue_s

ROOT = Path(__file__).resolve().parents[3]
BLOCK_S = 0.5
BLOCKS = 25  # 12 stalled blocks between 13 without


def _measure(tmp: Path, attempt: int) -> tuple[float, float, float, list[str]]:
    eng = Engine(
        EngineConfig(preset="tiny", workload="closed:1,in=32,out=4000", inject_stall="50@25", kv_blocks=400)
    )
    assert eng.engine_info()["contract"]["inject_stall"].startswith(
        "50 ms host stall in the schedule stage every 25"
    )
    probe = Probe("127.0.0.1:0", eng.engine_info(), warm_profiler=False, sample_devices=False)
    eng.attach(probe)
    out = tmp / f"stall{attempt}.rltrec"
    rec = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "record", f"tcp://{probe.address}", "--duration", "120",
         "-o", str(out), "-q"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stall = eng.stall
    blocks = []
    pid, tid = os.getpid(), threading.get_native_id()  # the engine steps on this thread
    try:
        deadline = time.monotonic() + 30
        while probe._publisher._subs == [] and time.monotonic() < deadline:  # wait for the recorder
            time.sleep(0.05)
        eng.run(duration=0.5)  # settle
        for i in range(BLOCKS):
            on = i % 2 == 1
            eng.stall = stall if on else None
            eng.step()  # the step across the switch: in neither the window nor the stall count
            s0, st0, q0 = probe.steps_total, eng.stall_total_ns, run_queue_s(pid, tid)
            eng.run(duration=BLOCK_S)
            blocks.append((on, s0, probe.steps_total, eng.stall_total_ns - st0, run_queue_s(pid, tid) - q0))
        # a tail outside the blocks: the probe's Bye can overtake the last few step records
        eng.stall = None
        eng.run(duration=0.3)
    finally:
        probe.close()
        rec.communicate(timeout=30)
    _, recs = read_all(out)
    steps = {r.step_id: r for r in recs if isinstance(r, StepRecord)}
    res = []
    for on, a, b, stall_ns, queued in blocks:
        ts = TargetStats(grow=True)
        missing = [i for i in range(a, b) if i not in steps]
        assert not missing, (missing[:5], len(missing), max(steps), rec.returncode)
        ts.add([steps[i] for i in range(a, b)])
        w = ts.window(None)
        assert w.idle_fraction is not None
        res.append((on, w.idle_fraction, w.span_s, stall_ns / 1e9, queued))
    # stalled steps really carry the stall in their schedule stage
    sched = [s.stage_ns[0] for s in steps.values() if s.stage_ns]
    assert max(sched) >= 50e6
    obs = pred = span = excuse = 0.0
    lines = []
    for k in range(1, len(res) - 1):
        on, idle, sp, st, q = res[k]
        if not on:
            continue
        (_, i_a, sp_a, _, q_a), (_, i_b, sp_b, _, q_b) = res[k - 1], res[k + 1]
        idle0 = (i_a * sp_a + i_b * sp_b) / (sp_a + sp_b)
        p = 1 - (1 - idle0) * (1 - st / sp)
        # time the engine's thread waited for a core (other tenants' load) lands in a busy
        # or an idle stretch: it can move a block's idle fraction by its share, no more
        e = q / sp + (q_a + q_b) / (sp_a + sp_b)
        lines.append(f"idle0 {idle0:.4f} stall share {st / sp:.3f} observed {idle:.4f} predicted {p:.4f}"
                     f" queued {e:.4f}")  # fmt: skip
        obs += idle * sp
        pred += p * sp
        excuse += e * sp
        span += sp
    return obs / span, pred / span, excuse / span, lines


def test_inject_stall_raises_idle_fraction_as_predicted(tmp_path: Path) -> None:
    # A timing check on a shared machine: one more full measurement if the first misses.
    for attempt in range(2):
        obs, pred, queued, lines = _measure(tmp_path, attempt)
        print(
            f"attempt {attempt}: pooled observed {obs:.4f}, predicted {pred:.4f}, diff {100 * (obs - pred):+.2f} pp,"
            f" queued for a core {100 * queued:.2f} pp"
        )
        print("\n".join(lines))
        if abs(obs - pred) <= 0.01 + min(queued, 0.01):
            break
    assert pred > 0.05  # the stalls are a visible share of the time
    # 1 pp, plus what other tenants took from the engine's thread, up to 1 pp more
    assert abs(obs - pred) <= 0.01 + min(queued, 0.01), (obs, pred, queued)
