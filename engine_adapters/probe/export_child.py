"""A capture's export, in a process of its own: the segments' Chrome traces merged into
one ``trace.json.gz``, its events and ``ProfilerStep`` spans counted, and the operator
table (``ops.txt``) built from the trace.

Standard library only, so it starts in milliseconds and never imports torch: the engine
spawns it (``export.py``, ``python export_child.py ARGS``; a spawn costs the engine
nothing like a fork, which copies its page tables with the GIL held: 15-30 ms of a
step) once each segment's trace is on disk.  The same ``export`` runs in the engine's
export thread when a process cannot be started (slow for the engine, still correct).

The operator table: host operators (``cpu_op`` events) by name (full mode: and input
shapes), with calls, self time (a span's duration less its direct children's on the
same thread) and total time; device activities (kernels, copies, sets) by name, when the
trace has any.  Times are profiled times, not a baseline.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from collections import defaultdict
from typing import Any

HOST_CATS = ("cpu_op", "operator")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TOP_ROWS = 60
SCRIPT = os.path.abspath(__file__)
"""This file: what the engine runs as the export process."""


def merge_traces(parts: list[str], path: str) -> None:
    """Write to ``path`` one Chrome trace holding the events of ``parts`` (traces of one
    process taken one after another: their timestamps share a base).  The first part's
    top-level fields are kept; metadata events (``ph: M``) are kept once."""
    if len(parts) == 1:
        os.replace(parts[0], path)
        return
    merged: dict[str, Any] | None = None
    events: list[Any] = []
    seen_meta: set[str] = set()
    for part in parts:
        with open(part, "rb") as f:
            data = json.load(f)
        evs = data.get("traceEvents", []) if isinstance(data, dict) else data
        if merged is None:
            merged = dict(data) if isinstance(data, dict) else {}
        for e in evs:
            if isinstance(e, dict) and e.get("ph") == "M":
                key = json.dumps([e.get("name"), e.get("pid"), e.get("tid"), e.get("args")], sort_keys=True)
                if key in seen_meta:
                    continue
                seen_meta.add(key)
            events.append(e)
    out = merged or {}
    out["traceEvents"] = events
    out["rltperfSegments"] = len(parts)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f)
    os.replace(tmp, path)
    for part in parts:
        os.unlink(part)


def _spans(events: list[Any], cats: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() in cats and "dur" in e
    ]


def host_table(events: list[Any], shapes: bool) -> list[tuple[str, str, int, float, float]]:
    """(name, input shapes, calls, self us, total us) of the host operators, by self time.
    Self time: a span's duration less its direct children's (same thread, nested)."""
    by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in _spans(events, HOST_CATS):
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    rows: dict[tuple[str, str], list[float]] = {}  # key -> [calls, self us, total us]

    def close(frame: list[Any]) -> None:
        rows[frame[2]][1] += frame[1]

    for evs in by_tid.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[list[Any]] = []  # [end, self us so far, key] of the open spans
        for e in evs:
            ts, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= ts:
                close(stack.pop())
            if stack:
                stack[-1][1] -= dur
            dims = e.get("args", {}).get("Input Dims") if shapes else None
            key = (str(e.get("name", "")), json.dumps(dims) if dims is not None else "")
            row = rows.setdefault(key, [0, 0.0, 0.0])
            row[0] += 1
            row[2] += dur
            stack.append([ts + dur, dur, key])
        while stack:
            close(stack.pop())
    out = [(k[0], k[1], int(v[0]), v[1], v[2]) for k, v in rows.items()]
    out.sort(key=lambda r: -r[3])
    return out


def device_table(events: list[Any]) -> list[tuple[str, int, float]]:
    """(name, calls, total us) of the device activities, by total time."""
    rows: dict[str, list[float]] = {}
    for e in _spans(events, DEVICE_CATS):
        row = rows.setdefault(str(e.get("name", "")), [0, 0.0])
        row[0] += 1
        row[1] += float(e["dur"])
    out = [(k, int(v[0]), v[1]) for k, v in rows.items()]
    out.sort(key=lambda r: -r[2])
    return out


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f}ms"


def ops_text(events: list[Any], capture_id: str, mode: str, steps: int) -> str:
    """The operator table of a capture's trace."""
    full = mode == "full"
    host = host_table(events, full)
    total_self = sum(r[3] for r in host) or 1.0
    lines = [
        f"# rltperf capture {capture_id}: {mode} mode, {steps} steps (profiled timings: not a baseline)",
        f"# host operators sorted by self CPU time; {'grouped by input shape' if full else 'no shapes recorded'}; "
        f"top {TOP_ROWS} of {len(host)}",
        "",
    ]
    name_w = 60
    head = f"{'Name':<{name_w}}  {'Self CPU %':>10}  {'Self CPU total':>14}  {'CPU total':>12}  {'CPU time avg':>12}  {'# of Calls':>10}"
    if full:
        head += "  Input Shapes"
    lines += [head, "-" * len(head)]
    for name, dims, calls, self_us, tot_us in host[:TOP_ROWS]:
        row = (
            f"{name[:name_w]:<{name_w}}  {100 * self_us / total_self:>9.2f}%  {_ms(self_us):>14}  "
            f"{_ms(tot_us):>12}  {_ms(tot_us / max(1, calls)):>12}  {calls:>10}"
        )
        if full:
            row += f"  {dims}"
        lines.append(row)
    lines.append(f"Self CPU time total: {_ms(sum(r[3] for r in host))}")
    dev = device_table(events)
    if dev:
        lines += ["", f"# device activities sorted by total time; top {TOP_ROWS} of {len(dev)}", ""]
        head = f"{'Name':<{name_w}}  {'Device total':>12}  {'Device avg':>12}  {'# of Calls':>10}"
        lines += [head, "-" * len(head)]
        for name, calls, tot in dev[:TOP_ROWS]:
            lines.append(
                f"{name[:name_w]:<{name_w}}  {_ms(tot):>12}  {_ms(tot / max(1, calls)):>12}  {calls:>10}"
            )
    return "\n".join(lines) + "\n"


