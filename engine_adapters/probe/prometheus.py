"""Fleet export: the probe's numbers as Prometheus metrics (``Probe(prometheus_port=P)``).

Existing Prometheus/Grafana set-ups scrape every engine; ``rltperf attach`` stays the
per-server deep view.  The exporter has its own ``CollectorRegistry`` (nothing of the
host process's default registry leaks in or out) and its own HTTP server thread; it is
fed in the probe's publisher thread with the same record batches subscribers get, so
the engine thread never pays for it.

Metrics (Prometheus naming: ``rltperf_`` prefix, base units, ``_total`` counters):

===========================================  =========  ===========================================
rltperf_engine_info                          info       engine, model, dtype, device, random_weights
rltperf_step_duration_seconds                histogram  step time (end - start), label ``kind``
rltperf_step_gap_seconds                     histogram  start of step k+1 - end of step k
rltperf_output_tokens_total                  counter    tokens produced
rltperf_device_busy_seconds_total            counter    device busy time the engine reported
rltperf_model_bytes_total                    counter    analytic bytes read + written
rltperf_model_flops_total                    counter    analytic FLOPs
rltperf_device_idle_ratio                    gauge      1 - busy / wall over the last ``window_s``
rltperf_model_bandwidth_utilization_ratio    gauge      MBU over the last ``window_s`` (needs a peak)
rltperf_window_stale_seconds                 gauge      0, or the age of the idle/MBU shown (see below)
rltperf_peak_memory_bandwidth_bytes_per_second gauge    the peak MBU is measured against, label ``source``
rltperf_exit_depth_tokens_total              counter    tokens by exit depth, label ``depth``
rltperf_spec_drafts_total                    counter    draft sequences proposed
rltperf_spec_draft_tokens_total              counter    draft tokens proposed
rltperf_spec_accepted_tokens_total           counter    draft tokens accepted (acceptance = ratio of rates)
rltperf_requests_total                       counter    finished requests, label ``status``
rltperf_time_to_first_token_seconds          histogram  TTFT of ok requests
rltperf_time_per_output_token_seconds        histogram  TPOT of ok requests with ≥ 2 tokens
rltperf_profiled_steps_total                 counter    steps run under the profiler (not baseline)
rltperf_captures_total                       counter    captures, labels ``mode``, ``result`` (saved/failed)
rltperf_probe_dropped_records_total          counter    step records lost by the probe's ring
rltperf_device_utilization_ratio             gauge      NVML utilisation (coarse), label ``device``
rltperf_device_memory_used_bytes             gauge      device memory used, label ``device``
rltperf_device_energy_joules_total           counter    the device's energy counter since the probe started,
                                                        label ``device``, ``source`` (nvml/rapl; never estimated)
===========================================  =========  ===========================================

The window gauges are ``engine_adapters.definitions.figures``'s definitions, the same code the
monitor and ``rltperf summary`` run: the window is the last ``window_s`` of wall time
up to the moment of the scrape (up to the start of a step still running), so the
gauges move to idle 1 and MBU 0 when the engine stops stepping instead of freezing at
their last value; profiled, exporting and warm-up steps leave them.  While those own
most of the window (a capture's export longer than it: ``figures.blind``), the gauges
hold the newest figures of a window that was not blind (``figures.HeldFigures``) and
``rltperf_window_stale_seconds`` says how old they are.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter_ns as _clk
from typing import Any, Protocol

import numpy as np

from engine_adapters.definitions import figures as F
from engine_adapters.definitions.records import (
    FLAG_PROFILED,
    CaptureDone,
    CaptureFailed,
    CaptureStarted,
    DeviceSample,
    EngineInfo,
    RequestRecord,
    StepRecord,
)

log = logging.getLogger("rltperf.probe.prometheus")

STEP_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Step-time and gap buckets, seconds (50 µs … 10 s)."""
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""TTFT/TPOT buckets, seconds."""
DEFAULT_WINDOW_S = 10.0


class ProbeView(Protocol):
    """What the exporter reads of a ``Probe`` (its public API only)."""

    engine_info: EngineInfo

    @property
    def ring_dropped(self) -> int: ...

    def in_step_since(self) -> int: ...

    def add_observer(self, fn: Callable[[list[Any]], Any]) -> None: ...


class _WindowCollector:
    """Scrape-time gauges over the recent window, and the probe's drop counter."""

    def __init__(self, exp: PrometheusExporter) -> None:
        self.exp = exp

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        idle, mbu = self.exp.window_figures()
        w = self.exp.window_s
        st = GaugeMetricFamily(
            "rltperf_window_stale_seconds",
            "0, or how old the window gauges (idle, MBU, step percentiles) are: held over a window a capture's export owns",
        )
        st.add_metric([], self.exp.stale_s or 0.0)
        yield st
        g = GaugeMetricFamily(
            "rltperf_device_idle_ratio",
            f"Device idle fraction over the last {w:g} s of steps: 1 - sum(busy) / wall (NaN until busy is known)",
        )
        g.add_metric([], float("nan") if idle is None else idle)
        yield g
        m = GaugeMetricFamily(
            "rltperf_model_bandwidth_utilization_ratio",
            f"Model bandwidth utilisation over the last {w:g} s: bytes / (wall x peak bandwidth) (NaN without a peak)",
        )
        m.add_metric([], float("nan") if mbu is None else mbu)
        yield m
        q = GaugeMetricFamily(
            "rltperf_window_step_duration_seconds",
            f"Step time percentiles over the last {w:g} s of steps, exact (pooled samples, the screen's "
            "and summary's figure; profiled, exporting and warm-up steps left out; NaN without steps)",
            labels=["percentile"],  # not "quantile": that label is a summary's (promtool lints it)
        )
        for p in F.PERCENTILES:
            v = self.exp.step_pct[f"p{p}"]
            q.add_metric([str(p)], float("nan") if v is None else v)
        yield q
        c = CounterMetricFamily(
            "rltperf_probe_dropped_records",
            "Step records lost because the publisher fell a whole ring behind",
        )
        c.add_metric([], float(self.exp.probe.ring_dropped))
        yield c


