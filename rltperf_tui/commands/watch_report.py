"""``rltperf watch``'s report: ``OUT/index.html``, ``events.json`` and a chart per target.

The figures cover the whole run (``rltperf_tui.live.whole_run``), not the recordings
still on disk nor the monitor's bounded step ring: the report says which figures are
exact, which are sketched (with the sketch's bound) and which raw steps are still on
disk; the chart is the whole run's bounded series with the trigger events marked.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
from collections.abc import Sequence
from typing import Any, Protocol

from rltperf_tui.live.aggregator import TargetStats
from rltperf_tui.live.triggers import TriggerSet
from rltperf_tui.live.whole_run import WholeRun


class Recordings(Protocol):
    """What the report reads of a target's rotating recordings."""

    files: list[str]
    removed: list[str]

    def on_disk(self) -> dict[str, Any] | None:
        """The raw steps still on disk (``watch._Rotating.on_disk``)."""
        ...


class WatchedTarget(Protocol):
    """What the report reads of a watched target (``watch._Watched``)."""

    target: str
    triggers: TriggerSet | None
    ended: bool
    end_reason: str
    stats: TargetStats
    events: list[dict[str, Any]]
    dropped_events: int
    run: WholeRun
    run_path: str

    @property
    def rec(self) -> Recordings:
        """The target's rotating recordings."""
        ...


