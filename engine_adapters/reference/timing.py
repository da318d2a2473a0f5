"""CUDA timing of the reference engine's steps without synchronising it: a pool of
preallocated events, and per-depth loop times read once their events completed."""

from __future__ import annotations

from collections import deque
from typing import Any


class EventPool:
    """Preallocated CUDA timing events handed out round-robin (never allocated per step)."""

    def __init__(self, n: int) -> None:
        import torch

        self._ev = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self._i = 0
        self._n = n

    def __call__(self) -> Any:
        e = self._ev[self._i]
        self._i = (self._i + 1) % self._n
        return e


def resolve_loop_events(
    pending: deque[tuple[list[tuple[Any, Any]], list[int]]],
) -> tuple[list[int], list[int]] | None:
    """CUDA: per-depth times of the oldest step in ``pending`` whose loop events completed.

    Carried by a later step's record (the aggregator averages per-depth times over
    windows, so the lag of a few steps does not matter); never synchronises.
    """
    if not pending:
        return None
    evs, toks = pending[0]
    if evs and not evs[-1][1].query() and len(pending) < 64:
        return None
    pending.popleft()
    if not evs:
        return None
    try:
        ns = [int(a.elapsed_time(b) * 1e6) for a, b in evs]
    except RuntimeError:
        return None
    # depths that ran on no tokens recorded no events
    full = [0] * len(toks)
    j = 0
    for i, n in enumerate(toks):
        if n and j < len(ns):
            full[i] = ns[j]
            j += 1
    return full, list(toks)
