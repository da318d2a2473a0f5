"""Adapter discovery through the ``rltperf.adapters`` entry-point group.

Entry points are listed without importing; an adapter is loaded when a target needs it.
A broken adapter (ImportError) is reported with its error and the others still work.
When the package runs from a source tree without being installed, the built-in table
below stands in for the entry points.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from engine_adapters.base import Adapter, AdapterTargetError

GROUP = "rltperf.adapters"

_BUILTIN = {
    "tcp": "engine_adapters.tcp:ProbeAdapter",
    "replay": "engine_adapters.replay:ReplayAdapter",
    "vllm": "engine_adapters.vllm.adapter:VllmAdapter",
}

# Which adapter a target's prefix selects, without importing any adapter.
_PREFIXES = (
    ("tcp://", "tcp"),
    ("vllm+http://", "vllm"),
    ("vllm+https://", "vllm"),
    ("replay://", "replay"),
    ("file://", "replay"),
)


@dataclass
class AdapterEntry:
    """One registered adapter (not yet imported)."""

    name: str
    value: str
    """``module:Class``."""
    error: str | None = None
    """Import error, once a load was tried and failed."""

    def load(self) -> type[Adapter]:
        """Import the adapter class; raises ``AdapterTargetError`` naming the failure."""
        mod_name, _, cls_name = self.value.partition(":")
        try:
            mod = importlib.import_module(mod_name)
            cls = getattr(mod, cls_name)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            raise AdapterTargetError(
                f"adapter {self.name!r} ({self.value}) cannot be loaded: {self.error}"
            ) from None
        return cls


def available() -> dict[str, AdapterEntry]:
    """Registered adapters by name (entry points, else the built-in table)."""
    found: dict[str, AdapterEntry] = {}
    try:
        for ep in entry_points(group=GROUP):
            found[ep.name] = AdapterEntry(ep.name, ep.value)
    except Exception:
        pass
    for name, value in _BUILTIN.items():
        found.setdefault(name, AdapterEntry(name, value))
    return found


def name_for(target: str) -> str:
    """The adapter name a target selects (prefix, else a file means a recording)."""
    for prefix, name in _PREFIXES:
        if target.startswith(prefix):
            return name
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise AdapterTargetError(
            f"unknown target scheme {scheme!r} in {target!r}: use tcp://HOST:PORT, vllm+http://HOST:PORT "
            "or a recording file"
        )
    return "replay"


def adapter_for(target: str, **options: Any) -> Adapter:
    """Build the adapter for ``target`` with ``options`` (unknown options are ignored)."""
    name = name_for(target)
    entries = available()
    entry = entries.get(name)
    if entry is None:
        raise AdapterTargetError(
            f"no adapter named {name!r} is installed (have: {', '.join(sorted(entries))})"
        )
    if name == "replay" and "://" not in target:
        import os

        if not os.path.exists(target):
            raise AdapterTargetError(
                f"{target!r} is neither a target (tcp://HOST:PORT, vllm+http://HOST:PORT) nor an existing recording file"
            )
    cls = entry.load()
    return cls(target, **options)
