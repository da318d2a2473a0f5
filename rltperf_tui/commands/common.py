"""Shared bits of the sub-commands: target options, opening sessions, progress lines."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from engine_adapters.monitor.base import Adapter, AdapterTargetError, Session
from engine_adapters.monitor.registry import adapter_for


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--token`` (probe secret) and ``--profiler-dir`` (vLLM traces) for live targets."""
    p.add_argument(
        "--token", default=None, help="probe token for non-loopback targets (default $RLTPERF_TOKEN)"
    )
    p.add_argument(
        "--profiler-dir",
        default=None,
        help="vLLM targets: the server's torch_profiler_dir, where its traces are gathered from "
        "(default: announced by the rltperf plugin for a server on this host)",
    )
    p.add_argument(
        "--loop-count",
        type=int,
        default=None,
        metavar="N",
        help="vLLM targets: loop passes of a looped model, to correct vLLM's byte/FLOP estimate "
        "(default: total_ut_steps from the model's config.json, or $RLTPERF_LOOP_COUNT)",
    )


def target_options(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """Adapter options from the parsed arguments."""
    opts: dict[str, Any] = {}
    if getattr(args, "token", None):
        opts["token"] = args.token
    if getattr(args, "profiler_dir", None):
        opts["profiler_dir"] = args.profiler_dir
    if getattr(args, "loop_count", None):
        if args.loop_count < 1:
            raise AdapterTargetError(f"--loop-count must be at least 1, not {args.loop_count}")
        opts["loop_count"] = args.loop_count
    opts.update(extra)
    return opts


def check_recording(path: str, prog: str) -> int | None:
    """Read a recording through once before using it: damage is said on stderr (a
    warning), and a file with nothing readable is an error.  Returns the exit status to
    stop with, or None to go on."""
    from engine_adapters.monitor.recording import RecordingError, scan

    try:
        check = scan(path)
    except RecordingError as exc:
        print(f"rltperf {prog}: error: {exc}", file=sys.stderr)
        return 1
    if not check.records_read:
        why = f" ({check.warning})" if check.warning else ""
        print(f"rltperf {prog}: error: {path}: no readable records{why}", file=sys.stderr)
        return 1
    if check.warning:
        print(f"rltperf {prog}: warning: {path}: {check.warning}", file=sys.stderr)
    return None


def open_session(target: str, **options: Any) -> tuple[Adapter, Session]:
    """Adapter and connected session for ``target`` (raises ``AdapterError``)."""
    adapter = adapter_for(target, **options)
    return adapter, adapter.connect()


def open_targets(targets: list[str], options: dict[str, Any], wait: bool, prog: str) -> list[Any] | None:
    """Connect to every target before the screen opens, so a wrong address is a clear
    message on the terminal.  Returns ``TargetSpec``s, or None after printing why."""
    from engine_adapters.monitor.base import AdapterError
    from engine_adapters.monitor.registry import adapter_for
    from rltperf_tui.live.driver import TargetSpec

    specs: list[TargetSpec] = []
    failed: list[str] = []
    live_failed = False
    for t in targets:
        if os.path.isfile(t):  # a recording: its damage is said here, before the screen opens
            rc = check_recording(t, prog)
            if rc is not None:
                for s in specs:
                    if s.session is not None:
                        s.session.close()
                return None
        try:
            adapter = adapter_for(t, **options)
        except AdapterError as exc:
            failed.append(str(exc))
            continue
        try:
            session = adapter.connect()
        except AdapterError as exc:
            if wait and adapter.SUPPORTS_RECONNECT:
                specs.append(TargetSpec(target=t, adapter=adapter))
                continue
            failed.append(f"{t}: {exc}")
            live_failed = live_failed or adapter.SUPPORTS_RECONNECT
            continue
        specs.append(TargetSpec(target=t, adapter=adapter, session=session))
    if failed:
        for s in specs:
            if s.session is not None:
                s.session.close()
        for msg in failed:
            print(f"rltperf {prog}: cannot attach: {msg}", file=sys.stderr)
        if not wait and live_failed:
            print(f"rltperf {prog}: (--wait keeps retrying a live target until it answers)", file=sys.stderr)
        return None
    return specs


class Progress:
    """A one-line progress display on stderr (rewritten in place on a terminal)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._last = ""
        self._last_key: str | None = None

    def show(self, text: str, key: str | None = None) -> None:
        """Replace the progress line.  Without a terminal, a line is printed only when
        ``key`` (default: the text) changes, so logs get one line per state."""
        if not self.enabled or text == self._last:
            return
        self._last = text
        if not self.tty:
            k = key if key is not None else text
            if k == self._last_key:
                return
            self._last_key = k
        self._write("\r\033[K" + text if self.tty else text + "\n")

    def done(self) -> None:
        """End the progress line."""
        if self.enabled and self.tty and self._last:
            self._write("\n")
        self._last = ""

    def _write(self, text: str) -> None:
        """A progress line that cannot be written (a terminal that hung up: EIO) turns the
        display off; it never fails the command it reports on."""
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self.enabled = False
