"""The ranks of a multi-rank server: how each is named, and the per-rank window figures.

A vLLM server runs one engine core per data-parallel (DP) rank; each engine core drives
one worker per tensor-parallel (TP) rank and pipeline (PP) stage.  The rltperf probe of
an engine core reports every worker of that engine, so a stream's identity is its DP
rank plus the list of its workers (``EngineInfo.ranks``), and the per-rank fields of a
``StepRecord`` (``rank_busy_ns``, ``rank_wait_ns``, ``rank_loop_ns``) are indexed like
that list.  A bundle names a trace by its full rank (``dp0-tp1``).

**Per-rank figures over a window** (``rank_figures``), from the steps whose every
rank reported:

- busy ms/step: a rank's model forward plus its LM head;
- wait ms/step: of that, the time inside tensor-parallel collectives (all-reduce),
  where a rank waits for the others;
- compute ms/step = busy − wait: the work the rank itself did.  TP ranks run in
  lockstep, so their busy times are nearly equal; the straggler is the rank whose
  peers wait for it: the one with the most compute (and the least wait);
- slowest rank: the largest compute; skew = its compute − the smallest compute (ms per
  step) and that as a share of the smallest.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def worker_tag(tp: int, pp: int = 0, pp_size: int = 1) -> str:
    """A worker's name within its engine: ``tp1``, or ``pp1-tp0`` with pipeline stages."""
    return f"tp{tp}" if pp_size <= 1 else f"pp{pp}-tp{tp}"


def worker_tags(tp_size: int, pp_size: int = 1) -> list[str]:
    """Every worker of one engine, in rank order (stage-major, as vLLM numbers them)."""
    return [worker_tag(t, p, pp_size) for p in range(max(1, pp_size)) for t in range(max(1, tp_size))]


def rank_name(dp: int | None, worker: str) -> str:
    """A worker's name within the server: ``dp1-tp0`` (``worker`` alone when DP is unknown)."""
    return worker if dp is None else f"dp{dp}-{worker}"


@dataclass
class RankFigures:
    """Per-rank means over a window (see the module docstring)."""

    ranks: list[str]
    """Worker names, as ``EngineInfo.ranks``."""
    steps: int
    """Steps in which every rank reported."""
    busy_ms: list[float | None] = field(default_factory=list)
    """Mean busy ms per step, per rank."""
    wait_ms: list[float | None] = field(default_factory=list)
    """Mean ms per step inside collectives, per rank (None: not measured on this device)."""
    compute_ms: list[float | None] = field(default_factory=list)
    """Mean busy − wait, ms per step, per rank (busy alone where wait is not measured)."""
    loop_ms: list[list[float]] = field(default_factory=list)
    """Mean ms per step of each loop pass, per rank."""
    slowest: str | None = None
    """The rank with the most compute per step, or None with fewer than two ranks."""
    skew_ms: float | None = None
    """Slowest compute − fastest compute, ms per step."""
    skew_frac: float | None = None
    """``skew_ms`` over the fastest compute (0.25: the slowest did 25 % more work)."""

    def as_summary(self) -> dict[str, object]:
        """The figures as ``summary --json`` writes them."""

        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "ranks": list(self.ranks),
            "rank_steps": self.steps,
            "rank_busy_ms": {k: r(v) for k, v in zip(self.ranks, self.busy_ms, strict=False)},
            "rank_wait_ms": {k: r(v) for k, v in zip(self.ranks, self.wait_ms, strict=False)},
            "rank_compute_ms": {k: r(v) for k, v in zip(self.ranks, self.compute_ms, strict=False)},
            "slowest_rank": self.slowest,
            "rank_skew_ms": r(self.skew_ms),
            "rank_skew": r(self.skew_frac),
        }


