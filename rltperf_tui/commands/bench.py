"""``rltperf bench NAME``: measured figures for the probe, ingest, engine and captures."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

HELP = "benchmarks: probe cost, monitor ingest, engine MBU, capture cost"
DESCRIPTION = """\
Benchmarks print the figures the targets are stated in; compare ratios from one run
(these machines are shared and noisy).

  probe    cost of the probe on the engine thread per four-stage step, and steps/s
           of a small torch loop with probe + live subscriber vs probe off
  ingest   records decoded and aggregated per second; monitor CPU at 1000 steps/s
  engine   reference engine decode MBU against this machine's copy bandwidth
  capture  keypress-to-first-captured-step, capture slow-down, export cost per mode
  exporting  steps during a bundle's export vs uncaptured ones (the window's rule)
  loops    vLLM Ouro model: step time with per-loop timing on vs off, interleaved
  peers    monitor CPU and RSS beside vllm-htop's on one vLLM server, side by side in tmux"""

BENCHES: dict[str, str] = {
    "probe": "rltperf_tui.bench.probe",
    "ingest": "rltperf_tui.bench.ingest",
    "engine": "rltperf_tui.bench.engine",
    "capture": "rltperf_tui.bench.capture",
    "exporting": "rltperf_tui.bench.exporting",
    "loops": "rltperf_tui.bench.loops",
    "peers": "rltperf_tui.bench.peers",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="NAME")
    for name, modname in BENCHES.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:
                continue
            raise
        bp = sub.add_parser(
            name,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        bp.add_argument("--json", action="store_true", help="print the figures as JSON")
        mod.add_arguments(bp)
        bp.set_defaults(_bench=mod)


def run(args: argparse.Namespace) -> int:
    mod = getattr(args, "_bench", None)
    if mod is None:
        print("rltperf bench: name a benchmark: " + ", ".join(BENCHES), file=sys.stderr)
        return 2
    result: dict[str, Any] = mod.run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        mod.print_text(result)
    return 0 if result.get("ok", True) else 1