def safe_name(target: str) -> str:
    """A target as a file-name stem."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", target.split("://", 1)[-1]).strip("_") or "target"


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _p(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _figures_table(fig: dict[str, Any]) -> str:
    """The whole run's figures, exact ones and sketched ones apart."""
    acc = fig["relative_accuracy"]
    ex = fig["excluded"]
    exact = (
        "<tr><th>steps</th><th>wall s</th><th>baseline s</th><th>idle</th><th>MBU</th><th>tokens/s</th>"
        "<th>steps/s</th><th>step mean / max ms</th><th>requests ok / failed</th><th>left out</th></tr>"
        f"<tr><td>{fig['steps']}</td><td>{fig['wall_s']:.1f}</td><td>{fig['baseline_s']:.1f}</td>"
        f"<td>{_p(fig['idle_fraction'])}</td><td>{_p(fig['mbu'])}</td><td>{_n(fig['tokens_per_s'])}</td>"
        f"<td>{_n(fig['steps_per_s'])}</td><td>{_n(fig['step_ms_mean'])} / {_n(fig['step_ms_max'])}</td>"
        f"<td>{fig['requests']['ok']} / {fig['requests']['failed']}</td>"
        f"<td>{ex['profiled_steps']} profiled, {ex['exporting_steps']} exporting, {ex['warmup_steps']} warm-up "
        f"steps ({ex['seconds']:.1f} s); {ex['requests']} requests</td></tr>"
    )
    rows = "".join(
        f"<tr><td>{name}</td>"
        + "".join(f"<td>{_n(fig[key][p])}</td>" for p in ("p50", "p95", "p99"))
        + "</tr>"
        for name, key in (("step", "step_ms"), ("gap", "gap_ms"), ("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
    )
    return (
        "<h3>Whole run: exact</h3><table>" + exact + "</table>"
        f"<h3>Whole run: sketched (DDSketch, each within {acc:.0%} of the sample at its rank)</h3>"
        "<table><tr><th>ms</th><th>P50</th><th>P95</th><th>P99</th></tr>" + rows + "</table>"
    )


def _on_disk_text(w: WatchedTarget) -> str:
    d = w.rec.on_disk()
    first = w.run.first_ns
    names = ", ".join(html.escape(os.path.basename(f)) for f in w.rec.files)
    if d is None or first is None:
        return f"<p>Raw steps on disk: none. Recordings: {names or 'none'}.</p>"
    t0, t1 = ((t - first) / 1e9 for t in d["span_ns"])
    return (
        f"<p>Raw steps on disk: {d['steps']} steps (#{d['step_ids'][0]}–#{d['step_ids'][1]}), from "
        f"{t0:.1f} s to {t1:.1f} s of the run, in {names}"
        + (
            f"; {d['rotated_out']} older files were rotated out to stay within the budget, so the raw "
            f"steps of the first {t0:.1f} s are gone: the figures above are the whole run's all the same"
            if d["rotated_out"]
            else ""
        )
        + f". The whole-run figures are persisted in {html.escape(os.path.basename(w.run_path))}.</p>"
    )


def _events_table(w: WatchedTarget, events: list[dict[str, Any]]) -> str:
    first = w.run.first_ns or w.stats.first_ns
    rows = "".join(
        "<tr><td>{t:.1f} s</td><td>{rule}</td><td>{v:.4g}</td><td>{step}</td><td>{res}</td><td>{detail}</td></tr>".format(
            t=(e["ts_ns"] - (first or e["ts_ns"])) / 1e9,
            rule=html.escape(e["rule"]),
            v=e["value"],
            step=e["step_id"] if e["step_id"] is not None else "window",
            res=html.escape(e["result"]),
            detail=html.escape(str(e.get("bundle") or e.get("reason") or "")),
        )
        for e in events
    )
    return (
        "<h3>Trigger events</h3>"
        + (
            f"<p>{w.dropped_events} older fires that were not captured are counted, not listed.</p>"
            if w.dropped_events
            else ""
        )
        + (
            "<table><tr><th>at</th><th>rule</th><th>value</th><th>step</th><th>result</th>"
            f"<th>bundle / reason</th></tr>{rows}</table>"
            if events
            else "<p>No rule fired.</p>"
        )
    )


def write_report(
    out: str, watched: Sequence[WatchedTarget], args: argparse.Namespace, elapsed: float, stopped: str = ""
) -> str:
    """Write OUT/index.html (and events.json, one chart per target); return the index path.
    ``stopped``: why the run ended early ("interrupted", or what could not be written)."""
    sections = []
    all_events = []
    for w in watched:
        ceiling = w.stats.ceiling
        fig = w.run.figures(ceiling.peak_bw_gbps if ceiling else None)
        events = sorted(w.events, key=lambda e: e["ts_ns"])
        all_events.append({"target": w.target, "summary": fig, "raw_on_disk": w.rec.on_disk(), "events": events,
                           "recordings": w.rec.files, "rotated_out": w.rec.removed})  # fmt: skip
        chart = _chart(w, events, os.path.join(out, f"steps-{safe_name(w.target)}.png"))
        sections.append(
            f"<h2>{html.escape(w.target)}</h2>"
            f"<p>{html.escape(w.triggers.status() if w.triggers else '')}"
            f"{' · ended: ' + html.escape(w.end_reason) if w.ended else ''}</p>"
            + _figures_table(fig)
            + _on_disk_text(w)
            + (
                f'<p><img src="{os.path.basename(chart)}" alt="step time with trigger events"></p>'
                if chart
                else ""
            )
            + _events_table(w, events)
        )
    with open(os.path.join(out, "events.json"), "w") as f:
        json.dump(all_events, f, indent=1, default=str)
    page = (
        "<!doctype html><meta charset=utf-8><title>rltperf watch</title>"
        "<style>body{font-family:sans-serif;max-width:70em;margin:auto}td,th{padding:2px 8px;text-align:left}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f2f2f2}</style>"
        f"<h1>rltperf watch</h1><p>{elapsed:.0f} s{f' ({html.escape(stopped)})' if stopped else ''}; "
        f"triggers {html.escape(', '.join(args.trigger))}; captures of {args.steps} steps ({args.mode}), "
        f"cooldown {args.cooldown:g} s, at most {args.max_captures}. Figures over each target's whole run "
        "(its wall time; profiled, exporting and warm-up steps and the requests in flight during them left "
        "out), kept beside the recordings in bounded memory: sums and counts exact, percentiles of pooled "
        "samples sketched.</p>" + "".join(sections)
    )
    path = os.path.join(out, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def _chart(w: WatchedTarget, events: list[dict[str, Any]], path: str) -> str | None:
    """Step time over the whole run (its bounded series) with the trigger events marked;
    None without steps or matplotlib (the report says the rest)."""
    x, mean, mx, excl = w.run.chart_series()
    first = w.run.first_ns
    if not x.size or first is None:
        return None
    try:
        from rltperf_tui.analysis.plots import _plt, _save

        plt = _plt()
    except Exception:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(x, mean, "-", lw=1, color="#4C72B0", label="mean step ms")
    ax.plot(x, mx, ".", ms=2, color="#DD8452", label="longest step ms")
    if (excl > 0).any():
        ax.plot(x[excl > 0], mx[excl > 0], "x", ms=3, color="#999999", label="with excluded steps")
    for e in events:
        c = "#C44E52" if e["result"] == "saved" else "#999999"
        ax.axvline((e["ts_ns"] - first) / 1e9, color=c, lw=1, alpha=0.8)
    ax.set_xlabel(
        f"seconds since the first record, {w.run.bucket_s:g} s buckets (red: triggered capture, grey: fire not captured)"
    )
    ax.set_ylabel("ms (log)")
    ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title(f"{w.target}: step time over the whole run, trigger events marked")
    return str(_save(fig, path))
