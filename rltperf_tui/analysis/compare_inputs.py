"""``rltperf compare``'s inputs: each one distinct, recordings loaded into the per-sample
series of one side (A or B), and the configuration each side reports.

Steps flagged profiled, exporting or warm-up leave the series, and requests
overlapping them too; time is the recording's wall time tiled by the steps
(``engine_adapters.definitions.figures``).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_adapters.definitions import energy as E
from engine_adapters.definitions import figures as F
from engine_adapters.definitions import roofline as RL
from engine_adapters.definitions.records import (
    Ceiling,
    EngineInfo,
    to_builtins,
)
from rltperf_tui.analysis import stats as S
from rltperf_tui.analysis.summary import load_recording

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
        out = S.BlockSums(
            *(
                np.concatenate([getattr(b, f) for b in bs])
                for f in ("span_s", "tokens", "busy_s", "busy_known", "nbytes", "bytes_known")
            )
        )
        if all(b.joules is not None and b.energy_s is not None for b in bs):
            out.joules = np.concatenate([b.joules for b in bs])
            out.energy_s = np.concatenate([b.energy_s for b in bs])
        return out

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
    R = stats.reqs
    ok = R.last("ok")
    ttft = R.last("ttft") / 1e6
    tpot = R.last("tpot") / 1e6
    rkeep = _requests_kept(R.last("arrival"), R.last("finish"), start, end, flags)
    k = int(keep.sum())
    energy = step_energy(stats, start, end, keep, *stats.window_bounds(None))
    owned_k, span_s, blk, bs = _time_blocks(stats, start, end, keep, block_s, energy)
    stages = St.last("stages")[keep]
    exits = St.last("exit")[keep].sum(axis=0)
    nbytes = St.last("bytes")[keep]
    flops = St.last("flops")[keep]
    dur_s = (end - start)[keep] / 1e9
    with np.errstate(invalid="ignore"):
        rl_ok = np.isfinite(nbytes) & np.isfinite(flops) & (nbytes > 0) & (dur_s > 0)
    intensity = RL.arithmetic_intensity(flops[rl_ok], nbytes[rl_ok])
    gflops = RL.achieved_gflops(flops[rl_ok], dur_s[rl_ok])
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
            "energy": energy,
        },
        "energy_known": bs.joules is not None,
        "energy_source": stats.stream.energy_source.get(stats.stream.energy_device()),
        "energy_why": stats.stream.energy_why(),
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


def _requests_kept(
    arrival: np.ndarray, finish: np.ndarray, start: np.ndarray, end: np.ndarray, flags: np.ndarray
) -> np.ndarray:
    """True for each request in flight during no excluded step's owned time (the window's
    own rule: ``figures.excluded_spans`` / ``figures.requests_clear_of``)."""
    return F.requests_clear_of(arrival, finish, F.excluded_spans(start, end, flags))


def _time_blocks(
    stats: Any,
    start: np.ndarray,
    end: np.ndarray,
    keep: np.ndarray,
    block_s: float,
    energy: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, float, int, S.BlockSums]:
    """The baseline steps' owned time, its total (s), the block length in steps and the
    block sums for the ratio metrics.

    Time is the recording's wall time, tiled by the steps (each owns the time since the
    previous step's end; engine_adapters.definitions.figures): excluded steps take theirs
    out, and the quiet tail after the last step belongs to the last block, whether or not
    that step was excluded.  ``energy``: the kept steps' ``step_energy``."""
    St = stats.steps
    k = int(keep.sum())
    w0, w1 = stats.window_bounds(None)
    owned = (end - F.owned_from(start, end, w0)).astype(np.float64)
    owned_k = owned[keep]
    if owned_k.size:
        # the quiet tail is no step's own time: baseline (idle) time even when the last
        # step was excluded (a recording ending on a capture's export), as in the window
        owned_k[-1] += max(0, w1 - int(end[-1]))
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
        if energy is not None:  # the kept steps' energy (step_energy), summed like the time
            bs.joules = np.add.reduceat(energy[0], cuts)
            bs.energy_s = np.add.reduceat(energy[1], cuts)
    return owned_k, span_s, blk, bs


def step_energy(
    stats: Any, start: np.ndarray, end: np.ndarray, keep: np.ndarray, w0: int, w1: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The joules the energy device's counter gained in each kept step's owned time (the
    last one's quiet tail included, as in ``_time_blocks``) and the seconds of it the
    readings cover; None: the recording has no energy counter (``energy.span_energy``)."""
    readings = stats.stream.energy_readings()
    if not readings or not keep.any():
        return None
    lo = F.owned_from(start, end, w0)[keep]
    hi = end[keep].copy()
    hi[-1] = max(int(hi[-1]), w1)
    return E.span_energy(readings, lo, hi)


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


def flat_info(
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


def config_note(cdiff: list[dict[str, Any]]) -> str:
    if not cdiff:
        return "A and B report the same configuration."
    names = ", ".join(d["field"] for d in cdiff)
    if len(cdiff) == 1:
        return f"B differs from A in one configuration field ({names}): the comparison isolates that change."
    return (
        f"A and B differ in {len(cdiff)} configuration fields ({names}): this compares two configurations, "
        "not the isolated cost of one feature; it cannot be split into per-field gains."
    )


def bundle_config_note(capture_diff: list[dict[str, Any]], engine_diff: list[dict[str, Any]]) -> str:
    """The configuration note of two bundles: how they were captured, then the engine."""
    if not capture_diff:
        return config_note(engine_diff)
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
