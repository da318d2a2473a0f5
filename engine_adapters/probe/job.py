"""A capture's state (``CaptureJob``) and the export windows steps are flagged by.

Shared by the capture controller (engine and publisher threads), the bundle writer
(export thread) and the ring reader (``FLAG_EXPORTING``); it imports nothing else of the
probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CaptureJob", "ExportWindows"]


@dataclass
class CaptureJob:
    """State of one capture, shared by the publisher, engine and export threads."""

    capture_id: str
    steps: int
    mode: str
    label: str
    requested_ns: int
    state: str = "armed"  # armed -> warmup -> capturing -> exporting | stalled -> saved | failed
    cold: bool = False
    prof: Any = None
    warmup_step: int | None = None
    first_step: int | None = None
    step_ids: list[int] = field(default_factory=list)
    slot_ids: list[int] = field(default_factory=list)
    started_ns: int | None = None
    window_end_ns: int | None = None
    export_start_ns: int | None = None
    export_end_ns: int | None = None
    error: str | None = None
    in_step: bool = False  # the engine is inside a step of this window (never "idle")
    last_step_ns: int = 0  # end of the window's last step (or its start), probe clock
    partial: str | None = None  # why the window ended before N steps (bundle complete: false)
    export_where: str | None = None  # "child" (forked) or "thread" (fallback)
    live_at_trigger: dict[str, Any] = field(default_factory=dict)
    trigger: Any = None
    """``TriggerInfo`` when a trigger rule asked for this capture."""

    @property
    def full(self) -> bool:
        """Full mode: shapes, memory and stacks recorded."""
        return self.mode == "full"


class ExportWindows:
    """The last few exports' (start, end) on the probe clock (end None while running):
    steps overlapping one are flagged ``FLAG_EXPORTING`` by the reader."""

    KEEP = 8

    def __init__(self) -> None:
        self._w: list[tuple[int, int | None]] = []

    def begin(self, start_ns: int) -> None:
        """An export starts (engine thread)."""
        self._w.append((start_ns, None))
        del self._w[: -self.KEEP]

    def end(self, start_ns: int, end_ns: int) -> None:
        """The export that started at ``start_ns`` ended (export thread)."""
        self._w[:] = [(s, end_ns if s == start_ns else e) for s, e in self._w]

    def __bool__(self) -> bool:
        return bool(self._w)

    def overlap(self, start_ns: int, end_ns: int) -> bool:
        """True when [start, end] overlaps an export."""
        return any(end_ns >= s and (e is None or start_ns <= e) for s, e in self._w)
