"""``--auto [HOST:]PORT-PORT``: the command-line side of target discovery.

The scan itself is ``engine_adapters.monitor.discover``; here the ranges are parsed,
scanned and what was found is said on stderr (or listed on stdout with ``--list``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

EXIT_NOTHING_FOUND = 2
"""Exit status of ``--auto`` when no range held a target."""

DEFAULT_RANGES = ("127.0.0.1:7788-7799", "127.0.0.1:8000-8099")
"""What a bare ``--auto`` scans: the probe's default port (``rltperf engine``,
``RLTPERF_PROBE`` in the README) and those of its data-parallel engines after it, and
vLLM's default port 8000 with the next ones (several servers on one host)."""

DEFAULT_HELP = "no range: " + " and ".join(DEFAULT_RANGES) + ", the probes' and vLLM's usual ports"


def expand(ranges: list[str]) -> list[str]:
    """The ranges to scan: a bare ``--auto`` (given as "") stands for ``DEFAULT_RANGES``."""
    out: list[str] = []
    for r in ranges:
        for x in DEFAULT_RANGES if r == "" else (r,):
            if x not in out:
                out.append(x)
    return out


@dataclass
class AutoTarget:
    """A target found by ``--auto`` and what it is."""

    target: str
    what: str


def add_auto_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("discovery")
    g.add_argument("--auto", action="append", default=[], nargs="?", const="", metavar="[HOST:]PORT-PORT",
                   help="find vLLM servers (vllm:* metrics on /metrics) and rltperf probes (their hello; "
                        "token from --token / $RLTPERF_TOKEN) on these ports (HOST default 127.0.0.1, "
                        f"at most 1024 ports a range; repeatable; {DEFAULT_HELP}) and attach to every one "
                        "found; none found: exit 2")  # fmt: skip
    g.add_argument("--list", action="store_true",
                   help="with --auto: print what was found (TARGET  WHAT, one a line) and exit")  # fmt: skip


def discover(ranges: list[str], token: str | None, prog: str, quiet: bool = False) -> list[AutoTarget] | int:
    """Scan every range; the targets found (said on stderr unless ``quiet``), or the
    exit status after printing why (a bad range: 2, nothing found: 2)."""
    from engine_adapters.monitor.discover import RangeError, parse_range, scan

    try:
        parsed = [parse_range(r) for r in ranges]
    except RangeError as exc:
        print(f"rltperf {prog}: error: {exc}", file=sys.stderr)
        return 2
    found: list[AutoTarget] = []
    empty: list[str] = []
    for rng in parsed:
        res = scan(rng, token=token)
        if not res.targets:
            empty.append(res.describe_empty())
        elif not quiet:
            print(
                f"rltperf {prog}: --auto {rng}: {len(res.targets)} found in {res.seconds:.2f} s",
                file=sys.stderr,
            )
        for f in res.found:
            if f.target is not None:
                if f.target not in (a.target for a in found):
                    found.append(AutoTarget(f.target, f.what))
                if not quiet:
                    print(f"  {f.target:<32} {f.what}", file=sys.stderr)
            elif not quiet:
                print(f"  {f.host}:{f.port:<5} (not a target: {f.what})", file=sys.stderr)
    for why in empty:
        print(f"rltperf {prog}: --auto: {why}", file=sys.stderr)
    if not found:
        return EXIT_NOTHING_FOUND
    return found


def print_list(found: list[AutoTarget]) -> None:
    """``--list``: one ``TARGET  WHAT`` line per target on stdout."""
    for a in found:
        print(f"{a.target}  {a.what}")


def resolve_targets(args: argparse.Namespace, prog: str) -> list[tuple[str, str]] | int:
    """The command's targets: those given, then those ``--auto`` found, each with a note
    for its header (what it is); or the exit status (``--list`` done, nothing found, none given)."""
    given: list[tuple[str, str]] = [(t, "") for t in getattr(args, "targets", []) or []]
    if not args.auto:
        if args.list:
            print(f"rltperf {prog}: error: --list goes with --auto [HOST:]PORT-PORT", file=sys.stderr)
            return 2
        if not given:
            print(f"rltperf {prog}: error: name a TARGET or --auto [HOST:]PORT-PORT", file=sys.stderr)
            return 2
        return per_engine(given, prog)
    found = discover(expand(list(args.auto)), getattr(args, "token", None), prog, quiet=args.list)
    if isinstance(found, int):
        return found
    if args.list:
        print_list([AutoTarget(t, what) for t, what in per_engine([(a.target, a.what) for a in found], prog)])
        return 0
    names = {t for t, _ in given}
    return per_engine(
        given + [(a.target, f"found by --auto: {a.what}") for a in found if a.target not in names], prog
    )


def per_engine(targets: list[tuple[str, str]], prog: str) -> list[tuple[str, str]]:
    """Each ``vllm+http://`` target of a data-parallel server as one target per engine
    (``?engine=N``: a column and a replica row each; ``?engine=all`` keeps one summed
    target), said on stderr."""
    from engine_adapters.monitor.vllm.engines import engine_targets

    out: list[tuple[str, str]] = []
    for t, note in targets:
        each = engine_targets(t)
        if len(each) > 1:
            print(f"rltperf {prog}: {t} runs {len(each)} data-parallel engines: one target each "
                  f"({t}?engine=all for their sum)", file=sys.stderr)  # fmt: skip
            out += [
                (e, f"{note + ' · ' if note else ''}engine {e.rsplit('=', 1)[-1]} of {len(each)}")
                for e in each
            ]
        else:
            out.append((t, note))
    return out
