"""``--jsonl``: the options and the run of the screenless monitor (``rltperf_tui.commands.headless``),
shared by ``rltperf attach`` and ``rltperf record``."""

from __future__ import annotations

import argparse
import sys

JSONL_HELP = """\
--jsonl: no screen.  One JSON object per target per refresh (--refresh, default 2 Hz)
on stdout, one a line, each flushed: the keys of `rltperf summary --json` over the
last --window seconds (default 10), plus target, timestamp (UTC, ISO 8601), state
(connected / reconnecting / ended) and, on a target's last object, reason.  Ends
after --duration seconds (exit 0), when the reader closes the pipe (`| head -3`:
exit 0), on Ctrl-C, SIGTERM or SIGHUP (a last object per target, reason "interrupted", exit
0), or when every target has gone away (engine stopped, server lost: a last object
each with the reason, exit 1; with --wait a lost target is retried instead; a
recording's end is exit 0)."""


def add_jsonl_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scripts (no screen)")
    g.add_argument("--jsonl", action="store_true",
                   help="no screen: one JSON object (summary --json's keys) per target per refresh on "
                        "stdout; see the description for how it ends")  # fmt: skip
    g.add_argument("--duration", type=float, default=None, metavar="S",
                   help="with --jsonl: stop after S seconds (default: until Ctrl-C)")  # fmt: skip


def check_jsonl_options(args: argparse.Namespace) -> str | None:
    """A sentence about a bad combination of the --jsonl options, or None."""
    if args.duration is not None and not args.jsonl:
        return "--duration goes with --jsonl (the screen runs until q)"
    if args.duration is not None and args.duration <= 0:
        return "--duration must be positive"
    if args.jsonl and getattr(args, "trigger", None):
        return "--trigger needs the screen; `rltperf watch` is the screenless flight recorder"
    return None


def run_jsonl(found: list[tuple[str, str]], args: argparse.Namespace, prog: str) -> int:
    """Open every target and stream JSON lines to stdout; returns the exit status."""
    from rltperf_tui.commands.common import open_targets, target_options
    from rltperf_tui.commands.headless import LineWriter, Stream
    from rltperf_tui.live.driver import LiveTarget, new_stats, peak_override

    opts = target_options(args)
    if not args.wait:
        opts["reconnect"] = False  # a target that goes away ends its stream, with the reason
    specs = open_targets([t for t, _ in found], opts, args.wait, prog)
    if specs is None:
        return 1
    override = peak_override(args.peak_gbps, args.peak_gflops)
    targets = []
    for s in specs:
        t = LiveTarget(s, new_stats(args.history, override))
        t.connect(opts, wait=True)  # --wait: a session that connects, and retries, in its own thread
        targets.append(t)
    stream = Stream(
        targets,
        LineWriter(sys.stdout),
        window_s=args.window,
        refresh_hz=args.refresh,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
    )
    try:
        rc = stream.run(args.duration)
    finally:
        stream.close()
    if not any(s.adapter is not None and s.adapter.IS_LIVE for s in specs):
        return 0  # recordings only: their end is the end, not a target gone away
    return rc
