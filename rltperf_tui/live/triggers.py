"""Capture triggers: rules over live figures that start a capture by themselves.

A rule is ``FIGURE OP NUMBER``: ``step_ms>150``, ``gap_ms>50``, ``idle>0.3`` (or
``idle>30%``), ``mbu<0.2``, ``step_p99_ms>40``, ``ttft_p99_ms>500``.  Per-step rules
(``step_ms``, ``gap_ms``) are checked on every step record as it arrives; window rules on
the figures of the statistics window (``engine_adapters.definitions.figures``), at each check.

When a rule fires and the target is not in its cooldown, a capture of N steps is asked
for; a rule that fires during the cooldown, or after ``max_captures`` captures, is
counted and not captured.  No Textual here: the app and ``rltperf watch`` share it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from engine_adapters.definitions.records import StepRecord, TriggerInfo

STEP_FIGURES = {
    "step_ms": "a step's duration, ms (every step)",
    "gap_ms": "the gap before a step (start − previous end), ms (every step)",
}
WINDOW_FIGURES = {
    "idle": "device idle fraction over the window (0-1, or a percentage)",
    "mbu": "model bandwidth utilisation over the window (0-1, or a percentage)",
    "step_p99_ms": "P99 step time over the window, ms",
    "step_p50_ms": "P50 step time over the window, ms",
    "gap_p99_ms": "P99 gap over the window, ms",
    "ttft_p99_ms": "P99 time to first token over the window, ms",
    "tpot_p99_ms": "P99 time per output token over the window, ms",
    "tokens_per_s": "output tokens per second over the window",
}
FIGURES = {**STEP_FIGURES, **WINDOW_FIGURES}
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_RULE = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=|>|<)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*$")
GRAMMAR = (
    "a rule is FIGURE OP NUMBER, e.g. 'step_ms>150', 'idle>0.3' or 'idle>30%', 'mbu<0.2'; "
    "OP is one of > < >= <=; FIGURE is one of " + ", ".join(FIGURES)
)


class RuleError(ValueError):
    """A rule that does not parse; the message is one sentence naming what is wrong."""


@dataclass(frozen=True)
class Rule:
    """One parsed trigger rule."""

    text: str
    """As written (normalised: no spaces)."""
    figure: str
    op: str
    threshold: float

    @property
    def per_step(self) -> bool:
        """Checked on each step record (else on the window's figures)."""
        return self.figure in STEP_FIGURES

    def holds(self, value: float | None) -> bool:
        """Whether ``value`` breaks the rule (an unknown value never does)."""
        return value is not None and value == value and _OPS[self.op](value, self.threshold)


def parse_rule(text: str) -> Rule:
    """Parse ``FIGURE OP NUMBER``; raises ``RuleError`` with one sentence otherwise."""
    m = _RULE.match(text)
    if not m:
        raise RuleError(f"cannot read trigger {text!r}: {GRAMMAR}")
    fig, op, num, percent = m.groups()
    if fig not in FIGURES:
        raise RuleError(f"unknown figure {fig!r} in trigger {text!r}: {GRAMMAR}")
    value = float(num)
    if percent:
        if fig not in ("idle", "mbu"):
            raise RuleError(f"trigger {text!r}: only idle and mbu take a percentage")
        value /= 100.0
    if fig in ("idle", "mbu") and value > 1.0 and not percent:
        raise RuleError(f"trigger {text!r}: {fig} is a fraction from 0 to 1 (or write {num}%)")
    return Rule(text=f"{fig}{op}{num}{percent}", figure=fig, op=op, threshold=value)


def window_value(figure: str, window: Any) -> float | None:
    """The value of a window figure from an ``aggregator.Window``."""
    if figure == "idle":
        return window.idle_fraction
    if figure == "mbu":
        return window.mbu
    if figure == "tokens_per_s":
        return window.tokens_per_s
    if figure == "step_p99_ms":
        return window.step_ms.get("p99")
    if figure == "step_p50_ms":
        return window.step_ms.get("p50")
    if figure == "gap_p99_ms":
        return window.gap_ms.get("p99")
    if figure == "ttft_p99_ms":
        return window.ttft_ms.get("p99")
    if figure == "tpot_p99_ms":
        return window.tpot_ms.get("p99")
    raise KeyError(figure)


@dataclass
class Fire:
    """A rule broken: which, by what value, when (probe clock), at which step."""

    rule: Rule
    value: float
    ts_ns: int
    step_id: int | None
    captured: bool = False
    """Whether a capture was asked for (False: in cooldown, over the maximum, or disarmed)."""
    why_not: str = ""
    capture_id: str | None = None

    def info(self) -> TriggerInfo:
        """The record the capture request carries (the bundle's ``meta.json`` "trigger")."""
        return TriggerInfo(
            rule=self.rule.text,
            figure=self.rule.figure,
            value=float(self.value),
            threshold=self.rule.threshold,
            ts_ns=self.ts_ns,
            step_id=self.step_id,
        )

    def as_dict(self) -> dict[str, Any]:
        """What a bundle's ``meta.json`` and the watch report record."""
        return {
            "rule": self.rule.text,
            "figure": self.rule.figure,
            "value": self.value,
            "threshold": self.rule.threshold,
            "ts_ns": self.ts_ns,
            "step_id": self.step_id,
        }


@dataclass
class TriggerSet:
    """The rules of one target and their state: armed, cooldown, counts, fires."""

    rules: list[Rule]
    cooldown_s: float = 30.0
    """No new capture this long after the last triggered one (data time)."""
    max_captures: int = 5
    """Triggered captures at most (then fires are only counted)."""
    armed: bool = True
    can_capture: bool = True
    """False for a recording: fires are found and counted, nothing can be captured."""
    fires: list[Fire] = field(default_factory=list)
    captures: int = 0
    suppressed: int = 0
    last_capture_ns: int | None = None
    _prev_end: int | None = None
    _prev_id: int | None = None
    max_kept: int = 1000

    @classmethod
    def parse(cls, texts: Iterable[str], **kw: Any) -> TriggerSet:
        """Rules from their texts (raises ``RuleError`` on the first bad one)."""
        return cls([parse_rule(t) for t in texts], **kw)

    def in_cooldown(self, ts_ns: int) -> bool:
        """Whether a fire at ``ts_ns`` falls in the cooldown of the last capture."""
        return self.last_capture_ns is not None and ts_ns - self.last_capture_ns < self.cooldown_s * 1e9

    def _fire(self, rule: Rule, value: float, ts_ns: int, step_id: int | None, busy: bool) -> Fire:
        f = Fire(rule, value, ts_ns, step_id)
        if not self.can_capture:
            f.why_not = "a recording: nothing to capture"
        elif not self.armed:
            f.why_not = "disarmed"
        elif self.captures >= self.max_captures:
            f.why_not = f"maximum of {self.max_captures} captures reached"
        elif self.in_cooldown(ts_ns):
            f.why_not = f"cooldown ({self.cooldown_s:g} s)"
        elif busy:
            f.why_not = "a capture is running"
        else:
            f.captured = True
            self.captures += 1
            self.last_capture_ns = ts_ns
        if not f.captured:
            self.suppressed += 1
        self.fires.append(f)
        if len(self.fires) > self.max_kept:
            del self.fires[: len(self.fires) - self.max_kept]
        return f

    def check_steps(self, steps: Iterable[StepRecord], busy: bool = False) -> list[Fire]:
        """Per-step rules over new step records (stream order); at most one capture per
        call (the first fire that may capture), the rest counted."""
        out: list[Fire] = []
        step_rules = [r for r in self.rules if r.per_step]
        for s in steps:
            gap = None
            if self._prev_end is not None and self._prev_id is not None and s.step_id == self._prev_id + 1:
                gap = (s.start_ns - self._prev_end) / 1e6
            self._prev_end, self._prev_id = s.end_ns, s.step_id
            for r in step_rules:
                v = (s.end_ns - s.start_ns) / 1e6 if r.figure == "step_ms" else gap
                if r.holds(v):
                    assert v is not None
                    f = self._fire(r, v, s.end_ns, s.step_id, busy or any(x.captured for x in out))
                    out.append(f)
        return out

    def check_window(self, window: Any, ts_ns: int, busy: bool = False) -> list[Fire]:
        """Window rules over an ``aggregator.Window`` ending at ``ts_ns``."""
        out: list[Fire] = []
        for r in self.rules:
            if r.per_step:
                continue
            v = window_value(r.figure, window)
            if r.holds(v):
                assert v is not None
                out.append(self._fire(r, v, ts_ns, None, busy or any(x.captured for x in out)))
        return out

    def status(self) -> str:
        """One line for the screen: ``armed: step_ms>150 (2 fired, 1 in cooldown)``."""
        rules = ", ".join(r.text for r in self.rules)
        if not self.can_capture:
            return f"{rules} ({len(self.fires)} fired; a recording: nothing captured)"
        state = "armed" if self.armed else "disarmed"
        return f"{state}: {rules} ({len(self.fires)} fired, {self.captures} captured, {self.suppressed} not)"
