"""``rltperf compare --fail-on``: a regression gate for CI over compare's own verdicts.

A rule names a figure ``compare`` reports and the direction that is worse, with the
smallest regression that counts: ``step_p99_ms:+5%`` (step time P99 higher by 5 % of A
or more is a regression), ``tokens_per_s:-3%`` (tokens/s lower by 3 % of A or more).
A plain number is in the figure's unit: ``idle_fraction:+0.05``, ``gap_ms.p99:+2``.

The gate adds no statistics of its own.  The rule's size becomes that figure's smallest
effect of interest in ``compare`` (``verdicts.Effect``: still at least compare's floor,
1 % of A's median step time for times, 0.01 for fractions), and a figure regressed only
when compare calls its difference *significant* (Holm-corrected bootstrap evidence,
that smallest effect, beyond the drift within recordings and, with rounds, the same
sign in every round) in the worse direction.  Anything short of that (not significant,
too few samples, drift, no data) never fails the gate, and the gate says which it was.
A significant difference the other way is an improvement, not a regression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine_adapters.definitions import figures as F
from rltperf_tui.analysis import verdicts as V

EXIT_REGRESSION = 3
"""``rltperf compare``'s exit status when a ``--fail-on`` figure significantly regressed."""
EXIT_BAD_RULE = 4
"""``rltperf compare``'s exit status when a ``--fail-on`` rule cannot be used."""

FRACTIONS = ("idle_fraction", "mbu")
"""Figures that are fractions from 0 to 1 (a plain N above 1 is a mistake)."""
_DIST_NAMES = {"step_ms": "step", "gap_ms": "gap", "ttft_ms": "ttft", "tpot_ms": "tpot"}
_PCTS = (50, 95, 99)
FIGURES: dict[str, str] = {
    **{f"{k}.p{q}": f"{k}.p{q}" for k in _DIST_NAMES for q in _PCTS},
    **{f"{short}_p{q}_ms": f"{k}.p{q}" for k, short in _DIST_NAMES.items() for q in _PCTS},
    **{k: k for k in F.RATIO_FIGURES},  # a ratio figure added there can be gated at once
    "idle": "idle_fraction",
}
"""Every figure name a rule may use → compare's metric key (``compare --json``'s
``metrics[].key``): the keys themselves, and the trigger rules' spellings
(``step_p99_ms``, ``idle``)."""

_RULE = re.compile(r"^\s*([a-z_0-9.]+)\s*:\s*([+-])?\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*$")
GRAMMAR = (
    "a rule is FIGURE:+N% (higher is worse) or FIGURE:-N% (lower is worse), N% of A, or a plain N in "
    "the figure's unit (ms, tok/s, a fraction), e.g. 'step_p99_ms:+5%', 'tokens_per_s:-3%', "
    "'idle_fraction:+0.05'; FIGURE is a metric key of compare --json (step_ms, gap_ms, ttft_ms or "
    "tpot_ms with .p50, .p95 or .p99; tokens_per_s, idle_fraction, mbu) or its trigger spelling "
    "(step_p99_ms, ttft_p50_ms, idle, ...)"
)


class RuleError(ValueError):
    """A ``--fail-on`` rule that cannot be used; the message is one sentence saying why."""


@dataclass(frozen=True)
class FailOn:
    """One parsed ``--fail-on`` rule."""

    text: str
    """As written (spaces removed)."""
    key: str
    """compare's metric key (``step_ms.p99``, ``tokens_per_s``, ...)."""
    worse: int
    """+1: B higher than A is worse; -1: B lower is worse."""
    size: float
    """The smallest regression that counts: a fraction of A (``relative``) or in the unit."""
    relative: bool
    """``size`` is a fraction of A (written with %), else in the figure's unit."""

    def effect(self) -> V.Effect:
        """The figure's smallest effect of interest in compare's verdict."""
        words = f"{self.size * 100:g}% of A, from " if self.relative else "from "
        return V.Effect(self.size, self.relative, f"{words}--fail-on {self.text}")


