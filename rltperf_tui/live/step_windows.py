"""The step windows: a target's steps and requests in numpy rings, and every per-window
statistic drawn from them (``window()``, ``timeline()``, ``idle_gaps()``...).

``TargetStats`` (``rltperf_tui.live.aggregator``) composes this with the connection and
capture state (``rltperf_tui.live.stream_state``); the two share one ``StreamClock``.
Metric definitions: the window rates (idle, MBU, tokens/s, steps/s, goodput) are
``engine_adapters.definitions.figures``'s, the percentiles of pooled samples are its
``pct()``; docs/ARCHITECTURE.md says where each figure is defined.  No Textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_adapters.definitions import figures as F
from engine_adapters.definitions import roofline
from engine_adapters.definitions.figures import pct, pct_sorted
from engine_adapters.definitions.order_stats import sorted_median
from engine_adapters.definitions.records import (
    FLAG_EXPORTING,
    FLAG_PROFILED,
    FLAG_WARMUP,
    Ceiling,
    RequestRecord,
    StepRecord,
)
from rltperf_tui.live.sorted_window import WindowSlide
from rltperf_tui.live.step_rings import (
    MAX_STAGES,
    REQ_COLS,
    STEP_COLS,
    Ring,
    TimelineSums,
    request_columns,
    step_columns,
)
from rltperf_tui.live.stream_state import StreamClock
from rltperf_tui.live.window_stats import IdleGap, Window, ceiling_ms_p50, loop_figures


class StepWindows:
    """A target's steps and requests as numpy columns, and the statistics of a window
    over them.  ``clock`` is shared with the target's ``StreamState``."""

    def __init__(self, clock: StreamClock, capacity: int = 32768, grow: bool = False) -> None:
        self.clock = clock
        self.steps = Ring(capacity, STEP_COLS, grow)
        """Step columns (``step_rings.STEP_COLS``), oldest overwritten unless ``grow``."""
        self.reqs = Ring(max(1024, capacity // 4), REQ_COLS, grow)
        """Request columns (``step_rings.REQ_COLS``)."""
        self.id_gaps = 0
        """Step ids missing from the stream (records dropped on the way)."""
        self.last_step_id: int | None = None
        self.last_step: StepRecord | None = None
        self.reported: tuple[bool, bool, bool] = (False, False, False)
        """Whether any step so far reported busy time, bytes, FLOPs (a window without such
        steps then reads 0, not unknown)."""
        self._timeline: TimelineSums | None = None
        self._slides: dict[float | None, WindowSlide] = {}
        self._rows_for: tuple[tuple[float | None, int, int, int | None], int] | None = None  # _window_rows'
        self._grown: dict[tuple[float, int, int], tuple[str | None, float | None]] = {}
        """(window, stages, step id) -> the stage that grew most before an idle gap after
        that step, and by how much (``idle_gaps``)."""

    # -- ingest ------------------------------------------------------------------------------

    def add_steps(self, steps: list[StepRecord]) -> None:
        """Append a batch of steps (stream order) and move the clock to its end."""
        n = len(steps)
        rep = self.reported
        want = not (rep[0] and rep[1] and rep[2])
        cols, batch_rep = step_columns(steps, want)
        ids = cols["step_id"]
        prev = self.last_step_id
        gaps = 0
        if prev is not None and ids[0] > prev + 1:
            gaps += ids[0] - prev - 1
        if ids[-1] - ids[0] != n - 1:  # holes inside the batch (dropped records)
            for i in range(1, n):
                d = ids[i] - ids[i - 1]
                if d > 1:
                    gaps += d - 1
        self.id_gaps += gaps
        self.last_step_id = ids[-1]
        self.last_step = steps[-1]
        self.clock.steps_ended(cols["start"][0], cols["end"][-1])
        if want:
            self.reported = (rep[0] or batch_rep[0], rep[1] or batch_rep[1], rep[2] or batch_rep[2])
        self.steps.append(cols, n)

    def add_requests(self, reqs: list[RequestRecord]) -> None:
        """Append a batch of finished requests (TTFT and TPOT as defined in records.py)."""
        cols = request_columns(reqs)
        self.clock.now_ns = max(self.clock.now_ns, max(cols["finish"]))
        self.reqs.append(cols, len(reqs))

    # -- which rows a window holds -----------------------------------------------------------

    def kept_seconds(self) -> float | None:
        """The window that holds exactly what the step ring still keeps: None (the whole
        stream) until the ring has overwritten old steps, then from the oldest kept
        step's start to now.  Whole-stream figures of a bounded ring use it."""
        oldest = self._oldest_kept_ns()
        return None if oldest is None else max(0.0, (self.clock.vouched_ns - oldest) / 1e9)

    def _oldest_kept_ns(self) -> int | None:
        """Start of the oldest step still kept, once the ring has overwritten older ones
        (None: it holds the whole stream)."""
        if self.steps.n <= len(self.steps) or not len(self.steps):
            return None
        return int(self.steps.oldest("start"))

    def bounds(self, seconds: float | None) -> tuple[int, int]:
        """``(w0, w1)`` of the window over the last ``seconds`` (None: the whole stream):
        the clock's (``StreamClock.window_bounds``), starting no earlier than the oldest
        step the ring still keeps.  A stream faster than the ring holds for the window
        (32 768 steps: 10 s at 3 277 steps/s) would otherwise count the time of the steps
        it overwrote with none of their steps, busy time or tokens: at ~20 000 steps/s
        the screen read 3 277 steps/s and idle 90 %."""
        w0, w1 = self.clock.window_bounds(seconds)
        oldest = self._oldest_kept_ns()
        if oldest is not None:
            w0 = min(max(w0, oldest), w1)
        return w0, w1

    def _window_rows(self, seconds: float | None) -> int:
        """How many of the newest kept steps end inside the window of the last ``seconds``
        (None: all kept); found again only once a step came or the clock moved."""
        key = (seconds, self.steps.n, self.clock.vouched_ns, self.clock.first_ns)
        if self._rows_for is not None and self._rows_for[0] == key:
            return self._rows_for[1]
        rows = len(self.steps)
        if rows and seconds is not None:
            w0, _ = self.bounds(seconds)
            rows -= self.steps.search("end", w0, side="right")
        self._rows_for = (key, rows)
        return rows

    def _window_cols(self, seconds: float | None, rows: int | None = None) -> Any:
        """``col(name)``: the rows of a step column that end inside the window of the last
        ``seconds`` (None: all kept), copying only those rows (a whole-ring copy of the
        stage matrix is megabytes, at every render tick); ``rows``: ``_window_rows``
        when the caller has it."""
        if rows is None:
            rows = self._window_rows(seconds)
        last = self.steps.last

        def col(name: str) -> np.ndarray:
            return last(name, rows)

        return col

    def _slide(self, seconds: float | None) -> WindowSlide:
        """What the window of the last ``seconds`` keeps between calls (its matrix sums
        and sorted samples, slid forward: ``sorted_window.WindowSlide``)."""
        sl = self._slides.get(seconds)
        if sl is None:
            if len(self._slides) >= 4:
                self._slides.pop(next(iter(self._slides)))
            sl = self._slides[seconds] = WindowSlide(self.steps)
        return sl

    # -- queries -----------------------------------------------------------------------------

    def window(
        self,
        seconds: float | None = 10.0,
        slo_ttft_ms: float | None = None,
        slo_tpot_ms: float | None = None,
        *,
        ceiling: Ceiling | None = None,
        stage_names: list[str] | None = None,
        max_loops: int | None = None,
        energy: Any = (),
        energy_source: str | None = None,
        energy_why: str | None = None,
    ) -> Window:
        """Statistics over the window of the last ``seconds`` of data time (None: the whole
        stream); rates are ``engine_adapters.definitions.figures``'s, percentiles leave excluded steps
        (profiled, exporting, warm-up) and the requests in flight during them out.
        ``ceiling``: the peaks for MBU and the roofline; ``max_loops``: the engine's loop
        depth (None: the deepest exit seen); ``energy``: the energy device's counter
        readings (``StreamState.energy_readings``), ``energy_source`` their source and
        ``energy_why`` why there are none."""
        clock = self.clock
        names = stage_names or []
        w0, w1 = self.bounds(seconds)
        n = self._window_rows(seconds)
        col = self._window_cols(seconds, n)
        start_x = self.steps.last("start", n + 1)  # and the step before the window, when kept
        end_x = self.steps.last("end", n + 1)
        k = start_x.size - n  # 1 when the step before the window is kept
        start = start_x[k:]
        end = end_x[k:]
        flags = col("flags")
        peak_bw = ceiling.peak_bw_gbps if ceiling else None
        peak_fl = ceiling.peak_gflops if ceiling else None
        # each step owns the time from the previous step's end (figures.owned_from)
        t0 = int(end_x[0]) if k else (clock.first_ns if clock.first_ns is not None else w0)
        owned_lo = F.owned_from(start, end, t0)
        busy = col("busy")
        nbytes = col("bytes")
        flops = col("flops")
        fig = F.window_figures(
            start=start,
            end=end,
            flags=flags,
            busy=busy,
            nbytes=nbytes,
            flops=flops,
            tokens=col("out_tokens"),
            w0_ns=w0,
            w1_ns=w1,
            owned_lo=owned_lo,
            reported=self.reported,
            energy=energy,
        )
        keep = (flags & F.EXCLUDED_FLAGS) == 0
        n_keep = int(keep.sum())
        whole = n_keep == n  # no excluded step: the kept rows are all the rows (no gathers)
        dur = (end - start).astype(np.float64)
        dur_k = dur if whole else dur[keep]
        slide = self._slide(seconds)
        # with no excluded step the gaps between kept steps are every gap: the idle-gap
        # threshold's samples (kept sorted as well) in ms, one sorted window slid, not two
        gap_ms = slide.sorted_gap_ns(n).astype(np.float64) / 1e6 if whole else slide.sorted_gap_ms(n)
        sums = slide.sums.get(self.steps, self.steps.n - n, self.steps.n)
        if n_keep < n:  # take the few excluded rows back out of the sliding sums
            sums = {c: v - col(c)[~keep].sum(axis=0, dtype=np.int64) for c, v in sums.items()}
        stage_mean = {}
        if n_keep:
            means = sums["stages"][: len(names)] / n_keep / 1e6 if names else np.zeros(0)
            stage_mean = {nm: float(v) for nm, v in zip(names, means, strict=False) if v > 0}
        known = ~np.isnan(busy) if whole else ~np.isnan(busy) & keep
        in_step_idle = None
        if known.any():
            busy_kn, dur_kn = (busy, dur) if known.all() else (busy[known], dur[known])
            dur_s = float(dur_kn.sum())
            if dur_s > 0:
                in_step_idle = F.idle_fraction(float(busy_kn.sum()), dur_s)
        rf = roofline.window_roofline(
            total_bytes=fig.nbytes,
            total_flops=fig.flops,
            seconds=fig.seconds,
            peak_bw_gbps=peak_bw,
            peak_gflops=peak_fl,
            in_step_idle=in_step_idle,
        )
        req = self._request_figures(w0, fig, slo_ttft_ms, slo_tpot_ms)
        exit_list, mean_depth, loop_ms, loop_tk = loop_figures(sums, n_keep, max_loops)
        drafts, drafted, accepted = (
            int(col(c).sum(dtype=np.int64) if whole else col(c)[keep].sum(dtype=np.int64))
            for c in ("drafts", "drafted", "accepted")
        )
        return Window(
            seconds=float(seconds) if seconds is not None else fig.wall_s,
            span_s=fig.wall_s,
            steps=n_keep,
            step_ms=pct_sorted(slide.sorted_step_ms(n)),
            gap_ms=pct_sorted(gap_ms),
            step_ms_mean=float(dur_k.mean() / 1e6) if n_keep else None,
            stage_ms_mean=stage_mean,
            idle_fraction=fig.idle_fraction,
            busy_known_steps=int(known.sum()),
            achieved_gbps=rf.achieved_gbps,
            achieved_gflops=rf.achieved_gflops,
            mbu=rf.mbu,
            mbu_overcount=rf.mbu is not None and rf.mbu > 1.0,
            intensity=rf.intensity,
            balance=rf.balance,
            verdict=rf.verdict,
            ceiling_ms_p50=ceiling_ms_p50(nbytes, flops, keep, peak_bw, peak_fl),
            tokens_per_s=fig.tokens_per_s if n or fig.seconds > 0 else None,
            steps_per_s=fig.steps_per_s,
            ttft_ms=pct(req.ttft_ms),
            tpot_ms=pct(req.tpot_ms),
            requests_ok=req.ok,
            requests_failed=req.failed,
            goodput_rps=req.goodput_rps,
            exit_hist=exit_list,
            mean_exit_depth=mean_depth,
            loop_ms_mean=loop_ms,
            loop_tokens_mean=loop_tk,
            spec_drafts=drafts,
            spec_drafted=drafted,
            spec_accepted=accepted,
            acceptance_rate=accepted / drafted if drafted else None,
            mean_acceptance_len=1.0 + accepted / drafts if drafts else None,
            profiled_steps=0 if whole else int(((flags & FLAG_PROFILED) != 0).sum()),
            warmup_steps=0 if whole else int(((flags & FLAG_WARMUP) != 0).sum()),
            exporting_steps=0 if whole else int(((flags & FLAG_EXPORTING) != 0).sum()),
            baseline_s=fig.seconds,
            excluded_s=fig.excluded_s,
            requests_excluded=req.excluded,
            quiet_s=clock.quiet_s,
            ring_cut=w0 > clock.window_bounds(seconds)[0],
            in_step_idle=in_step_idle,
            blind=F.blind(fig),
            power_w=fig.power_w,
            joules_per_token=fig.joules_per_token,
            joules_per_step=fig.joules_per_step,
            energy_source=energy_source if fig.power_w is not None else None,
            energy_na=None if fig.power_w is not None else _energy_na(fig, energy_why),
        )

    def _request_figures(
        self, w0: int, fig: F.WindowFigures, slo_ttft_ms: float | None, slo_tpot_ms: float | None
    ) -> _RequestFigures:
        """The requests finishing in the window; those in flight during excluded time leave."""
        R = self.reqs
        rfin = R.last("finish")
        rsl = slice(int(np.searchsorted(rfin, w0, side="right")), rfin.size)
        ok = R.last("ok")[rsl]
        ttft = R.last("ttft")[rsl]
        tpot = R.last("tpot")[rsl]
        clear = np.ones(ok.size, dtype=bool)
        if ok.size:
            arrival = R.last("arrival")[rsl]
            # the steps ending after its arrival, and the one before (where they own from)
            kept = len(self.steps)
            rows = min(kept, kept - self.steps.search("end", int(arrival.min()), side="right") + 1)
            flags = self.steps.last("flags", rows)
            if (flags & F.EXCLUDED_FLAGS).any():
                spans = F.excluded_spans(self.steps.last("start", rows), self.steps.last("end", rows), flags)
                clear = F.requests_clear_of(arrival, rfin[rsl], spans)
        ok_c = ok & clear
        goodput = None
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            good = ok_c.copy()
            if slo_ttft_ms is not None:
                good &= ~np.isnan(ttft) & (ttft / 1e6 <= slo_ttft_ms)
            if slo_tpot_ms is not None:
                # a one-token request has no TPOT: it meets the TPOT SLO trivially
                good &= np.isnan(tpot) | (tpot / 1e6 <= slo_tpot_ms)
            goodput = fig.per_second(float(good.sum()))
        return _RequestFigures(
            ttft_ms=ttft[ok_c & ~np.isnan(ttft)] / 1e6,
            tpot_ms=tpot[ok_c & ~np.isnan(tpot)] / 1e6,
            ok=int(ok_c.sum()),
            failed=int((~ok & clear).sum()),
            excluded=int((~clear).sum()),
            goodput_rps=goodput,
        )

    def timeline(
        self, seconds: float = 30.0, buckets: int = 60, stage_names: list[str] | None = None
    ) -> dict[str, Any]:
        """Per-bucket mean step time by stage and mean gap over the last ``seconds``.

        Buckets are ``seconds / buckets`` long and aligned to absolute time; the newest
        one holds "now" and is still filling.  Returns ``{"t0_ns", "bucket_s", "stage_ms":
        {name: array}, "gap_ms": array, "step_ms": array, "steps": [int]}`` (float arrays,
        one value a bucket); a step counts in the bucket its end falls in; empty buckets
        hold NaN.
        """
        bucket_ns = max(1, int(seconds * 1e9 / buckets))
        acc = self._timeline
        if acc is None or acc.bucket_ns != bucket_ns or acc.keep < buckets:
            acc = self._timeline = TimelineSums(bucket_ns, 2 * buckets)
            acc.seen = max(0, self.steps.n - len(self.steps))
        last_b = self.clock.now_ns // bucket_ns
        first_b = last_b - buckets + 1
        acc.update(self.steps, first_b * bucket_ns - 1)
        m = acc.rows(first_b, buckets)
        cnt = m[:, 0]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_step = m / cnt[:, None] / 1e6  # NaN where a bucket has no steps
            gap = m[:, 2] / m[:, 3] / 1e6
        out: dict[str, Any] = {
            "t0_ns": first_b * bucket_ns,
            "bucket_s": bucket_ns / 1e9,
            "stage_ms": {},
            "gap_ms": gap,
            "step_ms": per_step[:, 1],
            "steps": [int(c) for c in cnt],
        }
        h = TimelineSums.HEAD
        for i, nm in enumerate((stage_names or [])[:MAX_STAGES]):
            if m[:, h + i].any():
                out["stage_ms"][nm] = per_step[:, h + i]
        return out

    def flagged_buckets(self, t0_ns: int, bucket_s: float, buckets: int) -> np.ndarray:
        """Per timeline bucket (``timeline()``'s ``t0_ns`` and ``bucket_s``): 1 where a
        step ending in it was profiled, exporting or warm-up (not baseline), else 0."""
        out = np.zeros(buckets, dtype=np.int8)
        n = len(self.steps)
        if not n:
            return out
        rows = n - self.steps.search("end", t0_ns, side="left")
        flags = self.steps.last("flags", rows)
        hit = (flags & F.EXCLUDED_FLAGS) != 0
        if hit.any():
            end = self.steps.last("end", rows)
            cols = ((end[hit] - t0_ns) // int(bucket_s * 1e9)).astype(np.int64)
            cols = cols[(cols >= 0) & (cols < buckets)]
            out[cols] = 1
        return out

    def idle_gaps(
        self,
        seconds: float = 30.0,
        threshold_ms: float | None = None,
        limit: int = 8,
        stage_names: list[str] | None = None,
    ) -> list[IdleGap]:
        """Gaps between consecutive steps over the threshold, newest first, each with the
        stage that grew most in the step before it (over that stage's median, among the
        stages over it by more than twice their P99's distance from it: None when none
        was), over the window when the gap was first listed (kept for the gap from then
        on: a window's stage medians at every tick were most of the tick's cost while a gap
        was listed).

        Default threshold: max(1 ms, 5 × the median gap).
        """
        rows = self._window_rows(seconds)
        if threshold_ms is None:
            threshold_ms = self.idle_gap_threshold_ms(seconds)
        longest = self._slide(seconds).sorted_gap_ns(rows)  # the window's gaps, sorted
        if not longest.size or longest[-1] / 1e6 <= threshold_ms:
            return []  # none over the threshold (most ticks): the window's rows stay unread
        col = self._window_cols(seconds, rows)
        start, end, ids = col("start"), col("end"), col("step_id")
        g = start[1:] - end[:-1]
        idx = np.nonzero((np.diff(ids) == 1) & (g / 1e6 > threshold_ms))[0]  # not empty (above)
        names = stage_names or []
        width = min(len(names), MAX_STAGES)
        shown = idx[::-1][:limit].tolist()
        keys = [(seconds, width, int(ids[i])) for i in shown]
        memo = self._grown
        new = [(i, k) for i, k in zip(shown, keys, strict=True) if k not in memo]
        if new:
            grown_of: list[tuple[str | None, float | None]] = [(None, None)] * len(new)
            if width:
                # each stage's median over the window (kept sorted as it slides), against
                # the new gaps' steps' stages
                lo = self.steps.n - end.size
                at_gap = np.stack([self.steps.rows("stages", lo + i, lo + i + 1)[0, :width] for i, _ in new])
                med, p99 = self._slide(seconds).stage_median_p99(end.size, width)
                # a stage grew when it ran over its median by more than twice as far as the
                # window's P99 lies over it: one within its usual spread explains no gap (a
                # sleep between steps named the stage that ran 0.02 ms over its median)
                over = at_gap - med
                delta = np.where(over > 2 * (p99 - med), over, -np.inf)
                j = np.argmax(delta, axis=1)
                grown_of = [(names[a], float(d[a] / 1e6)) if d[a] > 0 else (None, None)
                            for a, d in zip(j.tolist(), delta, strict=True)]  # fmt: skip
            memo.update((k, v) for (_, k), v in zip(new, grown_of, strict=True))
        first = int(ids[0])  # forget the gaps that left the window
        self._grown = {k: v for k, v in memo.items() if k[0] != seconds or k[2] >= first}
        return [
            IdleGap(at_ns=int(end[i]), length_ms=float(g[i] / 1e6), after_step=int(ids[i]),
                    grown_stage=memo[k][0], grown_ms=memo[k][1])
            for i, k in zip(shown, keys, strict=True)
        ]  # fmt: skip

    def idle_gap_threshold_ms(self, seconds: float = 30.0) -> float:
        """The default threshold ``idle_gaps`` uses over the window: max(1 ms, 5 x median gap)
        (so the screen can say which threshold it lists gaps over)."""
        g = self._slide(seconds).sorted_gap_ns(self._window_rows(seconds))
        med = sorted_median(g) / 1e6 if g.size else 0.0
        return max(1.0, 5 * med)

    def latest_kv(self) -> dict[str, Any]:
        """Newest queue and KV figures (None when the engine does not report them)."""
        s = self.last_step
        if s is None:
            return {}
        return {
            "waiting": s.waiting,
            "running": s.running,
            "kv_used": s.kv_used,
            "kv_total": s.kv_total,
            "kv_per_depth": s.kv_per_depth,
        }


@dataclass
class _RequestFigures:
    """The requests of one window (``StepWindows._request_figures``)."""

    ttft_ms: np.ndarray
    """TTFT of the completed requests clear of excluded time, ms."""
    tpot_ms: np.ndarray
    """TPOT of those requests (two tokens or more), ms."""
    ok: int
    failed: int
    excluded: int
    """In flight during excluded (profiled/exporting/warm-up) time: left out."""
    goodput_rps: float | None


def _energy_na(fig: F.WindowFigures, why: str | None) -> str:
    """What the energy figures wait for, or why they never come."""
    if fig.joules is None:
        return why or "no energy counter readings yet (the probe sends them about once a second)"
    return f"waiting for readings: the energy counter covers {fig.energy_s or 0:.1f} s of the window"
