"""Latency: P50/P95/P99 of step time, gap, TTFT and TPOT; tokens/s; goodput; failures."""

from __future__ import annotations

from rltperf_tui.tui.widgets._fmt import Lines, ms, num, si
from rltperf_tui.tui.widgets.panel import Panel, PanelContext


class LatencyPanel(Panel):
    """Percentiles of pooled samples in the window (not means of per-run percentiles)."""

    DEFAULT_CSS = """
    LatencyPanel { height: 8; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        w = ctx.window
        if w.ring_cut:  # a stream faster than the ring holds for the window
            return f"Latency · P50/P95/P99 · last {w.span_s:.1f} s: all the ring keeps"
        return f"Latency · P50/P95/P99 of pooled samples · last {ctx.window_s:g} s"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        w = ctx.window
        ln = Lines()
        ln.add(f"{'ms':<8}{'p50':>9}{'p95':>9}{'p99':>9}", "$text-muted").nl()
        rows = (
            ("step", w.step_ms, f"{w.steps:,} steps {num(w.steps_per_s, '{:.0f}')}/s"),
            ("gap", w.gap_ms, "between steps"),
            ("TTFT", w.ttft_ms, f"{w.requests_ok:,} requests ok"),
            ("TPOT", w.tpot_ms, "per output token"),
        )
        for name, d, note in rows:
            ln.add(f"{name:<8}", "bold")
            for k in ("p50", "p95", "p99"):
                ln.add(f"{ms(d[k]):>9}")
            ln.add("  " + note, "$text-muted").nl()
        ln.add("tokens/s ", "$text-muted").add(si(w.tokens_per_s, digits=1), "bold")
        ln.add("  failed ", "$text-muted")
        ln.add(f"{w.requests_failed:,}", "bold $error" if w.requests_failed else "bold")
        excluded = w.profiled_steps + w.exporting_steps + w.warmup_steps
        if excluded:
            # they would show the profiler's cost as the engine's: every figure leaves them
            # short enough for a narrow column: "?" says which steps and why
            ln.add(f"  excluded {excluded:,} steps", "$warning")
            if w.requests_excluded:
                ln.add(f", {w.requests_excluded:,} req", "$warning")
            if w.stale_s is not None:  # figures held from before the export (figures.blind)
                ln.add(f"; figures {w.stale_s:.0f} s old", "bold $warning")
        ln.nl()
        ln.add("goodput ", "$text-muted")
        if ctx.slo_ttft_ms is None and ctx.slo_tpot_ms is None:
            ln.add("n/a: set --slo-ttft-ms / --slo-tpot-ms", "$text-muted")
        else:
            slo = []
            if ctx.slo_ttft_ms is not None:
                slo.append(f"TTFT≤{ctx.slo_ttft_ms:g} ms")
            if ctx.slo_tpot_ms is not None:
                slo.append(f"TPOT≤{ctx.slo_tpot_ms:g} ms")
            ln.add(num(w.goodput_rps, "{:.2f}", " req/s"), "bold")
            ln.add(" meeting " + " & ".join(slo), "$text-muted")
        return ln
