"""``rltperf bench capture --target tcp://PLUGIN_PROBE --vllm-url http://HOST:PORT``: what
a capture costs a vLLM server, by each path, in one run.

On a vLLM server with rltperf's plugin (``RLTPERF_PROBE``) *and* ``--profiler-config``
(so both paths can run), alternately: rltperf's capture inside vLLM's workers (through
the plugin's probe) and vLLM's own profiler (``vllm+http://``: ``/start_profile`` with
``max_iterations``, ``/stop_profile``), N steps each, ``--repeats`` times, while the
bench reads the plugin's step records (the engine core's steps: the independent truth
for both paths).  Load: the server's own clients, or ``--load C`` closed-loop clients the
bench runs (completions of 64 tokens).

For each capture, from its first profiled step (rltperf: the profiler's warm-up step)
to one second after its bundle was saved (the window's end, the stop and the export
included): the longest engine step and the longest gap between two steps (a gap after a
step that left no request is idle, not counted), held against the limit 3 × the median
unprofiled step + 20 ms (``window_stalls``); and the same figures over as long a stretch
just before the request (the control: what the machine does without a capture).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from rltperf_tui.bench.feed import LIMIT_MS, Feed, limit_ms, unprofiled_median_ms

AFTER_S = 1.0
"""Seconds after a capture's bundle is saved that are still checked."""


@dataclass
class WindowStalls:
    """The worst step and gap of a capture's window and after, against the limit."""

    median_ms: float | None
    """Median of the unprofiled steps before the request."""
    limit_ms: float
    worst_step_ms: float
    worst_step_id: int | None
    worst_gap_ms: float
    worst_gap_after: int | None
    """Step id before the worst gap."""
    steps_checked: int

    @property
    def held(self) -> bool:
        """No step and no gap over the limit."""
        return self.worst_step_ms <= self.limit_ms and self.worst_gap_ms <= self.limit_ms


def stalls(steps: list[Any], start_ns: int, end_ns: int, requested_ns: int) -> WindowStalls:
    """The worst step and gap among ``steps`` from ``start_ns`` to ``end_ns``.  A gap after a
    step that left no request running or waiting is the engine's idle time (the clients
    had sent nothing), not a stall, and is not counted."""
    med = unprofiled_median_ms(steps, requested_ns)
    limit = limit_ms(med) or LIMIT_MS
    win = sorted(
        (r for r in steps if r.end_ns >= start_ns and r.start_ns <= end_ns), key=lambda r: r.start_ns
    )
    ws, wsid, wg, wgid = 0.0, None, 0.0, None
    for i, r in enumerate(win):
        ms = (r.end_ns - r.start_ns) / 1e6
        if ms > ws:
            ws, wsid = ms, r.step_id
        prev = win[i - 1] if i else None
        if prev is not None and (
            prev.running or prev.waiting
        ):  # after a step that left no work, a gap is idle
            g = (r.start_ns - prev.end_ns) / 1e6
            if g > wg:
                wg, wgid = g, prev.step_id
    return WindowStalls(med, limit, ws, wsid, wg, wgid, len(win))


def window_stalls(
    steps: list[Any], capture: dict[str, Any], after_s: float = AFTER_S, control: bool = False
) -> WindowStalls:
    """``stalls`` of a bundle's capture (its ``meta.json`` ``capture``): from its warm-up
    step (or window start) to ``after_s`` after its export ended.  ``control``: the same
    length of time just before the request instead (no capture running: the machine's
    own noise, to read the capture's figure against)."""
    by_id = {r.step_id: r for r in steps}
    warm = by_id.get(capture.get("profiler_warmup_step"))
    start = warm.start_ns if warm is not None else int(capture.get("window_start_ns") or 0)
    end = int(capture.get("window_end_ns") or start) + int((capture.get("export_s") or 0.0) * 1e9)
    end += int(after_s * 1e9)
    req = int(capture.get("requested_ns") or start)
    if control:
        start, end = req - (end - start), req
    return stalls(steps, start, end, req)


_LOAD_SCRIPT = """
import json, sys, threading, time, urllib.request
url, conc, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = json.dumps({"model": model, "prompt": "def f(x): return x *", "max_tokens": 64}).encode()
def one():
    while True:
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
        except OSError:
            time.sleep(0.2)
for _ in range(conc):
    threading.Thread(target=one, daemon=True).start()
sys.stdin.read()  # until the bench closes the pipe (or ends)
"""
"""``--load``'s clients, in a process of their own: in the bench's process they would share
its GIL with the stream reader, so a burst of records could hold their requests back."""


def _load(url: str, conc: int) -> subprocess.Popen[bytes]:
    """``conc`` clients sending 64-token completions back to back until the process is ended."""
    return subprocess.Popen(
        [sys.executable, "-c", _LOAD_SCRIPT, url, str(conc), _model(url)], stdin=subprocess.PIPE
    )


