"""Fault injection for tests of the plugin's safety (never set on a real server).

Two environment variables, read once per process; unset, each costs one ``is None``
test at its call site:

- ``RLTPERF_INJECT_FAULTS=DIR``: a call site of the plugin or the loop recorder raises
  ``InjectedFault`` while the file ``DIR/<rank>-<site>`` exists.  ``<rank>`` is the
  worker's (``dp0-tp1``) for the recorder's sites ``begin``, ``mark``, ``add_logits``,
  and the engine's (``dp0``) for the step wrapper's ``probe_step`` and ``probe_mark``.
  A test creates the file while the server runs, to check that one failure turns
  recording off with a logged reason and vLLM serves on.
- ``RLTPERF_INJECT_SLOW=RANK:MS[,RANK:MS]``: the worker ``RANK`` (``dp0-tp1``) sleeps
  ``MS`` milliseconds inside every model forward, after the recorder's start: a
  straggler, for the per-rank figures (like the reference engine's ``--inject-stall``).

Standard library only.
"""

from __future__ import annotations

import os

ENV_FAULTS = "RLTPERF_INJECT_FAULTS"
"""Directory whose ``<rank>-<site>`` files make that call site raise."""
ENV_SLOW = "RLTPERF_INJECT_SLOW"
"""``RANK:MS,...``: ranks that sleep MS ms in every forward."""


class InjectedFault(RuntimeError):
    """Raised at a call site by ``Faults.check`` (a test asked for it)."""


class Faults:
    """The injected faults of one rank (``None`` from ``for_rank`` when none are asked)."""

    def __init__(self, directory: str, rank: str) -> None:
        self.directory = directory
        self.rank = rank

    def check(self, site: str) -> None:
        """Raise ``InjectedFault`` when the test asked this site to fail."""
        if os.path.exists(os.path.join(self.directory, f"{self.rank}-{site}")):
            raise InjectedFault(f"fault injected at {site} on {self.rank} ({ENV_FAULTS})")


def for_rank(rank: str) -> Faults | None:
    """The faults asked for ``rank`` by ``RLTPERF_INJECT_FAULTS``, or None (the normal case)."""
    d = os.environ.get(ENV_FAULTS, "").strip()
    return Faults(d, rank) if d else None


def slow_ms(rank: str) -> float:
    """Milliseconds ``rank`` sleeps per forward by ``RLTPERF_INJECT_SLOW`` (0: none)."""
    for part in os.environ.get(ENV_SLOW, "").split(","):
        name, _, ms = part.strip().partition(":")
        if name == rank:
            try:
                return max(0.0, float(ms))
            except ValueError:
                return 0.0
    return 0.0
