"""The record schema: one tagged union that travels on the socket, in recordings and in bundles.

Every record is a frozen, keyword-only ``msgspec.Struct`` encoded as a msgpack *array*
(``array_like=True``) whose first element is the tag.  Arrays keep frames small and
decoding fast; evolution works by appending: a new field is optional (has a default)
and goes at the end, so an older reader ignores it and a newer reader fills the default
when it is missing (msgspec's schema-evolution rules for array-like structs).

``SCHEMA_VERSION`` is exchanged in the hello messages.  It changes only when a change is
*not* an append (a field removed, re-typed or re-ordered); a peer with a different
version is refused with a message saying both versions.

Units: times are host monotonic nanoseconds (``time.perf_counter_ns``, CLOCK_MONOTONIC
on Linux, shared by all processes on one host) unless a name says otherwise; sizes are
bytes; fractions are 0..1; ``None`` means "not known / not available", never zero.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA_VERSION = 1
"""Version of this schema; bumped only on a change that is not an optional append."""

# Step flags (``StepRecord.flags`` bit field).
FLAG_WARMUP = 1
"""The step ran during the engine's warm-up (compilation, first shapes)."""
FLAG_PROFILED = 2
"""A profiler was active during the step: its timings are not a baseline."""
FLAG_EXPORTING = 4
"""A capture export ran (in another thread of the engine process) during the step."""
FLAG_PROFILER_WARMUP = 8
"""The profiler's own warm-up step before a capture window (profiled, not in the trace)."""

STANDARD_STAGES: tuple[str, ...] = (
    "schedule",
    "prepare",
    "forward",
    "exit_check",
    "sample",
    "draft",
    "verify",
    "accept",
    "update",
)
"""Stage names every adapter understands; engines may add their own."""

CaptureMode = Literal["ops", "full"]


class _Rec(msgspec.Struct, frozen=True, kw_only=True, array_like=True, tag=True, gc=False):
    """Base of all wire records (tagged, array-like, frozen).

    ``gc=False``: the cyclic garbage collector does not track records (a frozen record
    holds numbers, strings and lists of them, and never itself), so a monitor decoding
    1,000 steps/s does not trigger collections with them, and decodes them faster
    (``FrameReader.feed`` of ``bench.ingest.synthetic_stream``'s frames: 1.49 -> 1.32 µs a
    record on 2026-12-07; ``rltperf bench ingest``'s decode figure moves more than that)."""


class EngineInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the engine says about itself; the source of a bundle's ``contract``.

    Fields the engine cannot know are left ``None``; the bundle writer turns them into
    ``"unknown: <why>"``.  ``contract`` carries any further test-contract field by its
    contract name (see ``engine_adapters.definitions.contract.CONTRACT_FIELDS``).
    """

    name: str
    """Engine name, e.g. ``"rltperf-reference"`` or ``"vllm"``."""
    version: str | None = None
    """Engine version string."""
    model: str | None = None
    """Model name or path."""
    model_shape: dict[str, Any] = {}
    """Shape facts: hidden, ffn, layers, heads, kv_heads, head_dim, vocab, params (count)."""
    dtype: str | None = None
    """Weight/activation dtype, e.g. ``"bfloat16"``."""
    quantization: str | None = None
    """Quantisation method, or ``"none"``."""
    device: str | None = None
    """Main device the engine runs on, e.g. ``"cpu"`` or ``"cuda:0"``."""
    max_loops: int | None = None
    """Loop passes of the shared block at full depth (Ouro ``total_ut_steps``)."""
    loop_config: str | None = None
    """Human-readable loop configuration (prelude / shared block / coda)."""
    exit_config: str | None = None
    """Exit policy and mode, e.g. ``"gate:0.8 compact"``."""
    kv_policy: str | None = None
    """``"per_depth"`` (one cache per loop depth and layer) or ``"shared"``."""
    spec_config: str | None = None
    """Speculative decoding configuration, or ``None`` when off."""
    kv_capacity_blocks: int | None = None
    """KV capacity in blocks (all depths together)."""
    kv_block_tokens: int | None = None
    """Tokens per KV block."""
    max_requests: int | None = None
    """Maximum concurrently running requests (``max_num_seqs``)."""
    token_budget: int | None = None
    """Maximum tokens per engine step."""
    workload: str | None = None
    """Description of the driving workload (load generator, dataset)."""
    random_weights: bool | None = None
    """True when the weights are random: results are capacity/performance studies only."""
    pid: int | None = None
    """Engine process id."""
    host: str | None = None
    """Host name of the engine."""
    contract: dict[str, Any] = {}
    """Further test-contract fields by contract name (values as the engine knows them)."""
    dp_rank: int | None = None
    """Data-parallel rank of the engine this stream comes from (vLLM: its ``EngineCore_DP<n>``)."""
    tp_size: int | None = None
    """Tensor-parallel ranks of this engine."""
    pp_size: int | None = None
    """Pipeline stages of this engine."""
    ranks: list[str] | None = None
    """The engine's workers this stream reports, in rank order (``tp0``, ``tp1``;
    ``pp1-tp0`` with pipeline stages; ``engine_adapters.definitions.ranks``): the
    index of every per-rank field of ``StepRecord``."""
    probes: list[str] | None = None
    """Where this engine's steps stream from, as ``rltperf attach`` takes them
    (``tcp://HOST:PORT``): the rltperf probes a vLLM server's plugin announced (one per
    data-parallel engine the target covers).  None: not known (not announced, or the
    plugin runs without ``RLTPERF_PROBE``)."""


class Ceiling(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Peak figures of the engine's device, for MBU and the roofline."""

    device: str
    """Device name the figures belong to (NVML name, or the CPU model)."""
    peak_bw_gbps: float | None = None
    """Peak memory bandwidth, GB/s (10^9 B/s), counting bytes read + written."""
    peak_gflops: float | None = None
    """Peak dense FLOP/s in the engine's dtype, GFLOP/s (10^9 FLOP/s)."""
    dtype: str | None = None
    """Dtype the FLOP/s figure is for."""
    source: str = "unknown"
    """``"calibration"`` (measured by ``rltperf calibrate``), ``"quick calibration"`` (a
    sub-second CPU measurement made when nothing was cached), ``"spec table"`` or ``"unknown"``."""
    detail: str | None = None
    """What was measured (sizes, repetitions, date) or which datasheet row matched."""


# --------------------------------------------------------------------------- client -> probe


class ClientHello(_Rec, tag="chello", frozen=True):
    """First frame a monitor sends after connecting."""

    schema: int
    """The client's ``SCHEMA_VERSION``."""
    client: str = "rltperf"
    """Client name and version, for the probe's log."""
    token: str | None = None
    """Shared secret; required when the probe listens on a non-loopback address."""


MAX_CAPTURE_STEPS = 1024
"""Largest capture window (N) anyone accepts: the probe, the vLLM path, the monitor, the
command.  Captures are meant to be small; 1024 decode steps is already seconds of trace."""
CAPTURE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
"""What a ``Capture.capture_id`` may be (it becomes part of file names on the engine host)."""


