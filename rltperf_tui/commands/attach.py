"""``rltperf attach TARGET [TARGET ...]``: the live monitor."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rltperf_tui.commands.common import add_target_options, open_targets, target_options
from rltperf_tui.commands.jsonl import JSONL_HELP
from rltperf_tui.commands.stop_signals import TUI_STOP_SIGNALS, on_stop_signals, quit_on_signal

HELP = "the live monitor: attach to running engines (tcp://, vllm+http://) or recordings"
EXIT_WITHOUT_TEARDOWN = True
"""Done, the process ends at once (``cli._exit_now``): no interpreter teardown to wait for."""
DESCRIPTION = (
    """\
Open the live monitor on one or more targets, one column each, side by side (a
prefill and a decode instance, several ranks):

  tcp://HOST:PORT        an engine with the rltperf probe (reference engine, vLLM plugin, yours)
  vllm+http://HOST:PORT  a vLLM server (its /metrics and profiler endpoints)
  FILE.rltrec            a recording (same screen; see also `rltperf replay`)

Panels: step time by stage, latency percentiles (of pooled samples), device idle
fraction and idle gaps, bandwidth utilisation against the roofline, loop depths and
speculation, queue and KV, captures.  Keys: c / f capture ops-only / full on every
target, [ ] halve / double the capture length N, space pause the display, r record
the streams, ? explain every number, q quit (kill PID or a hang-up quits the same way:
recordings closed whole, the terminal given back; exit 128 + the signal).

A target that cannot be reached is reported and the command exits, unless --wait is
given: then its column shows "waiting" and it is retried until it answers.  A target
that goes away later shows "reconnecting" and resumes by itself.

--auto [HOST:]PORT-PORT finds the targets on a port range (vLLM servers by their
vllm:* metrics, rltperf probes by their hello), says on stderr what each open port
is, and attaches to every target found (with --list: prints them and exits); none
found: exit 2, saying what was scanned.

