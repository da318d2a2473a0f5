"""A/B differences and their verdicts: what one compared metric carries (``Diff``), the
conditions it must pass (Holm over the metrics of one run, the smallest effect of
interest, drift), and the words ``rltperf compare`` prints for each, formatted through
one set of functions so the table and the sentences never disagree in a digit.

The statistics behind the numbers (block bootstrap) are in ``analysis.stats``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.05

NA = "n/a"
"""How an unknown figure is printed."""


def fmt(v: float | None, spec: str = "{:.4g}") -> str:
    """A figure as ``rltperf compare`` prints it everywhere (table, sentences), or ``n/a``."""
    if v is None or not math.isfinite(v):
        return NA
    return spec.format(v)


def fmt_rel(rel: float | None) -> str:
    """A relative difference (fraction of A) as a signed percentage: ``+90.2%``."""
    return fmt(rel, "{:+.1%}")


def fmt_p(p: float | None) -> str:
    """A p-value."""
    return fmt(p, "{:.3g}")


def fmt_ci(lo: float | None, hi: float | None) -> str:
    """A confidence interval ``[lo, hi]`` (empty when unknown)."""
    return "" if lo is None or hi is None else f"[{fmt(lo)}, {fmt(hi)}]"


def round_sig(v: float | None, digits: int = 6) -> float | None:
    """``v`` to ``digits`` significant digits (None for unknown or non-finite)."""
    return None if v is None or not math.isfinite(v) else float(f"{v:.{digits}g}")


# Why a difference is not significant: the conditions a difference must pass, in order.
FAIL_HOLM = "holm"
FAIL_MIN_EFFECT = "min_effect"
FAIL_DRIFT = "drift"
FAIL_ROUNDS = "rounds"


def verdict_of(failed: list[str]) -> str:
    """The verdict words for the failed conditions (none failed: significant)."""
    if not failed:
        return "significant"
    if FAIL_ROUNDS in failed:
        return "not established (drift between rounds)"
    if FAIL_DRIFT in failed:
        return "not established (drift)"
    if FAIL_HOLM in failed and FAIL_MIN_EFFECT in failed:
        return "not significant, below min effect"
    if FAIL_HOLM in failed:
        return "not significant after Holm"
    return "below min effect"


@dataclass
class Diff:
    """One metric compared between A and B."""

    metric: str
    unit: str
    a: float | None
    b: float | None
    n_a: int = 0
    n_b: int = 0
    diff: float | None = None
    rel: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p: float | None = None
    p_holm: float | None = None
    significant: bool = False
    verdict: str = "not tested"
    reason: str = ""
    block: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    alpha: float | None = None
    """The family-wise level the Holm-corrected p was held to (set by ``decide``)."""
    n_tested: int = 0
    """How many metrics the Holm correction ran over."""
    need: float | None = None
    """The smallest effect of interest, in ``unit``."""
    need_basis: str = ""
    """What ``need`` is, in words (``5% of A``, ``1% of A's median step time``)."""
    failed: list[str] = field(default_factory=list)
    """The conditions this difference failed (``FAIL_*``); empty and decided = significant."""

    def settle(self) -> None:
        """Set ``significant``, ``verdict`` and ``reason`` from the failed conditions.

        The reason is written from the same rounded figures ``as_dict`` (and so the
        table) carries, through the same formatting functions: the sentence and the
        table never disagree in a digit."""
        self.significant = not self.failed
        self.verdict = verdict_of(self.failed)
        self.reason = explain(self._figures())

    def _figures(self) -> dict[str, Any]:
        r = round_sig
        d = {
            "metric": self.metric,
            "unit": self.unit,
            "a": r(self.a),
            "b": r(self.b),
            "diff": r(self.diff),
            "rel_diff": r(self.rel),
            "ci95": [r(self.ci_low), r(self.ci_high)],
            "p": r(self.p, 5),
            "p_holm": r(self.p_holm, 5),
            "alpha": self.alpha,
            "n_tested": self.n_tested,
            "min_effect": r(self.need),
            "min_effect_basis": self.need_basis,
            "failed": list(self.failed),
        }
        d.update(self.extra)
        return d

    def as_dict(self) -> dict[str, Any]:
        """JSON form (floats rounded to 6 significant digits)."""
        d = self._figures()
        d.update(
            significant=self.significant,
            verdict=self.verdict,
            reason=self.reason,
            n_a=self.n_a,
            n_b=self.n_b,
            block=self.block,
        )
        return d


def explain(m: dict[str, Any]) -> str:
    """Why a decided metric got its verdict, in words, from its (rounded) figures.

    Each failed condition is named with the numbers that failed it: the Holm-corrected p
    against alpha (and whether the uncorrected 95 % interval holds 0), the smallest
    effect of interest against |B-A|, the drift within recordings or between rounds."""
    unit = m["unit"]
    u = f" {unit}"
    lo, hi = m["ci95"]
    ci = fmt_ci(lo, hi)
    diff = m["diff"]
    adiff = None if diff is None else abs(diff)
    n = m["n_tested"]
    need = f"the smallest effect of interest ({m['min_effect_basis']}: {fmt(m['min_effect'])}{u})"
    out: list[str] = []
    failed = m["failed"]
    if FAIL_HOLM in failed:
        s = (
            f"not significant after Holm: p={fmt_p(m['p_holm'])} ≥ {m['alpha']:g} over {n} metrics "
            f"(uncorrected p={fmt_p(m['p'])})"
        )
        if lo is not None and hi is not None:
            if lo <= 0 <= hi:
                s += f"; the 95% CI {ci}{u} includes 0"
            else:
                s += f"; the 95% CI {ci}{u} excludes 0 but is not corrected for comparing {n} metrics at once"
        out.append(s)
    if FAIL_MIN_EFFECT in failed:
        out.append(f"below {need}: |B-A| is {fmt(adiff)}{u} ({fmt_rel(m['rel_diff'])} of A)")
    if FAIL_DRIFT in failed:
        out.append(
            f"drift within recordings: the quarters of one recording already differ by up to "
            f"{fmt(m.get('segment_spread'))}{u}, at least |B-A| {fmt(adiff)}{u}: this may be the machine, "
            "not the change"
        )
    if FAIL_ROUNDS in failed:
        rd = ", ".join(fmt(x) for x in m.get("round_diffs") or [])
        out.append(
            f"drift between rounds: the per-round differences B-A change sign ({rd}{u}), though "
            "the pooled difference passed"
        )
    if not failed:
        s = (
            f"p={fmt_p(m['p_holm'])} < {m['alpha']:g} after Holm over {n} metrics, 95% CI {ci}{u}, "
            f"|B-A| {fmt(adiff)}{u} ≥ {need}"
        )
        if m.get("segment_spread") is not None:
            s += f", beyond the drift within recordings ({fmt(m['segment_spread'])}{u})"
        out.append(s)
    return "; ".join(out)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adj = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adj[i] = running
    return adj


@dataclass(frozen=True)
class Effect:
    """One metric's own smallest effect of interest, in place of ``decide``'s
    ``min_effect`` (``compare --fail-on``); the unit's floor still applies."""

    size: float
    """A fraction of A (``relative``), or a difference in the metric's unit."""
    relative: bool
    basis: str
    """What it is, in words (the reasons print it)."""


def decide(
    diffs: list[Diff],
    alpha: float = DEFAULT_ALPHA,
    min_effect: float = DEFAULT_MIN_EFFECT,
    abs_floor: dict[str, float] | None = None,
    floor_basis: dict[str, str] | None = None,
    effects: dict[str, Effect] | None = None,
) -> None:
    """Holm-correct the p-values of the tested diffs and set verdict/significant/reason.

    ``abs_floor`` maps a unit (e.g. ``"ms"``) to the smallest absolute difference of
    interest in that unit, ``floor_basis`` to what that floor is, in words; ``effects``
    maps a metric's key (``Diff.extra["key"]``) to its own smallest effect.  A tested
    difference that fails a condition records which (``Diff.failed``), so its reason
    names it.
    """
    tested = [d for d in diffs if d.p is not None]
    adj = holm([d.p for d in tested if d.p is not None])
    for d, pa in zip(tested, adj, strict=True):
        d.p_holm = pa
        d.alpha = alpha
        d.n_tested = len(tested)
        floor = (abs_floor or {}).get(d.unit, 0.0)
        own = (effects or {}).get(d.extra.get("key", ""))
        if own is not None:
            rel_need = (own.size * abs(d.a) if d.a else 0.0) if own.relative else own.size
            basis = own.basis
        else:
            rel_need = min_effect * abs(d.a) if d.a else 0.0
            basis = f"{min_effect * 100:g}% of A"
        if rel_need >= floor:
            d.need, d.need_basis = rel_need, basis
        else:
            d.need = floor
            d.need_basis = (floor_basis or {}).get(d.unit, f"at least {floor:.4g} {d.unit}")
        assert d.diff is not None
        d.failed = []
        if pa >= alpha:
            d.failed.append(FAIL_HOLM)
        if abs(d.diff) < d.need:
            d.failed.append(FAIL_MIN_EFFECT)
        d.settle()
