"""The monitor's capture, trigger and recording actions (``c``/``f``, ``[``/``]``, ``t``, ``r``).

A base class of ``MonitorApp`` (``app.py``), kept apart so each module stays readable;
the attributes it uses are set up by ``MonitorApp.__init__``.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from functools import partial

from textual.app import App

from engine_adapters.definitions.records import MAX_CAPTURE_STEPS, Record, StageTable
from engine_adapters.monitor.base import AdapterError
from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from rltperf_tui.live.triggers import Fire
from rltperf_tui.tui.targets import CaptureRequested, TargetHandle, TargetProblem, slug


class MonitorActions(App[int]):
    """Capture, trigger and recording actions over ``self.handles``."""

    handles: list[TargetHandle]
    capture_steps: int
    trigger_all: bool
    trigger_mode: str
    record_dir: str

    def force_render(self) -> None:
        """Redraw now (``MonitorApp`` renders; the base does nothing)."""

    # -- captures and triggers -------------------------------------------------------------

    def action_capture(self, mode: str) -> None:
        """Ask every capable, connected target for a capture of N steps in ``mode``."""
        asked = 0
        skipped: list[str] = []
        for h in self.handles:
            if not h.live or not h.supports_capture:
                skipped.append(
                    f"{h.target} (recording)" if not h.live else f"{h.target} (adapter cannot capture)"
                )
                continue
            if h.session is None or h.stats.state != "connected":
                skipped.append(f"{h.target} ({h.stats.state})")
                continue
            asked += 1
            self.run_worker(
                partial(self._request_capture, h, mode, self.capture_steps),
                name=f"capture {h.target}",
                group=f"capture-{h.index}",
                thread=True,
                exit_on_error=False,
            )
        if asked:
            where = f"{asked} target{'s' if asked > 1 else ''}"
            self.notify(f"{mode} capture of {self.capture_steps} steps requested on {where}", timeout=3)
        if skipped:
            self.notify("not captured: " + ", ".join(skipped), severity="warning", timeout=5)

    def _request_capture(self, h: TargetHandle, mode: str, steps: int, fire: Fire | None = None) -> None:
        session = h.session
        if session is None:
            return
        try:
            if fire is None:
                cid = session.request_capture(steps, mode)
            else:
                cid = session.request_capture(steps, mode, f"trigger-{fire.rule.figure}", trigger=fire.info())
        except AdapterError as exc:
            self.post_message(TargetProblem(h.index, f"capture not requested: {exc}"))
            return
        trigger = f"{fire.rule.text} ({fire.value:.4g})" if fire is not None else None
        self.post_message(CaptureRequested(h.index, cid, mode, steps, trigger))

    def _capture_running(self, h: TargetHandle) -> bool:
        return any(
            c.state in ("requested", "armed", "capturing", "exporting") for c in h.stats.captures.values()
        )

    def _act_on_fires(self, h: TargetHandle, fires: list[Fire]) -> None:
        """Ask for a capture for each fire that may capture (``TriggerSet`` decided)."""
        for f in fires:
            h.fire_marks.append(f.ts_ns)
            if not f.captured:
                continue
            targets = [x for x in self.handles if x.live and x.supports_capture] if self.trigger_all else [h]
            for x in targets:
                if x.session is None or x.stats.state != "connected":
                    continue
                self.run_worker(
                    partial(self._request_capture, x, self.trigger_mode, self.capture_steps, f),
                    name=f"trigger capture {x.target}",
                    group=f"capture-{x.index}",
                    thread=True,
                    exit_on_error=False,
                )
            self.notify(
                f"{h.target}: {f.rule.text} fired ({f.value:.4g}): {self.trigger_mode} capture of "
                f"{self.capture_steps} steps",
                timeout=4,
            )

    def action_toggle_triggers(self) -> None:
        """Arm or disarm the triggers given on the command line."""
        sets = [h.triggers for h in self.handles if h.triggers is not None]
        if not sets:
            self.notify("no triggers: start with --trigger RULE (e.g. 'step_ms>150')", severity="warning")
            return
        armed = not sets[0].armed
        for t in sets:
            t.armed = armed
        self.notify(f"triggers {'armed' if armed else 'disarmed'}", timeout=3)
        for h in self.handles:
            h.dirty = True

    def action_halve_steps(self) -> None:
        """Halve the capture length N."""
        self.capture_steps = max(1, self.capture_steps // 2)
        self.force_render()

    def action_double_steps(self) -> None:
        """Double the capture length N."""
        self.capture_steps = min(MAX_CAPTURE_STEPS, self.capture_steps * 2)
        self.force_render()

    # -- recording ---------------------------------------------------------------------------

    def action_toggle_record(self) -> None:
        """Start or stop recording each live target's stream to a file."""
        live = [h for h in self.handles if h.live]
        if not live:
            self.notify("recordings are made of live targets; this is a replay", severity="warning")
            return
        if any(h.recorder is not None for h in live):
            for h in live:
                self._stop_recording(h)
            self.force_render()
            return
        for h in live:
            hello = h.stats.hello
            if hello is None:
                self.notify("not connected yet: nothing to record", title=h.target, severity="warning")
                continue
            path = self._recording_path(h)
            try:
                w = RecordingWriter(path, target=h.target)
                first: list[Record] = [hello]
                if list(hello.stage_names) != h.stats.stage_names:
                    first.append(StageTable(stage_names=list(h.stats.stage_names)))
                w.write(first)
            except RecordingError as exc:
                self.notify(str(exc), title="cannot record", severity="error")
                continue
            with h.rec_lock:
                h.recorder = w
                h.recording_path = path
                h.last_flush = time.monotonic()
            self.notify(f"recording to {path}", title=h.target, timeout=4)
        self.force_render()

    def _recording_path(self, h: TargetHandle) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = os.path.join(self.record_dir, f"rltperf-{slug(h.target)}-{stamp}")
        path, k = base + ".rltrec", 2
        while os.path.exists(path):
            path, k = f"{base}-{k}.rltrec", k + 1
        return path

    def _stop_recording(self, h: TargetHandle) -> None:
        with h.rec_lock:
            w, h.recorder = h.recorder, None
            path, h.recording_path = h.recording_path, None
        if w is not None:
            w.close()
            self.notify(f"{w.records:,} records saved to {path}", title="recording stopped", timeout=6)
