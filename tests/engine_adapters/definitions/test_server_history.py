"""Trend lines, totals and peaks since attach, and cost of a metrics endpoint
(``engine_adapters.definitions.server_history`` / ``cost``), against numbers computed by
hand and against a real vLLM 0.32 session (``tests/rltperf_tui/tui/data/vllm_replica_a.rltrec``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapters.definitions.cost import Prices, cost
from engine_adapters.definitions.histograms import markov_bound, pool
from engine_adapters.definitions.records import HistogramDelta, MetricsSample
from engine_adapters.definitions.server_history import PEAK_SPAN_S, ServerLifetime, server_trends
from engine_adapters.definitions.server_window import imbalance, replica_totals
from engine_adapters.monitor.recording import RecordingReader

REAL = Path(__file__).resolve().parents[2] / "rltperf_tui" / "tui" / "data" / "vllm_replica_a.rltrec"
S = 1_000_000_000

# vLLM's queue-time buckets start 0-0.3 s: 40 requests queued 0.012 ms each
QUEUE = HistogramDelta(bounds=[0.3, 0.5, 0.8], counts=[40.0, 40.0, 40.0], count=40.0, sum=40 * 0.012e-3)


def _m(t: float, gen: float = 0.0, prompt: float = 0.0, running: float = 0.0, interval: float = 0.5,
       **kw: object) -> MetricsSample:  # fmt: skip
    return MetricsSample(ts_ns=int(t * S), interval_s=interval, generation_tokens=gen, prompt_tokens=prompt,
                         running=running, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_one_column_per_scrape_while_they_fit_rates_and_gauges_by_hand() -> None:
    samples = [_m(0.5 * k, gen=10.0 * k, running=k, kv_usage=0.1 * k) for k in range(1, 11)]
    tr = server_trends(samples, seconds=3.0, columns=40)
    assert tr is not None and tr.per_column == 1
    # the last 3 s of data time: ts > 5.0 - 3.0, i.e. the scrapes at 2.5 .. 5.0 s (k = 5..10)
    assert tr.samples == 6
    gen = tr.lines["gen_tps"]
    assert gen.values == [pytest.approx(20.0 * k) for k in range(5, 11)]  # 10k tokens over 0.5 s
    assert (gen.lo, gen.hi, gen.now) == (pytest.approx(100.0), pytest.approx(200.0), pytest.approx(200.0))
    assert tr.lines["kv"].values[-1] == pytest.approx(100.0)  # percent
    assert tr.lines["ttft_p95"].values == [None] * 6  # no request finished: nothing, never zero


def test_more_scrapes_than_columns_pool_each_column() -> None:
    samples = [_m(0.5 * k, gen=10.0 * k, running=k % 3) for k in range(1, 11)]
    tr = server_trends(samples, seconds=60.0, columns=4)
    assert tr is not None and tr.per_column == 3  # 10 scrapes in 4 columns: 1 + 3 + 3 + 3
    gen = tr.lines["gen_tps"].values
    assert len(gen) == 4
    assert gen[0] == pytest.approx(10.0 / 0.5)
    assert gen[-1] == pytest.approx((80 + 90 + 100) / 1.5)  # pooled gains over pooled intervals
    assert tr.lines["running"].values[-1] == 2  # highest reading of k = 8, 9, 10 -> 2, 0, 1


def test_queue_p95_trend_stays_bounded_by_the_exact_mean() -> None:
    """Linear interpolation would put P95 of 0.012 ms queue times at 0.285 s (95 % of a
    0-300 ms bucket); the trend gives at most mean / 0.05 = 0.24 ms, marked as a bound."""
    samples = [_m(0.5 * k, hist={"queue": QUEUE}) for k in range(1, 5)]
    tr = server_trends(samples, seconds=30.0, columns=40)
    assert tr is not None
    q = tr.lines["queue_p95"]
    assert all(v is not None and v <= 0.012 / 0.05 + 1e-9 for v in q.values), q.values
    assert q.values[-1] == pytest.approx(0.24) and all(q.bounded) and q.now_bounded
    lt = ServerLifetime()
    for m in samples:
        lt.add(m)
    v, low = lt.latency_ms("queue")
    assert v == pytest.approx(0.24) and low and lt.mean_ms("queue") == pytest.approx(0.012)


def test_lifetime_totals_and_peaks_by_hand() -> None:
    lt = ServerLifetime()
    gens = [100.0, 300.0, 50.0, 950.0]
    for k, g in enumerate(gens, start=1):
        lt.add(_m(0.5 * k, gen=g, prompt=10.0, running=k, waiting=4 - k, kv_usage=0.2 * k,
                  requests_finished={"stop": 1.0, "length": float(k)}, preemptions=1.0))  # fmt: skip
    assert lt.generation_tokens == 1400 and lt.prompt_tokens == 40 and lt.preemptions == 4
    assert lt.finished == {"stop": 4.0, "length": 10.0} and lt.requests == 14
    assert (
        lt.peak_running.value == 4 and lt.peak_waiting.value == 3 and lt.peak_kv.value == pytest.approx(0.8)
    )
    # tokens/s peaks over >= PEAK_SPAN_S: spans (100+300)/1 s and (50+950)/1 s, not 950/0.5 s
    assert PEAK_SPAN_S == 1.0
    assert lt.peak_gen_tps.value == pytest.approx(1000.0) and lt.peak_gen_tps.at_ns == 2 * S
    assert lt.elapsed_s == pytest.approx(2.0) and lt.span_s == pytest.approx(2.0)


def test_cost_by_hand() -> None:
    c = cost(prompt_tps=300.0, gen_tps=100.0, prices=Prices(cost_in=0.5, cost_out=2.0, gpu_cost_hour=3.6))
    # (300 x 0.5 + 100 x 2.0) / 400 = 0.875 $/1M tok; x 400 tok/s x 3600 s / 1e6 = 1.26 $/h
    assert c.list_per_mtok == pytest.approx(0.875) and c.list_per_hour == pytest.approx(1.26)
    # 3.6 $/h over 100 tok/s x 3600 s = 360 000 tokens an hour -> 10 $ per 1M generated tokens
    assert c.gpu_per_mtok_out == pytest.approx(10.0)
    idle = cost(0.0, 0.0, Prices(gpu_cost_hour=3.6, cost_in=1.0, cost_out=1.0))
    assert idle.gpu_per_mtok_out is None and idle.list_per_mtok is None and idle.list_per_hour == 0.0


def test_real_vllm_session_trends_agree_with_its_counters_and_stay_bounded() -> None:
    recs = [r for r in RecordingReader(REAL).records() if isinstance(r, MetricsSample)]
    assert len(recs) > 50
    lt = ServerLifetime()
    for m in recs:
        lt.add(m)
    assert lt.generation_tokens == sum(m.generation_tokens for m in recs) > 0
    tr = server_trends(recs, seconds=1e6, columns=7)
    assert tr is not None and tr.samples == len(recs)
    # each column's rate is its pooled gains: weighted by intervals they give the total back
    per = tr.per_column
    cut = len(recs) % per
    cols = ([recs[:cut]] if cut else []) + [recs[i : i + per] for i in range(cut, len(recs), per)]
    back = sum(v * sum(m.interval_s for m in c) for v, c in zip(tr.lines["gen_tps"].values, cols, strict=True)
               if v is not None)  # fmt: skip
    assert back == pytest.approx(lt.generation_tokens)
    # every queue P95 column is at most what its exact mean allows (Markov), and some
    # column needed the bound: vLLM's first queue bucket is far wider than its queue times
    for v, c in zip(tr.lines["queue_p95"].values, cols, strict=True):
        p = pool(m.hist["queue"] for m in c if "queue" in m.hist)
        if v is None:
            continue
        bound = markov_bound(p, 95)
        assert bound is not None and v <= bound * 1e3 + 1e-9
        assert v <= p.bounds[0] * 1e3 if p is not None else True
    assert any(tr.lines["queue_p95"].bounded)


def test_trend_column_cache_gives_what_a_fresh_computation_gives_as_scrapes_arrive() -> None:
    """A render tick reuses the columns of the tick before (``cache``): fed the real
    session one scrape at a time, in a timeline that first fits every scrape a column and
    then pools them (per_column 1, then more), every call equals the computation without
    a cache, and the cache holds no more than the columns of the last call."""
    recs = [r for r in RecordingReader(REAL).records() if isinstance(r, MetricsSample)]
    cache: dict = {}
    pooled = False
    for k in range(1, len(recs) + 1):
        for seconds, columns in ((20.0, 60), (1e6, 12)):
            fresh = server_trends(recs[:k], seconds, columns)
            cached = server_trends(recs[:k], seconds, columns, cache)
            assert cached == fresh, k
            assert cached is not None and len(cache) <= columns
            pooled = pooled or cached.per_column > 1
    assert pooled  # the second timeline did pool scrapes into columns


def test_replica_totals_sum_pool_and_flag_imbalance_by_hand() -> None:
    h = HistogramDelta(bounds=[0.01, 0.02], counts=[10.0, 20.0], count=20.0, sum=0.25)
    a = [_m(1.0 * k, gen=400.0, prompt=100.0, running=4.0, interval=1.0, waiting=1.0, kv_usage=0.3,
            hist={"ttft": h}) for k in range(1, 4)]  # fmt: skip
    b = [_m(1.0 * k + 100, gen=100.0, prompt=50.0, running=1.0, interval=1.0, waiting=0.0, kv_usage=0.1,
            hist={"ttft": h}) for k in range(1, 4)]  # fmt: skip
    t = replica_totals([a, b], seconds=10.0)  # each over its own newest 10 s (clocks may differ)
    assert t.tokens_per_s == pytest.approx(500.0) and t.prompt_tokens_per_s == pytest.approx(150.0)
    assert t.running == 5 and t.waiting == 1 and t.kv_usage_max == pytest.approx(0.3)
    assert t.imbalance == {"running": pytest.approx(4.0), "tokens_per_s": pytest.approx(4.0)}
    assert t.flagged == ["running", "tokens_per_s"]
    # pooled over both: 60 of 120 at or below 10 ms, 120 at or below 20 ms -> P95 at rank 114
    assert t.latency_p95_ms["ttft"] == pytest.approx(10 + 10 * (114 - 60) / 60)
    # an idle pair is not an imbalance: 0.4 against 0 running, under one request apart
    idle = replica_totals([[_m(1.0, running=0.4)], [_m(1.0, running=0.0)]], 10.0)
    assert idle.imbalance["running"] == float("inf") and idle.flagged == []
    assert imbalance([None, 3.0]) is None and imbalance([0.0, 0.0]) == 1.0


def test_now_is_current_or_nothing() -> None:
    from engine_adapters.definitions.server_history import NOW_COLUMNS, Trend

    assert NOW_COLUMNS == 3
    t = Trend("ttft_p95", "TTFT", "p95", [5.0, None, None], [True, False, False])
    assert t.now == 5.0 and t.now_bounded
    quiet = Trend("ttft_p95", "TTFT", "p95", [5.0, None, None, None], [True, False, False, False])
    assert quiet.now is None and not quiet.now_bounded and quiet.hi == 5.0