def rank_figures(
    ranks: Sequence[str],
    busy: Sequence[Sequence[int | None]],
    wait: Sequence[Sequence[int | None] | None],
    loops: Sequence[Sequence[Sequence[int]] | None] = (),
) -> RankFigures:
    """Per-rank figures of the steps given (each entry one step's ``rank_busy_ns``,
    ``rank_wait_ns``, ``rank_loop_ns``); a step where some rank did not report is left
    out, so every rank is averaged over the same steps."""
    n = len(ranks)
    tb = [0] * n
    tw = [0] * n
    wait_known = [True] * n
    tl: list[list[int]] = [[] for _ in range(n)]
    steps = 0
    for i, b in enumerate(busy):
        if len(b) != n or any(v is None for v in b):
            continue
        steps += 1
        w = wait[i] if i < len(wait) else None
        lp = loops[i] if i < len(loops) else None
        for k in range(n):
            tb[k] += int(b[k] or 0)
            wk = w[k] if w is not None and k < len(w) else None
            if wk is None:
                wait_known[k] = False
            else:
                tw[k] += int(wk)
            if lp is not None and k < len(lp):
                row = tl[k]
                for d, v in enumerate(lp[k]):
                    if d < len(row):
                        row[d] += int(v)
                    else:
                        row.append(int(v))
    out = RankFigures(ranks=list(ranks), steps=steps)
    if not steps:
        out.busy_ms = out.wait_ms = out.compute_ms = [None] * n
        return out
    out.busy_ms = [tb[k] / steps / 1e6 for k in range(n)]
    out.wait_ms = [tw[k] / steps / 1e6 if wait_known[k] else None for k in range(n)]
    out.compute_ms = [
        (tb[k] - tw[k]) / steps / 1e6 if wait_known[k] else tb[k] / steps / 1e6 for k in range(n)
    ]
    out.loop_ms = [[v / steps / 1e6 for v in tl[k]] for k in range(n)]
    known = [(c, k) for k, c in enumerate(out.compute_ms) if c is not None]
    if n >= 2 and len(known) == n:
        hi, k_hi = max(known)
        lo, _ = min(known)
        out.slowest = out.ranks[k_hi]
        out.skew_ms = hi - lo
        out.skew_frac = (hi - lo) / lo if lo > 0 else None
    return out


def identity_text(
    dp_rank: int | None, tp_size: int | None, pp_size: int | None = None, host: str | None = None
) -> str:
    """Where a stream comes from, in a few words (``DP 1 · TP 2 · host``); empty when
    nothing is known."""
    parts = []
    if dp_rank is not None:
        parts.append(f"DP {dp_rank}")
    if tp_size is not None:
        parts.append(f"TP {tp_size}")
    if pp_size is not None and pp_size > 1:
        parts.append(f"PP {pp_size}")
    if host:
        parts.append(host)
    return " · ".join(parts)


def straggler_text(rf: RankFigures) -> str:
    """The slowest rank and the skew, in words (``slowest tp1: +4.6 ms/step (+91 %)``)."""
    if rf.slowest is None or rf.skew_ms is None:
        return "slowest rank n/a"
    rel = f" (+{rf.skew_frac * 100:.0f} %)" if rf.skew_frac is not None else ""
    return f"slowest {rf.slowest}: +{rf.skew_ms:.2f} ms/step{rel}"


def ranks_held(expected: Sequence[str] | None, held: dict[str, str]) -> dict[str, object]:
    """A bundle's ``capture.ranks``: which ranks it was to hold (None: unknown), which it
    holds (rank -> its trace file) and which are missing.  A missing rank's activity is
    not in the bundle: it is unknown, never zero cost."""
    missing = [r for r in expected if r not in held] if expected is not None else None
    return {"expected": list(expected) if expected is not None else None, "held": dict(sorted(held.items())),
            "missing": missing}  # fmt: skip


def ranks_text(ranks: object) -> str | None:
    """``2/2 ranks`` or ``1/2 ranks: dp1-tp0 missing`` for a bundle's ``capture.ranks``
    (None when the bundle does not say)."""
    if not isinstance(ranks, dict):
        return None
    held_d = ranks.get("held")
    held = [str(k) for k in held_d] if isinstance(held_d, dict) else []
    expected = ranks.get("expected")
    missing_l = ranks.get("missing")
    missing = [str(m) for m in missing_l] if isinstance(missing_l, list) else []
    if not isinstance(expected, list):
        s = "s" if len(held) != 1 else ""
        return f"{len(held)} rank{s} held ({', '.join(held) or 'none'}); expected ranks unknown"
    text = f"{len(held)}/{len(expected)} ranks"
    if missing:
        text += f": {', '.join(missing)} missing (their activity is unknown, not zero)"
    return text
