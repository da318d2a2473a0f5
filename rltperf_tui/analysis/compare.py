"""``rltperf compare``: A/B evidence from two recordings (or interleaved rounds), or two bundles.

Recordings are the unprofiled baselines: their step, gap, TTFT and TPOT distributions
are compared side by side (P50/P95/P99 of pooled samples and the difference), with
tokens/s, idle fraction and MBU, each difference with a bootstrap 95 % confidence
interval and a verdict (see ``rltperf_tui.analysis.stats`` for the method).  Steps
flagged profiled, exporting or warm-up are left out, and requests overlapping them too.

Configuration differences are listed first: a comparison across configurations says so.
Two isolated-feature gains are never combined into one claim: the command compares
exactly one A against one B (or interleaved rounds of the same A and B) and says that
its result holds for that pair only.

Bundles are profiled captures: their operator, stage and step differences locate where
time moved; they are not a speed-up claim.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from engine_adapters.definitions import energy as E
from engine_adapters.definitions import figures as F
from rltperf_tui.analysis import gate as G
from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.compare_bundles import compare_bundles
from rltperf_tui.analysis.compare_inputs import (
    COMBINE_REFUSAL,
    EXCLUDE_FLAGS,
    SCOPE,
    CompareError,
    RecSeries,
    check_distinct,
    config_diff,
    config_note,
    flat_info,
    load_side,
)
from rltperf_tui.analysis.compare_text import render_text

__all__ = [
    "COMBINE_REFUSAL",
    "EXCLUDE_FLAGS",
    "SCOPE",
    "CompareError",
    "RecSeries",
    "check_distinct",
    "compare_bundles",
    "compare_recordings",
    "config_diff",
    "load_side",
    "public",
    "render_text",
]


_DIST = (("step_ms", "step time"), ("gap_ms", "step gap"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))


def _metric_values(part_or_side: Any, key: str, q: float | None) -> float | None:
    x = part_or_side[key] if isinstance(part_or_side, dict) else part_or_side.pooled(key)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return None
    return F.percentile(x, q) if q is not None else float(x.mean())


def compare_recordings(
    a_paths: list[str],
    b_paths: list[str],
    *,
    resamples: int = S.DEFAULT_RESAMPLES,
    alpha: float = S.DEFAULT_ALPHA,
    min_effect: float = S.DEFAULT_MIN_EFFECT,
    peak_gbps: float | None = None,
    seed: int = 0,
    block_s: float = S.DEFAULT_BLOCK_S,
    fail_on: list[G.FailOn] | None = None,
) -> dict[str, Any]:
    """Compare A and B recordings (several of each: interleaved rounds, paired in order).

    ``fail_on``: the regression gate's rules (``analysis.gate``); each sets its figure's
    smallest effect of interest, and the result then has a ``gate``."""
    check_distinct([p for pair in zip(a_paths, b_paths, strict=False) for p in pair])
    rng = np.random.default_rng(seed)
    A = load_side("A", a_paths, peak_gbps, block_s)
    B = load_side("B", b_paths, peak_gbps, block_s)
    for side in (A, B):
        if not any(p["steps"] for p in side.parts):
            names = ", ".join(os.path.basename(x) for x in side.paths)
            raise CompareError(
                f"{side.label} ({names}) holds no unprofiled steps: nothing to compare "
                "(was the engine stepping while it was recorded?)"
            )
    warnings = A.warnings + B.warnings
    cdiff = _config_differences(A, B, warnings)
    diffs = _distribution_diffs(A, B, block_s, rng, resamples)
    peak_mbu = _rate_diffs(A, B, diffs, warnings, rng, resamples)
    a_step_p50 = _metric_values(A, "step_ms", 50) or 0.0
    S.decide(
        diffs,
        alpha=alpha,
        min_effect=min_effect,
        abs_floor={"ms": 0.01 * a_step_p50, "fraction": 0.01},
        floor_basis={"ms": "1% of A's median step time", "fraction": "the absolute floor"},
        effects=G.effects(fail_on) if fail_on else None,
    )

    # drift: within each recording (quarters), then between rounds (in this order)
    drift = {
        "segments": _segment_drift(A, B, diffs, peak_mbu),
        "rounds": _round_drift(A, B, diffs, warnings, peak_mbu),
    }
    metrics = [d.as_dict() for d in diffs]
    summary = _summary(metrics)
    stage_rows = _stage_rows(A, B)
    gate = {"gate": G.judge(metrics, fail_on)} if fail_on else {}
    return {
        "kind": "recordings",
        "a": _side_json(A),
        "b": _side_json(B),
        "config_differences": cdiff,
        "same_configuration": not cdiff,
        "config_note": config_note(cdiff),
        "metrics": metrics,
        "significant": [m["key"] for m in metrics if m["significant"]],
        "summary": summary,
        "stages_ms_mean": stage_rows,
        "drift": drift,
        "warnings": warnings,
        "method": (
            f"percentiles of pooled samples (profiled/exporting/warm-up steps left out); 95% CIs by moving-block "
            f"bootstrap ({resamples} resamples; blocks cover the autocorrelation and at least {block_s:g} s of the "
            f"recording, so the machine's slow wander is inside the interval; ratio metrics resample those "
            f"blocks of steps); significant = p < {alpha:g} after Holm over the metrics tested AND |diff| ≥ "
            f"{min_effect:.0%} of A (times also ≥ 1% of A's median step time; fractions ≥ 0.01); drift check: "
            "a difference must exceed how much each recording's own quarters disagree and, with rounds, keep its "
            "sign in every round"
        ),
        "scope": SCOPE,
        "exit_hist": {
            "a": _sum_hist([p["exit_hist"] for p in A.parts]),
            "b": _sum_hist([p["exit_hist"] for p in B.parts]),
        },
        **gate,
        "_series": (A, B),
    }


def _config_differences(A: RecSeries, B: RecSeries, warnings: list[str]) -> list[dict[str, Any]]:
    """Configuration fields A and B differ in (listed first); rounds of one side that
    differ among themselves are a warning."""
    cfg_a = flat_info(A.info, A.headers[0] if A.headers else None, A.ceiling)
    cfg_b = flat_info(B.info, B.headers[0] if B.headers else None, B.ceiling)
    same_host = cfg_a.get("recorded_on_host") == cfg_b.get("recorded_on_host")
    cdiff = config_diff(cfg_a, cfg_b, ignore=("recorded_on_host",) if same_host else ())
    for side in (A, B):
        firsts = [flat_info(i, h, None) for i, h in zip(side.infos, side.headers, strict=True)]
        for i in range(1, len(firsts)):
            rd = config_diff(firsts[0], firsts[i])
            if rd:
                warnings.append(
                    f"{side.label}'s recordings differ among themselves in "
                    f"{', '.join(x['field'] for x in rd)}: they are not rounds of one configuration"
                )
    return cdiff


def _distribution_diffs(
    A: RecSeries, B: RecSeries, block_s: float, rng: np.random.Generator, resamples: int
) -> list[S.Diff]:
    """P50/P95/P99 of step time, gap, TTFT and TPOT (pooled samples), A vs B."""
    diffs: list[S.Diff] = []
    span_a = sum(p["span_s"] for p in A.parts)
    span_b = sum(p["span_s"] for p in B.parts)
    for key, name in _DIST:
        xa, xb = A.pooled(key), B.pooled(key)
        # the time floor of the blocks, in samples of this series
        fa = math.ceil(block_s * xa.size / span_a) if span_a > 0 else 1
        fb = math.ceil(block_s * xb.size / span_b) if span_b > 0 else 1
        for q in S.PCTS:
            d = S.compare_stat(
                f"{name} P{q}", "ms", xa, xb, q, rng, resamples, min_block_a=fa, min_block_b=fb
            )
            d.extra["key"] = f"{key}.p{q}"
            diffs.append(d)
    return diffs


def _rate_diffs(
    A: RecSeries,
    B: RecSeries,
    diffs: list[S.Diff],
    warnings: list[str],
    rng: np.random.Generator,
    resamples: int,
) -> float | None:
    """Tokens/s, idle fraction and MBU over the recordings' time blocks, appended to
    ``diffs``; returns the peak bandwidth MBU was computed against."""
    ab, bb = A.blocks(), B.blocks()
    d = S.compare_ratio("tokens/s", "tok/s", ab, bb, "tokens_per_s", rng, resamples)
    d.extra["key"] = "tokens_per_s"
    diffs.append(d)
    if all(p["busy_known"] for p in A.parts + B.parts):
        d = S.compare_ratio("idle fraction", "fraction", ab, bb, "idle_fraction", rng, resamples)
    else:
        d = S.Diff(
            "idle fraction",
            "fraction",
            None,
            None,
            verdict="no data",
            reason="the engine reports no device busy time in one of the recordings",
        )
    d.extra["key"] = "idle_fraction"
    diffs.append(d)
    peak_a = A.ceiling.peak_bw_gbps if A.ceiling else None
    peak_b = B.ceiling.peak_bw_gbps if B.ceiling else None
    peak_mbu = peak_a or peak_b
    if peak_a and peak_b and peak_a != peak_b:
        src_a = A.ceiling.source if A.ceiling else "?"
        src_b = B.ceiling.source if B.ceiling else "?"
        warnings.append(
            f"A and B were measured against different peaks ({peak_a:.1f} GB/s, {src_a}; {peak_b:.1f} GB/s, "
            f"{src_b}): MBU of both is computed against A's {peak_a:.1f} GB/s"
        )
    if peak_mbu and all(p["bytes_known"] for p in A.parts + B.parts):
        d = S.compare_ratio("MBU", "fraction", ab, bb, "mbu", rng, resamples, peak_bw_gbps=peak_mbu)
    else:
        why = (
            "no peak bandwidth known (pass --peak-gbps)"
            if not peak_mbu
            else "the engine reports no bytes per step"
        )
        d = S.Diff("MBU", "fraction", None, None, verdict="no data", reason=why)
    d.extra["key"] = "mbu"
    diffs.append(d)
    _energy_diffs(A, B, ab, bb, diffs, warnings, rng, resamples)
    return peak_mbu


def _energy_diffs(
    A: RecSeries,
    B: RecSeries,
    ab: S.BlockSums,
    bb: S.BlockSums,
    diffs: list[S.Diff],
    warnings: list[str],
    rng: np.random.Generator,
    resamples: int,
) -> None:
    """Joules per output token and power, from each side's energy counter (figures)."""
    parts = A.parts + B.parts
    sources = {p["energy_source"] for p in parts}
    why = next(
        (p["energy_why"] or "no energy counter readings" for p in parts if not p["energy_known"]), None
    )
    if why is None and len(sources) > 1:
        why = f"A and B measured energy with different counters ({', '.join(sorted(map(str, sources)))})"
    for metric, unit, key in (("energy per token", "J/tok", "joules_per_token"), ("power", "W", "power_w")):
        if why is None and ab.joules is not None and bb.joules is not None:
            d = S.compare_ratio(metric, unit, ab, bb, key, rng, resamples)
        else:
            d = S.Diff(
                metric, unit, None, None, verdict="no data", reason=why or "no energy counter readings"
            )
        d.extra["key"] = key
        diffs.append(d)
    if why is None:
        src = next(iter(sources))
        warnings.append(f"energy: {E.CAVEATS.get(src, src)}")


