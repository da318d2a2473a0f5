"""Bandwidth and roofline: achieved GB/s, MBU against the peak (and its source),
arithmetic intensity against machine balance, the verdict, ceiling vs measured step."""

from __future__ import annotations

from rltperf_tui.tui.widgets._fmt import Lines, ms, num, pct
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

VERDICT_STYLE = {
    "memory-bound": "bold $primary",
    "compute-bound": "bold $secondary",
    "host-bound": "bold $warning",
    "unknown": "bold $text-muted",
}


class RooflinePanel(Panel):
    """MBU = Σ bytes / (W x peak BW); never shows MBU > 1 without a warning."""

    DEFAULT_CSS = """
    RooflinePanel { height: 7; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Bandwidth & roofline · sums over {ctx.window_span}"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        w = ctx.window
        ceiling = ctx.stats.ceiling
        ln = Lines()
        ln.add("achieved  ", "$text-muted").add(num(w.achieved_gbps, "{:.2f}", " GB/s"), "bold")
        ln.add(" · ").add(num(w.achieved_gflops, "{:.1f}", " GFLOP/s"), "bold")
        ln.add(" (analytic)", "$text-muted").nl()
        ln.add("MBU       ", "$text-muted")
        if w.mbu is None:
            if ceiling is None or not ceiling.peak_bw_gbps:
                ln.add("n/a", "bold").add(": no peak bandwidth known", "$text-muted").nl()
                ln.add("          run `rltperf calibrate` or pass --peak-gbps", "$text-muted")
            else:
                ln.add("n/a", "bold").add(": the engine reports no bytes per step", "$text-muted")
        else:
            if w.mbu_overcount:
                ln.add(f"{pct(w.mbu)} ⚠ >1: bytes overcounted or peak too low", "bold reverse $error")
            else:
                ln.add(f"{pct(w.mbu):>6} ", "bold").bar(w.mbu, max(5, min(16, width - 44)), "$primary")
            assert ceiling is not None
            ln.add(f" of {num(ceiling.peak_bw_gbps, '{:.1f}')} GB/s", "$text-muted")
        ln.nl()
        if ceiling is not None and ceiling.peak_bw_gbps:
            ln.add("peak from ", "$text-muted").add(ceiling.source, "bold")
            if ceiling.device:
                ln.add(f" ({ceiling.device})", "$text-muted")
            if ceiling.peak_gflops:
                ln.add(f" · {ceiling.peak_gflops:.0f} GFLOP/s", "$text-muted")
            ln.nl()
        ln.add("intensity ", "$text-muted").add(num(w.intensity, "{:.2f}", " FLOP/B"), "bold")
        ln.add(" vs balance ", "$text-muted").add(num(w.balance, "{:.2f}"))
        ln.add(" → ", "$text-muted").add(w.verdict, VERDICT_STYLE.get(w.verdict, "bold"))
        ln.nl()
        ln.add("ceiling   ", "$text-muted")
        ln.add(f"{ms(w.ceiling_ms_p50)} ms/step", "bold")
        ln.add(" vs measured ", "$text-muted")
        ln.add(f"{ms(w.step_ms['p50'])} ms", "bold")
        below = False
        if w.ceiling_ms_p50 and w.step_ms["p50"]:
            ratio = w.step_ms["p50"] / w.ceiling_ms_p50
            below = ratio < 1.0
            ln.add(f" ({ratio:.1f}x)", "bold reverse $error" if below else "$text-muted")
        ln.add(" p50", "$text-muted")
        ln.nl()
        if below:
            # faster than the roofline allows: never shown as if it were fine
            ln.add(
                "⚠ steps beat the ceiling: data served from cache, or bytes overcounted", "bold $error"
            ).nl()
        if w.profiled_steps or w.exporting_steps or w.warmup_steps:
            ln.add(
                f"{w.profiled_steps} profiled, {w.exporting_steps} exporting, "
                f"{w.warmup_steps} warm-up steps in window: not a baseline",
                "$warning",
            )
        return ln
