"""Adapter discovery and selection through the ``rltperf.adapters`` entry-point group.

Entry points are listed without importing (``available()``).  Choosing the adapter for
a target (``adapter_for``) imports each registered adapter once (cached) to ask its
``accepts(target)``; an adapter that fails to import is reported with its error and the
others still work.  When the package runs from a source tree without being installed,
the built-in table below stands in for its own entry points.

When more than one adapter accepts a target, the choice is deterministic
(``candidates`` ranks them):

1. a declared scheme the target starts with (``SCHEMES``) beats a declared file suffix
   (``SUFFIXES``), which beats any other reason ``accepts`` gave (the replay adapter's
   "any existing file");
2. within that, the longer scheme or suffix wins (``vllm+http://`` over ``vllm+``);
3. then a built-in adapter wins over an installed one, so installing a package can add
   targets but never changes where an existing one goes;
4. then the entry-point name, alphabetically.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from engine_adapters.monitor.base import Adapter, AdapterTargetError

GROUP = "rltperf.adapters"

_BUILTIN = {
    "tcp": "engine_adapters.monitor.tcp:ProbeAdapter",
    "vllm": "engine_adapters.monitor.vllm.adapter:VllmAdapter",
    "replay": "engine_adapters.monitor.replay:ReplayAdapter",
}
"""The adapters this package ships, in the order they are listed in messages."""

_LOADED: dict[str, type[Adapter] | str] = {}
"""``module:Class`` → the class, or the error its import raised (each is tried once)."""


@dataclass
class AdapterEntry:
    """One registered adapter (not yet imported)."""

    name: str
    value: str
    """``module:Class``."""
    error: str | None = None
    """Import error, once a load was tried and failed."""

    @property
    def builtin(self) -> bool:
        """Whether this is one of the adapters rltperf ships."""
        return self.value in _BUILTIN.values()

    def load(self) -> type[Adapter]:
        """Import the adapter class (once per process); raises ``AdapterTargetError``
        naming the failure."""
        got = _LOADED.get(self.value)
        if got is None:
            got = _import(self.value)
            _LOADED[self.value] = got
        if isinstance(got, str):
            self.error = got
            raise AdapterTargetError(f"adapter {self.name!r} ({self.value}) cannot be loaded: {got}")
        return got


def _import(value: str) -> type[Adapter] | str:
    """The class ``module:Class`` names, or why it cannot be had."""
    mod_name, _, cls_name = value.partition(":")
    try:
        obj = getattr(importlib.import_module(mod_name), cls_name)
    except Exception as exc:  # an adapter's import may fail in any way; report, never crash
        return f"{type(exc).__name__}: {exc}"
    if not (isinstance(obj, type) and issubclass(obj, Adapter)):
        return f"TypeError: {value} is not an Adapter subclass"
    return obj


def available() -> dict[str, AdapterEntry]:
    """Registered adapters by name (entry points, else the built-in table), imported
    nothing."""
    found: dict[str, AdapterEntry] = {}
    try:
        for ep in entry_points(group=GROUP):
            found[ep.name] = AdapterEntry(ep.name, ep.value)
    except Exception:
        pass
    for name, value in _BUILTIN.items():
        found.setdefault(name, AdapterEntry(name, value))
    return found


def _ordered(entries: dict[str, AdapterEntry]) -> list[AdapterEntry]:
    """Built-in adapters in their own order, then the others by name."""
    builtin = list(_BUILTIN.values())
    return sorted(
        entries.values(),
        key=lambda e: (0, builtin.index(e.value), "") if e.builtin else (1, 0, e.name),
    )


def candidates(target: str) -> tuple[list[tuple[AdapterEntry, type[Adapter]]], list[AdapterEntry]]:
    """The adapters that accept ``target``, best first (see the module docstring), and
    the adapters that could not be asked (their ``error`` says why)."""
    ranked: list[tuple[tuple[int, int, int, str], AdapterEntry, type[Adapter]]] = []
    broken: list[AdapterEntry] = []
    for entry in _ordered(available()):
        try:
            cls = entry.load()
            ok = bool(cls.accepts(target))
        except AdapterTargetError:
            broken.append(entry)
            continue
        except Exception as exc:  # a faulty accepts() must not hide the other adapters
            entry.error = f"{type(exc).__name__} in accepts(): {exc}"
            broken.append(entry)
            continue
        if not ok:
            continue
        scheme, suffix = cls.scheme_of(target), cls.suffix_of(target)
        tier, length = (0, len(scheme)) if scheme else (1, len(suffix)) if suffix else (2, 0)
        ranked.append(((tier, -length, 0 if entry.builtin else 1, entry.name), entry, cls))
    ranked.sort(key=lambda r: r[0])
    return [(e, c) for _, e, c in ranked], broken


def _forms(live: bool) -> list[str]:
    """How targets of the loadable adapters look (``tcp://HOST:PORT``), live or not."""
    out: list[str] = []
    for entry in _ordered(available()):
        try:
            cls = entry.load()
        except AdapterTargetError:
            continue
        form = cls.target_form()
        if bool(cls.IS_LIVE) == live and form and form not in out:
            out.append(form)
    return out


def _either(forms: list[str]) -> str:
    """``a, b or c``."""
    return forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"


def adapter_for(target: str, **options: Any) -> Adapter:
    """Build the adapter for ``target`` with ``options`` (unknown options are ignored);
    raises ``AdapterTargetError`` with a sentence naming the targets that would work."""
    found, broken = candidates(target)
    if found:
        _, cls = found[0]
        return cls(target, **options)
    live = _forms(live=True)
    if "://" in target:
        scheme = target.split("://", 1)[0]
        msg = f"unknown target scheme {scheme!r} in {target!r}: use {_either(live + _forms(live=False))}"
    else:
        files = [f.removeprefix("a ").removeprefix("an ") for f in _forms(live=False)] or ["recording file"]
        msg = f"{target!r} is neither a target ({', '.join(live)}) nor an existing {' or '.join(files)}"
    for e in broken:
        msg += f"; adapter {e.name!r} could not be asked ({e.error})"
    raise AdapterTargetError(msg)
