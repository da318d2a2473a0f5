"""``rltperf bench peers``: the monitor's CPU and memory next to vllm-htop's, on one server.

Each monitor runs as a person runs it: its own command line in a detached tmux session
of ``--size`` cells (default 160x48), all attached to the same ``vllm+http://`` target at
the same time.  After ``--warmup`` seconds (imports, first scrapes, a full trend window)
each process's CPU time is read from ``/proc`` (the scheduler's run time of all its threads),
again ``--duration`` seconds later; CPU time over wall time is its fraction of one core.
RSS is ``/proc/PID/status`` ``VmRSS`` at the end of the round.  ``--rounds`` rounds start
every monitor afresh (the order of the panes rotates); the figures are medians over the
rounds, and ``ratio`` is the median of each round's rltperf / vllm-htop CPU (same period,
same target, same machine load).

Monitors: ``rltperf attach TARGET`` from this checkout; ``vllm-htop --url URL --interval
I`` when it is installed (``--htop PATH``, else ``vllm-htop`` on ``PATH``; it is not a
dependency: when it is missing the benchmark says it could not compare, and measures
rltperf alone); with ``--baseline-root DIR``, also ``rltperf attach`` from another
checkout (its packages on ``PYTHONPATH``, this interpreter): a before/after in the same
period.  The target may also be a probe (``tcp://HOST:PORT``); vllm-htop, which reads
only a vLLM server's ``/metrics``, is then left out and said so (``rltperf bench ingest
--baseline-root`` runs this on a paced loop engine).  Needs ``tmux`` and Linux ``/proc``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_adapters.monitor.vllm.adapter import DEFAULT_INTERVAL_S
from rltperf_tui.bench import SOURCE_ROOT

HELP = "monitor CPU and RSS beside vllm-htop's, side by side in tmux on one vLLM server"
DESCRIPTION = __doc__ or HELP


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="vllm+http://HOST:PORT",
                   help="a running vLLM server (or a probe, tcp://HOST:PORT: without vllm-htop)")  # fmt: skip
    p.add_argument("--duration", type=float, default=60.0, metavar="S",
                   help="seconds measured per round (default 60)")  # fmt: skip
    p.add_argument("--warmup", type=float, default=35.0, metavar="S",
                   help="seconds each monitor runs before it is measured (default 35: a full 30 s trend window)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="rounds, each monitor started afresh (default 3)")
    p.add_argument("--interval", type=float, default=0.5, metavar="S",
                   help="vllm-htop's --interval (default 0.5: 2 Hz, rltperf's refresh rate)")  # fmt: skip
    p.add_argument("--htop", default=None, metavar="PATH", help="the vllm-htop command (default: on PATH)")
    p.add_argument("--baseline-root", default=None, metavar="DIR",
                   help="also run `rltperf attach` from this checkout (before/after in one period)")  # fmt: skip
    p.add_argument("--size", default="160x48", metavar="COLSxROWS", help="terminal size (default 160x48)")


@dataclass
class Monitor:
    """One monitor command line and what was measured of it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cpu: list[float]
    rss_mb: list[float]
    cwd: str | None = None
    """The directory it starts in.  For rltperf, the root of the checkout it runs:
    ``python -m`` puts its start directory first on ``sys.path``, ahead of ``PYTHONPATH``,
    so a baseline started from this checkout's directory ran this checkout's code."""


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far, all its threads: the scheduler's own run time
    (``/proc/PID/task/*/schedstat``, nanoseconds), else user + system clock ticks.

    Ticks are sampled: a process that wakes briefly a few times a second is charged a
    10 ms tick or nothing, by chance (vllm-htop read 0.64 % by ticks, 0.51 % by run time,
    in the same 45 s)."""
    tids = os.listdir(f"/proc/{pid}/task")  # FileNotFoundError: the monitor ended
    try:
        total = 0
        for tid in tids:
            # a thread that ended meanwhile is left out
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (PermissionError, ValueError, IndexError):  # no schedstat here: the ticks
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _tmux(*args: str) -> str:
    # tmux starts its server with the first session and ends it with the last: a session
    # started while the previous server is still ending fails ("server exited
    # unexpectedly"), so a failed command is tried once more
    for attempt in range(2):
        p = subprocess.run(["tmux", *args], capture_output=True, text=True)
        if p.returncode == 0 or attempt:
            break
        time.sleep(0.5)
    if p.returncode:
        raise RuntimeError(f"tmux {' '.join(args[:3])}: {p.stderr.strip() or p.returncode}")
    return p.stdout


def tmux_args(session: str, m: Monitor, cols: int, rows: int) -> list[str]:
    """The ``tmux`` arguments that start ``m`` in a new detached session of ``cols`` x
    ``rows``, in ``m.cwd``; the pane's process is the monitor (exec)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in m.env.items())
    cmd = f"exec env {env} {shlex.join(m.argv)}"
    where = ["-c", m.cwd] if m.cwd else []
    return ["new-session", "-d", "-s", session, *where, "-x", str(cols), "-y", str(rows), cmd]


def _start(session: str, m: Monitor, cols: int, rows: int) -> int:
    """Run ``m`` in a new detached tmux session (``tmux_args``); returns the monitor's pid."""
    _tmux(*tmux_args(session, m, cols, rows))
    return int(_tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0])


def _kill(session: str) -> None:
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def checkout(path: str) -> Path:
    """``--baseline-root PATH`` resolved, or the run ends with one sentence when it is not a
    checkout of rltperf."""
    root = Path(path).resolve()
    if not (root / "rltperf_tui" / "cli.py").is_file():
        raise SystemExit(
            f"rltperf bench: --baseline-root {path}: not a checkout of rltperf (no rltperf_tui/cli.py there)"
        )
    return root


def monitors(args: argparse.Namespace) -> tuple[list[Monitor], str | None]:
    """The monitors to run, and why vllm-htop is not among them (None: it is)."""
    target = args.target
    base_env = {"TERM": os.environ.get("TERM", "xterm-256color")}
    if base_env["TERM"] in ("", "dumb"):
        base_env["TERM"] = "xterm-256color"

    # the checkout comes from PYTHONPATH: the same interpreter runs this one and a baseline
    rltperf = [sys.executable, "-m", "rltperf_tui.cli", "attach", target]
    here = str(SOURCE_ROOT)
    out = [Monitor("rltperf", rltperf, dict(base_env, PYTHONPATH=here), [], [], cwd=here)]
    if args.baseline_root:
        root = checkout(args.baseline_root)
        env = dict(base_env, PYTHONPATH=str(root))
        out.append(Monitor(f"rltperf ({root.name})", rltperf, env, [], [], cwd=str(root)))
    htop = args.htop or shutil.which("vllm-htop")
    missing = None
    if not target.startswith("vllm+http://"):
        missing = "vllm-htop reads only a vLLM server's /metrics, and the target is a probe"
    elif htop is None or not os.access(htop, os.X_OK):
        missing = (
            f"{args.htop} is not an executable" if args.htop else "vllm-htop is not installed (not on PATH)"
        )
    else:
        url = "http" + target[len("vllm+http") :]
        out.append(
            Monitor("vllm-htop", [htop, "--url", url, "--interval", f"{args.interval:g}"], base_env, [], [])
        )
    return out, missing


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.target.startswith(("vllm+http://", "tcp://")):
        raise SystemExit("rltperf bench peers: the target must be vllm+http://HOST:PORT or tcp://HOST:PORT")
    if shutil.which("tmux") is None or not os.path.isdir("/proc/self"):
        return {"measured": False, "why": "needs tmux and Linux /proc", "ok": False}
    cols, rows = (int(v) for v in args.size.lower().split("x"))
    mons, missing = monitors(args)
    tag = f"rltperf-peers-{os.getpid()}"
    rounds = max(1, args.rounds)
    notes: list[str] = []
    for r in range(rounds):
        order = mons[r % len(mons) :] + mons[: r % len(mons)]
        pids: dict[str, int] = {}
        try:
            for i, m in enumerate(order):
                pids[m.name] = _start(f"{tag}-{i}", m, cols, rows)
            time.sleep(args.warmup)
            c0 = {n: proc_cpu_s(p) for n, p in pids.items()}
            t0 = time.monotonic()
            time.sleep(args.duration)
            wall = time.monotonic() - t0
            for m in order:
                pid = pids[m.name]
                m.cpu.append((proc_cpu_s(pid) - c0[m.name]) / wall)
                m.rss_mb.append(_proc_rss_mb(pid))
        except (FileNotFoundError, ProcessLookupError) as exc:
            notes.append(f"round {r + 1}: a monitor ended early ({exc})")
        finally:
            for i in range(len(order)):
                _kill(f"{tag}-{i}")
    res: dict[str, Any] = {
        "target": args.target,
        "size": f"{cols}x{rows}",
        "rounds": rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "htop_interval_s": args.interval if missing is None else None,
        "rltperf_scrape_s": DEFAULT_INTERVAL_S if args.target.startswith("vllm+http://") else None,
        "htop_missing": missing,
        "notes": notes,
        "monitors": {
            m.name: {
                "command": shlex.join(m.argv),
                "cpu_fraction": [round(c, 5) for c in m.cpu],
                "cpu_fraction_median": round(statistics.median(m.cpu), 5) if m.cpu else None,
                "rss_mb": [round(x, 1) for x in m.rss_mb],
                "rss_mb_median": round(statistics.median(m.rss_mb), 1) if m.rss_mb else None,
            }
            for m in mons
        },
    }
    ours = mons[0]
    for other in mons[1:]:
        pairs = [a / b for a, b in zip(ours.cpu, other.cpu, strict=False) if b > 0]
        res["monitors"][other.name]["rltperf_over_this_median"] = (
            round(statistics.median(pairs), 3) if pairs else None
        )
    if missing is None:
        ratio = res["monitors"]["vllm-htop"]["rltperf_over_this_median"]
        res["ok"] = ratio is not None and ratio <= 1.0
    else:
        res["ok"] = True
    return res


def print_text(r: dict[str, Any]) -> None:
    if not r.get("measured", True):
        print(f"not measured: {r['why']}")
        return
    print(f"{r['target']}: each monitor in its own {r['size']} tmux pane, the same {r['duration_s']:g} s "
          f"after {r['warmup_s']:g} s, {r['rounds']} round(s); CPU (run time from /proc) as a fraction of one core")  # fmt: skip
    # what each one polls is not in its command line: say it beside the figures
    if r["rltperf_scrape_s"] is not None:
        polls = f"  rltperf scrapes /metrics every {r['rltperf_scrape_s']:g} s (the vllm+http:// adapter's default)"
        if r["htop_interval_s"] is not None:
            polls += f"; vllm-htop polls every {r['htop_interval_s']:g} s (--interval)"
        print(polls)
    for name, m in r["monitors"].items():
        cpus = " ".join(f"{c:.2%}" for c in m["cpu_fraction"])
        med = m["cpu_fraction_median"]
        line = f"  {name:<22} CPU {med:.2%} (rounds: {cpus})" if med is not None else f"  {name}: no figure"
        if m["rss_mb_median"] is not None:
            line += f", RSS {m['rss_mb_median']:.0f} MB"
        if m.get("rltperf_over_this_median") is not None:
            line += f"; rltperf / this {m['rltperf_over_this_median']:.2f}"
        print(line)
        print(f"  {'':<22} $ {m['command']}")
    if r["htop_missing"]:
        print(f"  could not compare with vllm-htop: {r['htop_missing']}")
    for n in r["notes"]:
        print(f"  note: {n}")
    if not r["htop_missing"]:
        print("OK (no more CPU than vllm-htop)" if r["ok"] else "rltperf used more CPU than vllm-htop")


def screen_beside_htop(target: str, duration: float, htop: str | None) -> dict[str, Any]:
    """``bench ingest``'s screen on ``target`` beside vllm-htop's, the same period (one round)."""
    ns = argparse.Namespace(target=target, duration=duration, warmup=30.0, rounds=1, interval=0.5,
                            htop=htop, baseline_root=None, size="160x48")  # fmt: skip
    return run(ns)


def print_baseline(b: dict[str, Any]) -> None:
    """``bench ingest``'s this-checkout-beside-another lines: ``bench peers``'s own."""
    if b.get("measured", True):
        print(
            f"this checkout's screen beside the baseline's, on one loop engine at {b['engine_rate_steps_per_s']:g} steps/s:"
        )
    print_text(b)


def print_screen(p: dict[str, Any]) -> None:
    """``bench ingest``'s screen-beside-vllm-htop lines."""
    if not p.get("measured", True):
        print(f"screen on {p.get('target', '/metrics')}: not measured ({p['why']})")
        return
    mons = p["monitors"]
    ours = mons["rltperf"]["cpu_fraction_median"]
    line = f"screen (160x48 tmux pane) on {p['target']}, {p['duration_s']:g} s: rltperf CPU {ours:.2%} of one core"
    htop = mons.get("vllm-htop")
    if htop is not None and htop["cpu_fraction_median"] is not None:
        line += f", vllm-htop (--interval {p['htop_interval_s']:g}) {htop['cpu_fraction_median']:.2%}"
        line += f" (rltperf / vllm-htop {htop['rltperf_over_this_median']:.2f})"
    else:
        line += f"; vllm-htop not compared: {p['htop_missing']}"
    print(line)
