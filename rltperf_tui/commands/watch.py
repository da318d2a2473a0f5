"""``rltperf watch TARGET… --trigger RULE``: a headless flight recorder for load tests.

Records the unprofiled stream of every target (rotating files, bounded disk), checks
the trigger rules (``rltperf_tui.live.triggers``) as records arrive, asks the engine for a
capture when one fires (cooldown, maximum, the engine's snapshot budget respected),
and at the end (``--duration``, Ctrl-C, or every engine's goodbye) writes
``OUT/index.html``: each target's summary, every trigger event with its figures and
bundle, and the step-time chart with the events marked.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from engine_adapters.definitions.records import Record
from engine_adapters.monitor.base import AdapterError
from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from rltperf_tui.commands.common import Progress, add_target_options, open_session, target_options
from rltperf_tui.live.driver import Ingested, LiveTarget, TargetSpec, capture_targets, new_stats
from rltperf_tui.live.triggers import GRAMMAR, RuleError, TriggerSet

HELP = "headless flight recorder: record every target, capture when a trigger rule fires, write a report"
EXIT_WITHOUT_TEARDOWN = True
"""Done, the process ends at once (``cli._exit_now``): no interpreter teardown to wait for."""
DESCRIPTION = f"""\
Run without a screen (load tests, CI): record each target's unprofiled stream into
OUT (rotating .rltrec files, at most --max-recording-mb per target: the oldest file is
removed when a new one would pass it, and the report says so), check the trigger
rules, capture N steps when one fires, and at the end write OUT/index.html (each
target's summary, every trigger event with the value that fired it and its bundle,
and the step-time chart with the events marked).  Ends after --duration seconds, on
Ctrl-C, or when every engine says goodbye; exit 0 and the report's path.

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
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    add_target_options(p)


MAX_EVENTS = 2000
"""Events kept per target for the report (every capture is kept; the oldest fires that
were not captured go first, counted)."""


