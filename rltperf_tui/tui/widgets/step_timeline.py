"""Step timeline: mean step time per time bucket, stacked by stage, plus the gap row.

Hand-drawn with eighth blocks: each column is one time bucket; a cell belongs to the
stage at its middle; the top cell of a column is a partial block in the top stage's
colour.  With NO_COLOR each stage gets its own fill glyph so stacks stay readable.
(textual-plotext is stuck on plotext 5 and a plotting widget's axes cost more rows
than this panel has at 80x24; a stacked bar reads at a glance.)
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from engine_adapters.definitions import figures as F
from rltperf_tui.tui.widgets._fmt import BLOCKS, STAGE_COLORS, STAGE_GLYPHS, Lines, ms, spark
from rltperf_tui.tui.widgets.panel import Panel, PanelContext

AXIS_W = 9
"""Columns of the y-axis labels."""


def timeline_columns(width: int) -> int:
    """Buckets the chart draws at a content ``width`` (one a column; the view is computed
    with this many)."""
    return max(8, max(10, width) - AXIS_W - 1)


def _nice_top(v: float) -> float:
    """Round ``v`` up to 1, 2 or 5 times a power of ten (a readable axis top)."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    e = math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        top = m * 10**e
        if top >= v * 0.999:
            return float(top)
    return float(10 ** (e + 1))