def parse_fail_on(text: str) -> FailOn:
    """Parse ``FIGURE:±N[%]``; raises ``RuleError`` with one sentence otherwise."""
    m = _RULE.match(text)
    if not m:
        raise RuleError(f"cannot read --fail-on {text!r}: {GRAMMAR}")
    fig, sign, num, percent = m.groups()
    if fig not in FIGURES:
        raise RuleError(f"unknown figure {fig!r} in --fail-on {text!r}: {GRAMMAR}")
    if not sign:
        raise RuleError(
            f"--fail-on {text!r} does not say which direction is worse: write {fig}:+{num}{percent} "
            f"(higher is worse) or {fig}:-{num}{percent} (lower is worse)"
        )
    size = float(num) / 100.0 if percent else float(num)
    key = FIGURES[fig]
    if key in FRACTIONS and not percent and size > 1.0:
        raise RuleError(
            f"--fail-on {text!r}: {key} is a fraction from 0 to 1 (or write {num}% for {num}% of A)"
        )
    return FailOn(text=f"{fig}:{sign}{num}{percent}", key=key, worse=1 if sign == "+" else -1, size=size,
                  relative=bool(percent))  # fmt: skip


def parse_rules(texts: list[str]) -> list[FailOn]:
    """Parse every ``--fail-on``; one figure named twice (under any spelling) is refused."""
    rules = [parse_fail_on(t) for t in texts]
    seen: dict[str, FailOn] = {}
    for r in rules:
        if r.key in seen:
            raise RuleError(
                f"--fail-on {seen[r.key].text!r} and {r.text!r} both judge {r.key}: give one rule per figure"
            )
        seen[r.key] = r
    return rules


def effects(rules: list[FailOn]) -> dict[str, V.Effect]:
    """Each ruled figure's smallest effect of interest, by compare's metric key."""
    return {r.key: r.effect() for r in rules}


def judge(metrics: list[dict[str, Any]], rules: list[FailOn]) -> dict[str, Any]:
    """The gate over compare's decided metrics (``compare_recordings``'s ``metrics``):
    per rule its status (``regressed``, ``improved``, ``not established``) and one
    sentence; ``failed`` when any figure regressed."""
    by_key = {m["key"]: m for m in metrics}
    results = []
    for r in rules:
        m = by_key[r.key]
        status, sentence = _status(m, r)
        results.append({"rule": r.text, "key": r.key, "metric": m["metric"], "status": status,
                        "sentence": sentence})  # fmt: skip
    regressed = [x for x in results if x["status"] == "regressed"]
    if regressed:
        verdict = (
            f"gate FAILED: {len(regressed)} of {len(rules)} figure(s) significantly regressed "
            f"({', '.join(x['rule'] for x in regressed)}); exit {EXIT_REGRESSION}"
        )
    else:
        verdict = f"gate passed: no significant regression in {len(rules)} figure(s)"
    return {
        "rules": [r.text for r in rules],
        "failed": bool(regressed),
        "exit_status": EXIT_REGRESSION if regressed else 0,
        "results": results,
        "verdict": verdict,
    }


def _status(m: dict[str, Any], r: FailOn) -> tuple[str, str]:
    """A rule's status and its one sentence, from the metric's (rounded) JSON figures,
    printed through compare's own formatting functions (the table's digits)."""
    u = "" if m["unit"] == "fraction" else f" {m['unit']}"
    rule = f"(--fail-on {r.text})"
    diff = m["diff"]
    if diff is None or m["p"] is None:
        return "not established", f"{m['metric']} {rule}: not judged ({m['verdict']}: {m['reason']})"
    direction = "higher" if diff > 0 else "lower"
    how = (
        f"B is {V.fmt(abs(diff))}{u} {direction} than A ({V.fmt_rel(m['rel_diff'])} of A; "
        f"95% CI {V.fmt_ci(*m['ci95'])}{u})"
    )
    if m["significant"] and (diff > 0) == (r.worse > 0):
        past = f"at least {V.fmt(m['min_effect'])}{u} ({m['min_effect_basis']})"
        if m.get("segment_spread") is not None:
            past += f" and the drift within recordings ({V.fmt(m['segment_spread'])}{u})"
        return "regressed", (
            f"{m['metric']} REGRESSED {rule}: {how}: significant, p={V.fmt_p(m['p_holm'])} after Holm over "
            f"{m['n_tested']} metrics, {past}"
        )
    if m["significant"]:
        return "improved", f"{m['metric']} {rule}: improved, not a regression: {how}"
    return "not established", f"{m['metric']} {rule}: no established regression ({m['verdict']}): {how}"


def gate_lines(gate: dict[str, Any]) -> list[str]:
    """The gate as text: one sentence per rule, then the verdict."""
    return [f"gate: {x['sentence']}" for x in gate["results"]] + [gate["verdict"]]
