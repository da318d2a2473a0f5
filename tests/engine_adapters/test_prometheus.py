"""Fleet export: a real engine with ``--prometheus-port``, scraped over HTTP, parsed with
prometheus_client's own parser, and checked against ``rltperf summary`` of a recording of
the same steps."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LOOP_ENGINE, start_engine

STEPS = 300


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(s: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return s[name][tuple(sorted(labels.items()))]


@pytest.mark.slow
def test_prometheus_endpoint_parses_and_agrees_with_summary(tmp_path: Path) -> None:
    # A calibration cache of our own: the probe's ceiling (and so MBU) comes from it.
    from engine_adapters.probe.contract import cpu_model

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "calibration.json").write_text(
        json.dumps(
            {
                f"{socket.gethostname()}|{cpu_model()}": {
                    "copy_gbps": 20.0,
                    "matmul_gflops": 50.0,
                    "dtype": "float32",
                    "matmul_gflops_by_dtype": {"float32": 50.0},
                }
            }
        )
    )
    env = {"RLTPERF_CACHE": str(cache)}
    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "60",
            "--snapshots",
            str(tmp_path / "snaps"),
            "--prometheus-port",
            "0",
            "--start-delay",
            "2",
            "--steps",
            str(STEPS),
            "--sleep-ms",
            "1",
            "--requests-every",
            "8",
            "--loops",
            "4",
        ],
        env=env,
    )
    rec = tmp_path / "run.rltrec"
    try:
        assert eng.proc.stdout is not None
        line = eng.proc.stdout.readline()
        assert line.startswith("PROMETHEUS "), line
        prom = line.split()[1]
        # record every step: the recorder attaches during the engine's start delay, and
        # stops once all STEPS steps (and the requests they finish) have arrived
        from engine_adapters.recording import RecordingWriter
        from engine_adapters.records import StepRecord
        from engine_adapters.registry import adapter_for

        sess = adapter_for(eng.target, reconnect=False).connect()
        steps = 0
        with RecordingWriter(rec, target=eng.target) as w:
            deadline = time.monotonic() + 60
            while steps < STEPS and time.monotonic() < deadline:
                recs = sess.read(0.1)
                w.write(recs)
                steps += sum(isinstance(r, StepRecord) for r in recs)
            w.write(sess.read(0.3))
        sess.close()
        text = urllib.request.urlopen(f"http://{prom}/metrics", timeout=10).read().decode()
    finally:
        eng.stop()
    s = _samples(text)  # prometheus_client's parser: raises on anything malformed
    # what `rltperf summary FILE --json` prints
    from rltperf_tui.analysis.summary import load_recording, summarize

    summ = summarize(load_recording(rec)[0])

    assert summ["steps"] == STEPS, "the recording must hold every step the engine ran"
    n = _one(s, "rltperf_step_duration_seconds_count", kind="decode")
    assert n == STEPS
    assert _one(s, "rltperf_step_gap_seconds_count") == STEPS - 1
    # the histogram's P50 bucket holds summary's P50
    buckets = sorted((float(dict(k)["le"]), v) for k, v in s["rltperf_step_duration_seconds_bucket"].items())
    le50 = next(le for le, c in buckets if c >= n / 2)
    prev = max([le for le, c in buckets if le < le50], default=0.0)
    assert prev <= summ["step_ms"]["p50"] / 1e3 <= le50
    tokens = _one(s, "rltperf_output_tokens_total")
    assert tokens == pytest.approx(
        summ["tokens_per_s"] * summ["wall_s"], rel=1e-5
    )  # wall_s is rounded to 1 us
    # The gauges cover the last 10 s of wall time up to the scrape (engine_adapters.figures),
    # the summary the recording's wall time: the same busy time and bytes over two windows.
    # The gauge's window must be the one it claims: from at least the recording's span
    # (the probe started before the recorder attached, the scrape came after it left)
    # to at most 10 s, the same for both gauges (one window per scrape).
    assert summ["mbu"] is not None
    busy_s = (1 - summ["idle_fraction"]) * summ["baseline_s"]
    gauge_idle = _one(s, "rltperf_device_idle_ratio")
    gauge_s = busy_s / (1 - gauge_idle)
    assert summ["baseline_s"] - 0.01 <= gauge_s <= 10.0 + 1e-6, (gauge_s, summ["baseline_s"])
    nbytes = summ["mbu"] * summ["baseline_s"] * 20e9
    gauge_mbu = _one(s, "rltperf_model_bandwidth_utilization_ratio")
    assert nbytes / (gauge_mbu * 20e9) == pytest.approx(gauge_s, rel=1e-6)
    assert list(s["rltperf_peak_memory_bandwidth_bytes_per_second"].values()) == [20e9]
    assert _one(s, "rltperf_requests_total", status="ok") == summ["requests"]["ok"] > 0
    assert _one(s, "rltperf_time_to_first_token_seconds_count") == summ["requests"]["ok"]
    depths = {int(dict(k)["depth"]): v for k, v in s["rltperf_exit_depth_tokens_total"].items()}
    assert [depths.get(d, 0.0) for d in range(1, len(summ["exit_hist"]) + 1)] == summ["exit_hist"]
    assert sum(depths.values()) == tokens
    assert (
        _one(
            s,
            "rltperf_engine_info",
            engine="test-loop",
            model="mlp-256",
            dtype="float32",
            device="cpu",
            random_weights="true",
        )
        == 1.0
    )
    assert _one(s, "rltperf_probe_dropped_records_total") == 0
    assert _one(s, "rltperf_profiled_steps_total") == 0
    for name in s:  # conventions: rltperf_ prefix; counters end in _total
        assert name.startswith("rltperf_"), name


@pytest.mark.slow
def test_prometheus_counts_captures(tmp_path: Path) -> None:
    from engine_adapters.records import CaptureDone
    from engine_adapters.registry import adapter_for

    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "60",
            "--snapshots",
            str(tmp_path / "snaps"),
            "--prometheus-port",
            "0",
        ]
    )
    try:
        assert eng.proc.stdout is not None
        prom = eng.proc.stdout.readline().split()[1]
        sess = adapter_for(eng.target, reconnect=False).connect()
        try:
            cid = sess.request_capture(3, "ops")
            deadline = time.monotonic() + 60
            done = False
            while not done and time.monotonic() < deadline:
                done = any(isinstance(r, CaptureDone) and r.capture_id == cid for r in sess.read(0.2))
            assert done
        finally:
            sess.close()
        time.sleep(0.5)
        s = _samples(urllib.request.urlopen(f"http://{prom}/metrics", timeout=10).read().decode())
    finally:
        eng.stop()
    assert _one(s, "rltperf_captures_total", mode="ops", result="saved") == 1
    assert _one(s, "rltperf_profiled_steps_total") >= 3
