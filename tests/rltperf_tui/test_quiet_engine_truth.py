"""A real engine that stops stepping: the recording's summary and the probe's Prometheus
gauges against the wall clock and the loop's own busy time.

Before the window was wall time, the summary divided by the span of the steps (so the
quiet seconds vanished: idle and tokens/s read as if the engine were busy throughout)
and the gauges froze at their last busy value.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from tests.conftest import LOOP_ENGINE, run_rltperf, start_engine

pytestmark = pytest.mark.slow


def _gauge(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in the scrape"
    return float(m.group(1))


def test_recording_and_gauges_of_an_engine_that_goes_quiet(tmp_path):
    truth = tmp_path / "truth.json"
    rec = tmp_path / "quiet.rltrec"
    eng = start_engine(
        [str(LOOP_ENGINE), "--duration", "14", "--steps", "150", "--start-delay", "1.5", "--rows", "16",
         "--out", str(truth), "--prometheus-port", "0", "--snapshots", str(tmp_path), "--no-warm"]
    )  # fmt: skip
    try:
        prom = None
        assert eng.proc.stdout is not None
        line = eng.proc.stdout.readline()
        m = re.search(r"PROMETHEUS (\S+)", line)
        assert m, line
        prom = m.group(1)
        t0 = time.monotonic()
        out = run_rltperf("record", eng.target, "--duration", "7", "-o", str(rec), "-q")
        recorded_s = time.monotonic() - t0
        assert out.returncode == 0, out.stderr
        scrape = urllib.request.urlopen(f"http://{prom}/metrics", timeout=10).read().decode()
    finally:
        eng.proc.wait(60)
    loop = json.loads(truth.read_text())
    assert len(loop["busy_ns"]) == 150
    busy_s = sum(loop["busy_ns"]) / 1e9
    summ = json.loads(run_rltperf("summary", str(rec), "--json").stdout)
    assert summ["steps"] == 150
    # the recording's wall time is the time it recorded, not the ~1 s the steps spanned.
    # Truth: the recorder's own clock from connect to close ("over X s"); the process's
    # start is not in it (under a loaded machine it took 5.3 s of a 12.3 s run), and the
    # recording's newest record (a heartbeat, about one a second) may be up to ~1 s older
    # than the close
    m = re.search(r"over ([0-9.]+) s", out.stdout)
    assert m, out.stdout
    elapsed = float(m.group(1))
    assert 7.0 <= elapsed < recorded_s
    assert elapsed - 1.5 < summ["wall_s"] <= elapsed + 0.05, (summ["wall_s"], elapsed)
    idle_truth = 1 - busy_s / summ["wall_s"]
    assert summ["idle_fraction"] == pytest.approx(idle_truth, abs=0.01)
    assert summ["tokens_per_s"] == pytest.approx(150 * 16 / summ["wall_s"], rel=0.01)
    assert summ["idle_fraction"] > 0.7
    # the gauges, scraped ~5 s after the last step: 10 s window, at most busy_s busy in it
    idle = _gauge(scrape, "rltperf_device_idle_ratio")
    assert 1 - busy_s / 10 - 0.01 <= idle <= 1.0, (idle, busy_s)
    assert idle > 0.7