DEFAULT_HOST = "127.0.0.1"
"""Where the metrics are served unless a host is given: loopback, whatever the probe
listens on, because ``/metrics`` has no authentication (the probe's token does not
cover it); serving them further is an explicit choice (``--prometheus-listen``)."""


class PrometheusExporter:
    """Serves the probe's metrics on ``host:port`` (``DEFAULT_HOST`` unless given; port 0 = any).

    ``address`` is ``host:port`` actually bound; ``close()`` stops the server.
    """

    def __init__(
        self, probe: ProbeView, port: int, window_s: float = DEFAULT_WINDOW_S, host: str | None = None
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

        self.probe = probe
        self.window_s = float(window_s)
        self._lock = threading.Lock()
        self._win: deque[tuple[int, int, float, float, int]] = deque()
        self._win_before = 0  # end of the newest step pruned from the window
        self._started = _clk()
        self._busy_seen = False
        self._bytes_seen = False
        self._last_id: int | None = None
        self._last_end = 0
        self._cap_mode: dict[str, str] = {}
        self._held: F.HeldFigures[tuple[float | None, float | None, dict[str, float | None]]] = (
            F.HeldFigures()
        )
        self.stale_s: float | None = None
        """Age of the last ``window_figures`` when they were held over a blind window."""
        self.step_pct: dict[str, float | None] = F.pct(np.zeros(0))
        """Step time P50/P95/P99 (seconds) over the last ``window_figures`` window."""
        reg = self.registry = CollectorRegistry(auto_describe=True)
        info = probe.engine_info
        Info("rltperf_engine", "The engine this probe runs in", registry=reg).info(
            {
                "engine": info.name or "",
                "model": info.model or "",
                "dtype": info.dtype or "",
                "device": info.device or "",
                "random_weights": str(bool(info.random_weights)).lower(),
            }
        )
        self.step_seconds = Histogram(
            "rltperf_step_duration_seconds",
            "Engine step time (end - start)",
            ["kind"],
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        self.gap_seconds = Histogram(
            "rltperf_step_gap_seconds",
            "Start of step k+1 minus end of step k",
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        self.tokens = Counter("rltperf_output_tokens", "Tokens produced by engine steps", registry=reg)
        self.busy = Counter(
            "rltperf_device_busy_seconds", "Device busy time reported by the engine", registry=reg
        )
        self.nbytes = Counter(
            "rltperf_model_bytes", "Analytic bytes read + written by engine steps", registry=reg
        )
        self.flops = Counter(
            "rltperf_model_flops", "Analytic floating-point operations of engine steps", registry=reg
        )
        self.exit_tokens = Counter(
            "rltperf_exit_depth_tokens", "Tokens by the loop depth they exited at", ["depth"], registry=reg
        )
        self.drafts = Counter("rltperf_spec_drafts", "Speculative draft sequences proposed", registry=reg)
        self.drafted = Counter("rltperf_spec_draft_tokens", "Speculative draft tokens proposed", registry=reg)
        self.accepted = Counter(
            "rltperf_spec_accepted_tokens", "Speculative draft tokens accepted", registry=reg
        )
        self.requests = Counter(
            "rltperf_requests",
            "Finished requests by status (failed ones are counted)",
            ["status"],
            registry=reg,
        )
        self.ttft = Histogram(
            "rltperf_time_to_first_token_seconds",
            "Time to first token of ok requests",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.tpot = Histogram(
            "rltperf_time_per_output_token_seconds",
            "Time per output token after the first, ok requests with >= 2 tokens",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.profiled = Counter(
            "rltperf_profiled_steps", "Steps run with the profiler on (not baseline timings)", registry=reg
        )
        self.captures = Counter(
            "rltperf_captures", "Profiler captures by mode and result", ["mode", "result"], registry=reg
        )
        self.dev_util = Gauge(
            "rltperf_device_utilization_ratio",
            "NVML utilisation: share of the sample period with a kernel running (coarse)",
            ["device"],
            registry=reg,
        )
        self.dev_mem = Gauge(
            "rltperf_device_memory_used_bytes", "Device memory used", ["device"], registry=reg
        )
        self.energy = Counter(
            "rltperf_device_energy_joules",
            "Energy the device's own counter (NVML or RAPL) measured since the probe started; whole-device",
            ["device", "source"],
            registry=reg,
        )
        self._energy_last: dict[str, float] = {}
        self.peak_gauge = Gauge(
            "rltperf_peak_memory_bandwidth_bytes_per_second",
            "Peak memory bandwidth MBU is measured against",
            ["source"],
            registry=reg,
        )
        self.peak_bw_gbps: float | None = None
        try:
            from engine_adapters.definitions.ceilings import ceiling_for

            c = ceiling_for(info.device, info.dtype)
        except Exception:
            c = None
        if c is not None and c.peak_bw_gbps:
            self.peak_bw_gbps = c.peak_bw_gbps
            self.peak_gauge.labels(source=c.source).set(c.peak_bw_gbps * 1e9)
        reg.register(_WindowCollector(self))

        host = (host or DEFAULT_HOST).strip("[]")
        self._server, self._thread = start_http_server(port, addr=host, registry=reg)
        bound = self._server.server_address
        self.port = int(bound[1])
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        """``host:port`` the metrics are served on (``/metrics``)."""
        probe.add_observer(self.observe)
        log.info("Prometheus metrics on http://%s/metrics", self.address)

    # -- feeding (publisher thread) --------------------------------------------------------

    def _control(self, rec: Any) -> None:
        if isinstance(rec, CaptureStarted):
            self._cap_mode[rec.capture_id] = rec.mode
        elif isinstance(rec, CaptureDone):
            self._cap_mode.pop(rec.capture_id, None)
            self.captures.labels(mode=rec.mode, result="saved").inc()
        elif isinstance(rec, CaptureFailed):
            mode = self._cap_mode.pop(rec.capture_id, "unknown")
            self.captures.labels(mode=mode, result="failed").inc()

    def observe(self, recs: list[Any]) -> None:
        """Update the metrics from one batch of records (called by the publisher)."""
        win_add: list[tuple[int, int, float, float, int]] = []
        for r in recs:
            if isinstance(r, StepRecord):
                dur = (r.end_ns - r.start_ns) / 1e9
                self.step_seconds.labels(kind=r.kind).observe(dur)
                if self._last_id is not None and r.step_id == self._last_id + 1:
                    self.gap_seconds.observe((r.start_ns - self._last_end) / 1e9)
                self._last_id = r.step_id
                self._last_end = r.end_ns
                if r.out_tokens:
                    self.tokens.inc(r.out_tokens)
                if r.busy_ns is not None:
                    self.busy.inc(r.busy_ns / 1e9)
                    self._busy_seen = True
                nb: float | None = None
                if r.bytes_read is not None or r.bytes_written is not None:
                    nb = float((r.bytes_read or 0) + (r.bytes_written or 0))
                    self.nbytes.inc(nb)
                    self._bytes_seen = True
                if r.flops is not None:
                    self.flops.inc(r.flops)
                if r.exit_hist:
                    for d, n in enumerate(r.exit_hist, 1):
                        if n:
                            self.exit_tokens.labels(depth=str(d)).inc(n)
                if r.spec_drafts:
                    self.drafts.inc(r.spec_drafts)
                if r.spec_drafted:
                    self.drafted.inc(r.spec_drafted)
                if r.spec_accepted:
                    self.accepted.inc(r.spec_accepted)
                if r.flags & FLAG_PROFILED:
                    self.profiled.inc()
                win_add.append(
                    (
                        r.start_ns,
                        r.end_ns,
                        math.nan if r.busy_ns is None else float(r.busy_ns),
                        math.nan if nb is None else nb,
                        r.flags,
                    )
                )
            elif isinstance(r, RequestRecord):
                self.requests.labels(status=r.status).inc()
                if r.status == "ok" and r.first_token_ns is not None:
                    self.ttft.observe((r.first_token_ns - r.arrival_ns) / 1e9)
                    if r.output_tokens > 1:
                        self.tpot.observe((r.finish_ns - r.first_token_ns) / (r.output_tokens - 1) / 1e9)
            elif isinstance(r, DeviceSample):
                dev = f"{r.kind}:{r.index}"
                if r.gpu_util is not None:
                    self.dev_util.labels(device=dev).set(r.gpu_util)
                if r.mem_used is not None:
                    self.dev_mem.labels(device=dev).set(r.mem_used)
                if r.energy_j is not None and r.energy_source:
                    last = self._energy_last.get(dev)
                    self._energy_last[dev] = r.energy_j
                    c = self.energy.labels(device=dev, source=r.energy_source)
                    if last is not None and r.energy_j >= last:  # a counter only counts up
                        c.inc(r.energy_j - last)
            elif isinstance(r, (CaptureStarted, CaptureDone, CaptureFailed)):
                self._control(r)
        if win_add:
            with self._lock:
                self._win.extend(win_add)
                horizon = self._win[-1][1] - int(self.window_s * 1e9)
                while self._win and self._win[0][1] <= horizon:
                    self._win_before = self._win.popleft()[1]

    def window_figures(self, now_ns: int | None = None) -> tuple[float | None, float | None]:
        """(idle fraction, MBU) over the last ``window_s`` of wall time up to now (up to
        the start of a step still running), by ``engine_adapters.definitions.figures``;
        held over a blind window (``stale_s`` then says how old they are)."""
        now = _clk() if now_ns is None else now_ns
        since = self.probe.in_step_since()
        with self._lock:
            rows = list(self._win)
            before = self._win_before
        w1 = min(now, since) if since else now
        if rows:
            w1 = max(w1, rows[-1][1])
        w0 = max(self._started, w1 - int(self.window_s * 1e9))
        if w1 <= w0:
            return None, None
        if rows:
            start, end, busy, nbytes, flags = (np.array(c) for c in zip(*rows, strict=True))
        else:
            start = end = flags = np.zeros(0, dtype=np.int64)
            busy = nbytes = np.zeros(0)
        # the screen's step percentiles: steps that end inside the window, less the excluded
        keep = (end > w0) & ((flags & F.EXCLUDED_FLAGS) == 0)
        step_pct = F.pct((end[keep] - start[keep]) / 1e9)
        fig = F.window_figures(
            start=start,
            end=end,
            flags=flags,
            busy=busy,
            nbytes=nbytes,
            flops=np.full(start.size, np.nan),
            tokens=np.zeros(start.size),
            w0_ns=w0,
            w1_ns=w1,
            owned_lo=F.owned_from(start, end, before or (int(start[0]) if start.size else w0)),
            reported=(self._busy_seen, self._bytes_seen, False),
        )
        (idle, mbu, self.step_pct), self.stale_s = self._held.show(
            (fig.idle_fraction, fig.mbu(self.peak_bw_gbps), step_pct), F.blind(fig), w1
        )
        return idle, mbu

    def close(self) -> None:
        """Stop serving."""
        try:
            self._server.shutdown()
            self._server.server_close()
        except Exception:  # never let shutdown of metrics take the engine's close down
            log.debug("prometheus server close failed", exc_info=True)
