"""``rltperf record TARGET [--duration S] -o FILE``: save a live stream to a recording."""

from __future__ import annotations

import argparse
import sys
import time

from engine_adapters.monitor.recording import RecordingError, RecordingWriter
from rltperf_tui.commands.auto_targets import DEFAULT_HELP, discover, expand
from rltperf_tui.commands.common import Progress, add_target_options, open_session, target_options
from rltperf_tui.commands.stop_signals import on_stop_signals, raise_interrupt
from rltperf_tui.live.driver import LiveTarget, TargetSpec, new_stats

HELP = "record a target's live stream to a .rltrec file (unprofiled baseline)"
DESCRIPTION = """\
Record the records a target streams (steps, requests, device samples) into a
recording file, for --duration seconds or until Ctrl-C (or SIGTERM, SIGHUP).  Recordings are the unprofiled baselines that
`rltperf summary`, `rltperf compare` and `rltperf replay` read.  An existing file is
never overwritten.  If the engine goes away, what was recorded is kept.

--jsonl FILE (- for stdout): also (or, without -o, only) write one JSON object per
refresh (--refresh, default 2 Hz) to FILE, one a line, each flushed: the keys of
`rltperf summary --json` over the last --window seconds (default 10), plus target,
timestamp, state and, on the last object, reason (see `rltperf attach --help`).
Exit status: 0 after --duration, Ctrl-C (SIGTERM, SIGHUP) or a closed pipe; 1 when the engine went
away (what was recorded is kept; the last object says why)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="tcp://HOST:PORT, vllm+http://HOST:PORT")
    p.add_argument("--auto", default=None, nargs="?", const="", metavar="[HOST:]PORT-PORT",
                   help="instead of TARGET: the one vLLM server or rltperf probe on these ports "
                        f"({DEFAULT_HELP}; several found: they are listed, exit 2)")  # fmt: skip
    p.add_argument(
        "--duration", type=float, default=None, metavar="S", help="seconds to record (default: until Ctrl-C)"
    )
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="recording file to create (.rltrec); required unless --jsonl is given")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    p.add_argument("--jsonl", default=None, metavar="FILE",
                   help="also write one JSON object (summary --json's keys) per refresh to FILE (- : stdout)")  # fmt: skip
    p.add_argument("--window", type=float, default=10.0, metavar="S",
                   help="with --jsonl: statistics window, seconds (default 10)")  # fmt: skip
    p.add_argument("--refresh", type=float, default=2.0, metavar="HZ",
                   help="with --jsonl: objects per second (default 2)")  # fmt: skip
    add_target_options(p)


def run(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        print("rltperf record: error: --duration must be positive", file=sys.stderr)
        return 2
    if args.output is None and args.jsonl is None:
        print("rltperf record: error: give -o FILE (a recording) and/or --jsonl FILE|-", file=sys.stderr)
        return 2
    bad = _resolve_target(args)
    if bad is not None:
        return bad
    if args.jsonl is not None:
        return _run_jsonl(args)
    adapter, session = open_session(args.target, **target_options(args, reconnect=False))
    prog = Progress(not args.quiet)
    writer = RecordingWriter(args.output, target=args.target)
    t = LiveTarget(TargetSpec(args.target, session=session, adapter=adapter), new_stats())
    t.start_recording(writer, args.output)
    ended = ""
    with on_stop_signals(raise_interrupt) as signals:  # kill, timeout or a hang-up: as Ctrl-C
        t0 = time.monotonic()
        next_show = t0 + 1.0
        limit = args.duration if args.duration is not None else float("inf")
        of = f"/{args.duration:g} s" if args.duration is not None else " s (Ctrl-C stops)"
        try:
            while True:
                now = time.monotonic()
                if now - t0 >= limit:
                    break
                t.poll(min(0.2, limit - (now - t0)), check=False)
                if t.recording_error is not None:
                    raise RecordingError(t.recording_error)
                if t.ended:
                    ended = t.end_reason
                    break
                if now >= next_show:
                    next_show = now + 1.0
                    prog.show(
                        f"recording {args.target}: {now - t0:5.1f}{of}, {t.stats.steps.n} steps",
                        key=str(int((now - t0) // 10)),  # without a terminal: a line every 10 s
                    )
        except KeyboardInterrupt:
            ended = "interrupted" if args.duration is not None else ""
        finally:
            signals.closing()
            t.stop_recording()
            session.close()
            prog.done()
        steps = t.stats.steps.n
        elapsed = time.monotonic() - t0
        print(
            f"wrote {args.output}: {writer.records} records ({steps} steps) over {elapsed:.1f} s, {writer.bytes} bytes"
        )
        if ended:
            print(
                f"rltperf record: stopped early after {elapsed:.1f} s: {ended}; kept what was recorded",
                file=sys.stderr,
            )
            return 1
        return 0


def _resolve_target(args: argparse.Namespace) -> int | None:
    """``args.target`` from TARGET or ``--auto`` (exactly one found); the exit status on failure."""
    if (args.target is None) == (args.auto is None):
        print("rltperf record: error: give one TARGET or --auto [HOST:]PORT-PORT", file=sys.stderr)
        return 2
    if args.auto is None:
        return None
    found = discover(expand([args.auto]), args.token, "record")
    if isinstance(found, int):
        return found
    if len(found) > 1:
        print(f"rltperf record: error: --auto found {len(found)} targets; record one: name it as TARGET "
              "(or record each in its own command)", file=sys.stderr)  # fmt: skip
        return 2
    args.target = found[0].target
    return None


def _run_jsonl(args: argparse.Namespace) -> int:
    """``--jsonl``: the screenless stream (``rltperf_tui.commands.headless``), recording beside it
    when ``-o`` is given."""
    from rltperf_tui.commands.headless import LineWriter, Stream

    if args.window <= 0 or not 0 < args.refresh <= 30:
        print(
            "rltperf record: error: --window must be positive, --refresh between 0 and 30 Hz", file=sys.stderr
        )
        return 2
    adapter, session = open_session(args.target, **target_options(args, reconnect=False))
    t = LiveTarget(TargetSpec(args.target, session=session, adapter=adapter), new_stats())
    writer = RecordingWriter(args.output, target=args.target) if args.output else None
    if writer is not None:
        t.start_recording(writer, args.output)
    out = sys.stdout if args.jsonl == "-" else open(args.jsonl, "x", encoding="utf-8")  # noqa: SIM115
    stream = Stream([t], LineWriter(out), window_s=args.window, refresh_hz=args.refresh)
    t0 = time.monotonic()
    try:
        rc = stream.run(args.duration)
    finally:
        stream.close()
        if out is not sys.stdout:
            out.close()
    elapsed = time.monotonic() - t0
    if writer is not None:
        print(f"wrote {args.output}: {writer.records} records ({t.stats.steps.n} steps) over {elapsed:.1f} s, "
              f"{writer.bytes} bytes", file=sys.stderr)  # fmt: skip
    if rc:
        print(
            f"rltperf record: stopped early after {elapsed:.1f} s: {t.end_reason}",
            file=sys.stderr,
        )
    return rc
