"""Replicas: several metrics endpoints (``vllm+http://`` data-parallel replicas, prefill
and decode instances) in one table, a row each, their totals and an imbalance flag.

Shown above the per-target columns when two or more targets are metrics endpoints
(``v`` hides and shows it).  Totals, pooled latencies and the imbalance rule are defined
in ``engine_adapters.definitions.server_window.replica_totals`` and computed once per
render tick (``rltperf_tui.live.view.replica_view``); this panel only draws.
"""

from __future__ import annotations

from engine_adapters.definitions.server_window import IMBALANCE_RATIO, REPLICA_LATENCIES, ReplicaTotals
from rltperf_tui.live.view import ReplicaView
from rltperf_tui.tui.widgets._fmt import Lines, Row, ms, num, si
from rltperf_tui.tui.widgets.panel import Panel

NAME_W = 26
COLS = (("running", 8), ("waiting", 8), ("KV %", 7), ("gen tok/s", 10), ("prompt/s", 9), ("req/s", 7),
        ("TTFT p95", 9), ("TPOT p95", 9), ("queue p95", 10))  # fmt: skip


def short_name(target: str, width: int = NAME_W - 1) -> str:
    """The target without its scheme, cut at the front: replicas differ in their port or
    file name, which is at the end."""
    name = target.split("://", 1)[-1]
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _row(ln: Lines, name: str, cells: list[str], style: str = "") -> None:
    ln.add(f"{short_name(name):<{NAME_W}}", style or "bold")
    for (_, w), c in zip(COLS, cells, strict=True):
        ln.add(f"{c:>{w}}", style)
    ln.nl()


class ReplicaPanel(Panel):
    """One row per metrics target over the statistics window, totals, imbalance."""

    DEFAULT_CSS = """
    ReplicaPanel { height: auto; max-height: 14; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.view: ReplicaView | None = None
        self.totals: ReplicaTotals | None = None

    def show_replicas(self, view: ReplicaView) -> None:
        """Take the tick's replicas and repaint what changed."""
        self.view = view
        self.totals = view.totals
        n = len(view.names)
        title = f"Replicas · {n} metrics targets · last {view.window_s:g} s · v hides"
        if title != self.border_title:
            self.border_title = title
        self.styles.height = n + 5  # title, header, rows, totals, verdict
        self._rebuild()

    def rows(self) -> list[Row]:
        if self.view is None or self.totals is None:
            return [(("waiting for data…", "$text-muted"),)]
        return self.table(self.view, self.totals).rows()

    @staticmethod
    def table(view: ReplicaView, t: ReplicaTotals) -> Lines:
        """The table's lines."""
        ln = Lines()
        ln.add(f"{'replica':<{NAME_W}}", "$text-muted")
        for label, cw in COLS:
            ln.add(f"{label:>{cw}}", "$text-muted")
        ln.nl()
        for name, w, mean_run in zip(view.names, t.windows, t.mean_running, strict=True):
            if w is None:
                _row(ln, name, ["n/a"] * len(COLS))
                continue
            lat = [ms(w.latency_ms.get(k, {}).get("p95")) for k in REPLICA_LATENCIES]
            lat = [("≤" + v) if "p95" in w.latency_bounded.get(k, []) else v for k, v in zip(REPLICA_LATENCIES, lat, strict=True)]  # fmt: skip
            run = num(w.running, "{:.0f}") + (f"~{mean_run:.1f}" if mean_run is not None else "")
            kv = num(None if w.kv_usage is None else w.kv_usage * 100, "{:.1f}")
            _row(ln, name, [run, num(w.waiting, "{:.0f}"), kv, si(w.tokens_per_s), si(w.prompt_tokens_per_s),
                            num(w.requests_per_s, "{:.2f}"), *lat])  # fmt: skip
        lat = [("≤" if k in t.latency_bounded else "") + ms(t.latency_p95_ms[k]) for k in REPLICA_LATENCIES]
        kv = num(None if t.kv_usage_max is None else t.kv_usage_max * 100, "{:.1f}")
        _row(ln, "total", [num(t.running, "{:.0f}"), num(t.waiting, "{:.0f}"), kv,
             si(t.tokens_per_s), si(t.prompt_tokens_per_s), num(t.requests_per_s, "{:.2f}"), *lat],
             "bold $accent")  # fmt: skip
        parts = []
        for key, label in (("running", "mean running"), ("tokens_per_s", "gen tok/s")):
            r = t.imbalance.get(key)
            parts.append(
                f"{label} max/min {'n/a' if r is None else ('∞' if r == float('inf') else f'{r:.2f}')}"
            )
        if t.flagged:
            ln.add(" IMBALANCED ", "bold reverse $warning").add(" ")
        else:
            ln.add("balanced ", "$success")
        ln.add(" · ".join(parts), "bold" if t.flagged else "$text-muted")
        ln.add(f"  (flag > {IMBALANCE_RATIO:g}×; total KV: max, P95: pooled)", "$text-muted")
        return ln
