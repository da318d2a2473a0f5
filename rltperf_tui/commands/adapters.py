"""``rltperf adapters``: list the installed adapters and the targets each accepts."""

from __future__ import annotations

import argparse

from engine_adapters.monitor.registry import available

HELP = "list installed adapters and the targets they accept"
DESCRIPTION = """\
List the adapters installed in the `rltperf.adapters` entry-point group, the target
forms each accepts (schemes, file suffixes), and what it reads.  An adapter that fails
to import is shown as BROKEN with the error (exit 1); the others still work.  When two
adapters accept a target, a scheme beats a file suffix, the longer one wins, then a
built-in adapter, then the name in alphabetical order."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-l", "--long", action="store_true", help="also show where each adapter is defined")


def run(args: argparse.Namespace) -> int:
    bad = 0
    for name, entry in sorted(available().items()):
        try:
            cls = entry.load()
        except Exception as exc:
            bad += 1
            print(f"{name:8s} BROKEN: {exc}  ({entry.value})")
            continue
        targets = ", ".join([f"{s}…" for s in cls.SCHEMES] + [f"*{x}" for x in cls.SUFFIXES]) or "(files)"
        print(f"{name:8s} {targets:32s} {cls.DESCRIPTION}")
        if args.long:
            print(f"{'':8s} {entry.value}")
    return 1 if bad else 0
