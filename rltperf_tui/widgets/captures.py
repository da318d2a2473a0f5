"""Captures: each capture's state, mode, progress, bundle, size, events, export time, error."""

from __future__ import annotations

from textual.content import Content

from rltperf_tui.widgets._fmt import Lines, size
from rltperf_tui.widgets.panel import Panel, PanelContext

STATE_STYLE = {
    "requested": "bold $text-muted",
    "armed": "bold $warning",
    "capturing": "bold $warning",
    "exporting": "bold $accent",
    "saved": "bold $success",
    "failed": "bold $error",
    "refused": "bold $error",
}


def _short_path(path: str, width: int) -> str:
    if len(path) <= width:
        return path
    return "…" + path[-(width - 1) :]


class CapturesPanel(Panel):
    """Bounded profiler captures (newest first); ``c`` ops-only, ``f`` full."""

    DEFAULT_CSS = """
    CapturesPanel { height: 1fr; min-height: 4; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Captures · N={ctx.capture_steps} steps · c ops-only · f full"

    def body(self, ctx: PanelContext, width: int, height: int) -> Content:
        caps = list(ctx.stats.captures.values())[::-1]
        ln = Lines()
        if not caps:
            if not ctx.live:
                ln.add("a recording: captures need a live engine", "$text-muted")
            elif not ctx.supports_capture:
                ln.add("this target's adapter cannot capture", "$text-muted")
            else:
                ln.add(f"none yet: c ops-only, f full, N={ctx.capture_steps} steps", "$text-muted").nl()
                ln.add("[ ] halve/double N; bundles go to the engine's snapshots", "$text-muted")
            return ln.build()
        rows = 0
        for c in caps:
            if rows + 2 > height:
                break
            ln.add(f"{c.mode:<4} ", "bold").add(f"N={c.steps:<3} ", "$text-muted")
            ln.add(f"{c.state} ", STATE_STYLE.get(c.state, "bold"))
            if c.state == "capturing":
                frac = c.steps_done / c.steps if c.steps else 0.0
                ln.add(f"{c.steps_done}/{c.steps} ", "bold").bar(
                    frac, min(16, max(4, width - 50)), "$warning"
                )
                if c.first_step is not None:
                    ln.add(f" from step {c.first_step}", "$text-muted")
            elif c.state == "armed":
                ln.add("waiting for the next step boundary", "$text-muted")
            elif c.state == "exporting":
                seen = ctx.exporting_seen.get(c.capture_id)
                el = f"{ctx.mono_now - seen:.1f} s" if seen is not None else "…"
                ln.add(f"{c.steps_done}/{c.steps} steps, export running {el}", "$text-muted")
            elif c.state == "saved":
                ln.add(f"{c.steps_done}/{c.steps} steps", "bold")
                ln.add(f" · {size(c.trace_bytes)} · {c.events or 0:,} events", "")
                ln.add(f" · export {c.export_s:.2f} s" if c.export_s is not None else "", "")
            if c.cold:
                ln.add(" (cold profiler)", "$warning")
            ln.nl()
            rows += 1
            if c.state in ("failed", "refused"):
                ln.add("  " + (c.error or "no reason given"), "$error").nl()
                rows += 1
                if c.bundle and rows < height:
                    ln.add("  error kept in " + _short_path(c.bundle, width - 18), "$text-muted").nl()
                    rows += 1
            elif c.bundle:
                ln.add("  " + _short_path(c.bundle, width - 3), "$text-muted").nl()
                rows += 1
        return ln.build()