def _segment_drift(A: RecSeries, B: RecSeries, diffs: list[S.Diff], peak: float | None) -> dict[str, Any]:
    """Drift within recordings: a significant difference must exceed how much each
    recording's own quarters disagree (else it fails ``S.FAIL_DRIFT``)."""
    segments: dict[str, Any] = {}
    for d in diffs:
        if not d.significant:
            continue
        key = d.extra["key"]
        segs = {
            f"{side.label}{i + 1}": _segment_values(p, key, peak)
            for side in (A, B)
            for i, p in enumerate(side.parts)
        }
        spreads = [x for x in (S.spread(v) for v in segs.values() if v) if x is not None]
        if not spreads:
            continue
        worst = max(spreads)
        segments[key] = {k: None if v is None else [round(x, 6) for x in v] for k, v in segs.items()}
        d.extra["segment_spread"] = S.round_sig(worst)
        assert d.diff is not None
        if abs(d.diff) <= worst:
            d.failed.append(S.FAIL_DRIFT)
        d.settle()
    return segments


def _round_drift(
    A: RecSeries, B: RecSeries, diffs: list[S.Diff], warnings: list[str], peak: float | None = None
) -> dict[str, Any] | None:
    """Drift between interleaved rounds: a significant difference must keep its sign in
    every round (else it fails ``S.FAIL_ROUNDS``), the percentiles and the ratio figures
    alike (each round's ratio by the window's definition); None with fewer than two
    rounds."""
    n_rounds = min(len(A.parts), len(B.parts))
    if n_rounds >= 2:
        rounds = []
        order = sorted(
            range(n_rounds), key=lambda i: (A.headers[i].get("created_utc", ""), A.parts[i]["first_ns"])
        )
        for d in diffs:
            key = d.extra["key"]
            base, _, qs = key.partition(".")
            if base in dict(_DIST):
                qq = float(qs[1:])
                va = [_metric_values(A.parts[i], base, qq) for i in order]
                vb = [_metric_values(B.parts[i], base, qq) for i in order]
            elif key in F.RATIO_FIGURES and d.p is not None:
                va = [_part_ratio(A.parts[i], key, peak) for i in order]
                vb = [_part_ratio(B.parts[i], key, peak) for i in order]
            else:
                continue
            if any(v is None for v in va + vb):
                continue
            dd = [float(y or 0.0) - float(x or 0.0) for x, y in zip(va, vb, strict=True)]
            consistent = all(x > 0 for x in dd) or all(x < 0 for x in dd)
            fva = [float(v) for v in va if v is not None]
            med = float(np.median(fva))
            a_spread: float | None = (max(fva) - min(fva)) / abs(med) if med else None
            rounds.append(
                {
                    "key": key,
                    "a": va,
                    "b": vb,
                    "diffs": dd,
                    "consistent_sign": consistent,
                    "a_spread_rel": None if a_spread is None else round(float(a_spread), 4),
                }
            )
            if d.significant and not consistent:
                d.extra["round_diffs"] = [S.round_sig(x) for x in dd]
                d.failed.append(S.FAIL_ROUNDS)
                d.settle()
        return {"n": n_rounds, "metrics": rounds}
    elif len(A.parts) != len(B.parts):
        warnings.append(f"A has {len(A.parts)} recordings and B {len(B.parts)}: rounds must pair up")

    return None


