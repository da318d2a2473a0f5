"""Data parallelism on a real vLLM server: the tiny Ouro with ``--data-parallel-size 2``.

One server for the module (``multirank_servers.start``): two engine cores
(``EngineCore_DP0``, ``EngineCore_DP1``) behind one API server, each with its worker and
its own rltperf probe.  The tests check that both probes listen (base port, base + 1)
and are announced, that each engine's exits equal the tokens vLLM's own counter gives
that engine (its ``engine`` label), that ``/metrics`` of the server becomes one replica
(a column and a ``--jsonl`` line) per engine, that a capture holds both engines' traces
and ``report`` says "2/2 ranks" (vLLM's profiler: the server's target sums both engines),
that one engine's target (``?engine=1``) captures that engine through the plugin, and last, that faults at the recorder's LM-head call
and the step wrapper's stage mark stop recording only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import multirank_servers as M
from vllm_fixtures import ROOT, Collector, Load, Server, plugin_missing_reason, vllm_missing_reason

from engine_adapters.definitions.records import Bye, Hello, StepRecord
from engine_adapters.monitor.recording import read_all
from engine_adapters.monitor.tcp import ProbeAdapter
from engine_adapters.monitor.vllm.announced import find_all
from engine_adapters.monitor.vllm.engines import engine_targets
from engine_adapters.monitor.vllm.trace_files import trace_facts
from tests.conftest import finish_cli, run_cli

# on a worker of their own beside the shared servers' (multirank_servers.XDIST_GROUP)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group(M.XDIST_GROUP)]
_why = vllm_missing_reason() or plugin_missing_reason()
if _why:
    pytest.skip(_why, allow_module_level=True)


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = M.start(tmp_path_factory.mktemp("dp2"), ["--data-parallel-size", "2"])
    old = os.environ.get("RLTPERF_RUNTIME_DIR")
    os.environ["RLTPERF_RUNTIME_DIR"] = str(server.log_path.parent / "run")  # this server's announcements
    try:
        yield server
    finally:
        server.stop()
        if old is None:
            os.environ.pop("RLTPERF_RUNTIME_DIR", None)
        else:
            os.environ["RLTPERF_RUNTIME_DIR"] = old


def _probes(server: Server) -> list[str]:
    host, port = server.probe.rsplit(":", 1)
    return [f"{host}:{int(port) + k}" for k in range(2)]


def _cli(server: Server, *args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), timeout=timeout, env=M.cli_env(server), cwd=server.log_path.parent)


@pytest.fixture(scope="module")
def dp2_run(dp2: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Record both probes (and ``attach --jsonl`` the server) around 8 s of load: the load
    starts once every monitor watches (a recording file exists once its probe answered;
    a --jsonl line has metrics once two scrapes were taken) and ends before they stop.
    They stop on Ctrl-C (SIGINT: each exits 0 and keeps what it read) once the load is
    over and the --jsonl lines and the recordings hold vLLM's last count, not after a fixed duration:
    25 s of recording used to outlast the ~12 s they need by seconds of idle server."""
    d = tmp_path_factory.mktemp("dp2-run")
    recs = [d / f"dp{k}.rltrec" for k in range(2)]
    cmd = [sys.executable, "-m", "rltperf_tui.cli", "record", "-q"]
    procs = [
        subprocess.Popen([*cmd, f"tcp://{p}", "-o", str(r)], env=M.cli_env(dp2), cwd=str(ROOT),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for p, r in zip(_probes(dp2), recs, strict=True)
    ]  # fmt: skip
    jsonl = subprocess.Popen(
        [sys.executable, "-m", "rltperf_tui.cli", "attach", f"vllm+http://127.0.0.1:{dp2.port}", "--jsonl",
         "--window", "60"], env=M.cli_env(dp2), cwd=str(ROOT), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert jsonl.stdout is not None
    reader = M.read_lines(jsonl.stdout, lines)

    def watching() -> bool:
        ready = {o["target"] for o in map(json.loads, list(lines)) if o.get("metrics")}
        return len(ready) == 2 and all(r.exists() for r in recs)

    M.wait_until(watching, 90, "both recordings and both --jsonl engines")
    before = [M.generated(dp2, str(k)) for k in range(2)]
    load = Load(dp2.url, conc=4, max_tokens=32)
    load.run(8.0)
    time.sleep(1.5)
    after = [M.generated(dp2, str(k)) for k in range(2)]

    def counted() -> bool:  # each engine's last --jsonl line has seen vLLM's last count
        last = {o["target"]: o["metrics"] for o in map(json.loads, list(lines)) if o.get("metrics")}
        seen = [(m["tokens_per_s"] or 0.0) * m["span_s"] for m in last.values()]  # (None: no token yet)
        return len(seen) == 2 and sum(seen) >= 0.98 * (sum(after) - sum(before))

    M.wait_until(counted, 60, "the --jsonl lines count the load's tokens")
    for r, a, b in zip(recs, after, before, strict=True):
        M.wait_recorded(r, a - b)
    for p in (*procs, jsonl):
        p.send_signal(signal.SIGINT)
    for p in procs:
        _o, err = finish_cli(p, 90)
        assert p.returncode == 0, err[-2000:]
    err = finish_cli(jsonl, 90)[1]
    reader.join(10)
    assert jsonl.returncode == 0, err[-2000:]
    return {"recs": [read_all(r)[1] for r in recs], "rec_paths": recs, "load": load,
            "generated": [a - b for a, b in zip(after, before, strict=True)],
            "jsonl": [json.loads(ln) for ln in lines if ln.strip()], "jsonl_err": err}  # fmt: skip


def test_both_engines_probes_listen_and_are_announced(dp2: Server) -> None:
    """Each DP engine's probe on the base port + its DP rank (before the fix both took the
    base port and the second engine's probe failed to start)."""
    for k, p in enumerate(_probes(dp2)):
        s = ProbeAdapter(f"tcp://{p}", reconnect=False).connect()
        col = Collector(s)
        try:
            hello = col.wait_for(Hello, 20)
        finally:
            col.stop()
        e = hello.engine  # type: ignore[attr-defined]
        assert (e.dp_rank, e.tp_size, e.ranks) == (k, 1, ["tp0"]), e
    anns, why = find_all("127.0.0.1", dp2.port)
    assert [a.dp_rank for a in anns] == [0, 1], why
    assert [a.probe for a in anns] == _probes(dp2)
    assert all(list(a.data["workers"]) == ["tp0"] for a in anns)
    assert len({a.engine_pid for a in anns}) == 2 and len({a.api_pid for a in anns}) == 1


def test_each_engines_exits_equal_the_tokens_vllm_counts_for_it(dp2_run: dict[str, Any]) -> None:
    assert not dp2_run["load"].errors, dp2_run["load"].errors[:3]
    for k, records in enumerate(dp2_run["recs"]):
        hello = next(r for r in records if isinstance(r, Hello))
        assert hello.engine.dp_rank == k
        steps = [r for r in records if isinstance(r, StepRecord)]
        exits = sum(sum(s.exit_hist or []) for s in steps)
        gen = dp2_run["generated"][k]
        assert gen > 50, dp2_run["generated"]
        assert exits == pytest.approx(gen, rel=0.02), (k, exits, gen)
        timed = [s for s in steps if s.loop_ns]
        assert timed and all(sum(s.loop_ns or []) <= (s.busy_ns or 0) for s in timed)
        assert all(s.rank_busy_ns is None for s in steps)  # one worker per engine: nothing to compare


def test_the_metrics_target_gives_one_replica_per_engine(dp2: Server, dp2_run: dict[str, Any]) -> None:
    base = f"vllm+http://127.0.0.1:{dp2.port}"
    assert engine_targets(base) == [f"{base}?engine=0", f"{base}?engine=1"]
    assert engine_targets(f"{base}?engine=all") == [f"{base}?engine=all"]
    assert "2 data-parallel engines" in dp2_run["jsonl_err"]
    found = _cli(dp2, "attach", "--auto", f"127.0.0.1:{dp2.port}-{dp2.port}", "--list")
    assert found.returncode == 0, found.stderr
    assert [ln.split()[0] for ln in found.stdout.splitlines()] == [f"{base}?engine=0", f"{base}?engine=1"]
    last: dict[str, dict[str, Any]] = {}
    for line in dp2_run["jsonl"]:
        if line.get("metrics"):
            last[line["target"]] = line
    assert sorted(last) == [f"{base}?engine=0", f"{base}?engine=1"], sorted(last)
    for k in range(2):
        line = last[f"{base}?engine={k}"]
        assert line["identity"]["dp_rank"] == k
        m = line["metrics"]
        tokens = m["tokens_per_s"] * m["span_s"]  # over the whole run (--window 60)
        assert tokens == pytest.approx(dp2_run["generated"][k], rel=0.02), (k, tokens, dp2_run["generated"])


def test_the_screen_shows_a_column_and_a_replica_row_per_engine(dp2: Server) -> None:
    import asyncio

    from engine_adapters.monitor.vllm.adapter import VllmAdapter
    from rltperf_tui.live.driver import TargetSpec
    from rltperf_tui.tui.app import MonitorApp
    from rltperf_tui.tui.widgets.replicas import ReplicaPanel
    from rltperf_tui.tui.widgets.target_header import TargetHeader

    targets = engine_targets(f"vllm+http://127.0.0.1:{dp2.port}")
    specs = []
    for t in targets:
        a = VllmAdapter(t)
        specs.append(TargetSpec(target=t, adapter=a, session=a.connect()))

    async def run() -> tuple[str, list[str]]:
        app = MonitorApp(specs, window_s=10.0)
        async with app.run_test(size=(160, 48)) as pilot:
            load = Load(dp2.url, conc=2, max_tokens=16)
            t = threading.Thread(target=load.run, args=(5.0,), daemon=True)
            t.start()
            deadline = time.monotonic() + 60
            while (
                t.is_alive() or min(len(h.stats.metrics) for h in app.handles) < 4
            ) and time.monotonic() < deadline:
                await pilot.pause(0.2)
            app.force_render()
            await pilot.pause(0.3)
            headers = [app.query_one(f"#target-{k}").query_one(TargetHeader).render_text() for k in range(2)]
            return app.query_one(ReplicaPanel).render_text(), headers

    table, headers = asyncio.run(run())
    assert "?engine=0" in table and "?engine=1" in table and "total" in table, table
    assert "DP 0" in headers[0] and "DP 1" in headers[1], headers


def test_a_capture_holds_both_engines_and_report_says_2_of_2(dp2: Server, tmp_path: Path) -> None:
    """Engine 1 busy, engine 0 given a 2-token request every 1.5 s: engine 1's worker runs
    its 4 steps and writes its trace long before engine 0's has run 4; the window waits for
    both (stopping at the first trace left engine 0's with 2 of its 4 steps: CI, 5789ac4)."""
    stop = threading.Event()
    busy = Load(dp2.url, conc=2, max_tokens=64, engine=1)
    trickle = Load(dp2.url, conc=1, max_tokens=2, engine=0, pause=1.5)
    threads = [threading.Thread(target=x.run_until, args=(stop,), daemon=True) for x in (busy, trickle)]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0)  # both engines have a request in flight
        cap = M.capture_in_process(f"vllm+http://127.0.0.1:{dp2.port}", 4, tmp_path)
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert not busy.errors and not trickle.errors, (busy.errors, trickle.errors)
    assert "vLLM's own profiler" in str(cap["via"]), cap  # the server's target sums both engines
    bundle = Path(str(cap["bundle"]))
    ranks = json.loads((bundle / "meta.json").read_text())["capture"]["ranks"]
    # vLLM names both engines' worker traces dp0_..._rank0: the pids tell them apart
    assert ranks["expected"] == ["dp0-tp0", "dp1-tp0"] and ranks["missing"] == [], ranks
    assert sorted(ranks["held"]) == ["dp0-tp0", "dp1-tp0"]
    assert len(set(ranks["held"].values())) == 2
    for rank, name in ranks["held"].items():
        assert len(trace_facts(str(bundle / name)).annotations) == 4, rank
    r = _cli(dp2, "report", str(bundle))
    assert "2/2 ranks" in r.stdout, r.stdout[:3000]


def test_a_capture_with_an_idle_engine_ends_soon_after_the_busy_one_and_names_it(
    dp2: Server, tmp_path: Path
) -> None:
    """Every request to engine 1: engine 0 runs no annotated step, so its window never
    ends.  The capture ends ``IDLE_ENGINE_S`` after engine 1's trace, failed, naming
    engine 0 (not after the 60 s of a wholly idle server, nor with a bundle said to be
    whole)."""
    from engine_adapters.monitor.vllm.capture import IDLE_ENGINE_S, NO_STEP_TIMEOUT_S

    stop = threading.Event()
    busy = Load(dp2.url, conc=2, max_tokens=64, engine=1)
    t = threading.Thread(target=busy.run_until, args=(stop,), daemon=True)
    t.start()
    try:
        time.sleep(2.0)
        t0 = time.monotonic()
        out = M.capture_in_process(
            f"vllm+http://127.0.0.1:{dp2.port}", 4, tmp_path, timeout=90, failed_ok=True
        )
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join(90)
    assert not busy.errors, busy.errors
    reason = str(out.get("failed"))
    assert (
        "engine 0 " in reason and f"within {IDLE_ENGINE_S:.0f} s" in reason and "1 of 2 workers" in reason
    ), out
    assert IDLE_ENGINE_S <= took < NO_STEP_TIMEOUT_S, took


def test_one_engines_target_captures_that_engine_in_its_worker_through_the_plugin(
    dp2: Server, tmp_path: Path
) -> None:
    """``?engine=1``: the plugin's probe of engine 1 captures its worker (vLLM's profiler
    could only take every engine at once, from engine 0's target)."""
    stop = threading.Event()
    bg = Load(dp2.url, conc=4, max_tokens=64)
    t = threading.Thread(target=bg.run_until, args=(stop,), daemon=True)
    t.start()
    try:
        out = M.capture_in_process(f"vllm+http://127.0.0.1:{dp2.port}?engine=1", 4, tmp_path, timeout=90)
    finally:
        stop.set()
        t.join(90)
    assert out["complete"] is True and out["steps_captured"] == 4, out
    assert "vLLM's workers" in str(out["via"]) and "1/1 ranks" in str(out["via"]), out
    meta = json.loads((Path(str(out["bundle"])) / "meta.json").read_text())
    assert meta["engine"]["dp_rank"] == 1
    assert meta["capture"]["ranks"] == {
        "expected": ["dp1-tp0"],
        "missing": [],
        "held": {"dp1-tp0": "trace.json.gz"},
    }


def test_faults_at_the_lm_head_and_a_stage_mark_stop_recording_only(dp2: Server) -> None:
    faults = dp2.log_path.parent / "faults"
    cols = [Collector(ProbeAdapter(f"tcp://{p}", reconnect=False).connect()) for p in _probes(dp2)]
    try:
        (faults / "dp0-tp0-add_logits").touch()
        (faults / "dp1-probe_mark").touch()
        load = Load(dp2.url, conc=4, max_tokens=16)
        load.run(4.0)
        assert not load.errors and sum(r.tokens for r in load.results) > 0
        log = dp2.log_text()
        assert "loop recording stopped on dp0-tp0: add_logits failed (InjectedFault" in log
        assert "rltperf plugin: marking stage" in log and "InjectedFault" in log
        bye = cols[1].wait_for(Bye, 30)
        assert "marking stage" in bye.reason, bye  # type: ignore[attr-defined]
        n = len(cols[0].of(StepRecord))
        load = Load(dp2.url, conc=4, max_tokens=16)
        load.run(3.0)
        assert not load.errors and sum(r.tokens for r in load.results) > 0  # both engines serve on
        late = [s for s in cols[0].of(StepRecord)[n:] if s.kind != "idle"]
        assert late and all(s.loop_ns is None for s in late)  # engine 0's steps go on, without loops
    finally:
        for c in cols:
            c.stop()
