"""Fleet export: a real engine with ``--prometheus-port``, scraped over HTTP, parsed with
prometheus_client's own parser, and checked against ``rltperf summary`` of a recording of
the same steps."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import LOOP_ENGINE, LOOP_PACE, start_engine

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
    from engine_adapters.definitions.contract import cpu_model

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
            "--no-warm",  # never captured
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
        from engine_adapters.definitions.records import StepRecord
        from engine_adapters.monitor.recording import RecordingWriter
        from engine_adapters.monitor.registry import adapter_for

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
    # The gauges cover the last 10 s of wall time up to the scrape (engine_adapters.definitions.figures),
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
    # The window's step percentiles are exact, where histogram_quantile reads within a
    # bucket (a real Prometheus gave p50 3.7 ms for steps of 2.6 ms: the 2.5-5 ms bucket).
    # Every step is inside the gauge's window (above), so they are the recording's own:
    # numpy's linear percentile of its step times, and summary's figure.
    from engine_adapters.monitor.recording import read_all

    durs = np.array([(r.end_ns - r.start_ns) / 1e9 for r in read_all(rec)[1] if isinstance(r, StepRecord)])
    assert durs.size == STEPS
    for p in (50, 95, 99):
        g = _one(s, "rltperf_window_step_duration_seconds", percentile=str(p))
        assert g == pytest.approx(np.percentile(durs, p), rel=1e-9), p
        assert g == pytest.approx(summ["step_ms"][f"p{p}"] / 1e3, rel=1e-9), p
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
    from engine_adapters.definitions.records import CaptureDone
    from engine_adapters.monitor.registry import adapter_for

    eng = start_engine(
        [
            str(LOOP_ENGINE),
            "--duration",
            "60",
            *LOOP_PACE,
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


# -- where the metrics are served ------------------------------------------------------------


def _outward_ip() -> str | None:
    """A non-loopback address of this machine (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def _listening_hosts(port: int) -> set[str]:
    """IPv4 addresses a TCP socket listens on at ``port`` (from /proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            h, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                out.add(socket.inet_ntoa(bytes.fromhex(h)[::-1]))
    return out


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return True
    return False


def test_metrics_stay_on_loopback_when_the_probe_listens_everywhere() -> None:
    from engine_adapters.probe import Probe

    p = Probe("0.0.0.0:0", {"name": "x"}, warm_profiler=False, sample_devices=False, token="s3cret",
              prometheus_port=0)  # fmt: skip
    try:
        assert p._prometheus is not None
        host, port = p._prometheus.address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert _listening_hosts(int(port)) == {"127.0.0.1"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"rltperf_engine_info" in r.read()
        ip = _outward_ip()
        if ip is not None:
            probe_port = int(p.address.rsplit(":", 1)[1])
            assert not _refused(ip, probe_port), "the probe itself does listen off loopback"
            assert _refused(ip, int(port)), "the metrics port must not answer off loopback"
    finally:
        p.close()


def test_engine_help_says_where_metrics_are_served() -> None:
    from tests.conftest import run_rltperf

    out = run_rltperf("engine", "--help").stdout
    flat = " ".join(out.split())
    assert "--prometheus-listen HOST:PORT" in flat
    assert "127.0.0.1:P: loopback only" in flat and "no authentication" in flat


@pytest.mark.slow
def test_engine_metrics_bind_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    import selectors

    def metrics_line(extra: list[str]) -> str:
        eng = start_engine(
            ["-m", "rltperf_tui.cli", "engine", "--listen", "0.0.0.0:0", "--token", "s3cret",
             "--duration", "30", "--snapshots", str(tmp_path), "--no-warm-profiler", *extra]
        )  # fmt: skip
        try:
            assert eng.proc.stdout is not None
            sel = selectors.DefaultSelector()
            sel.register(eng.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if sel.select(0.5):
                    line = eng.proc.stdout.readline()
                    if "Prometheus metrics on" in line:
                        url = line.split("http://", 1)[1].split("/metrics")[0]
                        with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as r:
                            assert r.status == 200
                        return line
            raise AssertionError("no Prometheus line: " + eng.log_text()[-2000:])
        finally:
            eng.stop()

    line = metrics_line(["--prometheus-port", "0"])
    assert "http://127.0.0.1:" in line and "loopback only" in line
    line = metrics_line(["--prometheus-listen", "0.0.0.0:0"])
    assert "http://0.0.0.0:" in line and "no authentication" in line
