"""``rltperf watch TARGET… --trigger RULE``: a headless flight recorder for load tests.

Records the unprofiled stream of every target (rotating files, bounded disk), checks
the trigger rules (``rltperf_tui.live.triggers``) as records arrive, asks the engine for a
capture when one fires (cooldown, maximum, the engine's snapshot budget respected),
and at the end (``--duration``, Ctrl-C, SIGTERM, SIGHUP, or every engine's goodbye) writes
``OUT/index.html`` (``watch_report``): each target's figures over the whole run
(``rltperf_tui.live.whole_run``: exact sums, sketched percentiles, persisted beside the
files), which raw steps are still on disk, every trigger event with its figures and
bundle, and the whole run's step-time chart with the events marked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from engine_adapters.definitions.records import Record, StepRecord
from engine_adapters.monitor.base import AdapterError
from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from rltperf_tui.commands.common import Progress, add_target_options, open_session, target_options
from rltperf_tui.commands.stop_signals import on_stop_signals, raise_interrupt
from rltperf_tui.commands.watch_report import safe_name as _safe
from rltperf_tui.commands.watch_report import write_report
from rltperf_tui.live.driver import Ingested, LiveTarget, TargetSpec, capture_targets, new_stats
from rltperf_tui.live.triggers import GRAMMAR, RuleError, TriggerSet
from rltperf_tui.live.whole_run import WholeRun

HELP = "headless flight recorder: record every target, capture when a trigger rule fires, write a report"
EXIT_WITHOUT_TEARDOWN = True
"""Done, the process ends at once (``cli._exit_now``): no interpreter teardown to wait for."""
DESCRIPTION = f"""\
Run without a screen (load tests, CI): record each target's unprofiled stream into
OUT (rotating .rltrec files, at most --max-recording-mb per target: the oldest file is
removed when a new one would pass it, and the report says so; the figures cover the
whole run all the same: exact sums and sketched percentiles kept beside the files and
saved every 10 s in OUT/TARGET.run.json), check the trigger
rules, capture N steps when one fires, and at the end write OUT/index.html (each
target's summary, every trigger event with the value that fired it and its bundle,
and the step-time chart with the events marked).  Ends after --duration seconds, on
Ctrl-C, SIGTERM (kill, timeout) or SIGHUP (a dropped SSH connection), or when every
engine says goodbye; exit 0 and the report's path.

