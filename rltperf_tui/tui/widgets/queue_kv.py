"""Queue and KV: waiting/running requests, KV blocks used/total, host CPU and engine RSS."""

from __future__ import annotations

from rltperf_tui.tui.widgets._fmt import NA, Lines, is_num, pct, size
from rltperf_tui.tui.widgets.panel import Panel, PanelContext


def _int(v: float | int | None) -> str:
    return f"{int(v):,}" if v is not None and is_num(v) else NA


class QueuePanel(Panel):
    """Newest scheduler figures from the step records and the ~1 Hz host sample."""

    DEFAULT_CSS = """
    QueuePanel { height: 5; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return "Queue & KV · newest step · host sample ~1 Hz"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        st = ctx.stats
        kv = st.kv
        ln = Lines()
        ln.add("waiting  ", "$text-muted").add(_int(kv.get("waiting")), "bold")
        ln.add("  running ", "$text-muted").add(_int(kv.get("running")), "bold")
        s = st.last_step
        if s is not None:
            ln.add("  batch ", "$text-muted").add(f"{s.batch}", "bold")
            ln.add(f" ({s.tokens} tok, {s.prefill_tokens} prefill)", "$text-muted")
        ln.nl()
        used, total = kv.get("kv_used"), kv.get("kv_total")
        ln.add("KV       ", "$text-muted")
        if used is not None and is_num(used) and total:
            frac = used / total
            ln.add(f"{_int(used)}/{_int(total)} blocks {pct(frac):>6} ", "bold")
            ln.bar(frac, max(6, min(24, width - 40)), "$error" if frac > 0.9 else "$primary")
        else:
            ln.add(NA, "bold").add("  (the engine reports no KV blocks)", "$text-muted")
        ln.nl()
        host = st.devices.get(("cpu", 0))
        ln.add("host CPU ", "$text-muted")
        if host is not None and host.host_cpu:
            ln.add(pct(sum(host.host_cpu) / len(host.host_cpu), 0), "bold")
            ln.add(f" of {len(host.host_cpu)} cores", "$text-muted")
        else:
            ln.add(NA, "bold")
        if host is not None and host.host_mem_total:
            ln.add(f" · mem {size(host.host_mem_used)}/{size(host.host_mem_total)}", "$text-muted")
        ln.nl()
        ln.add("engine   ", "$text-muted")
        ln.add(f"{host.proc_cpu:.2f} cores" if host is not None and host.proc_cpu is not None else NA, "bold")
        ln.add(" CPU · RSS ", "$text-muted").add(size(host.proc_rss) if host is not None else NA, "bold")
        return ln
