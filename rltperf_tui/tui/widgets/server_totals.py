"""Since attach: a metrics endpoint's counter totals, latencies pooled since attach and
the session's peaks (``engine_adapters.definitions.server_history.ServerLifetime``), and
what it cost when prices were given (``engine_adapters.definitions.cost``)."""

from __future__ import annotations

from engine_adapters.definitions.cost import cost
from rltperf_tui.tui.widgets._fmt import Lines, ms, num, si
from rltperf_tui.tui.widgets.panel import Panel, PanelContext


def _dur(s: float) -> str:
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class ServerTotalsPanel(Panel):
    """Requests, tokens, preemptions, P95s and peaks since attach (data time)."""

    DEFAULT_CSS = """
    ServerTotalsPanel { height: 10; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        # fixed: the counters that move at every scrape are a content row, which is
        # redrawn alone; a new title is a pass through Textual's styles cache
        return "Since attach"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        lt = ctx.stats.lifetime
        ln = Lines()
        if not lt.samples:
            ln.add("no metrics scraped yet", "$text-muted")
            return ln
        ln.add("over       ", "$text-muted").add(_dur(lt.elapsed_s), "bold")
        ln.add(f" · {lt.samples:,} scrapes").nl()
        reasons = " · ".join(f"{k} {v:,.0f}" for k, v in sorted(lt.finished.items()) if v)
        ln.add("finished   ", "$text-muted").add(f"{lt.requests:,.0f} req", "bold")
        if reasons:
            ln.add(f"  ({reasons})", "$text-muted")
        ln.nl()
        ln.add("tokens     ", "$text-muted").add("prompt ").add(si(lt.prompt_tokens), "bold")
        ln.add(" · generated ").add(si(lt.generation_tokens), "bold").nl()
        ln.add("preempted  ", "$text-muted").add(f"{lt.preemptions:,.0f}", "bold")
        if lt.prefix_queries > 0:
            ln.add("  prefix-cache hits ", "$text-muted").add(f"{lt.prefix_hits / lt.prefix_queries:.1%}")
        ln.nl()
        for q, label in (("p95", "p95 since  "), ("mean", "mean since ")):
            ln.add(label, "$text-muted")
            parts = []
            for name, short in (("ttft", "TTFT"), ("tpot", "TPOT"), ("queue", "queue")):
                if q == "mean":
                    v, low = lt.mean_ms(name), False
                else:
                    v, low = lt.latency_ms(name)
                if v is not None:
                    parts.append(f"{short} {'≤' if low else ''}{ms(v)}")
            ln.add(" · ".join(parts) + " ms" if parts else "n/a").nl()
        ln.add("peak       ", "$text-muted")
        ln.add("running ").add(num(lt.peak_running, "{:.0f}"), "bold")
        ln.add(" · waiting ").add(num(lt.peak_waiting, "{:.0f}"), "bold")
        kv = lt.peak_kv
        ln.add(" · KV ").add(num(None if kv is None else kv * 100, "{:.1f}", "%"), "bold").nl()
        ln.add("peak tok/s ", "$text-muted").add("gen ").add(si(lt.peak_gen_tps), "bold")
        ln.add(" · prompt ").add(si(lt.peak_prompt_tps), "bold")
        ln.add("  (over ≥1 s)", "$text-muted").nl()
        prices = ctx.prices
        if prices is not None and prices.any and lt.span_s > 0:
            c = cost(lt.prompt_tokens / lt.span_s, lt.generation_tokens / lt.span_s, prices)
            ln.add("cost       ", "$text-muted")
            if c.list_per_hour is not None:
                ln.add(f"list ${c.list_per_hour * lt.span_s / 3600:,.4g}", "bold")
            if c.gpu_per_mtok_out is not None and prices.gpu_cost_hour is not None:
                ln.add(f"  GPU ${prices.gpu_cost_hour * lt.elapsed_s / 3600:,.4g}", "bold")
            ln.nl()
        return ln
