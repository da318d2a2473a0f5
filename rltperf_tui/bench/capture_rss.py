"""``rltperf bench capture``'s memory run (``--rss-captures``): the engine's RSS across
sequential captures once it has settled, net of its own drift without captures."""

from __future__ import annotations

import time
from typing import Any

from rltperf_tui.bench.feed import Feed

SETTLE_MAX_S = 180.0
"""The longest the memory run waits for a young engine's RSS to stop growing (``_settle``):
~28 s at ~144 steps/s, about twice that at half the rate on a busy machine."""


def _settle(feed: Feed, mb: Any, settle_max: float = SETTLE_MAX_S) -> float | None:
    """Read until the engine's RSS has stayed within 0.5 MB for three reads 2 s apart;
    the seconds that took (None: still growing after ``settle_max`` s, or unknown).  A
    fresh engine grows until its probe's reader holds its 4,096 recent ``StepRecord``s
    (bundles' ``steps.jsonl``): the reference engine under closed:4 (~144 steps/s) is
    flat from ~28 s (from 50-75 s, ~11 MB more, while ring slots kept their steps'
    facts).  Counted during that growth, the captures were charged with part of it."""
    t0 = time.monotonic()
    seen: list[float] = []
    while time.monotonic() - t0 < settle_max:
        v = mb()
        if v is None:
            return None
        seen.append(v)
        if len(seen) >= 4 and max(seen[-4:]) - min(seen[-4:]) <= 0.5:
            return round(time.monotonic() - t0, 1)
        feed.read(2.0)
        del feed.history[:-5000]
    return None


def net_growth_mb(
    growth: float | None, control: float | None, counted_s: float, control_s: float
) -> float | None:
    """The captures' RSS growth ``growth`` over ``counted_s``, less the engine's own
    growth without captures (``control`` over ``control_s``, scaled to ``counted_s``).
    A fall without captures is not charged to them: a parallel test run saw +4.7 MB over
    the ten, then -9.6 MB without (memory handed back), and read +14.3 MB net."""
    if growth is None or control is None or not control_s:
        return None
    return growth - max(0.0, control) * counted_s / control_s


def rss_run(
    feed: Feed, mode: str, steps: int, count: int, warmup: int, settle_max: float = SETTLE_MAX_S
) -> dict[str, Any]:
    """Once the engine's RSS has settled (``_settle``, at most ``settle_max`` s), ``count`` sequential captures,
    the engine's RSS (MB) before and after each; then as long again without captures
    (the engine's own drift), read the same way."""
    from engine_adapters.definitions.records import CaptureDone

    def mb() -> float | None:
        v = feed.rss_bytes()
        return round(v / 2**20, 1) if v else None

    settled_s = _settle(feed, mb, settle_max)
    rss = [mb()]
    failed = []
    t_counted = time.monotonic()
    for i in range(count):
        if i == warmup:
            t_counted = time.monotonic()
        # the RSS is read once the reply is in (the export freed the profiler's results
        # before it), not after the timing run's second of trailing steps: ten captures
        # and their control took 8-11 s instead of 29 on the reference engine (tiny, closed:4)
        result, _t = feed.capture(mode, steps, after_s=0.0)
        if not isinstance(result, CaptureDone):
            failed.append(getattr(result, "reason", "no answer within 300 s"))
        del feed.history[:-5000]
        rss.append(mb())
    counted_s = time.monotonic() - t_counted
    control_s = min(counted_s, 300.0)
    feed.read(control_s)
    control_end = mb()
    del feed.history[:-5000]
    counted = rss[warmup:] if 0 <= warmup < len(rss) else []
    n = len(counted) - 1
    a, b, c = (counted[0], counted[-1], rss[-1]) if n > 0 else (None, None, None)
    growth = b - a if a is not None and b is not None else None
    control = control_end - c if control_end is not None and c is not None else None
    net = net_growth_mb(growth, control, counted_s, control_s)
    return {
        "mode": mode,
        "steps": steps,
        "captures": count,
        "warmup": warmup,
        "rss_mb": rss,
        "source": f"/proc/{feed.pid}" if feed.pid is not None else "probe DeviceSample.proc_rss",
        "growth_mb": growth,
        "per_capture_mb": growth / n if growth is not None and n > 0 else None,
        "settled_s": settled_s,
        "counted_s": round(counted_s, 1),
        "control_s": round(control_s, 1),
        "control_mb": control,
        "net_per_capture_mb": net / n if net is not None and n > 0 else None,
        "net_mb": net,
        "failed": failed,
    }
