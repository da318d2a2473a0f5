"""Shared bits of the sub-commands: target options, opening sessions, progress lines."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine_adapters.base import Adapter, Session
from engine_adapters.registry import adapter_for


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--token`` (probe secret) and ``--profiler-dir`` (vLLM traces) for live targets."""
    p.add_argument(
        "--token", default=None, help="probe token for non-loopback targets (default $RLTPERF_TOKEN)"
    )
    p.add_argument(
        "--profiler-dir",
        default=None,
        help="vLLM targets: the server's torch_profiler_dir, where its traces are gathered from",
    )


def target_options(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """Adapter options from the parsed arguments."""
    opts: dict[str, Any] = {}
    if getattr(args, "token", None):
        opts["token"] = args.token
    if getattr(args, "profiler_dir", None):
        opts["profiler_dir"] = args.profiler_dir
    opts.update(extra)
    return opts


def open_session(target: str, **options: Any) -> tuple[Adapter, Session]:
    """Adapter and connected session for ``target`` (raises ``AdapterError``)."""
    adapter = adapter_for(target, **options)
    return adapter, adapter.connect()


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
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """End the progress line."""
        if self.enabled and self.tty and self._last:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self._last = ""