def export(tmp: str, parts: list[str], capture_id: str, mode: str, steps: int) -> dict[str, Any]:
    """Merge ``parts`` into ``tmp/trace.json.gz``, write ``tmp/ops.txt``; returns
    ``files``, ``trace_bytes``, ``events``, ``steps_found`` and ``error``."""
    out: dict[str, Any] = {"files": {}, "trace_bytes": 0, "events": 0, "steps_found": 0, "error": None}
    raw = os.path.join(tmp, "trace.json")
    try:
        merge_traces(parts, raw)
        with open(raw, "rb") as f:
            data = json.load(f)
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        out["events"] = len(events)
        out["steps_found"] = sum(
            1
            for e in events
            if isinstance(e, dict)
            and e.get("ph") == "X"
            and str(e.get("name", "")).startswith("ProfilerStep#")
        )
        try:
            table = ops_text(events, capture_id, mode, steps)
        except Exception as exc:  # the trace is still worth having
            table = f"# operator table could not be built: {type(exc).__name__}: {exc}\n"
        with open(os.path.join(tmp, "ops.txt"), "w", encoding="utf-8") as f:
            f.write(table)
        out["files"]["ops.txt"] = "operator table"
        with (
            open(raw, "rb") as src,
            gzip.open(os.path.join(tmp, "trace.json.gz"), "wb", compresslevel=3) as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        os.unlink(raw)
        out["trace_bytes"] = os.path.getsize(os.path.join(tmp, "trace.json.gz"))
        out["files"]["trace.json.gz"] = "Chrome trace (Perfetto)"
    except OSError as exc:
        out["error"] = f"the trace: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        out["errno"] = exc.errno
    except Exception as exc:
        out["error"] = f"trace export failed: {type(exc).__name__}: {exc}"
    for leftover in [raw, raw + ".tmp", *parts]:  # a failed export leaves partial files
        try:
            os.unlink(leftover)
        except OSError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("tmp")
    ap.add_argument("result")
    ap.add_argument("--capture-id", required=True)
    ap.add_argument("--mode", choices=("ops", "full"), required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("parts", nargs="+")
    a = ap.parse_args(argv)
    try:
        os.nice(5)  # the engine first (+10 starved it to minutes of export on a loaded 2-core box)
    except OSError:
        pass
    res = export(a.tmp, a.parts, a.capture_id, a.mode, a.steps)
    with open(a.result + ".part", "w", encoding="utf-8") as f:
        json.dump(res, f)
    os.replace(a.result + ".part", a.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
