"""What serving costs, from prices the user gives (``--cost-in``, ``--cost-out``,
``--gpu-cost-hour``) and the token rates of a window.  Defined once here; the screen,
the help screen and the tests call these.

- List price of the traffic, $ per 1M tokens (prompt and generated together, at the
  window's mix): ``(P × cost_in + G × cost_out) / (P + G)``, with P, G the prompt and
  generation tokens/s and cost_in, cost_out in $ per 1M tokens; and what that traffic
  is worth per hour: ``(P × cost_in + G × cost_out) × 3600 / 1e6``.
- Hardware cost, $ per 1M generated tokens: ``gpu_cost_hour / (G × 3600) × 1e6``, with
  gpu_cost_hour the $ per hour of the GPUs behind one target (all of them: a server on 4
  GPUs at $2 each costs $8 an hour).  At zero tokens/s it is unknown, never infinite.
"""

from __future__ import annotations

from dataclasses import dataclass

COST_FORMULAS = (
    "list $/1M tok = (P·in + G·out) / (P + G);  $/h = (P·in + G·out)·3600/1e6",
    "GPU $/1M out = gpu_cost_hour / (G·3600) · 1e6",
)
"""The formulas in words for the help screen (P, G: prompt and generation tokens/s)."""


@dataclass(frozen=True)
class Prices:
    """Prices given on the command line (None: not given)."""

    cost_in: float | None = None
    """$ per 1M prompt (input) tokens."""
    cost_out: float | None = None
    """$ per 1M generated (output) tokens."""
    gpu_cost_hour: float | None = None
    """$ per hour of the GPUs behind one target."""

    @property
    def any(self) -> bool:
        """Whether any price was given."""
        return self.cost_in is not None or self.cost_out is not None or self.gpu_cost_hour is not None


@dataclass(frozen=True)
class Cost:
    """Cost figures of one window (None: unknown)."""

    list_per_mtok: float | None
    """List price of the window's traffic, $ per 1M tokens (prompt + generated)."""
    list_per_hour: float | None
    """What the window's traffic is worth per hour at list prices, $."""
    gpu_per_mtok_out: float | None
    """Hardware cost per 1M generated tokens at the window's rate, $."""


def cost(prompt_tps: float | None, gen_tps: float | None, prices: Prices) -> Cost:
    """The cost figures of a window's token rates (module docstring)."""
    p = prompt_tps or 0.0
    g = gen_tps or 0.0
    lst = hour = gpu = None
    if prices.cost_in is not None or prices.cost_out is not None:
        value = p * (prices.cost_in or 0.0) + g * (prices.cost_out or 0.0)  # $·tok/s per 1M tok
        if prompt_tps is not None or gen_tps is not None:
            hour = value * 3600 / 1e6
            lst = value / (p + g) if p + g > 0 else None
    if prices.gpu_cost_hour is not None and g > 0:
        gpu = prices.gpu_cost_hour / (g * 3600) * 1e6
    return Cost(list_per_mtok=lst, list_per_hour=hour, gpu_per_mtok_out=gpu)
