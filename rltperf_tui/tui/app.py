"""The live monitor: one column of panels per attached target.

Data flow (after Toolong, Dolphie and nvitop; see STYLE.md):

- one thread worker per target runs the live driver's reader half (``LiveTarget.read``:
  the session, and the recording if one runs) and posts **one** ``RecordsBatch`` per render
  period (``batch_for``; at most ``MAX_INFLIGHT`` wait: a fast replay's memory is bounded);
- the message handler runs the driver's model half (``LiveTarget.ingest``: the target's
  ``TargetStats``, the aggregator ``rltperf summary`` uses too, and the step triggers);
- a render tick (``set_interval``) builds each changed target's window and ``StatsView``
  (plain values, ``rltperf_tui.live.view``) once and hands them to the panels inside
  ``app.batch_update()``; a paused display skips the tick while data keeps arriving;
- worker errors end in one ``Worker.StateChanged`` handler that turns them into a
  notification and marks the target.

Each target gets its own worker group (``ingest-<i>``, exclusive) rather than one shared
``ingest`` group: ``exclusive`` cancels the other workers of a group, and several
targets (PD, ranks) must be read at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.driver import Driver
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from engine_adapters.definitions.cost import Prices
from rltperf_tui import tune_gc_for_ingest
from rltperf_tui.live.driver import new_stats, peak_override
from rltperf_tui.live.triggers import TriggerSet
from rltperf_tui.live.view import replica_view, stats_view
from rltperf_tui.tui.app_actions import MonitorActions
from rltperf_tui.tui.targets import (
    HUNG_AFTER_S,
    READER_ALIVE_S,
    CaptureRequested,
    RecordsBatch,
    TargetHandle,
    TargetProblem,
    TargetSpec,
    batch_for,
    ingest,
)
from rltperf_tui.tui.widgets.containers import BlankHorizontal, BlankScreen, BlankVertical
from rltperf_tui.tui.widgets.panel import Panel, PanelContext
from rltperf_tui.tui.widgets.replicas import ReplicaPanel
from rltperf_tui.tui.widgets.status_bar import StatusBar, StatusInfo
from rltperf_tui.tui.widgets.target_column import TargetColumn

__all__ = ["HUNG_AFTER_S", "MonitorApp", "TargetSpec"]
"""Names other modules import from here (the targets' types live in ``targets.py``)."""


class MonitorApp(MonitorActions):
    """The live monitor over one or more targets (live engines or recordings)."""

    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses live elsewhere
    TITLE = "rltperf"

    BINDINGS: ClassVar[list[BindingType]] = [
        # in footer order, help and quit first: a narrow terminal cuts the last ones
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
        Binding("c", "capture('ops')", "ops", tooltip="capture N steps, ops only"),
        Binding("f", "capture('full')", "full", tooltip="capture N steps with shapes, memory, stacks"),
        Binding("left_square_bracket", "halve_steps", "N/2", key_display="["),
        Binding("right_square_bracket", "double_steps", "Nx2", key_display="]"),
        Binding("space", "toggle_pause", "pause"),
        Binding("r", "toggle_record", "record"),
        Binding("t", "toggle_triggers", "triggers", tooltip="arm / disarm the --trigger rules"),
        Binding("v", "toggle_replicas", "replicas", tooltip="show / hide the table of vLLM replicas"),
        # no text to copy here: Ctrl-C quits, as a person over SSH expects
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("p", "replay_pause", "play"),
        Binding("plus,equals_sign", "replay_speed(2.0)", "faster", key_display="+"),
        Binding("minus", "replay_speed(0.5)", "slower", key_display="-"),
    ]

    def __init__(
        self,
        targets: Sequence[str | TargetSpec],
        *,
        window_s: float = 10.0,
        timeline_s: float = 30.0,
        refresh_hz: float = 2.0,
        capture_steps: int = 8,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
        peak_gbps: float | None = None,
        peak_gflops: float | None = None,
        record_dir: str = ".",
        adapter_options: dict[str, Any] | None = None,
        wait: bool = True,
        history_steps: int = 32768,
        child_check: Callable[[], str | None] | None = None,
        triggers: Sequence[str] = (),
        trigger_all: bool = False,
        trigger_cooldown_s: float = 30.0,
        trigger_max: int = 5,
        trigger_mode: str = "ops",
        prices: Prices | None = None,
        exit_process: Callable[[int], object] | None = None,
    ) -> None:
        super().__init__()
        self.exit_process = exit_process
        """Ends the process on quit once the monitor's cleanup is done and the terminal is
        restored (``quit_now``); the command line passes one, None returns from ``run()``."""
        tune_gc_for_ingest()
        self.window_s = float(window_s)
        self.timeline_s = float(timeline_s)
        self.refresh_hz = max(0.5, float(refresh_hz))
        self.capture_steps = max(1, int(capture_steps))
        self.slo_ttft_ms = slo_ttft_ms
        self.slo_tpot_ms = slo_tpot_ms
        self.record_dir = record_dir
        self.adapter_options = dict(adapter_options or {})
        self.wait = wait
        self.child_check = child_check
        self.child_problem: str | None = None
        self.display_paused = False
        self.paused_records = 0
        override = peak_override(peak_gbps, peak_gflops)
        self.handles: list[TargetHandle] = []
        for i, t in enumerate(targets):
            spec = t if isinstance(t, TargetSpec) else TargetSpec(target=t)
            stats = new_stats(history_steps, override)
            if spec.session is None:
                stats.state_detail = f"connecting to {spec.target}"
            rules = (
                TriggerSet.parse(triggers, cooldown_s=trigger_cooldown_s, max_captures=trigger_max)
                if triggers
                else None
            )
            self.handles.append(TargetHandle(i, spec, stats, rules, batch_for(self.refresh_hz)))
        self.trigger_all = trigger_all
        self.prices = prices
        """Prices for the cost figures of metrics targets (``--cost-in`` ...), if given."""
        self.trigger_mode = trigger_mode
        self._columns: list[TargetColumn] = []
        self._status_bar: StatusBar | None = None
        self._replicas: ReplicaPanel | None = None
        self.show_replicas = True
        self._several_replicas = False
        """Whether the replica table shows when two or more targets are metrics endpoints (``v``)."""
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._last_child_check = 0.0
        self.ticks = 0
        """Render ticks run (tests wait on it)."""

    # -- layout ------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return BlankScreen(id="_default")

    def get_driver_class(self) -> type[Driver]:
        """Textual's terminal driver, with an input thread that wakes only for input (``terminal``)."""
        base = super().get_driver_class()
        if base.__name__ != "LinuxDriver":  # another platform, or a driver named in $TEXTUAL_DRIVER
            return base
        from rltperf_tui.tui.terminal import QuietInputDriver  # imports termios: Unix only

        return QuietInputDriver if issubclass(QuietInputDriver, base) else base

    def compose(self) -> ComposeResult:
        # the bars sit in one-row boxes of their own: Textual asks every widget whose
        # parent overlaps an update for its lines, and the screen overlaps every update
        with BlankVertical(id="top-bar"):
            yield StatusBar(id="status")
        yield ReplicaPanel(id="replicas", classes="panel")
        with BlankHorizontal(id="targets"):
            for h in self.handles:
                col = TargetColumn(h.index, id=f"target-{h.index}")
                col.set_class(h.index > 0, "-follow")
                yield col
        with BlankVertical(id="bottom-bar"):
            # no palette hint (it covered the last keys at 80 columns); ctrl+p still works
            yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._columns = list(self.query(TargetColumn))
        self._status_bar = self.query_one(StatusBar)
        self._replicas = self.query_one(ReplicaPanel)
        self._replicas.display = False
        for h in self.handles:
            self.run_worker(
                partial(ingest, h, self.adapter_options, self.wait, self.post_message),
                name=f"ingest {h.target}",
                group=f"ingest-{h.index}",
                thread=True,
                exclusive=True,
                exit_on_error=False,
            )
        self.set_interval(1.0 / self.refresh_hz, self.render_tick)
        self.render_tick()

    # -- messages (UI thread) -----------------------------------------------------------------

    def on_records_batch(self, message: RecordsBatch) -> None:
        h = self.handles[message.index]
        try:
            self._act_on_fires(h, h.ingest(message.records, final=message.final).fires)
        finally:
            if message.slot:
                h.handled += 1
                h.inflight.release()
        h.dirty = True
        if self.display_paused:
            self.paused_records += len(message.records)

    def on_capture_requested(self, message: CaptureRequested) -> None:
        h = self.handles[message.index]
        if message.capture_id is None:
            h.capture_not_sent()
            self.notify(
                f"capture not requested: {message.error}", title=h.target, severity="error", timeout=8
            )
        else:
            h.capture_sent(message.capture_id, message.mode, message.steps, message.fire)
        h.dirty = True

    def on_target_problem(self, message: TargetProblem) -> None:
        h = self.handles[message.index]
        self.notify(message.text, title=h.target, severity=message.severity, timeout=8)
        h.dirty = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker errors end: a notification, and the target marked."""
        if event.state != WorkerState.ERROR:
            return
        worker = event.worker
        err = worker.error
        text = f"{type(err).__name__}: {err}" if err is not None else "unknown error"
        self.notify(text, title=f"{worker.name} failed", severity="error", timeout=15)
        if worker.group.startswith("ingest-"):
            h = self.handles[int(worker.group.split("-", 1)[1])]
            h.stats.state = "error"
            h.stats.state_detail = f"reading this target failed: {text}"
            h.dirty = True

    # -- render tick -------------------------------------------------------------------------

    def render_tick(self) -> None:
        """Recompute each changed target's window and repaint its panels (one batch)."""
        now = time.monotonic()
        self.ticks += 1
        self._check_child(now)
        for h in self.handles:
            self._notice(h, now)
        bar = self._status_bar
        if bar is None or not bar.is_attached:  # not composed yet, or shutting down
            return
        with self.batch_update():
            if not self.display_paused:
                for h, col in zip(self.handles, self._columns, strict=False):
                    if not (h.dirty or h.capture_busy or self._silent_s(h, now) is not None):
                        continue
                    h.dirty = False
                    col.show(self._panel_context(h, col, now))
                self._show_replicas()
            bar.show_status(self._status())  # after the windows: it says when the ring cut one

    def _metrics_targets(self) -> list[TargetHandle]:
        """Targets that are metrics endpoints (scrapes, no step records)."""
        return [h for h in self.handles if h.stats.metrics and len(h.stats.steps) == 0]

    def _show_replicas(self) -> None:
        """The replica table: shown with two or more metrics targets, unless ``v`` hid it."""
        panel = self._replicas
        if panel is None:
            return
        reps = self._metrics_targets()
        if (len(reps) >= 2) != self._several_replicas:
            self._several_replicas = len(reps) >= 2
            self.refresh_bindings()  # the v key shows in the footer only then
        shown = self.show_replicas and len(reps) >= 2
        if panel.display != shown:
            panel.display = shown
        if shown:
            panel.show_replicas(
                replica_view([h.target for h in reps], [h.stats for h in reps], self.window_s)
            )

    def _silent_s(self, h: TargetHandle, now: float) -> float | None:
        """Seconds since a connected live target that sends heartbeats (a probe: about
        one a second) last sent anything, once that is longer than ``HUNG_AFTER_S``: the
        engine is hung (stopped, swapping, a step that never ends) or the path to it is
        cut.  None otherwise.  Only the silence its reader saw counts: up to now while the
        reader reads, up to its newest read when it has not run since (``READER_ALIVE_S``:
        this process stopped or starved of a CPU, the records waiting in the socket)."""
        st = h.stats
        if not h.live or st.state != "connected" or st.steps_total is None or st.ended:
            return None
        seen_to = now if now - h.read_at <= READER_ALIVE_S else h.read_at
        silent = seen_to - h.data_at
        return silent if silent > HUNG_AFTER_S else None

    def _panel_context(self, h: TargetHandle, col: TargetColumn, now: float) -> PanelContext:
        """This tick's values for ``h``'s panels (the window rules are checked on its window)."""
        st = h.stats
        h.view_size = col.view_size()
        key = (self.window_s, self.slo_ttft_ms, self.slo_tpot_ms)
        if st.step_free and h.empty_window is not None and h.empty_window[0] == key:
            window = h.empty_window[1]
        else:
            window = st.window(self.window_s, slo_ttft_ms=self.slo_ttft_ms, slo_tpot_ms=self.slo_tpot_ms)
            h.empty_window = (key, window) if st.step_free else None
        h.held_s = window.span_s if window.ring_cut else None
        silent = self._silent_s(h, now)
        if silent is None:  # a hung target's window is stale
            self._act_on_fires(h, h.check_window(window))
        trig = h.triggers
        return PanelContext(
            target=h.target,
            stats=stats_view(st, self.window_s, self.timeline_s, h.view_size),
            window=window,
            window_s=self.window_s,
            timeline_s=self.timeline_s,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_tpot_ms=self.slo_tpot_ms,
            capture_steps=self.capture_steps,
            live=h.live,
            supports_capture=h.supports_capture,
            note=h.note,
            mono_now=now,
            exporting_seen=dict(h.exporting_seen),
            recording=h.recording_path,
            replay=h.replay_text(),
            waiting_text=h.spec.waiting_text,
            silent_s=silent,
            triggers=trig.status() if trig is not None else None,
            fire_marks=tuple(h.fire_marks),
            prices=self.prices,
            no_color=self.no_color,
        )

    def on_panel_resized(self, message: Panel.Resized) -> None:
        """A panel changed size: a target whose panels now draw at other sizes than its
        view was computed for gets a new view at once (the others keep theirs)."""
        if self.display_paused:
            return
        now = time.monotonic()
        for h, col in zip(self.handles, self._columns, strict=False):
            if h.view_size is not None and col.view_size() != h.view_size:
                col.show(self._panel_context(h, col, now))

    def _status(self) -> StatusInfo:
        replays = [t for t in (h.replay_text() for h in self.handles) if t]
        active = []
        for h in self.handles:
            for c in h.stats.captures.values():
                if c.state == "capturing":
                    active.append(f"{c.mode} {c.steps_done}/{c.steps}")
                elif c.state in ("armed", "exporting"):
                    active.append(f"{c.mode} {c.state}")
        return StatusInfo(
            mode=replays[0] if replays and len(replays) == len(self.handles) else "live",
            targets=len(self.handles),
            window_s=self.window_s,
            held_s=min((h.held_s for h in self.handles if h.held_s is not None), default=None),
            refresh_hz=self.refresh_hz,
            capture_steps=self.capture_steps,
            paused=self.display_paused,
            paused_records=self.paused_records,
            recording=sum(1 for h in self.handles if h.recorder is not None),
            captures_active=" ".join(active[:3]),
        )

    def _notice(self, h: TargetHandle, now: float) -> None:
        """Notifications for connection changes and finished captures (live targets)."""
        st = h.stats
        if st.state != h.last_state:
            prev, h.last_state = h.last_state, st.state
            h.dirty = True
            if h.live and st.state in ("reconnecting", "ended", "error") and prev != st.state:
                sev: SeverityLevel = "error" if st.state == "error" else "warning"
                self.notify(
                    st.state_detail or st.state, title=f"{h.target}: {st.state}", severity=sev, timeout=6
                )
            elif h.live and st.state == "connected" and prev == "reconnecting":
                self.notify(st.state_detail or "connected", title=f"{h.target}: connected again", timeout=4)
        for cid, c in st.captures.items():
            if h.capture_seen.get(cid) == c.state:
                continue
            h.capture_seen[cid] = c.state
            h.dirty = True
            if c.state == "exporting":
                h.exporting_seen.setdefault(cid, now)
            if not h.live:
                continue
            if c.state == "saved":
                self.notify(
                    f"{c.mode}, {c.steps_done}/{c.steps} steps → {c.bundle}", title="capture saved", timeout=8
                )
            elif c.state in ("failed", "refused"):
                self.notify(c.error or c.state, title=f"capture {c.state}", severity="error", timeout=10)

    def _check_child(self, now: float) -> None:
        if self.child_check is None or self.child_problem is not None or now - self._last_child_check < 1.0:
            return
        self._last_child_check = now
        problem = self.child_check()
        if problem:
            self.child_problem = problem
            self.notify(problem, title="engine process", severity="error", timeout=30)

    def force_render(self) -> None:
        """Mark every target changed and run a tick now (tests, resume from pause)."""
        for h in self.handles:
            h.dirty = True
        self.render_tick()

    # -- shutdown ----------------------------------------------------------------------------

    async def action_quit(self) -> None:
        """``q`` and Ctrl-C: leave now (``quit_now``)."""
        self.quit_now(0)

    def quit_now(self, code: int = 0) -> None:
        """Stop recordings, close every session, and leave.

        The monitor's own cleanup comes first and is bounded (``close_all``: a
        recording's last records written and the file closed, workers cancelled,
        sessions closed without waiting on their servers).  Then, with ``exit_process``
        (the command line), the terminal is given back (``App.suspend``: input
        stopped, the alternate screen left, the terminal's modes restored) and the
        process ends there: Textual's own teardown, widget by widget, is skipped.  It
        does nothing a user needs, and on a host whose cores are busy serving (a
        loaded vLLM server) it took 1 to 18 s of waiting for CPU before the shell came
        back.  Without ``exit_process`` (tests, Python callers) the app exits the
        Textual way and ``run()`` returns."""
        self.close_all()
        if self.exit_process is not None and self._give_terminal_back():
            with contextlib.redirect_stdout(sys.__stdout__), contextlib.redirect_stderr(sys.__stderr__):
                self.exit_process(code)
        self.exit(code)

    def _give_terminal_back(self) -> bool:
        """Restore the terminal as Textual's driver does when the app ends, without
        waiting for the driver's input thread; False when there is none to restore
        (headless) or it could not be done (the app then ends the Textual way).

        ``stop_application_mode`` first joins the input thread.  Textual's noticed only
        at the end of its 0.1 s select and then selected once more: 0.2 s at best, up to
        1.2 s measured with a loaded vLLM server on the same 2 cores.  Ours
        (``terminal.py``) wakes at once, but still needs a core to run on.  The process
        ends right after this, so the thread is left to it (the driver's ``_key_thread`` is
        textual 8.2's, pinned in pyproject).  The writer thread is waited for: the
        sequences that restore the terminal go through it."""
        driver = self._driver
        if driver is None or self.is_headless:
            return False
        try:
            if getattr(driver, "_key_thread", None) is not None:
                driver._key_thread = None  # type: ignore[attr-defined]
            driver.stop_application_mode()
            driver.close()
        except Exception:
            return False
        return True

    def request_exit(self, code: int = 0) -> bool:
        """Ask the app to quit (``quit_now``) from a signal handler or another thread;
        False if it is not running (the caller then exits by itself)."""
        loop = self._event_loop
        if loop is None or loop.is_closed():
            return False
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.quit_now, code)
            return True
        return False

    def on_unmount(self) -> None:
        self.close_all()

    def close_all(self) -> None:
        """Stop recordings, cancel workers and close sessions (idempotent; never waits
        on a target: each session's ``close()`` is bounded)."""
        for h in self.handles:
            h.stop_recording()
        self.workers.cancel_all()
        for h in self.handles:
            if h.session is not None:
                try:
                    h.session.close()
                except Exception:
                    pass
