"""``rltperf capture TARGET --steps N --mode ops|full``: one bounded profiler capture."""

from __future__ import annotations

import argparse
import json
import sys
import time

from engine_adapters.definitions.records import (
    MAX_CAPTURE_STEPS,
    CaptureDone,
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    Refused,
    SessionEvent,
)
from rltperf_tui.commands.common import Progress, add_target_options, open_session, target_options

HELP = "run one bounded profiler capture inside the engine and wait for its bundle"
DESCRIPTION = f"""\
Ask the engine to profile exactly N (1 to {MAX_CAPTURE_STEPS}) complete steps (from its next step boundary) and
wait until the bundle (trace.json.gz, meta.json, ops.txt, steps.jsonl) is saved.
Prints the bundle path (with --json: bundle, steps_requested, steps_captured,
trace_bytes, events, export_s).  Exits non-zero with the reason on failure.

ops  = CPU + device activities only (operators, launches, copies, syncs, timeline)
full = also record_shapes, profile_memory and with_stack (shapes, allocations, stacks)
Start small (one representative step or speculative round); profiled timings are not
a baseline.

vLLM: on a server with the rltperf plugin (RLTPERF_PROBE set; same host for a
vllm+http:// target, whose plugin announces its probe), rltperf's own capture runs in
vLLM's workers: no --profiler-config, no restart (?engine=N: one data-parallel
engine).  Otherwise, or for a target summing several engines, or with
RLTPERF_VLLM_CAPTURE=vllm, vllm+http:// captures use vLLM's own profiler (the server
needs --profiler-config, and stops at the window's end).

Progress goes to stderr: rewritten in place on a terminal, one line per state change
(armed, capturing, exporting) otherwise.  A window whose engine stops stepping ends
after the engine's idle timeout with a partial bundle (said on stderr; exit status 0,
"complete": false with --json)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="tcp://HOST:PORT or vllm+http://HOST:PORT")
    p.add_argument(
        "--steps",
        type=int,
        default=8,
        metavar="N",
        help=f"complete steps to capture, 1 to {MAX_CAPTURE_STEPS} (default 8)",
    )
    p.add_argument("--mode", choices=("ops", "full"), default="ops", help="ops (default) or full")
    p.add_argument("--label", default=None, help="label added to the bundle folder name")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds (default 300)"
    )
    add_target_options(p)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.steps <= MAX_CAPTURE_STEPS:
        print(
            f"rltperf capture: error: --steps {args.steps} out of range: 1 to {MAX_CAPTURE_STEPS}",
            file=sys.stderr,
        )
        return 2
    _, session = open_session(args.target, **target_options(args, reconnect=False))
    prog = Progress(sys.stderr.isatty() or not args.json)
    try:
        cid = session.request_capture(args.steps, args.mode, args.label)
        # Nothing is printed before the engine answers: it acknowledges with progress 0/N
        # (armed) or refuses.
        deadline = time.monotonic() + args.timeout
        exporting_since: float | None = None
        while time.monotonic() < deadline:
            for r in session.read(0.2):
                if getattr(r, "capture_id", None) not in (cid, None):
                    continue
                if isinstance(r, CaptureStarted):
                    prog.show(
                        f"capture {cid}: capturing from step {r.first_step}"
                        + (" (cold profiler)" if r.cold else "")
                    )
                elif isinstance(r, CaptureProgress) and r.steps_done == 0:
                    prog.show(f"capture {cid}: armed, waiting for the next step boundary")
                elif isinstance(r, CaptureProgress):
                    # one line for the whole window without a terminal, a live count with one
                    prog.show(f"capture {cid}: capturing {r.steps_done}/{r.steps} steps", key="capturing")
                elif isinstance(r, CaptureExporting):
                    exporting_since = time.monotonic()
                elif isinstance(r, CaptureDone):
                    prog.done()
                    if args.json:
                        print(
                            json.dumps(
                                {
                                    "bundle": r.bundle,
                                    "steps_requested": r.steps_requested,
                                    "steps_captured": r.steps_captured,
                                    "trace_bytes": r.trace_bytes,
                                    "events": r.events,
                                    "export_s": r.export_s,
                                    "mode": r.mode,
                                    "complete": r.note is None and r.steps_captured == r.steps_requested,
                                    "note": r.note,
                                    "via": r.via,
                                },
                                indent=2,
                            )
                        )
                    else:
                        print(r.bundle)
                        print(
                            f"  {r.steps_captured}/{r.steps_requested} steps, {r.mode}, "
                            f"{r.trace_bytes / 1024:.0f} KiB trace, {r.events} events, export {r.export_s:.2f} s",
                            file=sys.stderr,
                        )
                    if r.via:
                        print(f"  via {r.via}", file=sys.stderr)
                    if r.note:
                        print(f"  partial: {r.note}", file=sys.stderr)
                    return 0
                elif isinstance(r, (CaptureFailed, Refused)):
                    prog.done()
                    kept = getattr(r, "bundle", None)
                    where = f" (error kept in {kept}/meta.json)" if kept else ""
                    print(f"rltperf capture: failed: {r.reason}{where}", file=sys.stderr)
                    if args.json:
                        print(json.dumps({"error": r.reason, "bundle": kept}))
                    return 1
                elif isinstance(r, SessionEvent) and r.state in ("ended", "reconnecting"):
                    prog.done()
                    print(f"rltperf capture: the engine went away: {r.detail}", file=sys.stderr)
                    return 1
            if exporting_since is not None:
                prog.show(
                    f"capture {cid}: exporting ({time.monotonic() - exporting_since:.1f} s)", key="exporting"
                )
        prog.done()
        print(
            f"rltperf capture: no result within {args.timeout:g} s (is the engine stepping?)", file=sys.stderr
        )
        return 1
    finally:
        session.close()
