"""Summary of a recording: the aggregator over the whole stream (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from engine_adapters.definitions.records import Ceiling, EngineInfo
from engine_adapters.monitor.recording import RecordingReader
from rltperf_tui.live.aggregator import MetricsWindow, TargetStats


def load_recording(
    path: str | os.PathLike[str], peak_gbps: float | None = None, peak_gflops: float | None = None
) -> tuple[TargetStats, dict[str, Any], str | None]:
    """A growing ``TargetStats`` holding every record of the file, its header, and a
    warning or None: what was skipped as damaged or cut off, with file byte offsets
    (``RecordingReader.warning``; the records before and after damage are all kept)."""
    stats = TargetStats(capacity=8192, grow=True)
    if peak_gbps is not None or peak_gflops is not None:
        stats.peak_override = Ceiling(
            device="(command line)", peak_bw_gbps=peak_gbps, peak_gflops=peak_gflops, source="command line"
        )
    with RecordingReader(path) as reader:
        for chunk in reader.chunks():
            stats.add(chunk)
        return stats, reader.header, reader.warning


SUMMARY_KEYS = (
    "steps", "wall_s", "baseline_s", "excluded_s", "step_ms", "gap_ms", "idle_fraction", "mbu",
    "tokens_per_s", "ttft_ms", "tpot_ms", "requests", "dropped", "peak", "achieved_gbps", "verdict",
    "steps_per_s", "stage_ms_mean", "goodput_rps", "profiled_steps", "excluded", "stale_s", "exit_hist",
    "mean_exit_depth", "loop_ms", "loop_tokens", "acceptance_rate", "mean_acceptance_len", "engine", "random_weights",
    "figures_from", "statistics", "metrics", "warning", "identity", "ranks",
)  # fmt: skip
"""The top-level keys of ``rltperf summary --json``: the same for every kind of target
(a figure a target cannot give is null).  ``figures_from`` says where the top-level
figures come from: ``"steps"`` (per-step records), ``"metrics"`` (a metrics endpoint
such as vLLM's ``/metrics``, whose full window is under ``metrics``) or null (neither).
``identity`` is where the stream comes from in a multi-rank server (DP rank, TP/PP size,
its workers, host); ``ranks`` the per-rank figures of a multi-rank engine
(``engine_adapters.definitions.ranks``: busy, wait and compute ms per step, the slowest
rank and the skew), null for a single rank.

``stale_s`` (live windows only, ``attach --jsonl``): the window is blind (a capture's
export owns most of it, ``figures.blind``) and the figures are those of the newest
window that was not, this many seconds older; else null."""

METRICS_FAILED_REASONS = ("abort", "error")
"""``finished_reason`` labels of vLLM's request counter that count as failed requests."""


def summarize(
    stats: TargetStats,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    window_s: float | None = None,
) -> dict[str, Any]:
    """The ``rltperf summary --json`` object (keys: ``SUMMARY_KEYS``): the whole stream, or
    what a bounded ring still keeps (``TargetStats.kept_seconds``; ``statistics`` then says so);
    with ``window_s``, the live window of its last seconds (``attach --jsonl``), same keys."""
    kept = stats.kept_seconds() if window_s is None else window_s
    w = stats.window(kept, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, hold=window_s is not None)
    out: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS)
    out.update(w.as_summary())
    out["dropped"] = stats.dropped
    ceiling = stats.ceiling
    out["peak"] = (
        {
            "bw_gbps": ceiling.peak_bw_gbps,
            "gflops": ceiling.peak_gflops,
            "source": ceiling.source,
            "device": ceiling.device,
        }
        if ceiling
        else None
    )
    out["achieved_gbps"] = w.achieved_gbps
    out["verdict"] = w.verdict
    out["steps_per_s"] = w.steps_per_s
    out["stage_ms_mean"] = w.stage_ms_mean
    out["goodput_rps"] = w.goodput_rps
    out["profiled_steps"] = w.profiled_steps
    out["excluded"] = {
        "profiled_steps": w.profiled_steps,
        "exporting_steps": w.exporting_steps,
        "warmup_steps": w.warmup_steps,
        "seconds": round(w.excluded_s, 6),
        "requests": w.requests_excluded,
    }
    out["exit_hist"] = w.exit_hist
    out["mean_exit_depth"] = w.mean_exit_depth
    out["loop_ms"] = w.loop_ms_mean
    out["loop_tokens"] = w.loop_tokens_mean
    out["acceptance_rate"] = w.acceptance_rate
    out["mean_acceptance_len"] = w.mean_acceptance_len
    info = stats.info
    out["engine"] = info.name if info else None
    out["random_weights"] = info.random_weights if info else None
    out["identity"] = identity(info)
    rf = stats.rank_window(kept)
    out["ranks"] = rf.as_summary() if rf is not None else None
    out["figures_from"] = "steps" if w.steps else None
    out["statistics"] = (
        "percentiles of pooled samples over the whole recording; rates over its wall time "
        "(first to last timestamp), profiled/exporting/warm-up steps and their time left out"
    )
    if window_s is not None:
        out["statistics"] = (
            f"percentiles of pooled samples over the last {window_s:g} s of data time; rates over that "
            "wall time, profiled/exporting/warm-up steps and their time left out"
        )
        if w.stale_s is not None:
            out["statistics"] += (
                f"; stale: excluded steps own most of this window, the figures are those of "
                f"{w.stale_s:.1f} s earlier"
            )
    elif kept is not None:
        out["statistics"] += f"; only the last {len(stats.steps)} steps ({kept:.0f} s) were kept in memory"
    mw = stats.metrics_window(window_s)  # vLLM over HTTP: its /metrics, not per-step records
    if mw is not None:
        out["metrics"] = asdict(mw)
        if not w.steps:
            _from_metrics(out, mw)
    return out


def identity(info: EngineInfo | None) -> dict[str, Any] | None:
    """Where a stream comes from in a multi-rank server (``summary --json``'s ``identity``)."""
    if info is None:
        return None
    return {"dp_rank": info.dp_rank, "tp_size": info.tp_size, "pp_size": info.pp_size, "ranks": info.ranks,
            "host": info.host}  # fmt: skip


def _from_metrics(out: dict[str, Any], mw: MetricsWindow) -> None:
    """The top-level figures of a recording without step records, from its metrics window."""
    out["figures_from"] = "metrics"
    out["wall_s"] = out["baseline_s"] = round(mw.span_s, 6)  # the scrape intervals the rates are over
    out["tokens_per_s"] = mw.tokens_per_s
    out["steps_per_s"] = mw.steps_per_s
    out["achieved_gbps"] = mw.achieved_gbps
    out["mbu"] = mw.mbu
    out["ttft_ms"] = mw.latency_ms.get("ttft", out["ttft_ms"])
    out["tpot_ms"] = mw.latency_ms.get("tpot", out["tpot_ms"])
    failed = sum(v for k, v in mw.finished.items() if k in METRICS_FAILED_REASONS)
    out["requests"] = {"ok": int(sum(mw.finished.values()) - failed), "failed": int(failed)}
    out["statistics"] = (
        f"from {mw.source}: rates over {mw.span_s:.1f} s of scrape intervals ({mw.samples} scrapes); "
        f"TTFT/TPOT {mw.percentile_method}; no per-step records, so step/gap/idle figures are null"
    )