def _summary(metrics: list[dict[str, Any]]) -> list[str]:
    """One sentence per significant metric, or what the compared metrics came to.

    Written from the metrics' JSON figures with the table's formatting functions, so the
    sentences and the table print every number identically."""
    sig = [m for m in metrics if m["significant"]]
    out = []
    for m in sig:
        direction = "higher" if m["diff"] > 0 else "lower"
        out.append(
            f"{m['metric']}: B is {S.fmt(abs(m['diff']))} {m['unit']} {direction} than A "
            f"({S.fmt_rel(m['rel_diff'])} of A; 95% CI {S.fmt_ci(*m['ci95'])}) — significant"
        )
    if not sig:
        tested = [m for m in metrics if m["p"] is not None]
        counts: dict[str, int] = {}
        for m in tested:
            counts[m["verdict"]] = counts.get(m["verdict"], 0) + 1
        parts = [f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])]
        out.append(
            f"No significant difference: of {len(tested)} compared metrics, " + "; ".join(parts) + "."
            if parts
            else "No metric could be compared."
        )
    return out


def _segment_values(part: dict[str, Any], key: str, peak: float | None) -> list[float] | None:
    """A metric over the quarters of one recording (None when the quarters are too small)."""
    base, _, qs = key.partition(".")
    if base in dict(_DIST):
        return S.segment_values(part[base], float(qs[1:]))
    raw = part["raw"]
    n = raw["start"].size
    if n < 40 or key not in F.RATIO_FIGURES or (key == "mbu" and not peak):
        return None
    # each quarter a window of its own: the window's formula on the four at once
    sums = _ratio_sums(raw, np.array_split(np.arange(n), 4))
    if (sums.seconds <= 0).any():
        return None
    return [float(v) for v in F.ratio_figure(key, sums, peak)]


