"""Server trends: every figure of a metrics endpoint (vLLM's ``/metrics``) as a line over
the timeline (``--timeline``), with the min, max and newest value of what is drawn.

The columns and what a column's value is (highest gauge reading, pooled rate, bounded
histogram P95) are defined in ``engine_adapters.definitions.server_history``; this panel
only draws them.  A blank cell is a column with nothing to say (no scrape, no request
finished), never a zero.
"""

from __future__ import annotations

from rltperf_tui.tui.widgets._fmt import Lines, ms, num, si, spark
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

LABEL_W = 13
NUM_W = 8
STYLE = {"gauge": "$accent", "rate": "$success", "p95": "$warning"}


def fmt(kind: str, key: str, v: float | None, bounded: bool = False) -> str:
    """A trend value as the panel prints it (``≤`` before an upper limit)."""
    if v is None:
        return "n/a"
    if kind == "p95":
        return ("≤" if bounded else "") + ms(v)
    if key == "kv":
        return num(v, "{:.2f}" if v < 1 else "{:.1f}", "%")
    if kind == "rate":
        return si(v, digits=1)
    return num(v, "{:.0f}")


def trend_cells(width: int) -> int:
    """Columns of the trend lines at a content ``width`` (the view is computed with this many)."""
    return max(8, max(10, width) - LABEL_W - 1 - 3 * NUM_W)


class ServerTrendsPanel(Panel):
    """Sparklines of running, waiting, KV %, token rates and latency P95s over the timeline."""

    DEFAULT_CSS = """
    ServerTrendsPanel { height: 11; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Trends · last {ctx.timeline_s:g} s (--timeline)"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        ln = Lines()
        cells = trend_cells(width)
        tr = ctx.stats.trends
        if tr is None:
            ln.add("no metrics scraped yet", "$text-muted")
            return ln
        n = len(next(iter(tr.lines.values())).values)
        rep = max(1, cells // n)  # each column drawn rep cells wide
        pad = cells - n * rep
        per = "1 scrape" if tr.per_column == 1 else f"{tr.per_column} scrapes"
        head = f"a column = {per} · {tr.samples} scrapes over {tr.span_s:.0f} s"
        if len(head) > cells:
            head = f"{per}/column"
        ln.add(f"{'':<{LABEL_W}}").add(f"{head[:cells]:<{cells}}", "$text-muted")
        ln.add(f" {'min':>{NUM_W}}{'max':>{NUM_W}}{'now':>{NUM_W}}", "$text-muted").nl()
        any_bounded = False
        for t in tr.lines.values():
            ln.add(f"{t.label:<{LABEL_W}}", "bold")
            vals = [float("nan") if v is None else v for v in t.values]
            top = 100.0 if t.key == "kv" else None  # a share: drawn against the whole cache
            line = spark(vals, top=top)
            if rep > 1:
                line = "".join([ch * rep for ch in line])
            ln.add(" " * pad).add(line, STYLE.get(t.kind, ""))
            lo, hi = t.lo, t.hi  # once: each is a pass over the values
            hi_b = t.kind == "p95" and any(b for v, b in zip(t.values, t.bounded, strict=True) if v == hi)
            lo_b = t.kind == "p95" and any(b for v, b in zip(t.values, t.bounded, strict=True) if v == lo)
            any_bounded = any_bounded or any(t.bounded)
            ln.add(f" {fmt(t.kind, t.key, lo, lo_b):>{NUM_W}}{fmt(t.kind, t.key, hi, hi_b):>{NUM_W}}")
            ln.add(f"{fmt(t.kind, t.key, t.now, t.now_bounded):>{NUM_W}}", "bold").nl()
        note = "gauges: highest reading per column; P95: histogram estimates per column"
        if any_bounded:
            note += "; ≤ bound from the exact mean (bucket too wide)"
        ln.add(note, "$text-muted")
        return ln
