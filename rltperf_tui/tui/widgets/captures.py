"""Captures: each capture's state, mode, progress, bundle, size, events, export time, error."""

from __future__ import annotations

import os

from rltperf_tui.elide import elide
from rltperf_tui.tui.widgets._fmt import Lines, bar, size
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

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
    """The path's end that fits, starting at a folder boundary (``…/20261129T…_ops_4steps``):
    the bundle's own name is what tells captures apart, so it is kept whole when it fits."""
    if len(path) <= width:
        return path
    tail = path[-(width - 1) :]
    k = tail.find("/")
    if k >= 0:
        return "…" + tail[k:]
    return elide(os.path.basename(path), width)


class CapturesPanel(Panel):
    """Bounded profiler captures (newest first); ``c`` ops-only, ``f`` full."""

    DEFAULT_CSS = """
    CapturesPanel { height: 1fr; min-height: 4; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Captures · N={ctx.capture_steps} steps · c ops-only · f full"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        caps = list(ctx.stats.captures.values())[::-1]
        ln = Lines()
        if ctx.triggers:
            ln.add("triggers ", "$text-muted").add(ctx.triggers, "bold $accent").nl()
            height -= 1
        if not caps:
            if not ctx.live:
                ln.add("a recording: captures need a live engine", "$text-muted")
            elif not ctx.supports_capture:
                ln.add("this target's adapter cannot capture", "$text-muted")
            else:
                ln.add(f"none yet: c ops-only, f full, N={ctx.capture_steps} steps", "$text-muted").nl()
                ln.add("[ ] halve/double N; bundles go to the engine's snapshots", "$text-muted")
            return ln
        out: list[list[tuple[str, str]]] = []  # lines of (text, style)
        for c in caps:
            lines: list[list[tuple[str, str]]] = []
            head = [(f"{c.mode:<4} ", "bold"), (f"N={c.steps:<3} ", "$text-muted"),
                    (f"{c.state} ", STATE_STYLE.get(c.state, "bold"))]  # fmt: skip
            if c.state == "capturing":
                frac = c.steps_done / c.steps if c.steps else 0.0
                bw = min(16, max(4, width - 40))
                filled = bar(frac, bw).rstrip(" ")
                head += [(f"{c.steps_done}/{c.steps} ", "bold"), (filled, "$warning"),
                         ("░" * (bw - len(filled)), "$text-disabled")]  # fmt: skip
                if c.first_step is not None:
                    head.append((f" from step {c.first_step}", "$text-muted"))
            elif c.state == "armed":
                head.append(("waiting for the next step boundary", "$text-muted"))
            elif c.state == "exporting":
                seen = ctx.exporting_seen.get(c.capture_id)
                el = f"{ctx.mono_now - seen:.1f} s" if seen is not None else "…"
                head.append((f"{c.steps_done}/{c.steps} steps, export running {el}", "$text-muted"))
            elif c.state == "saved":
                head.append((f"{c.steps_done}/{c.steps} steps", "bold"))
                if c.export_s is not None:
                    head.append((f" · export {c.export_s:.2f} s", ""))
            if c.cold:
                head.append((" (cold profiler)", "$warning"))
            lines.append(head)
            if c.trigger:
                lines.append([("  triggered by ", "$text-muted"), (c.trigger, "bold $accent")])
            if c.state == "saved":
                lines.append([(f"  trace {size(c.trace_bytes)} · {c.events or 0:,} events", "")])
                if c.via:  # which path the capture took (vLLM: rltperf's workers or vLLM's profiler)
                    lines.append([("  via " + elide(c.via, max(10, width - 6)), "$text-muted")])
            if c.state in ("failed", "refused"):
                text = c.error or "no reason given"
                step = max(10, width - 2)
                for k in range(0, min(len(text), 3 * step), step):
                    lines.append([("  " + text[k : k + step], "$error")])
                if c.bundle:
                    lines.append([("  error kept in " + _short_path(c.bundle, width - 18), "$text-muted")])
            elif c.bundle:
                lines.append([("  " + _short_path(c.bundle, width - 3), "$text-muted")])
            if out and len(out) + len(lines) > height:
                break
            out.extend(lines)
        for line in out[:height]:
            ln.extend(line).nl()
        return ln
