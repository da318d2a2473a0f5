"""``rltperf replay FILE``: the live screen over a recording, with play/pause and speed."""

from __future__ import annotations

import argparse
import os
import sys

from rltperf_tui.commands.attach import add_monitor_options, check_monitor_options, run_monitor

HELP = "the live screen over a recording (play/pause, speed)"
EXIT_WITHOUT_TEARDOWN = True
"""Done, the process ends at once (``cli._exit_now``): no interpreter teardown to wait for."""
DESCRIPTION = """\
Play one or more recordings (`rltperf record`, or `r` in the monitor) through the same
screen as a live target.  "Last 10 s" is data time, so the figures are the ones the
live screen showed.  Keys: p play/pause, + / - double / halve the speed, space
freeze the display, ? help, q quit.  --speed 0 reads as fast as it can (the screen
then shows the end of the recording).  A damaged file plays around the damage: what
was skipped, with byte offsets, is printed first (exit status 1 when nothing in a file
is readable)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="recording(s) (.rltrec)")
    p.add_argument(
        "--speed", type=float, default=1.0, help="playback speed (1 = real time, 0 = as fast as read)"
    )
    p.add_argument("--loop", action="store_true", help="start again at the end")
    add_monitor_options(p)


def run(args: argparse.Namespace) -> int:
    bad = check_monitor_options(args, "replay")
    if bad is None and args.speed < 0:
        bad = "--speed must be 0 (as fast as read) or positive"
    if bad:
        print(f"rltperf replay: error: {bad}", file=sys.stderr)
        return 2
    from engine_adapters.monitor.base import AdapterError
    from engine_adapters.monitor.replay import ReplayAdapter
    from rltperf_tui.commands.common import check_recording
    from rltperf_tui.live.driver import TargetSpec

    specs = []
    for f in args.files:
        if not os.path.isfile(f):
            print(f"rltperf replay: error: {f}: no such file", file=sys.stderr)
            return 1
        # Read it through once first: damage is reported here, on the terminal the
        # screen returns to, and a file with nothing readable never opens an empty screen.
        rc = check_recording(f, "replay")
        if rc is not None:
            return rc
        adapter = ReplayAdapter(f, speed=args.speed, loop=args.loop)
        try:
            session = adapter.connect()
        except AdapterError as exc:
            print(f"rltperf replay: error: {exc}", file=sys.stderr)
            return 1
        specs.append(TargetSpec(target=f, adapter=adapter, session=session))
    return run_monitor(specs, args)