"""
    + JSONL_HELP
)


def add_monitor_options(p: argparse.ArgumentParser) -> None:
    """Options every monitor command (attach, demo, replay) shares."""
    g = p.add_argument_group("monitor")
    g.add_argument("--window", type=float, default=10.0, metavar="S",
                   help="statistics window in seconds of data time (default 10)")  # fmt: skip
    g.add_argument("--timeline", type=float, default=30.0, metavar="S",
                   help="span of the step-time chart, seconds (default 30)")  # fmt: skip
    g.add_argument("--refresh", type=float, default=2.0, metavar="HZ",
                   help="screen refreshes per second (default 2)")  # fmt: skip
    g.add_argument("--steps", type=int, default=8, metavar="N", help="capture length N for c / f (default 8)")
    g.add_argument("--slo-ttft-ms", type=float, default=None, metavar="MS", help="TTFT SLO for goodput")
    g.add_argument("--slo-tpot-ms", type=float, default=None, metavar="MS", help="TPOT SLO for goodput")
    g.add_argument("--peak-gbps", type=float, default=None, metavar="GB/S",
                   help="peak memory bandwidth for MBU (overrides the engine's calibration)")  # fmt: skip
    g.add_argument(
        "--peak-gflops", type=float, default=None, metavar="GFLOP/S", help="peak FLOP/s for the roofline"
    )
    g.add_argument("--history", type=int, default=32768, metavar="STEPS",
                   help="step records kept per target (memory is bounded by this; default 32768)")  # fmt: skip
    g.add_argument("--record-dir", default=".", metavar="DIR", help="where `r` writes recordings (default .)")
    t = p.add_argument_group("triggers (captures that start themselves; t arms/disarms)")
    t.add_argument("--trigger", action="append", default=[], metavar="RULE",
                   help="capture N steps when RULE holds, e.g. 'step_ms>150', 'gap_ms>50', 'idle>0.3', "
                        "'mbu<0.2', 'step_p99_ms>40', 'ttft_p99_ms>500' (repeatable; see rltperf watch --help)")  # fmt: skip
    t.add_argument(
        "--trigger-all", action="store_true", help="a fire captures on every target, not only its own"
    )
    t.add_argument("--trigger-cooldown", type=float, default=30.0, metavar="S",
                   help="no triggered capture within S seconds of the last (default 30)")  # fmt: skip
    t.add_argument("--trigger-max", type=int, default=5, metavar="K",
                   help="triggered captures at most, per target (default 5)")  # fmt: skip


def check_monitor_options(args: argparse.Namespace, prog: str) -> str | None:
    """A sentence about the first bad option value, or None."""
    if args.window <= 0 or args.timeline <= 0:
        return "--window and --timeline must be positive"
    if args.refresh <= 0 or args.refresh > 30:
        return f"--refresh must be above 0 and at most 30 Hz (got {args.refresh:g})"
    if args.steps < 1:
        return "--steps must be at least 1"
    for name in ("slo_ttft_ms", "slo_tpot_ms", "peak_gbps", "peak_gflops"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            return f"--{name.replace('_', '-')} must be positive"
    if args.history < 1024:
        return "--history must be at least 1024 steps"
    if getattr(args, "trigger", None):
        from rltperf_tui.live.triggers import RuleError, TriggerSet

        try:
            TriggerSet.parse(args.trigger)
        except RuleError as exc:
            return str(exc)
        if args.trigger_cooldown < 0 or args.trigger_max < 0:
            return "--trigger-cooldown and --trigger-max must not be negative"
    return None


def monitor_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``MonitorApp`` keyword arguments from the shared options."""
    return {
        "window_s": args.window,
        "timeline_s": args.timeline,
        "refresh_hz": args.refresh,
        "capture_steps": args.steps,
        "slo_ttft_ms": args.slo_ttft_ms,
        "slo_tpot_ms": args.slo_tpot_ms,
        "peak_gbps": args.peak_gbps,
        "peak_gflops": args.peak_gflops,
        "history_steps": args.history,
        "record_dir": args.record_dir,
        "triggers": list(getattr(args, "trigger", []) or []),
        "trigger_all": bool(getattr(args, "trigger_all", False)),
        "trigger_cooldown_s": float(getattr(args, "trigger_cooldown", 30.0)),
        "trigger_max": int(getattr(args, "trigger_max", 5)),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rltperf_tui.commands.auto_targets import add_auto_options
    from rltperf_tui.commands.jsonl import add_jsonl_options

    p.add_argument(
        "targets", nargs="*", metavar="TARGET", help="tcp://HOST:PORT, vllm+http://HOST:PORT or a recording"
    )
    p.add_argument("--wait", action="store_true",
                   help="do not exit when a target cannot be reached: show it as waiting and keep retrying")  # fmt: skip
    add_monitor_options(p)
    c = p.add_argument_group("cost (vllm+http:// targets; the formulas are on the ? screen)")
    c.add_argument("--cost-in", type=float, default=None, metavar="$",
                   help="list price of 1M prompt (input) tokens, with --cost-out")  # fmt: skip
    c.add_argument("--cost-out", type=float, default=None, metavar="$",
                   help="list price of 1M generated (output) tokens, with --cost-in")  # fmt: skip
    c.add_argument("--gpu-cost-hour", type=float, default=None, metavar="$",
                   help="$ per hour of the GPUs behind one target: gives $ per 1M generated tokens")  # fmt: skip
    add_target_options(p)
    add_auto_options(p)
    add_jsonl_options(p)


def prices(args: argparse.Namespace) -> tuple[Any, str | None]:
    """The cost flags as ``Prices`` (None when none given), or a sentence about a bad one."""
    from engine_adapters.definitions.cost import Prices

    cin, cout, gpu = args.cost_in, args.cost_out, args.gpu_cost_hour
    for flag, v in (("--cost-in", cin), ("--cost-out", cout), ("--gpu-cost-hour", gpu)):
        if v is not None and v < 0:
            return None, f"{flag} must not be negative"
    if (cin is None) != (cout is None):
        return None, "--cost-in and --cost-out go together (the list price of input and of output tokens)"
    p = Prices(cost_in=cin, cost_out=cout, gpu_cost_hour=gpu)
    return (p if p.any else None), None


def run_monitor(specs: list[Any], args: argparse.Namespace, **extra: Any) -> int:
    """Run the monitor app over ``specs``; returns the exit status."""
    from rltperf_tui.tui.app import MonitorApp

    extra.setdefault("exit_process", getattr(args, "_exit_process", None))
    app = MonitorApp(specs, **monitor_kwargs(args), **extra)
    try:
        with on_stop_signals(quit_on_signal(app), TUI_STOP_SIGNALS):
            app.run()
    finally:
        app.close_all()
    if app.return_code not in (0, None):
        return int(app.return_code or 1)
    return 0


def run(args: argparse.Namespace) -> int:
    bad = check_monitor_options(args, "attach")
    if bad:
        print(f"rltperf attach: error: {bad}", file=sys.stderr)
        return 2
    cost, bad = prices(args)
    if bad:
        print(f"rltperf attach: error: {bad}", file=sys.stderr)
        return 2
    from rltperf_tui.commands.auto_targets import resolve_targets
    from rltperf_tui.commands.jsonl import check_jsonl_options, run_jsonl

    bad = check_jsonl_options(args)
    if bad:
        print(f"rltperf attach: error: {bad}", file=sys.stderr)
        return 2
    found = resolve_targets(args, "attach")
    if isinstance(found, int):
        return found
    if args.jsonl:
        return run_jsonl(found, args, "attach")
    opts = target_options(args)
    specs = open_targets([t for t, _ in found], opts, args.wait, "attach")
    if specs is None:
        return 1
    for spec, (_, note) in zip(specs, found, strict=True):
        spec.note = spec.note or note
    return run_monitor(specs, args, adapter_options=opts, wait=True, prices=cost)