def _ratio_sums(raw: dict[str, Any], groups: list[np.ndarray]) -> F.RatioSums:
    """The ratio figures' sums over each group of a recording's steps; time is the
    steps' owned time, as the whole recording's (figures)."""
    en = raw.get("energy")
    return F.RatioSums(
        seconds=np.array([float(raw["owned_ns"][g].sum()) / 1e9 for g in groups]),
        tokens=np.array([raw["tokens"][g].sum() for g in groups]),
        busy_s=np.array([np.nansum(raw["busy"][g]) / 1e9 for g in groups]),
        nbytes=np.array([np.nansum(raw["bytes"][g]) for g in groups]),
        joules=np.array([en[0][g].sum() for g in groups]) if en is not None else None,
        energy_s=np.array([en[1][g].sum() for g in groups]) if en is not None else None,
    )


def _part_ratio(part: dict[str, Any], key: str, peak: float | None) -> float | None:
    """A ratio figure over one whole recording (one round), by the window's definition."""
    n = part["raw"]["start"].size
    if not n or (key == "mbu" and not peak):
        return None
    sums = _ratio_sums(part["raw"], [np.arange(n)])
    if sums.seconds[0] <= 0:
        return None
    return float(F.ratio_figure(key, sums, peak)[0])


def _sum_hist(hs: list[list[int]]) -> list[int]:
    n = max((len(h) for h in hs), default=0)
    tot = [0] * n
    for h in hs:
        for i, v in enumerate(h):
            tot[i] += v
    while tot and tot[-1] == 0:
        tot.pop()
    return tot


