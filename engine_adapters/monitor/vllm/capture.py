"""Captures through vLLM's own profiler: ``/start_profile`` → N steps → ``/stop_profile`` → bundle.

vLLM 0.32 profiles inside its worker processes.  ``POST /start_profile`` with
``{"max_iterations": N, "profile_prefix": P}`` starts ``torch.profiler`` in every worker
(and in the API server unless ``ignore_frontend``); each worker annotates every model
execution (``execute_context_<n>(<tok>)_generation_<n>(<tok>)``) and stops by itself
after N of them, writing ``P_rank<r>.<ns>.pt.trace.json.gz`` and
``P_rank<r>.profiler_out.txt`` into the server's ``torch_profiler_dir``.  The front end's
trace is written at ``POST /stop_profile``, which must always be sent: until it is, the
server answers a new start with 409.

Shapes, stacks and memory are fixed by the server's ``--profiler-config`` at start; the
bundle's ``meta.json`` records what the trace shows the server actually did, and the
``CaptureDone`` note says when the requested mode could not be honoured.

With several ranks (``--tensor-parallel-size``, ``--data-parallel-size``) every worker
writes its own trace: the bundle keeps each (``trace.json.gz`` the first,
``trace_<rank>.json.gz`` the others), names each trace's rank, and says in
``meta.json`` ``capture.ranks`` which ranks it holds and which are missing (expected:
every worker the plugin's announcements list; a trace's rank: its worker's pid there,
else vLLM's ``dp<D>_pp<P>_tp<T>`` file name).

The session is reached through ``CaptureHost`` (a protocol of public names), so this
module does not import the adapter.  Everything here runs in the capture's own thread;
``read()`` is never blocked.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from time import perf_counter_ns as _clk
from typing import Any

from engine_adapters.definitions.bundle import (
    BundleMeta,
    CaptureMeta,
    bundle_name,
    capture_id_problem,
    capture_request_problem,
    new_meta,
    post_outcome,
    sanitize_label,
    seal_bundle,
    temp_bundle_dir,
)
from engine_adapters.definitions.bundle import os_error_text as _os_error_text
from engine_adapters.definitions.contract import CONTRACT_FIELDS, unknown
from engine_adapters.definitions.ranks import ranks_held
from engine_adapters.definitions.records import (
    CaptureExporting,
    CaptureFailed,
    CaptureProgress,
    CaptureStarted,
    EngineInfo,
)
from engine_adapters.monitor.vllm.capture_job import CaptureHost, HttpCaptureJob
from engine_adapters.monitor.vllm.http import ServerUnreachable, error_text
from engine_adapters.monitor.vllm.trace_files import (
    TraceFacts,
    copy_gz,
    engine_of,
    is_frontend,
    is_trace,
    list_prefixed,
    mode_note,
    rank_of,
    read_facts,
    trace_pid,
    trace_rank,
)

log = logging.getLogger("rltperf.vllm.capture")

VIA = "vLLM's own profiler (--profiler-config)"
"""``CaptureDone.via``: the path a capture of this adapter takes."""
VIA_DETAIL = "vLLM's own profiler (POST /start_profile, /stop_profile)"
"""``meta.json`` ``capture.via``."""
NO_STEP_TIMEOUT_S = 60.0
"""A capture whose engine runs no step for this long is stopped and fails (idle server)."""
EXPORT_TIMEOUT_S = 900.0
"""Longest wait for the server's trace export (full mode, many steps: minutes)."""
POLL_S = 0.05
SCRAPE_S = 0.5
"""How often the capture thread reads the server's step count during the window."""
IDLE_ENGINE_S = 10.0
"""How long a data-parallel engine may run no step while another ended its window."""
STOP_GRACE_S = 2.0
"""After the metrics show N steps, how long to wait for the workers' own stop."""
PROFILER_FLAG_HELP = '--profiler-config \'{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}\''


