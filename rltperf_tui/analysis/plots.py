"""PNG charts for ``report --png`` and ``compare --png`` (matplotlib, Agg backend).

matplotlib is an optional extra (``pip install 'rltperf[plots]'``); without it
``PlotUnavailable`` says so in a sentence.  Every chart says in its title what it shows
and whether its timings were profiled.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_adapters.definitions import roofline as RL

COLORS = [
    "#4C72B0",
    "#DD8452",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
]
A_COLOR, B_COLOR = "#4C72B0", "#C44E52"


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            "--png needs matplotlib, which is not installed: pip install 'rltperf[plots]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str) -> str:
    """Write the chart to ``path``; one that cannot be written whole (a full disk) is
    removed, not left empty or cut, and the ``OSError`` raised."""
    import matplotlib.pyplot as plt

    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    finally:
        plt.close(fig)
    return path


def stacked_bars(
    path: str,
    bars: Sequence[tuple[str, dict[str, float]]],
    title: str,
    ylabel: str = "ms",
    totals: Sequence[float | None] | None = None,
    subtitle: str = "",
) -> str:
    """One stacked bar per entry (stage → ms); ``totals`` draws each bar's full height as an outline."""
    plt = _plt()
    names: list[str] = []
    for _, d in bars:
        for k in d:
            if k not in names:
                names.append(k)
    n = len(bars)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * n + 3), 4.5))
    x = np.arange(n)
    bottom = np.zeros(n)
    for i, name in enumerate(names):
        vals = np.array([d.get(name, 0.0) for _, d in bars])
        ax.bar(x, vals, bottom=bottom, color=COLORS[i % len(COLORS)], label=name, width=0.7)
        bottom += vals
    if totals is not None:
        t = np.array([v if v is not None else np.nan for v in totals])
        ax.bar(x, t, fill=False, edgecolor="black", linewidth=0.8, width=0.7, label="whole step")
    ax.set_xticks(x)
    ax.set_xticklabels(
        [lab for lab, _ in bars], rotation=45 if n > 8 else 0, ha="right" if n > 8 else "center"
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def roofline(
    path: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    peak_bw_gbps: float | None,
    peak_gflops: float | None,
    title: str,
    ceiling_source: str | None = None,
) -> str:
    """Measured points (intensity FLOP/B, GFLOP/s) against the bandwidth and compute ceilings."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    xs: list[float] = []
    ys: list[float] = []
    for i, (label, pts) in enumerate(series):
        if not pts:
            continue
        px = [p[0] for p in pts]
        py = [p[1] for p in pts]
        xs += px
        ys += py
        ax.scatter(
            px, py, s=14, alpha=0.6, color=COLORS[i % len(COLORS)], label=f"{label} ({len(pts)} steps)"
        )
    if xs:
        lo = min(xs) / 10
        hi = max(xs) * 10
    else:
        lo, hi = 0.01, 100.0
    balance = RL.machine_balance(peak_gflops, peak_bw_gbps) if peak_bw_gbps and peak_gflops else None
    if balance is not None:
        lo = min(lo, balance / 10)
        hi = max(hi, balance * 10)
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    src = f" ({ceiling_source})" if ceiling_source else ""
    if peak_bw_gbps:
        ax.plot(
            grid,
            RL.attainable_gflops(grid, peak_bw_gbps, peak_gflops),
            color="black",
            linewidth=1.5,
            label=f"ceiling: {peak_bw_gbps:.1f} GB/s"
            + (f", {peak_gflops:.0f} GFLOP/s" if peak_gflops else "")
            + src,
        )
        if balance is not None:
            ax.axvline(
                balance,
                color="grey",
                linestyle=":",
                linewidth=1,
                label=f"machine balance {balance:.1f} FLOP/B",
            )
        # A point above the roof means the ceiling or the analytic counts are wrong: say so.
        above = sum(
            1
            for x, y in zip(xs, ys, strict=True)
            if y > 1.02 * RL.attainable_gflops(x, peak_bw_gbps, peak_gflops)
        )
        if above:
            ax.text(  # lower right: high intensity at low speed, where points rarely are
                0.98,
                0.03,
                f"{above} point(s) above the ceiling{src}:\nthe ceiling is too low or the counts are wrong"
                " (run rltperf calibrate)",
                transform=ax.transAxes,
                ha="right",
                va="bottom",
                bbox={"facecolor": "white", "edgecolor": "firebrick", "alpha": 0.85},
                fontsize=8,
                color="firebrick",
            )
    elif peak_gflops:
        ax.axhline(
            peak_gflops, color="black", linewidth=1.5, label=f"compute ceiling {peak_gflops:.0f} GFLOP/s{src}"
        )
    else:
        ax.text(
            0.5,
            0.95,
            "no ceiling known: pass --peak-gbps / --peak-gflops or run rltperf calibrate",
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize=8,
            color="firebrick",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    # below the axes, so it never hides a point
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    return _save(fig, path)


def exit_depth(path: str, hists: Sequence[tuple[str, Sequence[int]]], title: str) -> str:
    """Share of tokens by exit depth, one bar group per histogram."""
    plt = _plt()
    depth = max((len(h) for _, h in hists), default=0)
    fig, ax = plt.subplots(figsize=(max(5.0, depth * 0.8 + 2), 4))
    k = max(1, len(hists))
    w = 0.8 / k
    x = np.arange(1, depth + 1)
    for i, (label, h) in enumerate(hists):
        arr = np.zeros(depth)
        arr[: len(h)] = h
        tot = arr.sum()
        share = arr / tot if tot else arr
        mean = float((arr * x).sum() / tot) if tot else float("nan")
        color = [A_COLOR, B_COLOR][i] if k == 2 else COLORS[i % len(COLORS)]
        ax.bar(
            x + (i - (k - 1) / 2) * w,
            share,
            width=w,
            color=color,
            label=f"{label}: {int(tot)} tokens, mean depth {mean:.2f}",
        )
    top = max((max(h) / sum(h) for _, h in hists if h and sum(h)), default=1.0)
    ax.set_ylim(0, top * 1.35)  # headroom for the legend above the bars
    ax.set_xticks(x)
    ax.set_xlabel("exit depth (loop passes run)")
    ax.set_ylabel("share of tokens")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def cdfs(path: str, panels: Sequence[tuple[str, str, Sequence[tuple[str, Any]]]], title: str) -> str:
    """Overlaid empirical CDFs, one panel per metric: (panel title, unit, [(label, values)])."""
    plt = _plt()
    npanels = len(panels)
    cols = 2 if npanels > 1 else 1
    rows = (npanels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.8 * rows), squeeze=False, layout="constrained")
    for ax, (ptitle, unit, series) in zip(axes.flat, panels, strict=False):
        for i, (label, vals) in enumerate(series):
            v = np.sort(np.asarray(vals, dtype=np.float64))
            v = v[np.isfinite(v)]
            if v.size == 0:
                continue
            n = int(v.size)
            y = np.arange(1, n + 1) / n
            p99 = float(np.percentile(v, 99))
            if n > 600:  # the curve at 600 quantiles looks the same and draws far faster
                pick = np.unique(
                    np.concatenate(
                        [np.linspace(0, v.size - 1, 500).astype(int), np.arange(max(0, v.size - 100), v.size)]
                    )
                )
                v, y = v[pick], y[pick]
            color = [A_COLOR, B_COLOR][i] if len(series) == 2 else COLORS[i % len(COLORS)]
            tail = f"P99 {p99:.3g} {unit}" if n >= 100 else f"max {v[-1]:.3g} {unit} (too few for a P99)"
            v = np.concatenate([[v[0]], v])
            y = np.concatenate([[0.0], y])
            ax.step(v, y, where="post", color=color, label=f"{label} (n={n}, {tail})")
            if n >= 100:
                ax.axvline(p99, color=color, linestyle=":", linewidth=0.8)
        ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.6)
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction ≤ x")
        vals_all = [np.asarray(v, dtype=np.float64) for _, v in series]
        pos = np.concatenate([v[np.isfinite(v) & (v > 0)] for v in vals_all]) if vals_all else np.zeros(0)
        if pos.size and pos.max() / max(pos.min(), 1e-12) > 50:
            ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[npanels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)
