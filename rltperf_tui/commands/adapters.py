"""``rltperf adapters``: list the installed adapters (without importing them first)."""

from __future__ import annotations

import argparse

from engine_adapters.registry import available

HELP = "list installed adapters and the targets they accept"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="import each adapter and report errors")


def run(args: argparse.Namespace) -> int:
    bad = 0
    for name, entry in sorted(available().items()):
        line = f"{name:8s} {entry.value}"
        if args.check:
            try:
                cls = entry.load()
                line += f"  ok: {', '.join(cls.SCHEMES) or '(files)'}  {cls.DESCRIPTION}"
            except Exception as exc:
                bad += 1
                line += f"  BROKEN: {exc}"
        print(line)
    return 1 if bad else 0