class HttpCapture(threading.Thread):
    """Runs one capture against a vLLM server and writes its bundle (see module docstring)."""

    def __init__(self, session: CaptureHost, job: HttpCaptureJob) -> None:
        super().__init__(name=f"rltperf-vllm-capture-{job.capture_id}", daemon=True)
        self.session = session
        self.job = job
        self.post = session.post
        self.cancel = threading.Event()

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        job = self.job
        try:
            self._run()
        except Exception as exc:  # a bug guard: the person still gets a sentence
            log.exception("vLLM capture crashed")
            job.error = job.error or f"capture crashed: {type(exc).__name__}: {exc}"
            self.post(CaptureFailed(capture_id=job.capture_id, reason=job.error))
        finally:
            if job.state not in ("saved", "failed"):
                job.state = "failed"
            self.session.capture_finished(self)

    def _run(self) -> None:
        s = self.session
        job = self.job
        pdir = s.profiler_dir
        # the id names the profile prefix and the bundle's temp folder: never a path
        reason = capture_id_problem(job.capture_id) or s.capture_blocker()
        if reason:
            job.state = "failed"
            job.error = reason
            self.post(CaptureFailed(capture_id=job.capture_id, reason=reason))
            return
        assert pdir is not None
        job.engine_steps_at_start = s.scrape_steps()
        job.steps_at_start = _total(job.engine_steps_at_start)
        t0 = time.perf_counter()
        try:
            status, body = s.http.request(
                "POST",
                "/start_profile",
                {"max_iterations": job.steps, "profile_prefix": job.prefix},
                timeout=120,
            )
        except ServerUnreachable as exc:
            self._fail(f"cannot start the profiler: {exc}")
            return
        job.start_call_s = time.perf_counter() - t0
        if status == 404:
            s.profiler_available = False
            self._fail(
                f"the vLLM server at {s.base_url} has no /start_profile: it was started without "
                f"--profiler-config; restart it with {PROFILER_FLAG_HELP} and give rltperf the same "
                "directory with --profiler-dir"
            )
            return
        if status == 409:
            self._fail(
                "the server says a profiling session is already active (409): another client is capturing, "
                f"or an earlier session never sent /stop_profile; if nobody else is, run "
                f"`curl -X POST {s.base_url}/stop_profile` and try again"
            )
            return
        if status != 200:
            self._fail(f"the server refused /start_profile ({status}): {error_text(body)}")
            return
        job.started_ns = _clk()
        job.state = "capturing"
        cold = (job.start_call_s or 0.0) >= 0.5
        self.post(
            CaptureStarted(
                capture_id=job.capture_id,
                first_step=int(job.steps_at_start or 0) + 1,
                steps=job.steps,
                mode=job.mode,
                cold=cold,
            )
        )
        try:
            self._wait_window(pdir)
        finally:
            self._stop()
        if job.error and not list_prefixed(pdir, job.prefix):
            self.post(CaptureFailed(capture_id=job.capture_id, reason=job.error))
            job.state = "failed"
            return
        self._bundle(pdir)

    def _wait_window(self, pdir: str) -> None:
        """Until every worker wrote its trace (each stops by itself after its engine's N
        steps; data-parallel engines get there at different times, and /stop_profile
        would cut the slower one short), the metrics say every engine ran N steps and the
        traces did not all appear within ``STOP_GRACE_S`` (the load paused right after the
        window: /stop_profile then makes the workers export), or the slowest engine ran no
        step for ``NO_STEP_TIMEOUT_S``."""
        s = self.session
        job = self.job
        expected, _pids = s.server_ranks()
        want = max(1, len(expected or ()))
        done_last = -1
        last_progress = last_any = time.monotonic()  # the slowest engine stepped; any did
        slowest: tuple[float, str] | None = None
        total = 0.0
        start = job.engine_steps_at_start
        next_scrape = 0.0
        done_at: float | None = None
        while not self.cancel.is_set():
            files = list_prefixed(pdir, job.prefix)
            traces = sum(1 for n in files if is_trace(n) and not is_frontend(n))
            if traces >= want:
                self._exporting()
                return
            now = time.monotonic()
            if now >= next_scrape:
                next_scrape = now + SCRAPE_S
                by_engine = s.scrape_steps()
                if by_engine and start is not None:
                    # every engine profiles its own N steps: the window is done when the
                    # slowest engine has run them, and moves while the slowest one steps
                    low = min((max(0.0, v - start.get(e, v)), e) for e, v in by_engine.items())
                    if slowest is None or low[0] > slowest[0]:
                        last_progress = now
                    if sum(by_engine.values()) > total:
                        last_any, total = now, sum(by_engine.values())
                    slowest = low
                    done = int(min(job.steps, low[0]))
                    if done != done_last and done > 0:
                        self.post(
                            CaptureProgress(capture_id=job.capture_id, steps_done=done, steps=job.steps)
                        )
                    done_last = done
                    if done >= job.steps and done_at is None:
                        done_at = now
                        self._exporting()  # the workers export at their next step
            if done_at is not None and now - done_at > STOP_GRACE_S:
                return  # _stop() makes the workers stop and export
            # an engine idle while another stepped on and ended its window (not: every
            # engine waiting on a worker's export, whose trace is then on its way)
            idle = traces > 0 and now - last_any < IDLE_ENGINE_S
            limit = IDLE_ENGINE_S if idle else NO_STEP_TIMEOUT_S
            if job.export_start_ns is None and now - last_progress > limit:
                eng = slowest[1] if slowest and len(start or ()) > 1 else None
                which = f"engine {eng} of the server" if eng is not None else "the server"
                done_by = f" while {traces} of {want} workers ended their window" if idle else ""
                job.error = (
                    f"{which} ran no engine step within {limit:.0f} s{done_by} "
                    "(idle? send it requests during the capture)"
                )
                return
            time.sleep(POLL_S)
        job.error = job.error or "the capture was cancelled (session closed)"

    def _exporting(self) -> None:
        job = self.job
        if job.export_start_ns is None:
            job.window_end_ns = job.export_start_ns = _clk()
            job.state = "exporting"
            self.post(CaptureProgress(capture_id=job.capture_id, steps_done=job.steps, steps=job.steps))
            self.post(CaptureExporting(capture_id=job.capture_id, since_ns=job.export_start_ns))

    def _stop(self) -> None:
        """Always tell the server to stop (it resets the session guard; 409 otherwise)."""
        job = self.job
        self._exporting()
        t0 = time.perf_counter()
        try:
            status, body = self.session.http.request("POST", "/stop_profile", timeout=EXPORT_TIMEOUT_S)
            if status != 200:
                job.error = job.error or f"/stop_profile answered {status}: {error_text(body)}"
        except ServerUnreachable as exc:
            job.error = job.error or f"/stop_profile failed ({exc}): the server may still hold the session"
        job.stop_sent = True
        job.stop_call_s = time.perf_counter() - t0

    def _fail(self, reason: str) -> None:
        job = self.job
        job.error = reason
        job.state = "failed"
        self.post(CaptureFailed(capture_id=job.capture_id, reason=reason))

    # -- the bundle ------------------------------------------------------------------------

    def _settled_files(self, pdir: str) -> dict[str, int]:
        """The capture's files once their sizes stop changing (a trace may still be written)."""
        job = self.job
        prev = list_prefixed(pdir, job.prefix)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            cur = list_prefixed(pdir, job.prefix)
            if cur == prev and cur:
                return cur
            prev = cur
        return prev

    def _bundle(self, pdir: str) -> None:
        s = self.session
        job = self.job
        files = self._settled_files(pdir)
        root = s.snapshot_root
        info = s.info
        engine = info.name if info else "vllm"
        final = os.path.join(root, bundle_name(engine, job.mode, job.steps, job.label))
        tmp = temp_bundle_dir(root, job.capture_id)
        try:
            os.makedirs(root, exist_ok=True)
            os.mkdir(tmp)
        except OSError as exc:
            self._fail(_os_error_text(exc, f"the bundle under snapshot root {root}"))
            return
        workers = sorted((n for n in files if is_trace(n) and not is_frontend(n)), key=rank_of)
        expected, pids = s.server_ranks()
        ranks: dict[str, str] = {}  # trace file on the server -> its rank
        held: dict[str, str] = {}  # rank -> trace file in the bundle
        frontends = sorted(n for n in files if is_trace(n) and is_frontend(n))
        tables = sorted(
            (n for n in files if n.endswith(".profiler_out.txt") and not is_frontend(n)), key=rank_of
        )
        out_files: dict[str, str] = {}
        facts = TraceFacts()
        trace_bytes = 0
        t_read = time.perf_counter()
        try:
            if not workers:
                job.error = (
                    job.error or f"the server wrote no worker trace with prefix {job.prefix!r} into {pdir}"
                )
            for name in workers:
                src = os.path.join(pdir, name)
                ranks[name] = trace_rank(name, trace_pid(src), pids)
            workers.sort(key=lambda n: (ranks[n], n))
            taken: set[str] = set()
            for i, name in enumerate(workers):
                rank = ranks[name]
                dst = "trace.json.gz" if i == 0 else f"trace_{rank}.json.gz"
                if dst in taken:  # two traces of one rank (should not happen): keep both
                    dst = f"trace_{rank}_{i}.json.gz"
                taken.add(dst)
                held.setdefault(rank, dst)
                copy_gz(os.path.join(pdir, name), os.path.join(tmp, dst))
                out_files[dst] = f"worker trace of rank {rank}: {name} (Chrome trace, Perfetto)"
            if workers:
                facts = read_facts(os.path.join(tmp, "trace.json.gz"))
                trace_bytes = os.path.getsize(os.path.join(tmp, "trace.json.gz"))
                job.error = job.error or self._short_engine(tmp, held, ranks[workers[0]])
            for name in frontends[:1]:
                copy_gz(os.path.join(pdir, name), os.path.join(tmp, "frontend.trace.json.gz"))
                out_files["frontend.trace.json.gz"] = f"API-server trace {name}"
            header = (
                f"# rltperf capture {job.capture_id} through vLLM's profiler: {len(facts.annotations)} steps, "
                f"requested {job.mode} mode (profiled timings: not a baseline)\n"
                f"# vLLM's operator table {tables[0] if tables else '(none written)'}\n\n"
            )
            body = ""
            if tables:
                with open(os.path.join(pdir, tables[0]), encoding="utf-8", errors="replace") as f:
                    body = f.read()
            with open(os.path.join(tmp, "ops.txt"), "w", encoding="utf-8") as f:
                f.write(header + (body or "# the server wrote no operator table\n"))
            out_files["ops.txt"] = "operator table (vLLM profiler_out.txt)"
        except OSError as exc:
            job.error = job.error or _os_error_text(exc, "the bundle")
        except ValueError as exc:
            job.error = job.error or f"the server's trace is not readable JSON: {exc}"
        read_s = time.perf_counter() - t_read
        steps_captured = len(facts.annotations)
        if not job.error and steps_captured != job.steps:
            job.error = f"the trace holds {steps_captured} step annotations, {job.steps} were requested"
        export_s = (_clk() - job.export_start_ns) / 1e9 if job.export_start_ns else 0.0
        note = mode_note(job.mode, facts) if workers else None
        meta = self._meta(facts, steps_captured, trace_bytes, export_s, read_s, out_files, files, note)
        meta.capture.ranks = ranks_held(expected, held)
        try:
            path = seal_bundle(tmp, final, meta)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self._fail(job.error or _os_error_text(exc, "meta.json"))
            return
        post_outcome(
            job,
            path,
            self.post,
            steps_captured=steps_captured,
            trace_bytes=trace_bytes,
            events=facts.events,
            export_s=export_s,
            note=note,
            via=VIA,
        )
        log.info("vLLM capture %s -> %s", job.capture_id, path)

    def _short_engine(self, tmp: str, held: dict[str, str], first: str) -> str | None:
        """Each data-parallel engine runs its own N steps: a sentence when another engine's
        trace (the first of its ranks) holds a different number than requested."""
        seen = {engine_of(first)}
        for rank, dst in sorted(held.items()):
            if engine_of(rank) in seen:
                continue
            seen.add(engine_of(rank))
            n = len(read_facts(os.path.join(tmp, dst)).annotations)
            if n != self.job.steps:
                return f"the trace of engine {engine_of(rank)} holds {n} step annotations, {self.job.steps} were requested"
        return None

    def _meta(
        self,
        facts: TraceFacts,
        steps_captured: int,
        trace_bytes: int,
        export_s: float,
        read_s: float,
        out_files: dict[str, str],
        server_files: dict[str, int],
        note: str | None,
    ) -> BundleMeta:
        s = self.session
        job = self.job
        info = s.info or EngineInfo(name="vllm")
        full = job.mode == "full"
        capture = CaptureMeta(
            capture_id=job.capture_id,
            label=job.label or None,
            via=VIA_DETAIL,
            mode=job.mode,
            mode_honoured=note is None if facts.events else None,
            mode_note=note,
            requested={"record_shapes": full, "profile_memory": full, "with_stack": full},
            steps_requested=job.steps,
            steps_captured=steps_captured,
            step_ids=[],
            step_ids_note="vLLM's step annotations carry no engine step id; step_annotations lists them in order",
            step_annotations=facts.annotations,
            record_shapes=facts.record_shapes,
            profile_memory=facts.profile_memory,
            with_stack=facts.with_stack,
            with_flops=facts.with_flops,
            settings_source="read from the trace (the server's --profiler-config fixes them at start)",
            activities=["cpu", *facts.device_activities],
            device_trace=bool(facts.device_activities),
            cold=(job.start_call_s or 0.0) >= 0.5,
            cold_basis=(
                f"POST /start_profile took {job.start_call_s or 0.0:.2f} s; >= 0.5 s means the server's "
                "profiler initialised on this start"
            ),
            start_call_s=round(job.start_call_s or 0.0, 4),
            stop_call_s=round(job.stop_call_s or 0.0, 4),
            export_s=round(export_s, 4),
            trace_read_s=round(read_s, 4),
            trace_bytes=trace_bytes,
            events=facts.events,
            error=job.error,
            requested_ns=job.requested_ns,
            window_start_ns=job.started_ns,
            window_end_ns=job.window_end_ns,
            engine_steps_at_start=job.steps_at_start,
            profile_prefix=job.prefix,
            server_profiler_dir=s.profiler_dir,
            server_files=server_files,
            trace_vllm_version=facts.vllm_version,
        )
        return new_meta(
            note="Timings in this bundle were taken with vLLM's profiler on: they are not a baseline.",
            engine=info,
            stage_names=[],
            capture=capture,
            live_at_trigger=job.live_at_trigger,
            trigger=job.trigger,
            contract=server_contract(info),
            files=out_files,
        )


def _total(by_engine: dict[str, float] | None) -> float | None:
    return sum(by_engine.values()) if by_engine else None


def server_contract(info: EngineInfo) -> dict[str, Any]:
    """Every contract field for the server's bundle, from what the adapter learnt.

    Unlike the probe's ``build_contract`` this looks at nothing on the monitor's host (its
    git tree, torch or driver describe the monitor, not the server) and imports no torch.
    """
    c = info.contract
    out: dict[str, Any] = {}
    for f in CONTRACT_FIELDS:
        v = c.get(f)
        out[f] = v if v not in (None, "") else unknown("the vLLM server does not report it")
    for k, v in c.items():
        if k not in out and v is not None:
            out[k] = v
    out["profiled"] = True
    return out


validate_request = capture_request_problem
"""A reason to refuse a capture request, or None (the one check, ``definitions.bundle``)."""


def profile_prefix(capture_id: str, label: str) -> str:
    """A ``profile_prefix`` vLLM accepts (alphanumeric first, ``[A-Za-z0-9._-]``, <= 128)."""
    lab = sanitize_label(label)
    return f"rltperf-{capture_id}" + (f"-{lab}" if lab else "")