class TriggerInfo(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """Why a capture was asked for by a trigger rule (``rltperf_tui.live.triggers``)."""

    rule: str
    """The rule as written, e.g. ``step_ms>150``."""
    figure: str
    """The figure it tests."""
    value: float
    """The value that broke it."""
    threshold: float
    """The rule's threshold (fractions for idle/MBU)."""
    ts_ns: int = 0
    """When it broke (probe clock): the offending step's end, or the window's end."""
    step_id: int | None = None
    """The offending step (per-step rules), or None (window rules)."""


class Capture(_Rec, tag="capture", frozen=True):
    """Ask the engine for a bounded profiler capture of ``steps`` complete steps."""

    capture_id: str
    """Identifier chosen by the client; echoed in every capture reply."""
    steps: int
    """Number of complete engine steps to capture (N)."""
    mode: str = "ops"
    """``"ops"`` (CPU + device activities) or ``"full"`` (shapes, memory and stacks too)."""
    label: str | None = None
    """Free label, sanitised into the bundle folder name."""
    token: str | None = None
    """Shared secret, when the probe requires one."""
    trigger: TriggerInfo | None = None
    """Set when a trigger rule asked for this capture: the bundle says why it exists."""


class Ping(_Rec, tag="ping", frozen=True):
    """Keep-alive from a client; the probe answers with a ``Stats`` record."""

    sent_ns: int = 0
    """Client monotonic time at sending."""


# --------------------------------------------------------------------------- probe -> client


class Hello(_Rec, tag="hello", frozen=True):
    """First frame the probe sends to each subscriber."""

    schema: int
    """The probe's ``SCHEMA_VERSION``."""
    engine: EngineInfo
    """Engine information (model, config, contract)."""
    stage_names: list[str]
    """Names of ``StepRecord.stage_ns`` entries, by index."""
    probe_version: str = ""
    """rltperf version of the probe."""
    wall_minus_mono_ns: int = 0
    """``time.time_ns() - time.perf_counter_ns()`` at the probe, to show wall-clock times."""
    ceiling: Ceiling | None = None
    """Peak figures of the engine's device, when known."""
    started_ns: int = 0
    """Monotonic time the probe started."""
    capabilities: list[str] = []
    """What this probe supports, e.g. ``["capture", "device_samples"]``."""


class StageTable(_Rec, tag="stages", frozen=True):
    """New stage names appeared; replaces ``Hello.stage_names``."""

    stage_names: list[str]
    """Names of ``StepRecord.stage_ns`` entries, by index."""


class StepRecord(_Rec, tag="step", frozen=True):
    """One engine step."""

    step_id: int
    """Engine step counter (monotonic, no gaps unless records were dropped)."""
    start_ns: int
    """Step start, host monotonic ns."""
    end_ns: int
    """Step end, host monotonic ns."""
    kind: str = "decode"
    """``prefill``, ``decode``, ``mixed``, ``draft``, ``verify`` or ``idle``."""
    stage_ns: list[int] = []
    """Time per stage, ns, indexed like ``Hello.stage_names`` (shorter lists: trailing zeros)."""
    batch: int = 0
    """Requests in the step."""
    tokens: int = 0
    """Tokens processed in the step (prefill + decode, drafted included)."""
    prefill_tokens: int = 0
    """Of ``tokens``, prompt tokens."""
    busy_ns: int | None = None
    """Device busy time during the step, ns (CUDA events on GPU; compute regions on CPU)."""
    bytes_read: int | None = None
    """Analytic bytes read from device memory (weights per loop pass run + KV read)."""
    bytes_written: int | None = None
    """Analytic bytes written to device memory (KV written)."""
    flops: float | None = None
    """Analytic floating-point operations of the step."""
    out_tokens: int = 0
    """Tokens produced (committed to outputs) by the step."""
    exit_hist: list[int] | None = None
    """Tokens produced by exit depth: index d-1 counts tokens that exited at loop depth d."""
    loop_ns: list[int] | None = None
    """Time per loop depth of the shared block, ns (index d-1 = depth d)."""
    loop_tokens: list[int] | None = None
    """Tokens that ran at each loop depth (compact exit mode shrinks later depths)."""
    kv_used: int | None = None
    """KV blocks in use after the step."""
    kv_total: int | None = None
    """KV blocks in all."""
    kv_per_depth: list[int] | None = None
    """KV blocks in use per loop depth (per-depth KV policy), index d-1 = depth d."""
    waiting: int | None = None
    """Requests waiting for admission after the step."""
    running: int | None = None
    """Requests running after the step."""
    spec_drafts: int = 0
    """Draft sequences proposed in the step."""
    spec_drafted: int = 0
    """Draft tokens proposed in the step."""
    spec_accepted: int = 0
    """Draft tokens accepted by verification in the step."""
    preempted: int = 0
    """Requests preempted (to be recomputed) in the step."""
    flags: int = 0
    """Bit field of ``FLAG_*``."""
    rank_busy_ns: list[int | None] | None = None
    """Per worker rank (``EngineInfo.ranks`` order): that rank's model forward and LM head
    in this step, ns (None: the rank sent nothing for this step)."""
    rank_wait_ns: list[int | None] | None = None
    """Per worker rank: of ``rank_busy_ns``, the time inside tensor-parallel collectives,
    where the rank waited for the others, ns (None: not measured, e.g. on CUDA)."""
    rank_loop_ns: list[list[int]] | None = None
    """Per worker rank: time per loop depth, ns (as ``loop_ns``; the step's ``loop_ns`` is
    the slowest rank's per depth)."""


class RequestRecord(_Rec, tag="req", frozen=True):
    """One finished (or failed/aborted) request."""

    req_id: str
    """Request identifier."""
    arrival_ns: int
    """Arrival at the engine, host monotonic ns."""
    finish_ns: int
    """Finish (last token, failure or abort), host monotonic ns."""
    first_token_ns: int | None = None
    """First output token, host monotonic ns (None when none was produced)."""
    prompt_tokens: int = 0
    """Prompt length in tokens."""
    output_tokens: int = 0
    """Tokens generated."""
    status: str = "ok"
    """``ok``, ``failed`` or ``aborted``."""
    preemptions: int = 0
    """Times the request was preempted."""


class DeviceSample(_Rec, tag="dev", frozen=True):
    """About 1 Hz per device: utilisation, memory, clocks; host CPU and engine RSS.

    Every field a device cannot provide is ``None`` (shown as N/A), never zero.
    """

    ts_ns: int
    """Sample time, host monotonic ns."""
    index: int = 0
    """Device index (GPU ordinal; 0 for the CPU)."""
    kind: str = "cpu"
    """``cuda`` or ``cpu``."""
    name: str = ""
    """Device name (NVML name or CPU model)."""
    gpu_util: float | None = None
    """NVML utilisation: fraction of the sample period with a kernel running (coarse)."""
    mem_util: float | None = None
    """NVML memory utilisation: fraction of the period with device memory read or written."""
    util_samples: list[float] | None = None
    """Finer NVML utilisation samples since the last sample (fractions)."""
    dram_bw_util: float | None = None
    """GPM DRAM bandwidth utilisation (fraction of peak), Hopper and newer."""
    sm_occupancy: float | None = None
    """GPM SM occupancy (fraction)."""
    tensor_util: float | None = None
    """GPM any-tensor-core utilisation (fraction)."""
    mem_used: int | None = None
    """Device memory used, bytes."""
    mem_total: int | None = None
    """Device memory total, bytes."""
    sm_clock_mhz: float | None = None
    """SM clock, MHz."""
    mem_clock_mhz: float | None = None
    """Memory clock, MHz."""
    power_w: float | None = None
    """Board power, W."""
    temp_c: float | None = None
    """GPU temperature, °C."""
    pcie_tx_bps: float | None = None
    """PCIe transmit throughput, bytes/s."""
    pcie_rx_bps: float | None = None
    """PCIe receive throughput, bytes/s."""
    nvlink_bps: float | None = None
    """NVLink throughput (tx + rx), bytes/s."""
    proc_cpu: float | None = None
    """Engine process CPU use, in cores (1.0 = one core busy)."""
    proc_rss: int | None = None
    """Engine process resident memory, bytes."""
    host_cpu: list[float] | None = None
    """Host CPU use per core (fractions)."""
    host_mem_used: int | None = None
    """Host memory used, bytes."""
    host_mem_total: int | None = None
    """Host memory total, bytes."""
    note: str | None = None
    """A one-off message, e.g. ``"no NVIDIA driver: the CPU is the device"``."""
    energy_j: float | None = None
    """The device's cumulative energy counter, J (only differences mean anything): NVML's
    total energy on a GPU, the CPU packages' RAPL counters (wraps undone) on ``cpu``.
    None: no counter (``energy_na`` says why).  Never estimated (``definitions/energy.py``)."""
    energy_source: str | None = None
    """Where ``energy_j`` comes from: ``nvml`` or ``rapl`` (``definitions.energy.CAVEATS``)."""
    energy_na: str | None = None
    """Why this device has no energy counter, e.g. ``"no NVIDIA driver; RAPL not readable (...)"``."""


class Stats(_Rec, tag="stats", frozen=True):
    """Probe health, about once a second per subscriber."""

    ts_ns: int
    """Probe monotonic time."""
    steps_total: int = 0
    """Steps the engine has run since the probe started."""
    ring_dropped: int = 0
    """Step records lost because the publisher fell a whole ring behind the engine."""
    sub_dropped: int = 0
    """Records dropped for *this* subscriber because it did not read fast enough."""
    subscribers: int = 0
    """Subscribers attached."""
    in_step_since_ns: int = -1
    """At ``ts_ns`` the engine was inside a step that began at this time (probe clock);
    0: between steps (the time since the last step's end is idle, and the heartbeat
    vouches for it); -1: not said (an older probe)."""


class CaptureStarted(_Rec, tag="cap_started", frozen=True):
    """The profiler window began."""

    capture_id: str
    """Capture identifier from the request."""
    first_step: int
    """Step id of the first captured step."""
    steps: int
    """Steps requested (N)."""
    mode: str
    """``ops`` or ``full``."""
    cold: bool = False
    """The profiler had not been warmed: its first-use cost falls in the window."""


class CaptureProgress(_Rec, tag="cap_progress", frozen=True):
    """k of N steps captured so far."""

    capture_id: str
    """Capture identifier."""
    steps_done: int
    """Steps captured so far."""
    steps: int
    """Steps requested."""


class CaptureExporting(_Rec, tag="cap_exporting", frozen=True):
    """The window closed; the trace is being exported off the step loop."""

    capture_id: str
    """Capture identifier."""
    since_ns: int
    """Export start, host monotonic ns."""


class CaptureDone(_Rec, tag="cap_done", frozen=True):
    """The bundle is saved."""

    capture_id: str
    """Capture identifier."""
    bundle: str
    """Absolute path of the bundle folder (on the engine host)."""
    steps_requested: int
    """Steps requested (N)."""
    steps_captured: int
    """Steps found in the trace."""
    trace_bytes: int
    """Size of ``trace.json.gz`` on disk, bytes."""
    events: int
    """Trace events in the trace."""
    export_s: float
    """Export time, seconds."""
    mode: str = "ops"
    """``ops`` or ``full``."""
    note: str | None = None
    """Something the person should know about the bundle, e.g. that the engine could not
    honour the requested mode (vLLM fixes shapes/stacks/memory at server start)."""
    via: str | None = None
    """The path the capture took, when not the engine process's own profiler: rltperf in
    vLLM's workers (with the ranks held), or vLLM's own profiler."""


class CaptureFailed(_Rec, tag="cap_failed", frozen=True):
    """The capture could not be made or saved; ``reason`` says why."""

    capture_id: str
    """Capture identifier."""
    reason: str
    """A sentence a person can act on."""
    bundle: str | None = None
    """Bundle folder holding the error in ``meta.json``, when one was written."""


class Refused(_Rec, tag="refused", frozen=True):
    """A control message was refused (wrong token, capture already running, bad request)."""

    reason: str
    """Why, in a sentence."""
    capture_id: str | None = None
    """The capture it concerns, when it was a capture request."""


class Bye(_Rec, tag="bye", frozen=True):
    """The probe is closing (engine shutting down)."""

    reason: str = ""
    """Why."""
    ts_ns: int = 0
    """Probe monotonic time of the goodbye (0: not said): the stream's last moment."""


class SessionEvent(_Rec, tag="session", frozen=True):
    """Monitor-side only: the state of an adapter session changed (never sent by a probe)."""

    state: str
    """``connecting``, ``connected``, ``reconnecting``, ``ended`` or ``error``."""
    detail: str = ""
    """A sentence for the screen."""
    ts_ns: int = 0
    """Monitor monotonic time."""


class HistogramDelta(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Observations one Prometheus histogram gained during one scrape interval."""

    bounds: list[float]
    """Finite bucket upper bounds (``le``), ascending; the ``+Inf`` bucket is ``count``."""
    counts: list[float]
    """Cumulative observations at or below each bound, gained in the interval."""
    count: float = 0.0
    """Observations gained in the interval (the ``+Inf`` bucket)."""
    sum: float = 0.0
    """Sum of the observed values gained in the interval (seconds for latencies)."""


class MetricsSample(_Rec, tag="metrics", frozen=True):
    """Engine-wide figures scraped from a metrics endpoint (vLLM's ``/metrics``), one per scrape.

    Monitor-side (made by the vLLM HTTP adapter, never sent by a probe).  Counter fields
    are what the counter gained since the previous scrape (``interval_s`` earlier), so
    any window can be pooled exactly: rate = sum of gains / sum of intervals.  Latency
    percentiles come from ``hist`` by linear interpolation inside a bucket: they are
    *histogram estimates*, as precise as the server's bucket bounds.  ``None`` = the
    server does not export that metric.
    """

    ts_ns: int
    """Monitor monotonic time the scrape's answer arrived."""
    interval_s: float
    """Seconds since the previous scrape (the denominator of this sample's rates)."""
    source: str = ""
    """Where the figures come from, e.g. ``"vllm /metrics"``."""
    generation_tokens: float = 0.0
    """Output tokens generated in the interval (``vllm:generation_tokens_total``)."""
    prompt_tokens: float = 0.0
    """Prompt tokens processed in the interval (``vllm:prompt_tokens_total``)."""
    requests_finished: dict[str, float] = {}
    """Requests finished in the interval by finish reason (stop, length, abort, error...)."""
    steps: float = 0.0
    """Engine steps in the interval (observations of ``vllm:iteration_tokens_total``)."""
    step_tokens: float = 0.0
    """Tokens those steps processed (sum of ``vllm:iteration_tokens_total``)."""
    preemptions: float = 0.0
    """Requests preempted in the interval."""
    prefix_queries: float = 0.0
    """Prefix-cache token queries in the interval."""
    prefix_hits: float = 0.0
    """Prefix-cache token hits in the interval."""
    running: float | None = None
    """Requests running at the scrape (gauge)."""
    waiting: float | None = None
    """Requests waiting at the scrape (gauge)."""
    kv_usage: float | None = None
    """KV-cache usage at the scrape, 0..1 (gauge)."""
    read_bytes: float | None = None
    """vLLM's estimate of bytes read per GPU in the interval (``--enable-mfu-metrics``), times
    ``loop_factor``; None when the server does not estimate it."""
    write_bytes: float | None = None
    """vLLM's estimate of bytes written per GPU in the interval, times ``loop_factor``."""
    flops: float | None = None
    """vLLM's estimate of FLOPs per GPU in the interval, times ``loop_factor``."""
    loop_factor: float = 1.0
    """Correction applied to the estimates (a looped model's loop count), 1 when none."""
    hist: dict[str, HistogramDelta] = {}
    """Latency histograms gained in the interval: ``ttft``, ``itl``, ``tpot``, ``e2e``,
    ``queue``, ``prefill``, ``decode`` (seconds); absent when nothing was observed."""
    engines: int = 1
    """Engine label sets summed into the sample (data-parallel engines)."""
    notes: list[str] = []
    """Caveats to show beside the figures (estimator limits, counter resets...)."""


DataRecord = StepRecord | RequestRecord | DeviceSample
"""Records a probe streams in bulk (what a ``Batch`` carries)."""

DATA_RECORDS = (StepRecord, RequestRecord, DeviceSample)


class Batch(_Rec, tag="batch", frozen=True):
    """Several data records in one frame (the publisher sends one per tick).

    Decoding a batch costs about 40 % of decoding its records as separate frames: the
    monitor's ingest and the probe's publisher both gain.  Readers flatten it: no code
    above the frame reader ever sees a ``Batch``.
    """

    records: list[DataRecord]
    """The records, in stream order."""


Record = (
    ClientHello
    | Capture
    | Ping
    | Hello
    | StageTable
    | StepRecord
    | RequestRecord
    | DeviceSample
    | Stats
    | CaptureStarted
    | CaptureProgress
    | CaptureExporting
    | CaptureDone
    | CaptureFailed
    | Refused
    | Bye
    | SessionEvent
    | MetricsSample
    | Batch
)
"""Every record that can appear in a frame."""

CAPTURE_REPLIES = (CaptureStarted, CaptureProgress, CaptureExporting, CaptureDone, CaptureFailed)
"""Records that report on a capture."""


def engine_info_from(value: EngineInfo | dict[str, Any] | None, **defaults: Any) -> EngineInfo:
    """Return an ``EngineInfo`` from a struct, a plain dict (validated) or None."""
    if isinstance(value, EngineInfo):
        return value
    data = dict(defaults)
    data.update(value or {})
    data.setdefault("name", "engine")
    return msgspec.convert(data, EngineInfo)


def to_builtins(rec: Any) -> Any:
    """A record as plain JSON-able Python objects (dicts with field names)."""
    if isinstance(rec, msgspec.Struct):
        out: dict[str, Any] = {"type": rec.__struct_config__.tag} if rec.__struct_config__.tag else {}
        for f in rec.__struct_fields__:
            out[f] = to_builtins(getattr(rec, f))
        return out
    if isinstance(rec, (list, tuple)):
        return [to_builtins(v) for v in rec]
    if isinstance(rec, dict):
        return {k: to_builtins(v) for k, v in rec.items()}
    return rec
