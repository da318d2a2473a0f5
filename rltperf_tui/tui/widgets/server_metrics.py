"""Server metrics: what a metrics endpoint (vLLM's ``/metrics``) says, for targets that
send no step records (``vllm+http://``).

Rates are counter gains over the scrape intervals in the window; latency percentiles are
*histogram estimates* (interpolated inside the server's buckets) and the panel says so;
MBU from the server's own byte estimate carries its caveat (vLLM counts
``num_hidden_layers`` once, so a looped model is under-counted unless corrected).
"""

from __future__ import annotations

from engine_adapters.definitions.cost import cost
from rltperf_tui.tui.widgets._fmt import NA, Lines, bar, ms, num, si
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

_LATENCIES = (
    ("ttft", "TTFT"),
    ("itl", "inter-token"),
    ("tpot", "TPOT"),
    ("e2e", "end-to-end"),
    ("queue", "queue"),
)


def _usd(v: float | None) -> str:
    """Dollars with the precision that suits the size, or ``n/a``."""
    if v is None:
        return NA
    return f"${v:,.2f}" if v >= 1 else f"${v:.3g}"


class ServerMetricsPanel(Panel):
    """Engine-wide rates, queue and KV, latency estimates and MBU from a metrics endpoint."""

    DEFAULT_CSS = """
    ServerMetricsPanel { height: 20; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Server metrics · /metrics scrapes · last {ctx.window_s:g} s"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        ln = Lines()
        m = ctx.stats.metrics
        if m is None:
            ln.add("no metrics scraped yet", "$text-muted")
            return ln
        ln.add("tokens/s ", "$text-muted").add(si(m.tokens_per_s, digits=1), "bold")
        ln.add("  prompt/s ", "$text-muted").add(si(m.prompt_tokens_per_s, digits=1))
        ln.add("  req/s ", "$text-muted").add(num(m.requests_per_s, "{:.2f}")).nl()
        prices = ctx.prices
        if prices is not None and prices.any:
            c = cost(m.prompt_tokens_per_s, m.tokens_per_s, prices)
            ln.add("cost ", "$text-muted")
            if c.list_per_mtok is None and c.gpu_per_mtok_out is None:
                ln.add("n/a: no tokens in the window", "$text-muted")
            if c.list_per_mtok is not None:
                ln.add("list ", "$text-muted").add(_usd(c.list_per_mtok) + "/1M tok", "bold")
                ln.add(f" ({_usd(c.list_per_hour)}/h)  ", "$text-muted")
            if c.gpu_per_mtok_out is not None:
                ln.add("GPU ", "$text-muted").add(_usd(c.gpu_per_mtok_out) + "/1M out", "bold")
            ln.nl()
        ln.add("running ", "$text-muted").add(num(m.running, "{:.0f}"), "bold")
        ln.add("  waiting ", "$text-muted").add(num(m.waiting, "{:.0f}"), "bold")
        ln.add("  KV ", "$text-muted")
        if m.kv_usage is None:
            ln.add("n/a")
        else:
            ln.add(f"{m.kv_usage:6.1%} ", "bold").add(bar(m.kv_usage, 12))
        ln.nl()
        ln.add("steps/s ", "$text-muted").add(num(m.steps_per_s, "{:.1f}"))
        ln.add("  tok/step ", "$text-muted").add(num(m.tokens_per_step, "{:.1f}"))
        ln.add("  preempted ", "$text-muted").add(f"{m.preemptions:.0f}")
        if m.prefix_hit_rate is not None:
            ln.add("  prefix hits ", "$text-muted").add(f"{m.prefix_hit_rate:.1%}")
        ln.nl()
        done = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m.finished.items()) if v)
        ln.add("finished ", "$text-muted").add(done or "none in window").nl()
        ln.nl()
        ln.add(f"{'ms':<12}{'p50':>9}{'p95':>9}{'p99':>9}{'mean':>9}", "$text-muted")
        ln.add("  histogram estimates", "$warning").nl()
        for key, label in _LATENCIES:
            d = m.latency_ms.get(key)
            n = m.latency_samples.get(key, 0)
            if d is None and not n:
                continue
            ln.add(f"{label:<12}", "bold")
            low = m.latency_bounded.get(key, [])
            for q in ("p50", "p95", "p99"):
                txt = ms((d or {}).get(q))
                ln.add(f"{('≤' + txt) if q in low else txt:>9}")
            ln.add(f"{ms(m.latency_mean_ms.get(key)):>9}")
            capped = m.latency_capped.get(key)
            note = f"  n={n:,}" + (f", {'/'.join(capped)} beyond the last bucket" if capped else "")
            ln.add(note, "$text-muted").nl()
        if m.latency_bounded:
            ln.add("≤ upper limit: bucket too wide, bound from the exact mean", "$text-muted").nl()
        ln.add(m.percentile_method, "$text-muted").nl()
        ln.nl()
        ln.add("bandwidth ", "$text-muted")
        if m.achieved_gbps is None:
            ln.add("n/a (start the server with --enable-mfu-metrics for vLLM's byte estimate)", "$text-muted")
        else:
            ln.add(f"{m.achieved_gbps:.2f} GB/s", "bold")
            if m.achieved_gflops is not None:
                ln.add(f" · {m.achieved_gflops:.1f} GFLOP/s", "bold")
            ln.add("  MBU ", "$text-muted")
            if m.mbu is None:
                ln.add("n/a (no peak known)", "$text-muted")
            else:
                ln.add(f"{m.mbu:.1%}", "bold $error" if m.mbu_overcount else "bold")
                if m.mbu_overcount:
                    ln.add(" > 100%: the byte estimate or the peak is wrong", "$error")
        ln.nl()
        if m.mbu_note:
            ln.add(m.mbu_note, "$warning").nl()
        for note in [n for n in m.notes if n != m.mbu_note][:3]:
            ln.add(note, "$text-muted").nl()
        return ln
