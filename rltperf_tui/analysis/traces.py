"""Chrome traces (torch.profiler / Kineto JSON) read as evidence: steps, stages, operators, idle.

This module is where the trace-based definitions live (docs/ARCHITECTURE.md, "Where each figure is defined"):

- **Steps**: ``ProfilerStep#k`` spans (one per ``prof.step()``; in rltperf bundles each
  one covers a captured step *and the gap before it*), the probe's ``rltperf.step#<id>
  <kind>`` ranges (the step itself), and vLLM's step annotations
  ``execute_context_<n>(<tok>)_generation_<n>(<tok>)`` (category ``user_annotation``).
- **Stages**: ``stage:<name>`` ``record_function`` ranges, attributed to the step range
  that contains them.
- **Device busy / idle** (Holistic Trace Analysis' definition): the union of the device's
  activity intervals (kernels, memcpy, memset) over the capture window is busy; the rest
  is idle.  Each idle gap is classified by the activity that ends it, as HTA does:
  *host wait* when that activity was launched (its ``cudaLaunchKernel``/driver call,
  matched by ``correlation``) after the device had gone idle, i.e. the host was late;
  otherwise *kernel wait* when the gap is shorter than a threshold (back-to-back launch
  overhead) and *other* when it is longer (waits on events, syncs, unknown).  A gap
  after the last activity of the window is host wait (nothing was queued).
  HTA's threshold is the number 30 in its timestamp unit: Kineto's JSON is in µs (the
  classic HTA compared µs); releases that convert to ns keep 30, i.e. 30 ns.  We default
  to 30 µs and let callers choose.
- **CPU-only traces**: the same union over the operator (``cpu_op``) intervals of the
  engine thread (the thread of the step spans).  Operators run synchronously there, so
  every gap is, by HTA's rule, host wait; kernel wait and other are *not defined* and are
  reported as None, never as zero.

Idle is further split into time inside engine steps and time between them, because a
gap between steps (scheduler, Python, sleep) and a gap inside one (launch overhead,
syncs) call for different fixes.

Nothing here imports torch: reports run anywhere.  Times inside are trace microseconds
(the JSON's unit); results are seconds or milliseconds as their names say.
"""

from __future__ import annotations

from rltperf_tui.analysis.trace_file import TraceFile, load_trace, save_trace
from rltperf_tui.analysis.trace_idle import IdleBreakdown, idle_breakdown
from rltperf_tui.analysis.trace_steps import (
    ANNOTATION_CATS,
    DEFAULT_KERNEL_WAIT_US,
    DEVICE_CATS,
    HOST_OP_CATS,
    LAUNCH_CATS,
    PROFILER_STEP_RE,
    RLTPERF_STEP_RE,
    STAGE_PREFIX,
    VLLM_STEP_RE,
    EngineStep,
    OpStat,
    Span,
    StepScan,
    device_op_stats,
    host_op_stats,
    memory_peaks,
    scan_steps,
    spans,
)

__all__ = [
    "ANNOTATION_CATS",
    "DEFAULT_KERNEL_WAIT_US",
    "DEVICE_CATS",
    "HOST_OP_CATS",
    "LAUNCH_CATS",
    "PROFILER_STEP_RE",
    "RLTPERF_STEP_RE",
    "STAGE_PREFIX",
    "VLLM_STEP_RE",
    "EngineStep",
    "IdleBreakdown",
    "OpStat",
    "Span",
    "StepScan",
    "TraceFile",
    "device_op_stats",
    "host_op_stats",
    "idle_breakdown",
    "load_trace",
    "memory_peaks",
    "save_trace",
    "scan_steps",
    "spans",
]
