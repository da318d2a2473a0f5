"""The in-engine probe: ``from engine_adapters.probe import Probe``.

See ``Probe`` for the public shape; README.md has a 15-line example.
"""

from engine_adapters.probe.core import Probe, StepSlot, now_ns

__all__ = ["Probe", "StepSlot", "now_ns"]
