"""The in-engine probe: ``from engine_adapters.probe import Probe``.

See ``Probe`` for the public shape; README.md has a 15-line example. The names are
loaded on first use, so importing a sub-package (the vLLM plugin, which vLLM imports in
every one of its processes) does not start importing the probe itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_adapters.probe.core import Probe, StepSlot, now_ns

__all__ = ["Probe", "StepSlot", "now_ns"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from engine_adapters.probe import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
