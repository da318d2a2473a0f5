"""SIGTERM and SIGHUP end a command the way its own stop does: nothing it owns is lost.

A long-running command is stopped by more than Ctrl-C: ``kill PID`` and ``timeout``
send SIGTERM (a load-test harness ending its run), and a dropped SSH connection or a
closed terminal window sends SIGHUP.  By default either kills the process where it
stands: ``rltperf watch`` then wrote no report, ``rltperf record`` lost its last records
and its closing line, and the monitor left the terminal in its alternate screen, raw
mode and mouse reporting on, so that what the user typed next showed as garbage.

``on_stop_signals(handler)`` puts ``handler`` on those signals for the block:

- the headless commands (``record``, ``watch``, ``attach --jsonl``) raise
  ``KeyboardInterrupt`` from it (``raise_interrupt``), so the path Ctrl-C takes
  (recordings closed, the last objects and the report written) is the one path;
- the monitor asks its app to quit (``MonitorApp.request_exit``), its ``q`` path;
- the engine sets its stop event.

Only the first signal acts, and none once the command is in its own cleanup
(``StopSignals.closing``): a second (SIGHUP then SIGTERM, or a harness that sends
SIGTERM twice), or one that comes while ``watch`` writes its report at the end of its
``--duration``, is ignored rather than cutting that cleanup short.  On SIGHUP the terminal is gone: the standard streams that were that terminal
are pointed at ``/dev/null`` first, so that the closing lines (the report's path, the
terminal's reset sequences) cost nothing and raise nothing; a stream redirected to a
file or a pipe keeps its output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a command as its own stop (Ctrl-C, ``q``) does."""
TUI_STOP_SIGNALS: tuple[signal.Signals, ...] = (*STOP_SIGNALS, signal.SIGINT)
"""The signals the monitor quits on as on ``q`` (its terminal is raw: Ctrl-C is a key
there, and SIGINT comes only from ``kill -INT``)."""


class _Quittable(Protocol):
    def request_exit(self, code: int = 0) -> bool: ...


def leave_hung_up_terminal() -> None:
    """Point each standard stream that is a terminal at ``/dev/null`` (after SIGHUP: the
    terminal is gone, and writing to it fails with EIO).  A terminal is told by its file
    type, a character device: once hung up, ``isatty`` says False for it (its ioctls
    fail), and a ``\n`` written to it made ``rltperf record`` exit 1 with its work done."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
    finally:
        os.close(null)


def raise_interrupt(signum: int) -> None:
    """The headless commands' handler: stop as Ctrl-C stops them."""
    raise KeyboardInterrupt


def quit_on_signal(app: _Quittable) -> Callable[[int], None]:
    """A handler that quits the monitor ``app`` as ``q`` does (recordings closed, the
    terminal given back; ``MonitorApp.request_exit``), exit status 128 + the signal's
    number; before the app runs, or after, it raises ``SystemExit`` with that status."""

    def handler(signum: int) -> None:
        if not app.request_exit(128 + signum):
            raise SystemExit(128 + signum)

    return handler


class StopSignals:
    """What ``on_stop_signals`` yields: ``closing()`` once the command is in its own
    cleanup, after which a stop signal only has the hang-up's streams redirected (the
    cleanup is what it asks for, and raising in it would cut it short)."""

    def __init__(self) -> None:
        self.fired: int | None = None
        """The first stop signal that came, if one did."""
        self.is_closing = False

    def closing(self) -> None:
        self.is_closing = True


@contextlib.contextmanager
def on_stop_signals(
    handler: Callable[[int], None], signals: tuple[signal.Signals, ...] = STOP_SIGNALS
) -> Iterator[StopSignals]:
    """Call ``handler(signum)`` on the first of ``signals`` during the block, unless the
    block said it is closing; the old handlers come back after it.  Outside the main
    thread (where Python runs signal handlers) nothing is installed."""
    state = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def on_signal(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            leave_hung_up_terminal()
        if state.fired is not None or state.is_closing:
            return  # a cleanup is running: let it finish
        state.fired = signum
        handler(signum)

    old = {s: signal.signal(s, on_signal) for s in signals}
    try:
        yield state
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = [
    "STOP_SIGNALS",
    "TUI_STOP_SIGNALS",
    "StopSignals",
    "leave_hung_up_terminal",
    "on_stop_signals",
    "quit_on_signal",
    "raise_interrupt",
]
