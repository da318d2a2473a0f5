"""``--auto``, ``attach --jsonl`` and ``bench ingest --metrics-target`` against a real
vLLM server (the shared ``vllm_server`` of ``vllm_servers.py``; the rltperf plugin's
probe in it too), under a real closed-loop load."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from vllm_fixtures import Load, Server

from engine_adapters.monitor.discover import PortRange, scan
from rltperf_tui.commands.headless import EXTRA_KEYS
from tests.conftest import ROOT, run_rltperf

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_auto_finds_vllm_and_its_probe_not_a_plain_http_server(vllm_server: Server) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    plain = srv.server_address[1]
    probe_port = int(vllm_server.probe.rsplit(":", 1)[1])
    try:
        lo = min(vllm_server.port, plain) - 3
        hi = max(vllm_server.port, plain) + 3
        if hi - lo >= 1024:  # the two free ports are far apart: scan each
            res = [scan(PortRange("127.0.0.1", p - 3, p + 3)) for p in (vllm_server.port, plain)]
        else:
            res = [scan(PortRange("127.0.0.1", lo, hi))]
        res.append(scan(PortRange("127.0.0.1", probe_port, probe_port)))
    finally:
        srv.shutdown()
        srv.server_close()
    targets = {f.port: f for r in res for f in r.targets}
    others = {f.port: f for r in res for f in r.others}
    assert targets[vllm_server.port].target == f"vllm+http://127.0.0.1:{vllm_server.port}"
    assert (
        targets[vllm_server.port].what.startswith("vLLM 0.")
        and "serving tiny" in targets[vllm_server.port].what
    )
    assert targets[probe_port].kind == "probe" and targets[probe_port].target == f"tcp://{vllm_server.probe}"
    assert plain not in targets and "not vLLM" in others[plain].what
    # the command line: both listed, attachable as printed
    p = run_rltperf("attach", "--auto", f"{vllm_server.port}", "--auto", f"{probe_port}", "--list")
    assert p.returncode == 0, p.stderr
    assert [ln.split()[0] for ln in p.stdout.splitlines()] == [
        f"vllm+http://127.0.0.1:{vllm_server.port}",
        f"tcp://{vllm_server.probe}",
    ]


def test_jsonl_stream_of_a_loaded_vllm_server(vllm_server: Server, tmp_path: Path) -> None:
    target = f"vllm+http://127.0.0.1:{vllm_server.port}"
    rec = tmp_path / "v.rltrec"
    r = run_rltperf("record", target, "--duration", "2.5", "-q", "-o", str(rec))
    assert r.returncode == 0, r.stderr
    s = run_rltperf("summary", str(rec), "--json")
    assert s.returncode == 0, s.stderr
    keys = set(json.loads(s.stdout))
    window = 60.0  # longer than the load: the last objects' window holds all of it
    p = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "attach", target, "--jsonl", "--window", str(window)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert p.stdout is not None
    stdout = p.stdout
    objs: list[dict] = []
    reader = threading.Thread(target=lambda: objs.extend(json.loads(line) for line in stdout), daemon=True)
    reader.start()

    def total(o: dict) -> float | None:
        m = o.get("metrics")  # (null, not absent, before the first sample: SUMMARY_KEYS)
        return m["tokens_per_s"] * m["span_s"] if m and m["tokens_per_s"] is not None else None

    # The load starts once the stream has a first sample (two scrapes), and the stream is
    # stopped once its window has stopped growing for three more samples: on a busy
    # machine the monitor's start-up and its scrapes can each lag by seconds, and tokens
    # outside every sample are in no window.
    deadline = time.monotonic() + 60
    while not any(o.get("metrics") for o in list(objs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    load = Load(vllm_server.url, conc=4, max_tokens=32)
    load.run(8.0)
    client_tokens = sum(x.tokens for x in load.results)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        done = [o for o in list(objs) if total(o) is not None]
        last = done[-1] if done else None
        if last is not None:
            same = [o for o in done if total(o) == total(last)]
            if last["metrics"]["samples"] - same[0]["metrics"]["samples"] >= 3:
                break
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    p.wait(60)  # (not communicate(): the reader thread owns stdout)
    reader.join(10)
    err = p.stderr.read() if p.stderr else ""
    assert p.returncode == 0 and "Traceback" not in err, err
    assert not load.errors, load.errors[:3]
    assert len(objs) >= 3
    for o in objs:
        assert set(o) - set(EXTRA_KEYS) == keys, set(o) ^ keys
        assert o["target"] == target
    assert objs[-1]["reason"] == "interrupted"
    # tokens/s against what the clients received (usage.completion_tokens): after the
    # load, the window's rate times its span is every token generated during it
    m = objs[-1]["metrics"]
    assert m["tokens_per_s"] * m["span_s"] == pytest.approx(client_tokens, rel=0.02), (m, client_tokens)
    rates = [o["metrics"]["tokens_per_s"] for o in objs if o["metrics"] and o["metrics"]["tokens_per_s"]]
    assert max(rates) > 0


def test_bench_ingest_states_the_metrics_only_cpu(vllm_server: Server) -> None:
    from rltperf_tui.bench.metrics_ingest import metrics_only_cost

    m = metrics_only_cost(f"vllm+http://127.0.0.1:{vllm_server.port}", duration=4.0, hz=2.0)
    assert m["state"] == "connected" and m["scrape_errors"] == 0
    # at most 2 Hz over 4 s; fewer when a busy server answers /metrics late
    assert 2 <= m["scrapes"] <= 10, m
    assert 0 < m["cpu_fraction"] < 1
    one = m["one_scrape"]
    assert one["parse_cpu_ms"] > 0 and one["vllm_lines"] > 0 and one["body_bytes"] > 10_000
