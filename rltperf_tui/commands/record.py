"""``rltperf record TARGET [--duration S] -o FILE``: save a live stream to a recording."""

from __future__ import annotations

import argparse
import sys
import time

from engine_adapters.definitions.records import SessionEvent, StepRecord
from engine_adapters.monitor.recording import RecordingWriter
from rltperf_tui.commands.common import Progress, add_target_options, open_session, target_options

HELP = "record a target's live stream to a .rltrec file (unprofiled baseline)"
DESCRIPTION = """\
Record the records a target streams (steps, requests, device samples) into a
recording file, for --duration seconds or until Ctrl-C.  Recordings are the unprofiled baselines that
`rltperf summary`, `rltperf compare` and `rltperf replay` read.  An existing file is
never overwritten.  If the engine goes away, what was recorded is kept."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="tcp://HOST:PORT, vllm+http://HOST:PORT")
    p.add_argument(
        "--duration", type=float, default=None, metavar="S", help="seconds to record (default: until Ctrl-C)"
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="recording file to create (.rltrec)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    add_target_options(p)


def run(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        print("rltperf record: error: --duration must be positive", file=sys.stderr)
        return 2
    _, session = open_session(args.target, **target_options(args, reconnect=False))
    prog = Progress(not args.quiet)
    writer = RecordingWriter(args.output, target=args.target)
    steps = 0
    ended = ""
    t0 = time.monotonic()
    next_flush = t0 + 1.0
    limit = args.duration if args.duration is not None else float("inf")
    of = f"/{args.duration:g} s" if args.duration is not None else " s (Ctrl-C stops)"
    try:
        while True:
            now = time.monotonic()
            if now - t0 >= limit:
                break
            recs = session.read(min(0.2, limit - (now - t0)))
            writer.write(recs)
            for r in recs:
                if isinstance(r, StepRecord):
                    steps += 1
                elif isinstance(r, SessionEvent) and r.state in ("ended", "reconnecting"):
                    ended = r.detail
            if ended:
                break
            if now >= next_flush:
                writer.flush()
                next_flush = now + 1.0
                prog.show(
                    f"recording {args.target}: {now - t0:5.1f}{of}, {steps} steps",
                    key=str(int((now - t0) // 10)),  # without a terminal: a line every 10 s
                )
    except KeyboardInterrupt:
        ended = "interrupted" if args.duration is not None else ""
    finally:
        writer.close()
        session.close()
        prog.done()
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