def _stage_rows(A: RecSeries, B: RecSeries) -> dict[str, dict[str, float | None]]:
    names = A.stage_names if len(A.stage_names) >= len(B.stage_names) else B.stage_names
    out: dict[str, dict[str, float | None]] = {}
    for i, n in enumerate(names):
        vals = []
        for side in (A, B):
            steps = sum(p["steps"] for p in side.parts)
            tot = sum(float(p["stage_sum_ms"][i]) for p in side.parts if i < len(p["stage_sum_ms"]))
            vals.append(tot / steps if steps else None)
        if any(vals):
            out[n] = {
                "a": vals[0],
                "b": vals[1],
                "diff": (vals[1] - vals[0]) if vals[0] is not None and vals[1] is not None else None,
            }
    return out


def _side_json(s: RecSeries) -> dict[str, Any]:
    info = s.info
    return {
        "recordings": s.paths,
        "engine": info.name if info else None,
        "random_weights": info.random_weights if info else None,
        "steps": sum(p["steps"] for p in s.parts),
        "steps_excluded": sum(p["steps_excluded"] for p in s.parts),
        "requests_ok": sum(p["requests_ok"] for p in s.parts),
        "requests_failed": sum(p["requests_failed"] for p in s.parts),
        "dropped": sum(p["dropped"] for p in s.parts),
        "created_utc": [h.get("created_utc") for h in s.headers],
        "peak": None
        if s.ceiling is None
        else {
            "bw_gbps": s.ceiling.peak_bw_gbps,
            "gflops": s.ceiling.peak_gflops,
            "source": s.ceiling.source,
        },
    }


def public(res: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a result (drops the in-memory series)."""
    return {k: v for k, v in res.items() if not k.startswith("_")}