Triggers: {GRAMMAR}.  step_ms and gap_ms are checked on every step as it arrives;
the others on the figures of the last --window seconds, twice a second.  A rule that
fires during the cooldown, while a capture runs, or after --max-captures captures is
counted and not captured.  Captures are asked of the target whose figure fired
(--trigger-all: of every target) and land in the engine's snapshot folder."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="+", metavar="TARGET", help="tcp://HOST:PORT (probe) targets")
    p.add_argument(
        "--trigger",
        action="append",
        default=[],
        metavar="RULE",
        help="a rule, e.g. 'step_ms>150' (repeatable)",
    )
    p.add_argument(
        "--duration", type=float, default=None, metavar="S", help="seconds to run (default: until Ctrl-C)"
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="report and recordings folder (default: watch-<time>)"
    )
    p.add_argument(
        "--steps", type=int, default=8, metavar="N", help="steps per triggered capture (default 8)"
    )
    p.add_argument("--mode", choices=("ops", "full"), default="ops", help="capture mode (default ops)")
    p.add_argument(
        "--cooldown", type=float, default=30.0, metavar="S", help="seconds between captures (default 30)"
    )
    p.add_argument(
        "--max-captures", type=int, default=5, metavar="K", help="triggered captures at most (default 5)"
    )
    p.add_argument(
        "--window", type=float, default=10.0, metavar="S", help="window of the window rules (default 10)"
    )
    p.add_argument(
        "--trigger-all", action="store_true", help="a fire captures on every target, not only its own"
    )
    p.add_argument(
        "--max-recording-mb",
        type=float,
        default=256.0,
        metavar="MB",
        help="recording budget per target (default 256)",
    )
    p.add_argument(
        "--save-every",
        type=float,
        default=SAVE_EVERY_S,
        metavar="S",
        help=f"save each target's whole-run figures every S s, what a crash can lose "
        f"(default {SAVE_EVERY_S:g}; at least {SAVE_MIN_S:g})",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    add_target_options(p)


RING_STEPS = 65536
"""Steps the live model keeps (the window rules' figures): at 150 steps/s, 7 minutes.
The report's figures are the whole run's (``WholeRun``), whatever it keeps."""
PART_MIN_BYTES = 4 << 10
"""The smallest recording file: a budget under four of them keeps fewer, larger files."""
SAVE_EVERY_S = 10.0
"""How often each target's whole-run figures are persisted by default
(``OUT/<target>.run.json``, ``--save-every``): a crash loses at most this much of them."""
SAVE_MIN_S = 0.5
"""The shortest ``--save-every``: a save writes each target's sketches (a few kB)."""

MAX_EVENTS = 2000
"""Events kept per target for the report (every capture is kept; the oldest fires that
were not captured go first, counted)."""


@dataclass
class _Rotating:
    """Recording files of one target: a new file each ``part_bytes``, at most ``budget``."""

    folder: str
    stem: str
    target: str
    budget: int
    part_bytes: int
    files: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    writer: RecordingWriter | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    steps: dict[str, list[int]] = field(default_factory=dict)
    """Per file kept: [first step id, last step id, first step start, last step end, steps]."""
    _records: int = 0

    @property
    def records(self) -> int:
        """Records written into the files still kept and the removed ones."""
        return self._records

    def write(self, recs: list[Record]) -> None:
        """Append records, starting a new file (and removing the oldest) as needed."""
        self._records += len(recs)
        if self.writer is None or self.writer.bytes >= self.part_bytes:
            self._next()
        assert self.writer is not None
        self.writer.write(recs)
        path = self.writer.path
        self.sizes[path] = self.writer.bytes
        for r in recs:
            if isinstance(r, StepRecord):
                st = self.steps.get(path)
                if st is None:
                    self.steps[path] = [r.step_id, r.step_id, r.start_ns, r.end_ns, 1]
                else:
                    st[1], st[3], st[4] = r.step_id, r.end_ns, st[4] + 1

    def on_disk(self) -> dict[str, Any] | None:
        """The raw steps still on disk: step ids, probe times and count over the kept
        files (None: no step written)."""
        kept = [self.steps[f] for f in self.files if f in self.steps]
        if not kept:
            return None
        return {"files": len(self.files), "rotated_out": len(self.removed), "step_ids": [kept[0][0], kept[-1][1]],
                "span_ns": [kept[0][2], kept[-1][3]], "steps": sum(k[4] for k in kept)}  # fmt: skip

    def _next(self) -> None:
        if self.writer is not None:
            self.writer.close()
        path = os.path.join(self.folder, f"{self.stem}-{len(self.files) + len(self.removed):04d}.rltrec")
        self.writer = RecordingWriter(path, target=self.target)
        self.files.append(path)
        while (
            len(self.files) > 1
            and sum(self.sizes.get(f, 0) for f in self.files) + self.part_bytes > self.budget
        ):
            old = self.files.pop(0)
            os.remove(old)
            self.sizes.pop(old, None)
            self.steps.pop(old, None)
            self.removed.append(old)

    def flush(self) -> None:
        """Push the current file's buffered records to the OS."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Close the current file."""
        if self.writer is not None:
            self.writer.close()


class _Watched(LiveTarget):
    """A target driven by ``watch``: the live driver, its rotating recording and the
    events of its trigger rules."""

    def __init__(self, spec: TargetSpec, triggers: TriggerSet, rec: _Rotating) -> None:
        super().__init__(spec, new_stats(RING_STEPS), triggers)
        self.rec = rec
        self.start_recording(rec)
        self.run = WholeRun()
        """The whole run's figures (the ring and the files keep only its end)."""
        self.run_path = os.path.join(rec.folder, f"{rec.stem}.run.json")
        self.events: list[dict[str, Any]] = []
        self.dropped_events = 0
        """Fires not captured beyond ``MAX_EVENTS`` (counted, not kept: hours of a rule that
        keeps firing must not grow memory)."""

    def ingest(self, recs: list[Record], *, final: bool = False, check: bool = True) -> Ingested:
        """``LiveTarget.ingest``, and the batch into the whole run's figures."""
        out = super().ingest(recs, final=final, check=check)
        if recs:
            self.run.add(recs, self.stats.clock)
        return out

    def save_run(self) -> None:
        """Persist the whole run's figures (written aside, then renamed: never half a file;
        one that cannot be written, a full disk, is removed and raises ``RecordingError``,
        the file saved before it kept)."""
        tmp = self.run_path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"target": self.target, **self.run.to_json()}, f)
            os.replace(tmp, self.run_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise RecordingError(f"cannot write {self.run_path}: {exc.strerror}") from None

    def keep_event(self, event: dict[str, Any]) -> None:
        """Keep an event; of those not captured only the newest ``MAX_EVENTS``."""
        self.events.append(event)
        if len(self.events) > MAX_EVENTS:
            for i, e in enumerate(self.events):
                if e["result"] == "not captured":
                    del self.events[i]
                    self.dropped_events += 1
                    break


def run(args: argparse.Namespace) -> int:
    if not args.trigger:
        print("rltperf watch: error: give at least one --trigger RULE (e.g. 'step_ms>150')", file=sys.stderr)
        return 2
    try:
        TriggerSet.parse(args.trigger)
    except RuleError as exc:
        print(f"rltperf watch: error: {exc}", file=sys.stderr)
        return 2
    for flag, v, lo in (("--steps", args.steps, 1), ("--max-captures", args.max_captures, 0)):
        if v < lo:
            print(f"rltperf watch: error: {flag} must be at least {lo}", file=sys.stderr)
            return 2
    if args.duration is not None and args.duration <= 0:
        print("rltperf watch: error: --duration must be positive", file=sys.stderr)
        return 2
    if not args.save_every >= SAVE_MIN_S:  # (a NaN too)
        print(f"rltperf watch: error: --save-every must be at least {SAVE_MIN_S:g} s", file=sys.stderr)
        return 2
    out = args.out or time.strftime("watch-%Y%m%dT%H%M%S")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        print(f"rltperf watch: error: cannot create {out}: {exc.strerror}", file=sys.stderr)
        return 1
    budget = int(args.max_recording_mb * 2**20)
    watched: list[_Watched] = []
    try:
        for t in args.targets:
            adapter, session = open_session(t, **target_options(args, reconnect=False))
            rules = TriggerSet.parse(args.trigger, cooldown_s=args.cooldown, max_captures=args.max_captures)
            rec = _Rotating(out, _safe(t), t, budget, max(PART_MIN_BYTES, budget // 4))
            watched.append(_Watched(TargetSpec(t, session=session, adapter=adapter), rules, rec))
    except (AdapterError, RecordingError) as exc:
        for w in watched:
            w.stop_recording()
            if w.session is not None:
                w.session.close()
        print(f"rltperf watch: error: {exc}", file=sys.stderr)
        return 1
    with on_stop_signals(raise_interrupt) as signals:  # kill, timeout or a hang-up: as Ctrl-C
        prog = Progress(not args.quiet)
        t0 = time.monotonic()
        limit = args.duration if args.duration is not None else float("inf")
        next_window = t0 + 0.5
        next_show = t0 + 1.0
        next_save = t0 + args.save_every
        stopped = ""
        failure: RecordingError | None = None
        try:
            while time.monotonic() - t0 < limit and not all(w.ended for w in watched):
                per = max(0.01, 0.2 / len(watched))
                for w in watched:
                    if not w.ended:
                        _act(w, _poll(w, per), watched, args)
                now = time.monotonic()
                if now >= next_window:
                    next_window = now + 0.5
                    for w in watched:
                        if not w.ended and w.stats.steps.n:
                            _act(
                                w, Ingested(fires=w.check_window(w.stats.window(args.window))), watched, args
                            )
                if now >= next_save:
                    next_save = now + args.save_every
                    for w in watched:
                        w.save_run()
                if now >= next_show:
                    next_show = now + 1.0
                    fired = sum(len(w.triggers.fires) for w in watched if w.triggers is not None)
                    caps = sum(w.triggers.captures for w in watched if w.triggers is not None)
                    prog.show(
                        f"watching {len(watched)} target(s): {now - t0:5.0f} s, {fired} fires, {caps} captures",
                        key=str(int((now - t0) // 30)),
                    )
            # captures still exporting: give them a bounded moment to land
            deadline = time.monotonic() + 60
            while any(w.triggered for w in watched if not w.ended) and time.monotonic() < deadline:
                for w in watched:
                    if w.triggered and not w.ended:
                        _act(w, _poll(w, 0.2, check=False), watched, args)
        except KeyboardInterrupt:
            stopped = "interrupted"
        except RecordingError as exc:  # a full disk: stop, keep what is written, say so
            failure = exc
            stopped = f"stopped: {exc}"
        finally:
            signals.closing()
            for w in watched:
                w.stop_recording()
                if w.session is not None:
                    w.session.close()
                with contextlib.suppress(RecordingError):  # the loop's error says it first
                    w.save_run()
            prog.done()
        before = set(os.listdir(out))
        try:
            report = write_report(out, watched, args, time.monotonic() - t0, stopped)
        except OSError as exc:
            for name in set(os.listdir(out)) - before:  # the report's files, half written
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(out, name))
            if failure is None:
                failure = RecordingError(f"cannot write the report in {out}: {exc.strerror}")
            saved = sorted(os.path.join(out, n) for n in before if n.endswith(".run.json"))
            kept = (
                f"the whole run's figures as last saved: {', '.join(saved)}"
                if saved
                else "no .run.json saved yet"
            )
            print(
                f"rltperf watch: error: {failure}; no report either ({exc.strerror}); {kept}", file=sys.stderr
            )
            return 1
        if failure is not None:
            print(
                f"rltperf watch: error: {failure}; the report of the run until then: {report}",
                file=sys.stderr,
            )
            return 1
        print(report)
        return 0


def _poll(w: _Watched, timeout: float, check: bool = True) -> Ingested:
    """Read and ingest one batch of ``w``; a recording that failed stops the watch."""
    got = w.poll(timeout, check=check)
    if w.recording_error is not None:
        raise RecordingError(w.recording_error)
    return got


def _act(w: _Watched, got: Ingested, watched: list[_Watched], args: argparse.Namespace) -> None:
    """Note how triggered captures ended, and capture for each fire that may."""
    for o in got.outcomes:
        w.keep_event(o.as_dict())
    for f in got.fires:
        if not f.captured:
            w.keep_event({**f.as_dict(), "result": "not captured", "reason": f.why_not})
            continue
        for x in capture_targets(w, watched, args.trigger_all):
            try:
                x.request_capture(args.steps, args.mode, f)
            except AdapterError as exc:
                x.keep_event({**f.as_dict(), "result": "failed", "reason": str(exc)})