def _model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def _one(feed: Any, session: Any, other: Any, mode: str, steps: int, path: str) -> dict[str, Any]:
    """One capture through ``session`` (the plugin's, or ``other``: the ``vllm+http://``
    one) while ``feed`` (the plugin's stream) collects the engine core's steps."""
    from engine_adapters.definitions.records import FLAG_PROFILED, CaptureDone, CaptureFailed, Refused

    req_ns = time.perf_counter_ns()
    cid = session.request_capture(steps, mode, "bench")

    def answer(r: Any) -> bool:
        return isinstance(r, (CaptureDone, CaptureFailed, Refused)) and getattr(r, "capture_id", None) == cid

    done: Any = None
    deadline = time.monotonic() + 300
    while done is None and time.monotonic() < deadline:
        done = feed.read(0.05, answer)  # the plugin's stream (and rltperf's replies)
        for r in other.read(0.01):  # vLLM's path's replies (read on either path: never left to pile up)
            if done is None and answer(r):
                done = r
    done_ns = time.perf_counter_ns()
    feed.read(AFTER_S + 0.5)
    if not isinstance(done, CaptureDone):
        return {"path": path, "error": getattr(done, "reason", "no answer within 300 s")}
    h = feed.history
    if path == "rltperf":
        with open(done.bundle + "/meta.json", encoding="utf-8") as f:
            cap = json.load(f)["capture"]
        w, ctl = window_stalls(h, cap), window_stalls(h, cap, control=True)
    else:  # vLLM's profiler: its window is the steps the plugin flagged profiled
        first = next((r for r in h if r.start_ns >= req_ns and r.flags & FLAG_PROFILED), None)
        start, end = first.start_ns if first else req_ns, done_ns + int(AFTER_S * 1e9)
        w, ctl = stalls(h, start, end, req_ns), stalls(h, req_ns - (end - start), req_ns, req_ns)
    return {"path": path, "mode": mode, "steps_captured": done.steps_captured, "via": done.via, **asdict(w),
            "held": w.held, "control_step_ms": ctl.worst_step_ms, "control_gap_ms": ctl.worst_gap_ms}  # fmt: skip


def run_vllm(args: Any) -> dict[str, Any]:
    """Both paths on one server; medians and worst per path."""
    from engine_adapters.monitor.registry import adapter_for
    from engine_adapters.monitor.vllm.plugin_capture import VIA_VLLM

    url = args.vllm_url.rstrip("/")
    loader = _load(url, args.load) if args.load else None
    host = url.split("://", 1)[-1]
    feed = Feed(adapter_for(args.target, reconnect=False).connect(), None)
    vsess = adapter_for(f"vllm+http://{host}", reconnect=False, capture_via=VIA_VLLM).connect()
    runs: list[dict[str, Any]] = []
    try:
        feed.read(3.0)
        for _ in range(max(1, args.repeats)):
            for path, sess in (("rltperf", feed.session), ("vllm", vsess)):
                runs.append(_one(feed, sess, vsess, args.modes.split(",")[0], args.steps, path))
                del feed.history[:-20000]
                feed.read(1.0)
    finally:
        if loader is not None:
            loader.kill()
            loader.wait()
        vsess.close()
        feed.session.close()
    paths: dict[str, Any] = {}
    for path in ("rltperf", "vllm"):
        rs = [r for r in runs if r["path"] == path and "error" not in r]
        paths[path] = {
            "captures": len(rs),
            "failed": [r["error"] for r in runs if r["path"] == path and "error" in r],
            "median_ms": statistics.median([r["median_ms"] for r in rs if r["median_ms"]]) if rs else None,
            "limit_ms": statistics.median([r["limit_ms"] for r in rs]) if rs else None,
            "worst_step_ms": max((r["worst_step_ms"] for r in rs), default=None),
            "worst_gap_ms": max((r["worst_gap_ms"] for r in rs), default=None),
            "held": sum(1 for r in rs if r["held"]),
            "control_step_ms": max((r["control_step_ms"] for r in rs), default=None),
            "control_gap_ms": max((r["control_gap_ms"] for r in rs), default=None),
            "via": next((r["via"] for r in rs if r.get("via")), None),
        }
    return {"kind": "vllm", "target": args.target, "vllm_url": url, "steps_per_capture": args.steps,
            "repeats": args.repeats, "paths": paths, "runs": runs,
            "ok": all(p["captures"] and not p["failed"] for p in paths.values())}  # fmt: skip


def print_vllm(r: dict[str, Any]) -> None:
    """The figures of ``run_vllm``, one line per path."""

    def f(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    print(
        f"capture cost on the vLLM server {r['vllm_url']} (plugin stream {r['target']}): {r['repeats']} captures "
        f"of {r['steps_per_capture']} steps per path; from the first profiled step to {AFTER_S:g} s after the "
        "bundle was saved, engine core steps from the plugin's records"
    )
    for name, p in r["paths"].items():
        print(
            f"{name:<8} median unprofiled step {f(p['median_ms'])} ms, limit 3 x p50 + 20 = {f(p['limit_ms'])} ms: "
            f"worst step {f(p['worst_step_ms'])} ms, worst gap {f(p['worst_gap_ms'])} ms; "
            f"{p['held']}/{p['captures']} captures within the limit  ({p['via'] or ''})"
        )
        print(
            f"{'':<8} control (as long, just before each request, no capture): worst step "
            f"{f(p['control_step_ms'])} ms, worst gap {f(p['control_gap_ms'])} ms"
        )
        for e in p["failed"]:
            print(f"   failed: {e}")
    print("OK" if r["ok"] else "SOME CAPTURES FAILED")
