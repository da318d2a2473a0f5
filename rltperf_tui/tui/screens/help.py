"""The ``?`` screen: what every panel and number means, and the keys."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from engine_adapters.definitions.cost import COST_FORMULAS
from engine_adapters.definitions.server_history import PEAK_SPAN_S
from engine_adapters.definitions.server_window import IMBALANCE_RATIO

HELP_TEXT = f"""\
# rltperf — what you are looking at

Every figure comes from the engine's own probe (or a recording of it).  **"Last 10 s"**
is *data* time (the newest record's time), so a replay shows what the live screen did.
A figure the engine does not report shows as **n/a**, never as zero.

## Keys

| key | action |
|---|---|
| `c` | capture **ops-only** (CPU + device activities) of N complete steps, on every attached target |
| `f` | capture **full** (also shapes, memory and stacks) of N steps, on every target |
| `[` / `]` | halve / double N (default 8; shown in the top bar and the Captures panel) |
| `space` | pause the display; data still arrives and is counted |
| `r` | start / stop recording each live stream to `rltperf-<target>-<time>.rltrec` |
| `p`, `+`, `-` | replays: play/pause, faster, slower |
| `v` | two or more `vllm+http://` targets: hide / show the replica table |
| `ctrl+p` | command palette (every action above) |
| `?` | this screen · `q` or `ctrl+c` quit |
| `↑` `↓` `PgUp` `PgDn`, `tab` | scroll a target's column (narrow terminals stack the panels), move between targets |

Profiled timings are not a baseline: steps inside a capture, its profiler warm-up or
its export are flagged and counted in the Bandwidth panel.  Start with a small N.

The top bar says **"late: CPU wait X s in 10 s"** when this monitor itself waited that
long for a CPU over the last 10 s (Linux's schedstat of its drawing thread; from 0.5 s):
on a server whose cores the engine keeps busy the screen comes late.  The figures are
not wrong (they are reckoned on the engine's clock); they arrive late.

## Header (one per target)

Target, engine name and version, model, dtype, device; loop, exit, KV and speculative
configuration; **connection state** (connected / reconnecting / ended — a probe
session reconnects by itself); **records dropped** (the probe's ring and this monitor's
queue: non-zero means the monitor or network fell behind, the engine never waits);
**RANDOM WEIGHTS** when the engine says its weights are random: then exit depths and
acceptance rates are not real, only capacity and latency are.  The third line repeats
the headline figures of the panels below.

## Step time by stage

Each column is one time bucket of the last N seconds; its height is the **mean step
time** of the steps ending in it, stacked by stage (schedule, prepare, forward, …; the
part no stage covers is grey "other").  The row below is the **mean gap** between
consecutive steps (start of step k+1 - end of step k) per bucket, scaled to its own
maximum.  The legend gives each stage's mean ms per step over the chart.

## Latency

**P50 / P95 / P99 of pooled samples** in the window (all samples together, not a mean
of per-run percentiles).  Step = end - start of one step; gap as above; TTFT = first
token - arrival; TPOT = (finish - first token) / (output tokens - 1), over requests that
finished in the window.  Tokens/s = produced tokens / window.  The **window** is wall
time, up to the newest moment the probe vouches for (a step's end, or its heartbeat
between steps): when the load stops, idle climbs to 100 % and the header says "no steps
for N s"; when the engine stops answering altogether (not even its ~1 s heartbeat) the
header says "hung?" and the figures are marked stale.  Profiled, exporting and warm-up
steps leave every figure (their time, tokens and bytes, and the requests in flight
during them): the panel's "excluded N steps, M req" says how many were left out.  While
they own more than half of the window (an export longer than the window on a loaded
machine, where the engine runs slower during it), the panels keep the newest figures
of a window that was not, and say how old they are ("stale: as of N s ago (capture)",
"figures N s old").  **Goodput** = completed
requests per second meeting both SLOs (`--slo-ttft-ms`, `--slo-tpot-ms`; DistServe's
definition).  Failed requests are counted, never dropped.

## Device

**Idle fraction** = 1 - Σ device busy / window, from the probe's events (CUDA events
around each device region on a GPU; the compute regions on a CPU).  It sees idle time
between steps and between regions; idle inside a region needs a capture.  **NVML util**
is the driver's share of each 1/6-1 s period with any kernel running: a coarse
cross-check, not the same number.  **Idle gaps** lists gaps between consecutive steps
longer than the threshold (max(1 ms, 5 x the median gap)), newest first, with the
stage that grew most in the step before the gap compared with its median.

## Bandwidth & roofline

**Achieved** = analytic bytes (weights per loop pass + KV read + KV written) and FLOPs
summed over the window / window.  **MBU** = achieved bytes/s / peak bandwidth; the peak
comes from `rltperf calibrate` (a measured copy: read + write, STREAM convention), a
spec table, or `--peak-gbps` — the panel says which.  MBU above 1 means a wrong byte
count or peak, and is flagged, never shown silently.  **Intensity** = FLOPs / bytes
against **machine balance** = peak FLOP/s / peak bandwidth: below it a step is
memory-bound, above compute-bound; **host-bound** when the device is idle for more than half
of the steps' own time (1 − Σ busy / Σ step time: the gaps between steps never count, since they
follow the load, not the step; they are the idle figure shown beside the verdict).  **Ceiling** =
median over steps of max(bytes / peak BW, FLOPs / peak FLOP/s), against the measured
median step time.

## Loops & speculation

Share of produced tokens by the loop depth at which they exited, mean exit depth, mean
time and tokens per step at each depth, KV blocks per depth (newest step).  **ranks**
(an engine with several workers, e.g. tensor parallel): each worker's compute per step =
its busy time − its time inside all-reduces (waiting for the others; CPU only, else
busy), over the window's steps in which every worker reported; the **slowest** rank is
the one with the most compute (its peers wait for it), +ms/step and % over the fastest.
Speculation: draft tokens proposed and accepted in the window, acceptance rate =
accepted / drafted, mean acceptance length = 1 + accepted / drafts.

## Queue & KV

Waiting and running requests and KV blocks used / total from the newest step; host CPU
(mean over cores), engine process CPU (cores) and RSS from the ~1 Hz host sample.

## Captures

Each capture: mode, N, state (**armed** → **capturing k/N** → **exporting** (off the
step loop, elapsed shown) → **saved** or **failed**), steps captured, trace size,
events, export time and the bundle folder (trace.json.gz for Perfetto, meta.json,
ops.txt, steps.jsonl), or the error text.  A capture runs inside every attached engine
(PD: prefill and decode each capture their own N steps).

## Server metrics (`vllm+http://` targets)

A vLLM server seen through its `/metrics` (scraped about once a second): rates are
counter gains over the scrape intervals of the window; running, waiting and KV are the
newest scrape's.  Latency percentiles are **histogram estimates**: the rank is found in
the server's bucket and interpolated inside it; when the interpolation would exceed what
the exact mean allows (P(X ≥ mean / (1 − q)) ≤ 1 − q), it is lowered to that bound and
shown as **≤ value**, an upper limit (vLLM's first queue-time bucket is 0–300 ms: queue
times of 0.012 ms would otherwise read 285 ms).  A **"≥"** or "beyond the last bucket"
is a lower limit.

**Trends** (the lower half) draw every figure over the timeline (`--timeline` seconds):
a column per scrape while they fit, else the same number of consecutive scrapes per
column; per column a gauge is its highest reading, a rate the column's pooled gains
over its intervals, a P95 the bounded histogram estimate of the column's pooled
histogram (blank: no request finished there, never zero).  min / max / now are those
of the columns drawn.

**Since attach**: counters summed over every scrape since the monitor attached
(requests finished by reason, prompt and generated tokens, preemptions, prefix-cache
hits), TTFT / TPOT / queue P95 and exact means over the histograms pooled since attach,
and **peaks**: the highest running, waiting and KV reading, and the highest tokens/s
over any {PEAK_SPAN_S:g} s of consecutive scrapes (one half-second scrape is noise, not a
peak).

**Replicas** (two or more `vllm+http://` targets: data-parallel replicas, prefill and
decode instances): a row per target over its own window; `running` is now~mean over the
window.  **total**: sums of rates and gauges, KV the largest replica's, P95s from the
replicas' histograms pooled together (bounded as above).  **IMBALANCED** when, for mean
running or tokens/s, the largest replica exceeds the smallest by more than
{IMBALANCE_RATIO:g}× and by at least one request / one token a second.

**Cost** (`--cost-in` / `--cost-out` in $ per 1M tokens, `--gpu-cost-hour` in $ per hour of
the GPUs behind one target), with P, G the prompt and generation tokens/s of the window:

- {COST_FORMULAS[0]}
- {COST_FORMULAS[1]}
"""


class HelpScreen(ModalScreen[None]):
    """Explains every panel and number."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 96%;
        max-width: 110;
        height: 94%;
        border: round $accent;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "dismiss", "Close help"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP_TEXT)

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).focus()
