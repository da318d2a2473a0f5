"""Loops: exit-depth histogram, time and tokens per loop depth, KV per depth; speculation."""

from __future__ import annotations

from engine_adapters.definitions.ranks import straggler_text
from rltperf_tui.tui.widgets._fmt import Lines, ms, num, pct
from rltperf_tui.tui.widgets.panel import Panel, PanelContext


class LoopsPanel(Panel):
    """Where tokens exit the loop, what each depth costs, and how drafts fare."""

    DEFAULT_CSS = """
    LoopsPanel { height: 9; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Loops & speculation · sums/means per step · {ctx.window_span}"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        w = ctx.window
        kv = ctx.stats.kv.get("kv_per_depth") or []
        ln = Lines()
        hist = w.exit_hist
        total = sum(hist)
        depths = max(len(hist), len(w.loop_ms_mean), len(kv))
        rf = ctx.stats.ranks  # None for a single-rank engine
        rows_left = height - 3 - (rf is not None)  # header + two speculation lines (+ ranks)
        if depths == 0:
            ln.add("no loop data reported (exit depths, loop times)", "$text-muted").nl()
        else:
            bw = max(6, min(20, width - 46))
            ln.add("depth  " + "exited tokens".ljust(bw + 8), "$text-muted")
            ln.add(f"{'ms/step':>8}{'tok/step':>9}{'KV blk':>8}", "$text-muted").nl()
            shown = depths if depths <= rows_left else rows_left - 1
            for d in range(shown):
                share = hist[d] / total if total and d < len(hist) else None
                ln.add(f"{d + 1:>5}  ", "bold")
                ln.bar(share, bw, "$accent")
                ln.add(f" {pct(share):>6} ")
                lm = w.loop_ms_mean[d] if d < len(w.loop_ms_mean) else None
                lt = w.loop_tokens_mean[d] if d < len(w.loop_tokens_mean) else None
                ln.add(f"{ms(lm):>8}{num(lt, '{:.1f}'):>9}{(str(kv[d]) if d < len(kv) else 'n/a'):>8}")
                ln.nl()
            if shown < depths:
                ln.add(f"  … {depths - shown} deeper depths (widen or scroll)", "$text-muted").nl()
            ln.add("mean exit depth ", "$text-muted").add(num(w.mean_exit_depth, "{:.2f}"), "bold")
            ln.add(f" of {depths}", "$text-muted")
            ln.nl()
        if rf is not None:
            ln.add("ranks ", "$text-muted")
            if not rf.steps:
                ln.add("no step in the window where every rank reported", "$text-muted").nl()
            else:
                ln.add(
                    " · ".join(f"{k} {ms(c)}" for k, c in zip(rf.ranks, rf.compute_ms, strict=False)), "bold"
                )
                ln.add(" ms compute/step · ", "$text-muted")
                ln.add(straggler_text(rf), "bold $warning" if (rf.skew_frac or 0) > 0.25 else "bold").nl()
        if w.spec_drafted == 0:
            ln.add("speculation ", "$text-muted").add("no drafts in window (off or idle)", "$text-muted")
        else:
            ln.add("speculation ", "$text-muted")
            ln.add("drafted ", "$text-muted").add(f"{w.spec_drafted:,}", "bold")
            ln.add(" · accepted ", "$text-muted").add(f"{w.spec_accepted:,}", "bold")
            ln.add(" · rate ", "$text-muted").add(pct(w.acceptance_rate), "bold").nl()
            ln.add("            mean acceptance length ", "$text-muted")
            ln.add(num(w.mean_acceptance_len, "{:.2f}"), "bold").add(" (1 + accepted/drafts)", "$text-muted")
        return ln
