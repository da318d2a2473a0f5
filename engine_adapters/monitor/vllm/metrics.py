"""vLLM's ``/metrics``: parse one scrape (``exposition.read_families``) and derive a sample.

``parse_scrape(text)`` sums every ``vllm:*`` series over its label sets (engines, model
names) into a ``Scrape`` of cumulative values (``engine=`` keeps one engine's series of a
data-parallel server, ``engines.py``); ``derive(prev, cur)`` turns two scrapes into
one ``MetricsSample`` of what was gained in between (counters, histogram buckets) plus the
gauges at ``cur``.  Names are vLLM 0.32's (see ``../shared/VLLM_CPU.md``); older aliases
are tried where vLLM renamed a metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_adapters.definitions import looped_cost
from engine_adapters.definitions.records import HistogramDelta, MetricsSample
from engine_adapters.monitor.vllm.exposition import Family, read_families

# raised by the reader; re-exported here, where the adapter and the tests import it
from engine_adapters.monitor.vllm.exposition import ScrapeError as ScrapeError
from engine_adapters.monitor.vllm.histogram_read import Histogram as Histogram
from engine_adapters.monitor.vllm.histogram_read import read_histogram

# Counters (sample names as exposed, with _total).
GEN_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
READ_BYTES = "vllm:estimated_read_bytes_per_gpu_total"
WRITE_BYTES = "vllm:estimated_write_bytes_per_gpu_total"
FLOPS = "vllm:estimated_flops_per_gpu_total"
# Gauges (first name found wins).
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"
# Histograms: our short name -> vLLM family names (first found wins).
ITERATION_TOKENS = "vllm:iteration_tokens_total"
LATENCY_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds",),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
}
"""Latency histograms the sample carries (seconds)."""
HISTOGRAMS_SKIPPED = frozenset({
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens",
    "vllm:request_params_n", "vllm:request_params_max_tokens", "vllm:request_inference_time_seconds",
    "vllm:request_num_preemptions", "vllm:request_prefill_kv_computed_tokens",
})  # fmt: skip
"""vLLM 0.32's histograms that nothing here reads (request sizes and params, inference
time, preemptions and KV computed per request): ``parse_scrape`` skips their lines unparsed
(``read_families``), 102 of the stored page's 604 lines.  Named one by one, so a histogram
a later vLLM adds is read, not lost."""


@dataclass(frozen=True)
class LmHead:
    """The part of vLLM's estimate that a looped model runs once per step: the LM head.

    vLLM 0.32's estimator (``vllm/v1/metrics/perf.py``) sums three components per
    step: attention and FFN, each times ``num_hidden_layers``, and the unembedding (LM
    head), once.  It has no embedding term (a lookup of T rows, left out), so tied or
    untied embeddings change nothing here.  For a step of T tokens of which G need
    logits (decode tokens plus one per prefill), with hidden size D, vocabulary V and
    b bytes per element (weights and activations in the model dtype), the LM head is

    - FLOPs: ``2·G·D·V``
    - read bytes: ``D·V·b`` (the weight, once per step) ``+ G·D·b`` (its input)
    - write bytes: ``G·V·b`` (the logits)

    Everything else in the estimate (the layers' weights, activations, KV reads and
    writes, attention FLOPs) belongs to the layer stack, which a looped model runs
    ``k`` times per step (Ouro: ``total_ut_steps`` passes over all layers, one KV per
    pass).  Over a scrape interval of ``n`` steps and ``G`` generated tokens (every
    generated token needed logits) the corrected figure of vLLM's ``X`` is

        ``X_looped = k·(X − H) + H = k·X − (k − 1)·H``

    with ``H`` the LM head's share above summed over the interval.  ``k = 1`` gives
    ``X`` back unchanged.  ``H`` is capped at ``X`` (so the result is never below
    vLLM's own figure).  The byte size comes from the model's config
    (``torch_dtype``/``dtype``); a server started with another ``--dtype`` makes the
    head's share off by that ratio (its weight is a few % of a step's bytes)."""

    hidden: int
    """Hidden size D."""
    vocab: int
    """Vocabulary size V (the LM head's rows)."""
    bytes_per_elem: float
    """Bytes per weight/activation element (model dtype)."""
    dtype: str = ""
    """The dtype the byte size was read from (``"assumed"`` when the config had none)."""

    def flops(self, steps: float, tokens: float) -> float:
        """FLOPs of the LM head over ``steps`` steps that produced ``tokens`` logits rows."""
        return looped_cost.head_flops(self.hidden, self.vocab, tokens)

    def read_bytes(self, steps: float, tokens: float) -> float:
        """Bytes the LM head reads over the interval (weight once per step, inputs)."""
        return looped_cost.head_read_bytes(self.hidden, self.vocab, self.bytes_per_elem, steps, tokens)

    def write_bytes(self, steps: float, tokens: float) -> float:
        """Bytes the LM head writes over the interval (the logits)."""
        return looped_cost.head_write_bytes(self.vocab, self.bytes_per_elem, tokens)


def lm_head_from(config: dict[str, object] | None) -> LmHead | None:
    """The ``LmHead`` of a Hugging Face ``config.json`` (None without hidden and vocab sizes)."""
    if not config:
        return None
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        config = {**text, **{k: v for k, v in config.items() if k in ("torch_dtype", "dtype")}}
    hidden, vocab = config.get("hidden_size"), config.get("vocab_size")
    if not isinstance(hidden, int) or not isinstance(vocab, int) or hidden <= 0 or vocab <= 0:
        return None
    dt = config.get("torch_dtype") or config.get("dtype")
    name = str(dt).removeprefix("torch.") if dt else ""
    size = looped_cost.DTYPE_BYTES.get(name)
    if size is None:
        size, name = 2, "assumed"  # 16-bit weights: what a served model nearly always has
    return LmHead(hidden=hidden, vocab=vocab, bytes_per_elem=float(size), dtype=name)


def loop_corrected(value: float, head_share: float, loops: float) -> float:
    """``k·X − (k − 1)·H`` (see ``LmHead``), with ``H`` capped at ``X`` (``definitions.looped_cost``)."""
    return looped_cost.loop_corrected(value, head_share, loops)


@dataclass
class Scrape:
    """Cumulative values of one ``/metrics`` answer, every series summed over its labels."""

    ts_ns: int
    counters: dict[str, float] = field(default_factory=dict)
    """Counter samples by sample name (``..._total``)."""
    finished: dict[str, float] = field(default_factory=dict)
    """``vllm:request_success_total`` by ``finished_reason``."""
    gauges: dict[str, float] = field(default_factory=dict)
    """Gauges summed over label sets (``vllm:kv_cache_usage_perc`` averaged instead)."""
    hists: dict[str, Histogram] = field(default_factory=dict)
    """Histograms by family name."""
    info: dict[str, dict[str, str]] = field(default_factory=dict)
    """Labels of ``*_info`` gauges (first label set), e.g. ``vllm:cache_config_info``."""
    engines: set[str] = field(default_factory=set)
    """Values of the ``engine`` label seen."""
    engine_steps: dict[str, float] = field(default_factory=dict)
    """Cumulative engine steps by ``engine`` label (``""``: unlabelled)."""

    @property
    def has_vllm(self) -> bool:
        """True when the answer held any ``vllm:`` series."""
        return bool(self.counters or self.gauges or self.hists or self.info)

    def steps(self) -> float | None:
        """Cumulative engine steps (observations of ``iteration_tokens_total``)."""
        h = self.hists.get(ITERATION_TOKENS)
        return h.count if h is not None else None


def parse_scrape(text: str, ts_ns: int, engine: str | None = None) -> Scrape:
    """Parse a ``/metrics`` answer into a ``Scrape`` (only ``vllm:`` families are kept;
    with ``engine``, only the series labelled ``engine=<engine>`` and unlabelled ones)."""
    out = Scrape(ts_ns=ts_ns)
    kv_n = 0
    families = read_families(text, "vllm:", HISTOGRAMS_SKIPPED)  # ScrapeError on a malformed line
    for fam in families:
        if not fam.name.startswith("vllm:"):
            continue
        if engine is not None:
            fam = _one_engine(fam, engine)
        if fam.type == "counter":
            for sname, labels, value, _ in fam.samples:
                # a counter's value is *_total: a 0.0.4 counter family named without
                # it gets it on every sample, one named with it keeps its samples' names
                # and a sample not so named is no value (prometheus_client's reading;
                # it differs only for samples read before a second # TYPE of the
                # family, e.g. a histogram's, made it a counter)
                name = sname if fam.name.endswith("_total") else sname + "_total"
                if not name.endswith("_total"):
                    continue
                eng = labels.get("engine")
                if eng is not None:
                    out.engines.add(eng)
                out.counters[name] = out.counters.get(name, 0.0) + value
                if name == REQUEST_SUCCESS:
                    reason = labels.get("finished_reason", "?")
                    out.finished[reason] = out.finished.get(reason, 0.0) + value
        elif fam.type == "gauge":
            if fam.name.endswith("_info"):
                if fam.samples and fam.name not in out.info:
                    out.info[fam.name] = dict(fam.samples[0][1])
                continue
            for sname, _, value, _ in fam.samples:
                if sname != fam.name:
                    continue
                if sname in KV_USAGE:
                    kv_n += 1
                out.gauges[sname] = out.gauges.get(sname, 0.0) + value
        elif fam.type == "histogram":
            out.hists[fam.name] = read_histogram(
                fam, out.engine_steps if fam.name == ITERATION_TOKENS else None
            )
    for name in KV_USAGE:
        if name in out.gauges and kv_n > 1:
            out.gauges[name] /= kv_n  # a mean over engines, not a sum
    return out


def _one_engine(fam: Family, engine: str) -> Family:
    """``fam`` with only the samples of ``engine`` (and those without an engine label)."""
    keep = [smp for smp in fam.samples if smp[1].get("engine", engine) == engine]
    if len(keep) == len(fam.samples):
        return fam
    return Family(fam.name, fam.type, keep)


def _first(d: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        if n in d:
            return d[n]
    return None


def counters_went_back(prev: Scrape, cur: Scrape) -> bool:
    """True when a counter decreased: the server restarted (or its metrics were reset)."""
    for name, v in prev.counters.items():
        if cur.counters.get(name, v) < v - 1e-9:
            return True
    ps, cs = prev.steps(), cur.steps()
    return ps is not None and cs is not None and cs < ps


def _gain(prev: Scrape, cur: Scrape, name: str) -> float:
    return max(0.0, cur.counters.get(name, 0.0) - prev.counters.get(name, 0.0))


def _hist_delta(prev: Scrape, cur: Scrape, family: str) -> HistogramDelta | None:
    c = cur.hists.get(family)
    if c is None:
        return None
    p = prev.hists.get(family)
    if p is None or p.bounds != c.bounds:
        p = Histogram(c.bounds, [0.0] * len(c.counts))
    n = c.count - p.count
    if n <= 0:
        return None
    return HistogramDelta(
        bounds=list(c.bounds),
        counts=[max(0.0, a - b) for a, b in zip(c.counts, p.counts, strict=True)],
        count=n,
        sum=max(0.0, c.sum - p.sum),
    )


@dataclass
class MfuState:
    """Whether the server estimates bytes/FLOPs (``--enable-mfu-metrics``), learnt over time."""

    seen_nonzero: bool = False

    def observe(self, cur: Scrape) -> bool | None:
        """True: estimating; False: counters stay 0 although steps ran; None: cannot tell yet."""
        if cur.counters.get(READ_BYTES, 0.0) > 0 or cur.counters.get(FLOPS, 0.0) > 0:
            self.seen_nonzero = True
        if self.seen_nonzero:
            return True
        if READ_BYTES not in cur.counters:
            return False
        steps = cur.steps() or 0.0
        return False if steps > 0 else None


def derive(
    prev: Scrape,
    cur: Scrape,
    mfu: MfuState,
    loop_factor: float = 1.0,
    loop_known: bool = False,
    source: str = "vllm /metrics",
    head: LmHead | None = None,
) -> MetricsSample:
    """The ``MetricsSample`` of the interval ``prev`` → ``cur`` (``prev`` must not be newer).

    A looped model (``loop_factor`` k > 1) gets vLLM's bytes and FLOPs corrected layer
    by layer: the layer stack k times, the LM head (``head``) once (formula in
    ``LmHead``).  Without ``head`` everything is multiplied by k, which over-counts the
    LM head (the notes say so)."""
    interval = max(0.0, (cur.ts_ns - prev.ts_ns) / 1e9)
    notes: list[str] = []
    finished = {reason: max(0.0, v - prev.finished.get(reason, 0.0)) for reason, v in cur.finished.items()}
    finished = {k: v for k, v in finished.items() if v > 0}
    steps_c, steps_p = cur.steps(), prev.steps()
    steps = max(0.0, (steps_c or 0.0) - (steps_p or 0.0))
    it_c = cur.hists.get(ITERATION_TOKENS)
    it_p = prev.hists.get(ITERATION_TOKENS)
    step_tokens = max(0.0, (it_c.sum if it_c else 0.0) - (it_p.sum if it_p else 0.0))
    estimating = mfu.observe(cur)
    read_b = write_b = flops = None
    if estimating:
        read_b = _gain(prev, cur, READ_BYTES)
        write_b = _gain(prev, cur, WRITE_BYTES)
        flops = _gain(prev, cur, FLOPS)
        if loop_factor != 1.0 and head is not None:
            logits = _gain(prev, cur, GEN_TOKENS)
            read_b = loop_corrected(read_b, head.read_bytes(steps, logits), loop_factor)
            write_b = loop_corrected(write_b, head.write_bytes(steps, logits), loop_factor)
            flops = loop_corrected(flops, head.flops(steps, logits), loop_factor)
            notes.append(
                f"bytes/FLOPs corrected here: the layers x{loop_factor:g} (the model's loop count), "
                f"the LM head once ({head.dtype or '?'}, {head.bytes_per_elem:g} B per element): {looped_cost.MFU_CAVEAT}"
            )
        elif loop_factor != 1.0:
            read_b, write_b, flops = read_b * loop_factor, write_b * loop_factor, flops * loop_factor
            notes.append(
                f"bytes/FLOPs corrected here x{loop_factor:g} (the model's loop count), the LM head "
                f"included (its shape is unknown here, so it is over-counted): {looped_cost.MFU_CAVEAT}"
            )
        elif loop_known:
            notes.append("not looped: vLLM's bytes/FLOPs need no loop correction")
        else:
            notes.append(
                "bytes/FLOPs not corrected: loop count unknown (set RLTPERF_LOOP_COUNT or the loop_count "
                f"option); {looped_cost.MFU_CAVEAT}"
            )
    elif estimating is False:
        notes.append("no byte/FLOP estimates: start the server with --enable-mfu-metrics for MBU")
    hist: dict[str, HistogramDelta] = {}
    for short, names in LATENCY_HISTOGRAMS.items():
        for fam in names:
            d = _hist_delta(prev, cur, fam)
            if d is not None:
                hist[short] = d
                break
    return MetricsSample(
        ts_ns=cur.ts_ns,
        interval_s=interval,
        source=source,
        generation_tokens=_gain(prev, cur, GEN_TOKENS),
        prompt_tokens=_gain(prev, cur, PROMPT_TOKENS),
        requests_finished=finished,
        steps=steps,
        step_tokens=step_tokens,
        preemptions=_gain(prev, cur, PREEMPTIONS),
        prefix_queries=_gain(prev, cur, PREFIX_QUERIES),
        prefix_hits=_gain(prev, cur, PREFIX_HITS),
        running=_first(cur.gauges, RUNNING),
        waiting=_first(cur.gauges, WAITING),
        kv_usage=_first(cur.gauges, KV_USAGE),
        read_bytes=read_b,
        write_bytes=write_b,
        flops=flops,
        loop_factor=loop_factor,
        hist=hist,
        engines=max(1, len(cur.engines)),
        notes=notes,
    )
