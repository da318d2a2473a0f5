"""The engines of one vLLM server: ``vllm+http://HOST:PORT?engine=N`` targets.

A server started with ``--data-parallel-size N`` (internal load balancing) runs N engine
cores behind one API server, and its ``/metrics`` carries every ``vllm:*`` family once
per engine, labelled ``engine="0"`` ... ``engine="N-1"``.  A target may name one of them:
``vllm+http://HOST:PORT?engine=1`` keeps only that engine's series (and the unlabelled
ones), so each engine is a replica of its own, exactly as separate servers on separate
URLs are.  ``?engine=all`` keeps the sum over engines (what a plain target gives).

``engine_targets(target)`` is how the monitor expands a plain target of such a server
into one target per engine (``rltperf attach``, ``--auto``, ``--jsonl``).
"""

from __future__ import annotations

from time import perf_counter_ns as _clk
from urllib.parse import parse_qs

from engine_adapters.monitor.vllm.http import HttpClient, ServerUnreachable
from engine_adapters.monitor.vllm.metrics import ScrapeError, parse_scrape

ALL = "all"
"""``?engine=all``: the server's figures summed over its engines (no expansion)."""


def split_target(target: str) -> tuple[str, str | None]:
    """``(target without its query, engine)`` of ``vllm+http://HOST:PORT?engine=N``; the
    engine is None without ``?engine=`` (raises ValueError for another query)."""
    base, sep, query = target.partition("?")
    if not sep:
        return target, None
    q = parse_qs(query, keep_blank_values=True)
    if set(q) != {"engine"} or len(q["engine"]) != 1 or not q["engine"][0]:
        raise ValueError(
            f"the only query a vllm+http:// target takes is ?engine=N or ?engine={ALL}, not ?{query}"
        )
    eng = q["engine"][0]
    if eng != ALL and not eng.isdigit():
        raise ValueError(f"?engine= takes an engine number (vLLM's engine label) or {ALL}, not {eng!r}")
    return base, eng


def server_engines(base_url: str, timeout: float = 5.0) -> list[str]:
    """The ``engine`` label values on the server's ``/metrics``, in numeric order (empty
    when it does not answer or labels nothing)."""
    try:
        status, body = HttpClient(base_url, timeout=timeout).request("GET", "/metrics")
        if status != 200:
            return []
        engines = parse_scrape(body.decode("utf-8", "replace"), _clk()).engines
    except (ServerUnreachable, ScrapeError, ValueError):
        return []
    return sorted(engines, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e))


def engine_targets(target: str, timeout: float = 5.0) -> list[str]:
    """``target`` as one target per engine when it names a whole server with two or more
    engines (``...?engine=0``, ``...?engine=1``...); else ``[target]`` unchanged."""
    if not target.startswith(("vllm+http://", "vllm+https://")):
        return [target]
    try:
        base, eng = split_target(target)
    except ValueError:
        return [target]  # the adapter says what is wrong with it
    if eng is not None:
        return [target]
    scheme, _, rest = base.partition("://")
    engines = server_engines(f"{scheme[len('vllm+') :]}://{rest.rstrip('/')}", timeout)
    if len(engines) < 2:
        return [target]
    return [f"{base.rstrip('/')}?engine={e}" for e in engines]
