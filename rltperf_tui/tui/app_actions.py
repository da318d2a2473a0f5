"""What the monitor's keys do: captures and triggers (``c``/``f``, ``[``/``]``, ``t``),
recording (``r``), the display and replays (space, ``v``, ``p``, ``+``/``-``, ``?``), and
the command palette's entries.

A base class of ``MonitorApp`` (``app.py``: workers, messages, the render tick), kept
apart so each module stays readable; the attributes it uses are set up by
``MonitorApp.__init__``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime, timezone
from functools import partial
from typing import Any

from textual.app import App, SystemCommand
from textual.screen import Screen

from engine_adapters.definitions.records import MAX_CAPTURE_STEPS
from engine_adapters.monitor.base import AdapterError, ReplayControl
from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from rltperf_tui.live.driver import capture_targets
from rltperf_tui.live.triggers import Fire
from rltperf_tui.tui.targets import CaptureRequested, TargetHandle, slug


class MonitorActions(App[int]):
    """The key actions over ``self.handles``."""

    handles: list[TargetHandle]
    capture_steps: int
    trigger_all: bool
    trigger_mode: str
    record_dir: str
    display_paused: bool
    paused_records: int
    show_replicas: bool
    _several_replicas: bool

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
            self._ask_capture(h, mode, self.capture_steps)
        if asked:
            where = f"{asked} target{'s' if asked > 1 else ''}"
            self.notify(f"{mode} capture of {self.capture_steps} steps requested on {where}", timeout=3)
        if skipped:
            self.notify("not captured: " + ", ".join(skipped), severity="warning", timeout=5)

    def _ask_capture(self, h: TargetHandle, mode: str, steps: int, fire: Fire | None = None) -> None:
        """Send a capture request from a worker thread (the network may be slow); the
        driver counts it as on its way until ``CaptureRequested`` comes back."""
        h.begin_capture()
        self.run_worker(
            partial(self._send_capture, h, mode, steps, fire),
            name=f"{'trigger ' if fire is not None else ''}capture {h.target}",
            group=f"capture-{h.index}",
            thread=True,
            exit_on_error=False,
        )

    def _send_capture(self, h: TargetHandle, mode: str, steps: int, fire: Fire | None) -> None:
        try:
            cid = h.send_capture(steps, mode, fire)
        except AdapterError as exc:
            self.post_message(CaptureRequested(h.index, None, mode, steps, fire, error=str(exc)))
            return
        self.post_message(CaptureRequested(h.index, cid, mode, steps, fire))

    def _act_on_fires(self, h: TargetHandle, fires: list[Fire]) -> None:
        """Ask for a capture for each fire that may capture (``TriggerSet`` decided)."""
        for f in fires:
            if not f.captured:
                continue
            for x in capture_targets(h, self.handles, self.trigger_all):
                self._ask_capture(x, self.trigger_mode, self.capture_steps, f)
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
            if h.stats.hello is None:
                self.notify("not connected yet: nothing to record", title=h.target, severity="warning")
                continue
            path = self._recording_path(h)
            try:
                h.start_recording(RecordingWriter(path, target=h.target), path)
            except RecordingError as exc:
                self.notify(str(exc), title="cannot record", severity="error")
                continue
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
        w, path = h.stop_recording()
        if w is not None:
            self.notify(f"{w.records:,} records saved to {path}", title="recording stopped", timeout=6)

    # -- display and replays ---------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("replay_pause", "replay_speed"):
            return any(not h.live for h in self.handles)
        if action == "toggle_replicas":
            return self._several_replicas
        if action == "toggle_record":
            return any(h.live for h in self.handles)
        return True

    def action_toggle_replicas(self) -> None:
        """Show or hide the replica table (two or more metrics targets)."""
        self.show_replicas = not self.show_replicas
        self.force_render()

    def action_toggle_pause(self) -> None:
        """Pause or resume the display (data keeps arriving)."""
        self.display_paused = not self.display_paused
        self.paused_records = 0
        self.force_render()

    def action_replay_pause(self) -> None:
        """Play or pause every replayed recording."""
        for h in self.handles:
            if not h.live and isinstance(h.session, ReplayControl):
                h.session.toggle_pause()
        self.force_render()

    def action_replay_speed(self, factor: float) -> None:
        """Multiply the replay speed by ``factor`` (0 = as fast as read stays 0)."""
        for h in self.handles:
            s = h.session
            if h.live or not isinstance(s, ReplayControl):
                continue
            speed = float(s.speed)
            if speed > 0:
                s.set_speed(min(256.0, max(1 / 64, speed * factor)))
        self.force_render()

    def action_help(self) -> None:
        """Show what every panel and number means."""
        from rltperf_tui.tui.screens.help import HelpScreen

        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Capture ops-only", f"profile N={self.capture_steps} steps, ops only (c)",
                            partial(self.action_capture, "ops"))  # fmt: skip
        yield SystemCommand("Capture full", f"profile N={self.capture_steps} steps with shapes, memory, stacks (f)",
                            partial(self.action_capture, "full"))  # fmt: skip
        yield SystemCommand("Halve capture length", "N / 2 ([)", self.action_halve_steps)
        yield SystemCommand("Double capture length", "N x 2 (])", self.action_double_steps)
        yield SystemCommand(
            "Pause display", "freeze the screen; data still arrives (space)", self.action_toggle_pause
        )
        if any(h.live for h in self.handles):
            yield SystemCommand(
                "Record stream", "start/stop recording to .rltrec files (r)", self.action_toggle_record
            )
        if any(not h.live for h in self.handles):
            yield SystemCommand(
                "Replay play/pause", "pause or resume the recording (p)", self.action_replay_pause
            )
            yield SystemCommand(
                "Replay faster", "double the replay speed (+)", partial(self.action_replay_speed, 2.0)
            )
            yield SystemCommand(
                "Replay slower", "halve the replay speed (-)", partial(self.action_replay_speed, 0.5)
            )
        yield SystemCommand("Help", "what every panel and number means (?)", self.action_help)
