"""A capture's state (``CaptureJob``) and the export windows steps are flagged by.

Shared by the capture controller (engine and publisher threads), the bundle writer
(export thread) and the ring reader (``FLAG_EXPORTING``); it imports nothing else of the
probe.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from engine_adapters.definitions.bundle import capture_id_problem, capture_request_problem
from engine_adapters.definitions.records import Capture, Refused

__all__ = ["CaptureJob", "ExportWindows", "budget_problem", "note_cost", "snapshot_usage"]


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
    costs: dict[str, float] = field(default_factory=dict)
    """What the capture cost the engine process, measured where it ran (``meta.json``
    ``capture.engine_cost``): ``profiler_start`` / ``profiler_stop`` on the engine thread,
    the ``fork`` of the export child and the ``release`` of the results on the export
    thread (both with the GIL held), each ``*_ms`` (wall) and
    ``*_cpu_ms`` (that thread's CPU time: preemption on a busy host does not count)."""
    live_at_trigger: dict[str, Any] = field(default_factory=dict)
    trigger: Any = None
    """``TriggerInfo`` when a trigger rule asked for this capture."""
    via: str | None = None
    """How the capture was taken when not by this process's own profiler (``meta.json``
    ``capture.via``): vLLM's workers, each with its own profiler."""
    ranks: dict[str, dict[str, Any]] | None = None
    """Worker captures: each rank's result (``RankResult`` fields: ``steps_found``,
    ``events``, ``trace_bytes``, ``export_in``, ``costs``, ``error``); its files are in
    the temp bundle's ``.rank-<rank>/``.  None: this process's profiler (``prof``)."""
    expected_ranks: list[str] | None = None
    """The ranks a worker capture was to hold."""

    @property
    def full(self) -> bool:
        """Full mode: shapes, memory and stacks recorded."""
        return self.mode == "full"


def note_cost(job: CaptureJob, name: str, t0_ns: int, cpu0_ns: int) -> None:
    """Record ``name``'s wall and thread CPU time since ``t0_ns`` / ``cpu0_ns``
    (``perf_counter_ns`` / ``thread_time_ns``, read on the same thread)."""
    job.costs[f"{name}_ms"] = round((time.perf_counter_ns() - t0_ns) / 1e6, 3)
    job.costs[f"{name}_cpu_ms"] = round((time.thread_time_ns() - cpu0_ns) / 1e6, 3)


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


def snapshot_usage(root: str) -> tuple[int, int]:
    """(bundles, bytes) under ``root``: every folder not starting with ``.``, recursively."""
    count = total = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0, 0
    for e in entries:
        if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
            continue
        count += 1
        for dirpath, _dirs, names in os.walk(e.path):
            for n in names:
                try:
                    total += os.lstat(os.path.join(dirpath, n)).st_size
                except OSError:
                    pass
    return count, total


def budget_problem(root: str, budget_bytes: int | None, budget_count: int | None) -> str | None:
    """Why the snapshot root has no room for another bundle, or None.  Nothing is
    ever deleted to make room: the person decides what to keep."""
    if budget_bytes is None and budget_count is None:
        return None
    count, total = snapshot_usage(root)
    if budget_count is not None and count >= budget_count:
        return (
            f"snapshot budget reached: {count} bundles in {root} (limit {budget_count}); "
            "move or delete old bundles, or raise --snapshot-budget-count"
        )
    if budget_bytes is not None and total >= budget_bytes:
        return (
            f"snapshot budget reached: {total / 2**20:.0f} MiB of bundles in {root} "
            f"(limit {budget_bytes / 2**20:.0f} MiB); move or delete old bundles, "
            "or raise --snapshot-budget-mb"
        )
    return None


def request_refusal(
    cap: Capture,
    torch_error: str | None,
    closed: bool,
    root: str,
    budget_bytes: int | None,
    budget_count: int | None,
) -> Refused | None:
    """The ``Refused`` a capture request gets before it may be armed, on every capture path
    (the probe's own, the vLLM workers'): a bad id, no profiler, a bad N or mode, an engine
    shutting down, a full snapshot budget; None when it may be armed."""
    bad_id = capture_id_problem(cap.capture_id)
    if bad_id:
        return Refused(reason=bad_id, capture_id=None)
    why = (
        torch_error
        or capture_request_problem(cap.steps, cap.mode)
        or ("the engine is shutting down" if closed else None)
        or budget_problem(root, budget_bytes, budget_count)
    )
    return Refused(reason=why, capture_id=cap.capture_id) if why else None
