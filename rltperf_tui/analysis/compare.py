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

import hashlib
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import (
    Ceiling,
    EngineInfo,
    to_builtins,
)
from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.summary import load_recording
from rltperf_tui.elide import elide

EXCLUDE_FLAGS = F.EXCLUDED_FLAGS
SCOPE = (
    "This result holds for this A/B pair only: do not add it to a gain measured in another comparison "
    "(gains of isolated features are never combined into a claim for the combined mode; measure the "
    "combined mode itself)."
)
COMBINE_REFUSAL = (
    "rltperf compare takes one A and one B (or interleaved rounds A1 B1 A2 B2 ... of the same A and B). "
    "{n} inputs would combine separate comparisons into one claim, which the evidence rules forbid: gains "
    "of two isolated features do not add up to the gain of the combined mode. Record the combined mode and "
    "compare it with the baseline directly."
)


class CompareError(Exception):
    """The inputs cannot be compared; the message says why."""


# --------------------------------------------------------------------------- inputs


def _files_of(path: str) -> list[str]:
    """The files that make up an input: the file itself, or every file of a bundle folder."""
    if not os.path.isdir(path):
        return [path]
    out = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files)]
    return out


def _content_digest(path: str) -> str:
    h = hashlib.sha256()
    for f in _files_of(path):
        h.update(os.path.relpath(f, path).encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def check_distinct(paths: list[str]) -> None:
    """Refuse an input given twice: by path, by link (same inode) or by content (a copy).

    One file counted twice would pass as an independent round or side and narrow the
    evidence with nothing measured twice.  Content is hashed only among inputs of equal
    size, so distinct recordings cost one ``stat`` each.
    """
    seen: dict[tuple[int, int], int] = {}
    sizes: dict[int, list[int]] = {}
    for i, p in enumerate(paths):
        st = os.stat(p)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            j = seen[key]
            raise CompareError(
                f"input {i + 1} ({p}) is input {j + 1} ({paths[j]}) again: each input must be its own "
                "recording or bundle, so one file cannot count as two rounds or as both A and B"
            )
        seen[key] = i
        total = sum(os.path.getsize(f) for f in _files_of(p))
        sizes.setdefault(total, []).append(i)
    digests: dict[str, int] = {}
    for group in sizes.values():
        if len(group) < 2:
            continue
        for i in group:
            d = _content_digest(paths[i])
            if d in digests:
                j = digests[d]
                raise CompareError(
                    f"input {i + 1} ({paths[i]}) has the same content as input {j + 1} ({paths[j]}): a copy "
                    "of one recording or bundle cannot count as two rounds or as both A and B"
                )
            digests[d] = i


# --------------------------------------------------------------------------- recordings


@dataclass
class RecSeries:
    """One side (A or B) of a recording comparison: pooled over its recordings."""

    label: str
    paths: list[str]
    headers: list[dict[str, Any]] = field(default_factory=list)
    infos: list[EngineInfo | None] = field(default_factory=list)
    ceiling: Ceiling | None = None
    parts: list[dict[str, Any]] = field(default_factory=list)
    """Per recording: arrays (step_ms, gap_ms, ttft_ms, tpot_ms, blocks, ...)."""
    stage_names: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def pooled(self, key: str) -> np.ndarray:
        """A per-sample array pooled over the recordings."""
        arrs = [p[key] for p in self.parts if p[key].size]
        return np.concatenate(arrs) if arrs else np.zeros(0)

    def blocks(self) -> S.BlockSums:
        """Block sums of every recording, concatenated (blocks never straddle two files)."""
        bs = [p["blocks"] for p in self.parts]
        return S.BlockSums(
            *(
                np.concatenate([getattr(b, f) for b in bs])
                for f in ("span_s", "tokens", "busy_s", "busy_known", "nbytes", "bytes_known")
            )
        )

    @property
    def info(self) -> EngineInfo | None:
        """Engine info of the first recording that has one."""
        return next((i for i in self.infos if i is not None), None)


def _series_part(
    path: str, peak_gbps: float | None, block_s: float
) -> tuple[dict[str, Any], dict[str, Any], EngineInfo | None, Ceiling | None, list[str], str | None]:
    stats, header, warning = load_recording(path, peak_gbps)
    St = stats.steps
    ids = St.last("step_id").astype(np.int64)
    start = St.last("start").astype(np.int64)
    end = St.last("end").astype(np.int64)
    flags = St.last("flags")
    keep = (flags & EXCLUDE_FLAGS) == 0
    step_ms = (end - start)[keep] / 1e6
    consec = (np.diff(ids) == 1) & keep[1:] & keep[:-1]
    gap_ms = ((start[1:] - end[:-1]) / 1e6)[consec] if ids.size > 1 else np.zeros(0)
    # requests overlapping an excluded step are excluded too
    R = stats.reqs
    arr = R.last("arrival").astype(np.int64)
    fin = R.last("finish").astype(np.int64)
    ok = R.last("ok")
    ttft = R.last("ttft") / 1e6
    tpot = R.last("tpot") / 1e6
    rkeep = np.ones(arr.size, dtype=bool)
    if (~keep).any() and arr.size:
        ps, pe = start[~keep], end[~keep]
        order = np.argsort(pe)
        ps, pe = ps[order], pe[order]
        j = np.searchsorted(pe, arr, side="right")
        inb = j < pe.size
        rkeep[inb] = ~(ps[j[inb]] < fin[inb])
    k = int(keep.sum())
    # Time is the recording's wall time, tiled by the steps (each owns the time since the
    # previous step's end; engine_adapters.definitions.figures): excluded steps take theirs out, and
    # the quiet tail after the last step belongs to the last block.
    w0, w1 = stats.window_bounds(None)
    owned = (end - F.owned_from(start, end, w0)).astype(np.float64)
    if end.size:
        owned[-1] += max(0, w1 - int(end[-1]))
    owned_k = owned[keep]
    span_s = float(owned_k.sum()) / 1e9
    blk = max(S.block_length(k), math.ceil(block_s * k / span_s)) if span_s > 0 else S.block_length(k)
    blk = min(blk, max(1, k // 3))
    bs = S.block_sums(
        start[keep],
        end[keep],
        St.last("out_tokens")[keep].astype(np.float64),
        St.last("busy")[keep],
        St.last("bytes")[keep],
        blk,
    )
    if k:  # the blocks' spans: their steps' owned time (block_sums measures start to start)
        cuts = np.arange(0, k, blk)
        bs.span_s = np.add.reduceat(owned_k, cuts) / 1e9
    stages = St.last("stages")[keep]
    exits = St.last("exit")[keep].sum(axis=0)
    nbytes = St.last("bytes")[keep]
    flops = St.last("flops")[keep]
    dur_s = (end - start)[keep] / 1e9
    with np.errstate(invalid="ignore", divide="ignore"):
        rl_ok = np.isfinite(nbytes) & np.isfinite(flops) & (nbytes > 0) & (dur_s > 0)
        intensity = flops[rl_ok] / nbytes[rl_ok]
        gflops = flops[rl_ok] / dur_s[rl_ok] / 1e9
    part = {
        "path": path,
        "step_ms": step_ms,
        "gap_ms": gap_ms,
        "ttft_ms": ttft[ok & rkeep & np.isfinite(ttft)],
        "tpot_ms": tpot[ok & rkeep & np.isfinite(tpot)],
        "requests_ok": int((ok & rkeep).sum()),
        "requests_failed": int((~ok & rkeep).sum()),
        "requests_excluded": int((~rkeep).sum()),
        "steps": k,
        "steps_excluded": int((~keep).sum()),
        "blocks": bs,
        "block_steps": blk,
        "stage_sum_ms": stages.sum(axis=0) / 1e6,
        "exit_hist": [int(v) for v in exits],
        "busy_known": bool(np.isfinite(St.last("busy")[keep]).any()),
        "bytes_known": bool(np.isfinite(nbytes).any()),
        "roofline": (intensity, gflops),
        "first_ns": int(start[0]) if start.size else 0,
        "span_s": span_s,
        "raw": {
            "start": start[keep],
            "end": end[keep],
            "tokens": St.last("out_tokens")[keep].astype(np.float64),
            "busy": St.last("busy")[keep],
            "bytes": St.last("bytes")[keep],
            "owned_ns": owned_k,
        },
        "dropped": stats.dropped,
    }
    warns = []
    if warning:
        warns.append(f"{os.path.basename(path)}: {warning}")
    if stats.dropped:
        warns.append(f"{os.path.basename(path)}: {stats.dropped} records were dropped while recording")
    if part["steps_excluded"]:
        warns.append(
            f"{os.path.basename(path)}: {part['steps_excluded']} profiled/exporting/warm-up steps left out "
            f"(and {part['requests_excluded']} requests overlapping them)"
        )
    return part, header, stats.info, stats.ceiling, list(stats.stage_names), "; ".join(warns) or None


def load_side(
    label: str, paths: list[str], peak_gbps: float | None, block_s: float = S.DEFAULT_BLOCK_S
) -> RecSeries:
    """Load the recordings of one side."""
    side = RecSeries(label, paths)
    for p in paths:
        part, header, info, ceiling, names, warn = _series_part(p, peak_gbps, block_s)
        side.parts.append(part)
        side.headers.append(header)
        side.infos.append(info)
        if side.ceiling is None:
            side.ceiling = ceiling
        if len(names) > len(side.stage_names):
            side.stage_names = names
        if warn:
            side.warnings.append(warn)
    return side


def _flat_info(
    info: EngineInfo | None, header: dict[str, Any] | None, ceiling: Ceiling | None
) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if info is not None:
        b = to_builtins(info)
        for k, v in b.items():
            if k in ("pid", "contract"):
                continue
            d[k] = v
        for k, v in (info.contract or {}).items():
            d[f"contract.{k}"] = v
    if header:
        d["recorded_on_host"] = header.get("host")
    # The ceiling is measurement context, not configuration: two starts of one engine take
    # two quick calibrations that differ by noise.  MBU is compared against one peak.
    return d


def config_diff(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Fields whose values differ between two flat configuration dicts (missing = None)."""
    out = []
    for k in sorted(set(a) | set(b)):
        if k in ignore:
            continue
        va, vb = a.get(k), b.get(k)
        if va != vb:
            out.append({"field": k, "a": va, "b": vb})
    return out


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
) -> dict[str, Any]:
    """Compare A and B recordings (several of each: interleaved rounds, paired in order)."""
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
    # ---- configuration first
    cfg_a = _flat_info(A.info, A.headers[0] if A.headers else None, A.ceiling)
    cfg_b = _flat_info(B.info, B.headers[0] if B.headers else None, B.ceiling)
    same_host = cfg_a.get("recorded_on_host") == cfg_b.get("recorded_on_host")
    cdiff = config_diff(cfg_a, cfg_b, ignore=("recorded_on_host",) if same_host else ())
    for side in (A, B):
        firsts = [_flat_info(i, h, None) for i, h in zip(side.infos, side.headers, strict=True)]
        for i in range(1, len(firsts)):
            rd = config_diff(firsts[0], firsts[i])
            if rd:
                warnings.append(
                    f"{side.label}'s recordings differ among themselves in "
                    f"{', '.join(x['field'] for x in rd)}: they are not rounds of one configuration"
                )
    # ---- distributions
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
    a_step_p50 = _metric_values(A, "step_ms", 50) or 0.0
    S.decide(
        diffs,
        alpha=alpha,
        min_effect=min_effect,
        abs_floor={"ms": 0.01 * a_step_p50, "fraction": 0.01},
        floor_basis={"ms": "1% of A's median step time", "fraction": "the absolute floor"},
    )

    # ---- drift: quarters of each recording, and rounds
    drift: dict[str, Any] = {"segments": {}, "rounds": None}
    peak = peak_mbu
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
        drift["segments"][key] = {k: None if v is None else [round(x, 6) for x in v] for k, v in segs.items()}
        d.extra["segment_spread"] = S.round_sig(worst)
        assert d.diff is not None
        if abs(d.diff) <= worst:
            d.failed.append(S.FAIL_DRIFT)
        d.settle()
    n_rounds = min(len(A.parts), len(B.parts))
    if n_rounds >= 2:
        rounds = []
        order = sorted(
            range(n_rounds), key=lambda i: (A.headers[i].get("created_utc", ""), A.parts[i]["first_ns"])
        )
        for d in diffs:
            key = d.extra["key"]
            base, _, qs = key.partition(".")
            if base not in dict(_DIST):
                continue
            qq = float(qs[1:])
            va = [_metric_values(A.parts[i], base, qq) for i in order]
            vb = [_metric_values(B.parts[i], base, qq) for i in order]
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
        drift["rounds"] = {"n": n_rounds, "metrics": rounds}
    elif len(A.parts) != len(B.parts):
        warnings.append(f"A has {len(A.parts)} recordings and B {len(B.parts)}: rounds must pair up")

    metrics = [d.as_dict() for d in diffs]
    summary = _summary(metrics)
    stage_rows = _stage_rows(A, B)
    return {
        "kind": "recordings",
        "a": _side_json(A),
        "b": _side_json(B),
        "config_differences": cdiff,
        "same_configuration": not cdiff,
        "config_note": _config_note(cdiff),
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
        "_series": (A, B),
    }


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
    if n < 40:
        return None
    out = []
    for idx in np.array_split(np.arange(n), 4):
        span = float(raw["owned_ns"][idx].sum()) / 1e9  # the same time as the whole's (figures)
        if span <= 0:
            return None
        if key == "tokens_per_s":
            out.append(float(raw["tokens"][idx].sum() / span))
        elif key == "idle_fraction":
            b = raw["busy"][idx]
            out.append(float(1 - min(1.0, np.nansum(b) / 1e9 / span)))
        elif key == "mbu" and peak:
            out.append(float(np.nansum(raw["bytes"][idx]) / (span * peak * 1e9)))
        else:
            return None
    return out


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


def _config_note(cdiff: list[dict[str, Any]]) -> str:
    if not cdiff:
        return "A and B report the same configuration."
    names = ", ".join(d["field"] for d in cdiff)
    if len(cdiff) == 1:
        return f"B differs from A in one configuration field ({names}): the comparison isolates that change."
    return (
        f"A and B differ in {len(cdiff)} configuration fields ({names}): this compares two configurations, "
        "not the isolated cost of one feature; it cannot be split into per-field gains."
    )


def _bundle_config_note(capture_diff: list[dict[str, Any]], engine_diff: list[dict[str, Any]]) -> str:
    """The configuration note of two bundles: how they were captured, then the engine."""
    if not capture_diff:
        return _config_note(engine_diff)
    how = "; ".join(f"{d['field']} {d['a']} vs {d['b']}" for d in capture_diff)
    text = (
        f"A and B were captured differently ({how}): the profiler's cost differs between them, so their "
        "figures differ even for one engine; "
    )
    if not engine_diff:
        return text + "the engine configuration is the same."
    names = ", ".join(d["field"] for d in engine_diff)
    return (
        text + f"the engine also differs ({names}), and the capture difference is mixed into it: "
        "capture both in one mode and window to see the engine's difference alone."
    )


# --------------------------------------------------------------------------- bundles


def compare_bundles(a_path: str, b_path: str, top: int = 20) -> dict[str, Any]:
    """Operator, stage and step differences between two capture bundles (profiled)."""
    from rltperf_tui.analysis.report import analyze_bundle

    check_distinct([a_path, b_path])
    A = analyze_bundle(a_path)
    B = analyze_bundle(b_path)
    ra, rb = A.report, B.report
    warnings: list[str] = []
    ca = ra.get("contract") or {}
    cb = rb.get("contract") or {}
    # how each side was captured comes first: a mode or window difference changes every
    # figure below without any engine difference
    capture_diff = config_diff(
        {"capture.mode": ra.get("mode"), "capture.steps (N)": ra.get("steps_requested")},
        {"capture.mode": rb.get("mode"), "capture.steps (N)": rb.get("steps_requested")},
    )
    cdiff = capture_diff + config_diff(
        {k: v for k, v in ca.items() if k != "profiled"}, {k: v for k, v in cb.items() if k != "profiled"}
    )
    if not ca or not cb:
        warnings.append("a contract is missing: configuration differences cannot be listed in full")
    for lab, r in (("A", ra), ("B", rb)):
        if not r["complete"]:
            more = len(r["problems"]) - 3
            warnings.append(
                f"{lab} is incomplete ({'; '.join(r['problems'][:3])}"
                f"{f'; and {more} more' if more > 0 else ''}): what is missing there is "
                "not a saving or a cost"
            )
    if ra.get("mode") != rb.get("mode"):
        warnings.append(
            f"A was captured in {ra.get('mode')} mode and B in {rb.get('mode')} mode: full mode records more "
            "and runs slower; that is not an engine difference — compare matching modes"
        )
    if ra.get("steps_found") != rb.get("steps_found"):
        warnings.append(
            f"the windows differ ({ra.get('steps_found')} vs {rb.get('steps_found')} steps): figures "
            "are per step"
        )
    na = ra.get("steps_found") or 1
    nb = rb.get("steps_found") or 1

    def op_rows(oa: list[Any], ob: list[Any]) -> list[dict[str, Any]]:
        ma = {o.name: o for o in oa}
        mb = {o.name: o for o in ob}
        rows = []
        for name in set(ma) | set(mb):
            x, y = ma.get(name), mb.get(name)
            sa = x.self_us / 1e3 / na if x else 0.0
            sb = y.self_us / 1e3 / nb if y else 0.0
            ka = x.count / na if x else 0.0
            kb = y.count / nb if y else 0.0
            rows.append(
                {
                    "name": name,
                    "a_ms_per_step": round(sa, 5),
                    "b_ms_per_step": round(sb, 5),
                    "diff_ms_per_step": round(sb - sa, 5),
                    "a_count_per_step": round(ka, 3),
                    "b_count_per_step": round(kb, 3),
                    "diff_count_per_step": round(kb - ka, 3),
                    "only_in": "A" if y is None else "B" if x is None else None,
                }
            )
        rows.sort(key=lambda r: abs(r["diff_ms_per_step"]), reverse=True)
        return rows[:top]

    stages = {}
    for name in list(ra["stage_ms"]) + [n for n in rb["stage_ms"] if n not in ra["stage_ms"]]:
        sa = (ra["stage_ms"].get(name) or {}).get("mean")
        sb = (rb["stage_ms"].get(name) or {}).get("mean")
        stages[name] = {"a": sa, "b": sb, "diff": (sb - sa) if sa is not None and sb is not None else None}
    ia, ib = ra.get("idle_fraction"), rb.get("idle_fraction")
    return {
        "kind": "bundles",
        "a": {
            "bundle": ra["bundle"],
            "mode": ra["mode"],
            "steps_found": ra["steps_found"],
            "complete": ra["complete"],
        },
        "b": {
            "bundle": rb["bundle"],
            "mode": rb["mode"],
            "steps_found": rb["steps_found"],
            "complete": rb["complete"],
        },
        "config_differences": cdiff,
        "same_configuration": not cdiff,
        "config_note": _bundle_config_note(capture_diff, cdiff[len(capture_diff) :]),
        "profiled": True,
        "note": (
            "Both sides are profiled captures: these differences show where time moved, not a speed-up; "
            "claim gains only from unprofiled recordings."
        ),
        "step_ms": {"a": ra["step_ms"], "b": rb["step_ms"]},
        "stages_ms_mean": stages,
        "idle_fraction": {"a": ia, "b": ib, "diff": (ib - ia) if ia is not None and ib is not None else None},
        "host_ops": op_rows(A.host_ops, B.host_ops),
        "device_ops": op_rows(A.device_ops, B.device_ops) if (A.device_ops or B.device_ops) else None,
        "warnings": warnings,
        "scope": SCOPE,
        "_analyses": (A, B),
    }


# --------------------------------------------------------------------------- text


_f = S.fmt


def _config_lines(res: dict[str, Any]) -> list[str]:
    """The configuration differences, values in full: a value too long for its column
    is given its own lines rather than cut."""
    L = ["configuration differences (listed first):"]
    if not res["config_differences"]:
        L.append("  none — " + res["config_note"])
    else:
        for d in res["config_differences"]:
            name, va, vb = d["field"], str(d["a"]), str(d["b"])
            if len(name) <= 34 and len(va) <= 30 and len(vb) <= 40:
                L.append(f"  {name:<34} A: {va:<30}  B: {vb}")
            else:
                L.append(f"  {name}")
                for lab, v in (("A", va), ("B", vb)):
                    wrapped = textwrap.wrap(v, 96, break_on_hyphens=False, break_long_words=False) or [""]
                    L.append(f"    {lab}: {wrapped[0]}")
                    L += [f"       {w}" for w in wrapped[1:]]
        L.append("  → " + res["config_note"])
    return L


def render_text(res: dict[str, Any]) -> str:
    """A comparison as text."""
    L: list[str] = []
    if res["kind"] == "recordings":
        for lab in ("a", "b"):
            s = res[lab]
            rw = " [random weights]" if s["random_weights"] else ""
            L.append(
                f"{lab.upper()}: {', '.join(s['recordings'])} — {s['engine']}{rw}, {s['steps']} steps"
                f" ({s['steps_excluded']} profiled/warm-up left out), {s['requests_ok']} requests ok,"
                f" {s['requests_failed']} failed"
            )
        L += _config_lines(res)
        L.append("")
        L.append(f"{'metric':<18} {'A':>10} {'B':>10} {'B-A':>10} {'rel':>8}  {'95% CI of B-A':<24} verdict")
        for m in res["metrics"]:
            ci = S.fmt_ci(*m["ci95"])
            name = m["metric"] + ("" if m["unit"] in ("fraction",) else f" {m['unit']}")
            L.append(
                f"{elide(name, 18):<18} {S.fmt(m['a']):>10} {S.fmt(m['b']):>10} {S.fmt(m['diff']):>10} "
                f"{S.fmt_rel(m['rel_diff']):>8}  {ci:<24} {m['verdict']}"
            )
        L.append("")
        L += res["summary"]
        # every verdict short of significant says which condition it failed, with the numbers
        why = [m for m in res["metrics"] if not m["significant"] and m["reason"]]
        if why:
            L.append("why not significant:")
            for m in why:
                said = m["reason"] if m["failed"] else f"{m['verdict']} — {m['reason']}"
                L.append(f"  {m['metric']}: {said}")
        if res["stages_ms_mean"]:
            L.append("")
            L.append("mean stage time per step (ms)     A          B        B-A")
            for n, r in res["stages_ms_mean"].items():
                L.append(f"  {elide(n, 28):<28} {_f(r['a']):>9} {_f(r['b']):>10} {_f(r['diff']):>10}")
        dr = res["drift"]
        for m in res["metrics"]:
            if "segment_spread" in m:
                L.append(
                    f"drift check {m['metric']}: quarters of a recording differ by up to "
                    f"{S.fmt(m['segment_spread'])} {m['unit']} vs |B-A| {S.fmt(abs(m['diff']))} → {m['verdict']}"
                )
        if len(res["a"]["recordings"]) == 1:
            L.append(
                "one recording per side: run-to-run variation is estimated from inside each recording (time "
                "blocks, quarters); interleaved rounds (A B A B ...) establish small differences better"
            )
        if dr["rounds"]:
            bad = [r["key"] for r in dr["rounds"]["metrics"] if not r["consistent_sign"]]
            L.append(
                f"rounds: {dr['rounds']['n']} interleaved A/B rounds; "
                + (
                    f"the difference changes sign across rounds for {', '.join(bad)}"
                    if bad
                    else "every round's difference has the same sign"
                )
            )
    else:
        L.append(f"A: {res['a']['bundle']} ({res['a']['mode']}, {res['a']['steps_found']} steps)")
        L.append(f"B: {res['b']['bundle']} ({res['b']['mode']}, {res['b']['steps_found']} steps)")
        L += _config_lines(res)
        L.append("PROFILED: " + res["note"])
        L.append("")
        sa, sb = res["step_ms"]["a"], res["step_ms"]["b"]
        L.append(f"step ms p50   A {_f(sa['p50'])}   B {_f(sb['p50'])}   (profiled)")
        idl = res["idle_fraction"]
        L.append(f"idle fraction A {_f(idl['a'], '{:.1%}')}   B {_f(idl['b'], '{:.1%}')}")
        if res["stages_ms_mean"]:
            L.append("mean stage ms per step            A          B        B-A")
            for n, r in res["stages_ms_mean"].items():
                L.append(f"  {elide(n, 28):<28} {_f(r['a']):>9} {_f(r['b']):>10} {_f(r['diff']):>10}")
        for title, key in (("host operators", "host_ops"), ("device activities", "device_ops")):
            rows = res.get(key)
            if not rows:
                continue
            L.append(
                f"{title} by |Δ self ms per step|   A ms/step  B ms/step   Δ ms/step   A n/step  B n/step"
            )
            for r in rows:
                only = f"  (only in {r['only_in']})" if r["only_in"] else ""
                L.append(
                    f"  {elide(r['name'], 32):<32} {r['a_ms_per_step']:>10.4f} {r['b_ms_per_step']:>10.4f} "
                    f"{r['diff_ms_per_step']:>+11.4f} {r['a_count_per_step']:>9.2f} {r['b_count_per_step']:>9.2f}{only}"
                )
    for w in res["warnings"]:
        L.append(f"warning: {w}")
    if res["kind"] == "recordings":
        L.append("")
        L.append("method: " + res["method"])
    L.append("scope: " + res["scope"])
    for p in res.get("pngs", []):
        L.append(f"wrote {p}")
    for s in res.get("png_skipped", []):
        L.append(f"not drawn: {s}")
    return "\n".join(L)


def public(res: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a result (drops the in-memory series)."""
    return {k: v for k, v in res.items() if not k.startswith("_")}