def _safe(target: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", target.split("://", 1)[-1]).strip("_") or "target"


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
        self.sizes[self.writer.path] = self.writer.bytes

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
        super().__init__(spec, new_stats(65536), triggers)
        self.rec = rec
        self.start_recording(rec)
        self.events: list[dict[str, Any]] = []
        self.dropped_events = 0
        """Fires not captured beyond ``MAX_EVENTS`` (counted, not kept: hours of a rule that
        keeps firing must not grow memory)."""

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
            rec = _Rotating(out, _safe(t), t, budget, max(1 << 20, budget // 4))
            watched.append(_Watched(TargetSpec(t, session=session, adapter=adapter), rules, rec))
    except (AdapterError, RecordingError) as exc:
        for w in watched:
            w.stop_recording()
            if w.session is not None:
                w.session.close()
        print(f"rltperf watch: error: {exc}", file=sys.stderr)
        return 1
    prog = Progress(not args.quiet)
    t0 = time.monotonic()
    limit = args.duration if args.duration is not None else float("inf")
    next_window = t0 + 0.5
    next_show = t0 + 1.0
    interrupted = False
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
                        _act(w, Ingested(fires=w.check_window(w.stats.window(args.window))), watched, args)
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
        interrupted = True
    finally:
        for w in watched:
            w.stop_recording()
            if w.session is not None:
                w.session.close()
        prog.done()
    report = write_report(out, watched, args, time.monotonic() - t0, interrupted)
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


def write_report(
    out: str, watched: list[_Watched], args: argparse.Namespace, elapsed: float, interrupted: bool
) -> str:
    """Write OUT/index.html (and events.json, steps.png); return the index path."""
    from rltperf_tui.analysis.summary import summarize

    sections = []
    all_events = []
    for w in watched:
        summ = summarize(w.stats)
        events = sorted(w.events, key=lambda e: e["ts_ns"])
        all_events.append({"target": w.target, "summary": summ, "events": events,
                           "recordings": w.rec.files, "rotated_out": w.rec.removed})  # fmt: skip
        png = os.path.join(out, f"steps-{_safe(w.target)}.png")
        chart = _chart(w, events, png)
        rows = "".join(
            "<tr><td>{t:.1f} s</td><td>{rule}</td><td>{v:.4g}</td><td>{step}</td><td>{res}</td><td>{detail}</td></tr>".format(
                t=(e["ts_ns"] - (w.stats.first_ns or e["ts_ns"])) / 1e9,
                rule=html.escape(e["rule"]),
                v=e["value"],
                step=e["step_id"] if e["step_id"] is not None else "window",
                res=html.escape(e["result"]),
                detail=html.escape(str(e.get("bundle") or e.get("reason") or "")),
            )
            for e in events
        )
        fig = summ
        sections.append(
            f"<h2>{html.escape(w.target)}</h2>"
            f"<p>{html.escape(w.triggers.status() if w.triggers else '')}"
            f"{' · ended: ' + html.escape(w.end_reason) if w.ended else ''}</p>"
            f"<table><tr><th>steps</th><th>wall s</th><th>step P50/P99 ms</th><th>idle</th><th>MBU</th><th>tokens/s</th></tr>"
            f"<tr><td>{fig['steps']}</td><td>{fig['wall_s']:.1f}</td>"
            f"<td>{_n(fig['step_ms']['p50'])} / {_n(fig['step_ms']['p99'])}</td>"
            f"<td>{_p(fig['idle_fraction'])}</td><td>{_p(fig['mbu'])}</td><td>{_n(fig['tokens_per_s'])}</td></tr></table>"
            + (
                f'<p><img src="{os.path.basename(chart)}" alt="step time with trigger events"></p>'
                if chart
                else ""
            )
            + "<h3>Trigger events</h3>"
            + (
                f"<p>{w.dropped_events} older fires that were not captured are counted, not listed.</p>"
                if w.dropped_events
                else ""
            )
            + (
                f"<table><tr><th>at</th><th>rule</th><th>value</th><th>step</th><th>result</th><th>bundle / reason</th></tr>{rows}</table>"
                if events
                else "<p>No rule fired.</p>"
            )
            + "<p>Recordings: "
            + ", ".join(html.escape(os.path.basename(f)) for f in w.rec.files)
            + (
                f" ({len(w.rec.removed)} older files rotated out to stay within the budget)"
                if w.rec.removed
                else ""
            )
            + "</p>"
        )
    with open(os.path.join(out, "events.json"), "w") as f:
        json.dump(all_events, f, indent=1, default=str)
    page = (
        "<!doctype html><meta charset=utf-8><title>rltperf watch</title>"
        "<style>body{font-family:sans-serif;max-width:70em;margin:auto}td,th{padding:2px 8px;text-align:left}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f2f2f2}</style>"
        f"<h1>rltperf watch</h1><p>{elapsed:.0f} s{' (interrupted)' if interrupted else ''}; "
        f"triggers {html.escape(', '.join(args.trigger))}; captures of {args.steps} steps ({args.mode}), "
        f"cooldown {args.cooldown:g} s, at most {args.max_captures}. Figures over each target's whole recording "
        "(wall time; profiled steps left out); percentiles of pooled samples.</p>" + "".join(sections)
    )
    path = os.path.join(out, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def _n(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _p(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _chart(w: _Watched, events: list[dict[str, Any]], path: str) -> str | None:
    """Step time over the run with the trigger events marked; None without steps or
    matplotlib (the report says the rest)."""
    st = w.stats
    if not st.steps.n:
        return None
    try:
        from rltperf_tui.analysis.plots import _plt, _save

        plt = _plt()
    except Exception:
        return None
    start = st.steps.last("start")
    end = st.steps.last("end")
    t0 = st.first_ns or int(start[0])
    x = (end - t0) / 1e9
    y = (end - start) / 1e6
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(x, y, ".", ms=2, color="#4C72B0", label="step time (ms)")
    for e in events:
        c = "#C44E52" if e["result"] == "saved" else "#999999"
        ax.axvline((e["ts_ns"] - t0) / 1e9, color=c, lw=1, alpha=0.8)
    ax.set_xlabel("seconds since the first record (red: triggered capture, grey: fire not captured)")
    ax.set_ylabel("ms (log)")
    ax.set_yscale("log")
    ax.set_title(f"{w.target}: step time (unprofiled and profiled steps), trigger events marked")
    return str(_save(fig, path))