class StepTimeline(Panel):
    """Step time split by stage over the last N seconds, and the gap between steps."""

    DEFAULT_CSS = """
    StepTimeline { height: 12; }
    """

    def panel_title(self, ctx: PanelContext) -> str:
        return f"Step time by stage · mean per bucket · last {ctx.timeline_s:g} s"

    def body(self, ctx: PanelContext, width: int, height: int) -> Lines:
        st = ctx.stats
        legend_rows = 2 if height >= 8 else 1
        chart_h = max(2, height - 2 - legend_rows)  # gap row + x axis + legend
        tl = st.timeline
        if tl is None or not any(tl.steps):
            ln = Lines()
            ln.add("no steps in the last " + f"{ctx.timeline_s:g} s", "$text-muted")
            if st.state != "connected":
                shown = "waiting" if st.state == "reconnecting" and st.hello is None else st.state
                ln.add(f" (target {shown})", "$text-muted")
            return ln
        # the view's buckets: computed for this width (after a resize, until the next view)
        cols = len(tl.step_ms)
        stage_ms = tl.stage_ms
        step_ms = tl.step_ms
        gap_ms = tl.gap_ms
        names = [n for n in st.stage_names if n in stage_ms]
        no_color = ctx.no_color
        idx = {n: st.stage_names.index(n) for n in names}
        # Stage stacks per column (rows: stages in order, then "other": the part of the
        # step no stage covers, when over 2 %), in eighths of a cell; numpy over columns.
        tot = np.asarray(step_ms, dtype=np.float64)
        valid = np.isfinite(tot)
        parts = np.zeros((len(names) + 1, cols))
        if names:
            sm = np.asarray([stage_ms[n] for n in names], dtype=np.float64)
            parts[:-1] = np.where(np.isfinite(sm) & (sm > 0), sm, 0.0)
        covered = parts[:-1].sum(axis=0)
        tot0 = np.where(valid, tot, 0.0)
        rest = tot0 - covered
        parts[-1] = np.where(rest > 0.02 * tot0, rest, 0.0)
        totals = np.where(valid, np.maximum(tot0, covered), np.nan)
        # The axis covers the typical columns: a rare outlier (a capture's export step, a
        # stall) would otherwise flatten every other column for the chart's whole span; it
        # is drawn to the top with a ↑ and its value is named under the chart.
        peak = float(np.nanmax(totals)) if valid.any() else 1.0
        typical = F.percentile(totals[valid], 90) * 1.5 if valid.sum() >= 8 else peak
        top = _nice_top(min(peak, typical))
        clipped = valid & (np.nan_to_num(totals) > top * 1.001)
        unit = top / (chart_h * 8)  # ms per eighth
        total_e = np.where(valid, np.minimum(np.nan_to_num(totals) / unit, chart_h * 8), 0.0)
        cum = np.cumsum(parts / unit, axis=0)
        nonzero = parts > 0
        # the last part with any height in each column (a cell above the stages' sum)
        last_part = np.where(nonzero.any(axis=0), len(parts) - 1 - np.argmax(nonzero[::-1], axis=0), -1)
        part_names = [*names, "other"]

        def style_of(name: str) -> tuple[str, str]:
            if name == "other":
                return ("·" if no_color else "█"), "$text-muted"
            i = idx[name]
            glyph = STAGE_GLYPHS[i % len(STAGE_GLYPHS)] if no_color else "█"
            return glyph, STAGE_COLORS[i % len(STAGE_COLORS)]

        cells = [style_of(n) for n in part_names]
        # Every cell at once, as indices into a glyph and a style table: 0 blank, then the
        # parts (whole cells), then the partial blocks of 1..8 eighths, then ↑ (clipped);
        # a row is then added as runs of one style, not cell by cell.
        n_parts = len(part_names)
        glyphs = np.array([" ", *(g for g, _ in cells), *BLOCKS[1:9], "↑"])
        styles = ["", *(st for _, st in cells), "bold $warning"]
        lo = np.arange(chart_h)[:, None] * 8  # (rows, 1)
        mid = np.minimum(lo + 4, total_e[None, :] - 0.01)  # the cell's middle (or top, if partial)
        k = np.minimum((cum[None, :, :] <= mid[:, None, :]).sum(axis=1), last_part[None, :])
        filled = (total_e[None, :] > lo) & (last_part[None, :] >= 0)
        partial = filled & (total_e[None, :] < lo + 8)
        eighths = np.clip(np.rint(total_e[None, :] - lo), 1, 8).astype(np.int64)
        glyph_i = np.where(filled, np.where(partial, n_parts + eighths, 1 + k), 0)
        style_i = np.where(filled, 1 + k, 0)
        glyph_i[chart_h - 1, clipped] = n_parts + 9
        style_i[chart_h - 1, clipped] = n_parts + 1
        ln = Lines()
        for row in range(chart_h - 1, -1, -1):
            if row == chart_h - 1:
                ln.add(f"{top:g} ms".rjust(AXIS_W - 1) + "┤", "$text-muted")
            elif row == 0:
                ln.add("0 ms".rjust(AXIS_W - 1) + "┤", "$text-muted")
            else:
                ln.add(" " * (AXIS_W - 1) + "│", "$text-muted")
            text = "".join(glyphs[glyph_i[row]].tolist())
            si = style_i[row]
            cuts = [0, *(np.flatnonzero(si[1:] != si[:-1]) + 1).tolist(), cols]
            for a, b in pairwise(cuts):
                ln.add(text[a:b], styles[si[a]])
            ln.nl()
        # gap row: mean gap per bucket, scaled to its own max
        garr = np.asarray(gap_ms, dtype=np.float64)
        gmax = float(np.nanmax(garr)) if np.isfinite(garr).any() else None
        ln.add("gap".rjust(AXIS_W - 1) + "┤", "$text-muted")
        # buckets that held profiled/exporting steps (P) or a trigger's fire (▲) are
        # marked on the gap row: their figures are not the engine's baseline
        gap_cells = list(spark(gap_ms, gmax))
        marks = tl.flagged.copy()
        bucket_ns = tl.bucket_s * 1e9
        for t in ctx.fire_marks:
            c = int((t - tl.t0_ns) // bucket_ns)
            if 0 <= c < cols:
                marks[c] = 2
        if marks.any():
            for c, cell in enumerate(gap_cells):
                if marks[c] == 2:
                    ln.add("▲", "bold $error")
                elif marks[c] == 1:
                    ln.add("P", "bold $accent")
                else:
                    ln.add(cell, "$warning")
        else:
            ln.add("".join(gap_cells), "$warning")
        ln.nl()
        left = f"-{ctx.timeline_s:g} s"
        right = f"now · gap max {ms(gmax)} ms" if gmax is not None else "now"
        if marks.any():
            right = ("▲ trigger · " if (marks == 2).any() else "") + "P profiled · " + right
        if clipped.any():
            right = f"↑ {ms(peak)} ms · " + right
        pad = max(1, cols - len(left) - len(right))
        ln.add(" " * AXIS_W + left + " " * pad + right, "$text-muted")
        ln.nl()
        # legend: mean ms per step by stage over the chart's span (stage order = stack order)
        items: list[tuple[str, str, str]] = []
        for n in names:
            vals = np.asarray(stage_ms[n], dtype=np.float64)
            vals = vals[np.isfinite(vals)]
            mean = float(vals.mean()) if vals.size else 0.0
            glyph, style = style_of(n)
            items.append((glyph, style, f"{n} {ms(mean)}"))
        # Items are whole or absent: one that does not fit starts the next row, and when
        # no row is left a "…" says so (a cut item would show a wrong number).  On the
        # last row, room for that mark is kept unless the item is the last one.
        ln.add("ms/step".rjust(AXIS_W - 1) + " ", "$text-muted")
        line_w = AXIS_W
        rows_used = 1
        more = "  …"
        for k, (glyph, style, label) in enumerate(items):
            item_w = 2 + len(label)  # glyph, space, label
            sep = 2 if line_w > AXIS_W else 0
            # the rest of the items all fit on this row: no mark needed
            rest = sum(4 + len(x[2]) for x in items[k:]) - (0 if sep else 2)
            reserve = 0 if line_w + rest <= width else len(more)
            if line_w + sep + item_w + (reserve if rows_used >= legend_rows else 0) > width:
                if rows_used >= legend_rows or line_w == AXIS_W:
                    ln.add(more if line_w > AXIS_W else more.strip(), "$text-muted")
                    break
                ln.nl()
                rows_used += 1
                ln.add(" " * AXIS_W)
                line_w, sep = AXIS_W, 0
                rest = sum(4 + len(x[2]) for x in items[k:]) - 2
                reserve = 0 if line_w + rest <= width else len(more)
                if line_w + item_w + (reserve if rows_used >= legend_rows else 0) > width:
                    ln.add(more.strip(), "$text-muted")
                    break
            ln.add(" " * sep).add(glyph, style).add(" " + label)
            line_w += sep + item_w
        return ln
