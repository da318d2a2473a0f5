"""``rltperf`` command line: one sub-command per module under ``rltperf_tui.commands``.

Each command module defines ``HELP`` (one line), ``DESCRIPTION`` (a paragraph),
``add_arguments(parser)`` and ``run(args) -> int``, and imports nothing heavy (torch,
textual, vllm) at module level, so ``rltperf --help`` stays fast.  A command line that
names a command loads that command's module alone (``build_parser(only)``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from types import ModuleType
from typing import NoReturn

from rltperf_tui import __version__

# name -> module; order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "demo": "rltperf_tui.commands.demo",
    "attach": "rltperf_tui.commands.attach",
    "replay": "rltperf_tui.commands.replay",
    "engine": "rltperf_tui.commands.engine",
    "record": "rltperf_tui.commands.record",
    "watch": "rltperf_tui.commands.watch",
    "capture": "rltperf_tui.commands.capture",
    "summary": "rltperf_tui.commands.summary",
    "report": "rltperf_tui.commands.report",
    "compare": "rltperf_tui.commands.compare",
    "calibrate": "rltperf_tui.commands.calibrate",
    "bench": "rltperf_tui.commands.bench",
    "adapters": "rltperf_tui.commands.adapters",
}

EPILOG = """\
Start here:  rltperf demo          (reference engine on the CPU + the live monitor)
Your engine: rltperf attach tcp://127.0.0.1:7788
vLLM:        rltperf attach vllm+http://127.0.0.1:8000

Keys in the monitor: c / f capture ops / full, [ ] capture length, space pause,
r record, ? help, q quit.

A command that seems stuck: kill -USR1 PID prints each of its threads' stacks to stderr.
"""


BLAS_THREADED = frozenset({"demo", "engine", "bench", "calibrate"})
"""Commands that run or start an engine, or measure the machine: their math libraries keep
their own thread pools (``_one_blas_thread``)."""


def _one_blas_thread(argv: list[str]) -> None:
    """Every other command does no linear algebra, yet numpy's OpenBLAS starts a thread for
    each other core at import, each spinning before it sleeps: 0.06 s of CPU more for
    ``import numpy`` on 2 cores (0.14 against 0.08 s, 20 imports x 3), so on a 64-core
    server a monitor's start would cost seconds of the cores it watches.  A user's own
    ``OPENBLAS_NUM_THREADS`` wins.  Set before the command's module (numpy) is imported."""
    cmd = next((a for a in argv if a == "--" or not a.startswith("-")), None)
    if cmd not in BLAS_THREADED:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(COMMANDS[name])
    except ModuleNotFoundError as exc:
        if exc.name == COMMANDS[name]:
            return None  # not part of this build
        raise


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every available sub-command, or only the sub-command ``only``
    (what ``main`` builds when the command line names one: each command module's imports
    are start-up CPU, and on cores a loaded server saturates every 0.1 s of it took 1-2 s)."""
    parser = argparse.ArgumentParser(
        prog="rltperf",
        description=(
            "Live performance monitor for looped-transformer inference engines: per-step timing "
            "by stage, device idle fraction, bandwidth utilisation against the roofline, tail "
            "latencies, and bounded profiler captures saved with a reproducible metadata snapshot."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rltperf {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output on stderr (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else [only]:
        mod = _load(name)
        if mod is None:
            continue
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP),
            epilog=getattr(mod, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rltperf`` console script.

    Run from the command line (``argv`` None), a command whose module sets
    ``EXIT_WITHOUT_TEARDOWN`` ends the process as soon as its output is flushed (see
    ``_exit_now``); called with ``argv`` (tests, other Python code) it always returns.
    """
    if argv is None:
        _stacks_on_sigusr1()
        _one_blas_thread(sys.argv[1:])
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    fast = argv is None and getattr(getattr(args, "_module", None), "EXIT_WITHOUT_TEARDOWN", False)
    # a command may end the process itself once its work is done (the monitor on `q`)
    args._exit_process = _exit_now if fast else None
    rc = _run(parser, args)
    if fast:
        _exit_now(rc)
    return rc


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's stack to stderr, the process going on: a
    command that seems stuck says where it is (the tests send it to a command that ran
    past its time before they kill it, ``tests/conftest.py`` ``run_cli``)."""
    import faulthandler
    import signal

    with contextlib.suppress(AttributeError, OSError, ValueError, RuntimeError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _named_command(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names (after the top-level options, which take no value),
    or None (no command, an unknown one, or one not part of this build)."""
    for a in argv:
        if a == "--":
            return None
        if not a.startswith("-"):
            return a if a in COMMANDS and _load(a) is not None else None
    return None


def _exit_now(rc: int) -> NoReturn:
    """Run the atexit handlers, flush, and leave without the interpreter's teardown.

    After ``import torch`` that teardown (destructors of torch's native libraries) takes
    2-7 s on a busy 2-core machine: an engine told to stop would linger that long after
    saying it stopped.  A monitor's finalisation (a full garbage collection, module
    teardown) costs 0.2-0.3 s of CPU, and on a host whose cores are busy serving (a loaded
    vLLM server on 2 cores) it waited 1-11 s for that CPU after the screen was gone
    (measured: ``q`` to exit 3.5-16.6 s).  Everything the command owns is closed by then
    (sessions, recordings, the demo's engine).  The monitor calls it itself on ``q``
    (``args._exit_process``, ``MonitorApp.quit_now``), before Textual's own teardown.
    """
    import atexit
    import os

    atexit._run_exitfuncs()
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            f.flush()
    os._exit(rc)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from engine_adapters.monitor.base import AdapterError
    from engine_adapters.monitor.recording import RecordingError

    if args.command != "engine":  # the reference engine keeps Python's defaults, as an engine would
        from rltperf_tui import tune_gc_for_ingest

        tune_gc_for_ingest()
    try:
        return int(args._module.run(args) or 0)
    except (AdapterError, RecordingError) as exc:
        print(f"rltperf {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"rltperf {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rltperf report ... | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
