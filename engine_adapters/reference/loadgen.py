"""In-process load generator: fixed-shape requests, deterministic from a seed.

A workload is ``NAME[:ARG][,key=value...]``:

- ``single-128``          1 request, 128 prompt tokens, 64 output tokens (seed scenario 1)
- ``burst16-1024``        16 requests arriving together, 1024 in / 64 out (scenario 2)
- ``rate-4096[:RATE]``    4096 in / 64 out arriving at a fixed rate, RATE req/s (default
                          0.5), evenly spaced; 16 requests unless ``n=`` (scenario 3)
- ``poisson:RATE``        Poisson arrivals at RATE req/s (128 in / 64 out), open-ended
- ``closed:C``            closed loop: C requests in flight, a new one as each finishes
- ``steady-bursts[:RATE]`` Poisson at RATE req/s (default 3) plus a burst of ``burst=``
                          requests (default 16) every ``every=`` seconds (default 10):
                          the demo's default

Keys: ``in=`` prompt tokens, ``out=`` output tokens, ``n=`` total requests (open-ended
workloads run until the engine stops), ``rate=``, ``burst=``, ``every=``, ``pool=``
(distinct prompts cycled by open-ended workloads, default 64).

Every request is fixed-shape: exactly ``out`` tokens are generated whatever is sampled
(ignore-EOS).  Prompts are uniform random token IDs from the seed; their sha256 (over the
little-endian int32 IDs of the whole prompt pool) goes into the engine info with the
workload description, so a run can be reproduced token for token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Request:
    """One request from the load generator."""

    req_id: str
    prompt: list[int]
    max_tokens: int
    arrival_ns: int = 0


@dataclass
class WorkloadSpec:
    """A parsed workload string."""

    name: str
    prompt_len: int = 128
    output_len: int = 64
    total: int | None = None
    arrival: str = "poisson"
    """``burst`` (all at t=0), ``fixed`` (evenly spaced), ``poisson``, ``closed``, ``steady-bursts``."""
    rate: float = 1.0
    concurrency: int = 1
    burst: int = 0
    every_s: float = 0.0
    pool: int = 64
    text: str = ""
    extras: dict[str, str] = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        """True when the workload has a fixed number of requests."""
        return self.total is not None

    def describe(self) -> str:
        """One line for the engine info."""
        shape = f"{self.prompt_len} in / {self.output_len} out (fixed shape, ignore EOS)"
        n = f"{self.total} requests" if self.total is not None else "open-ended"
        if self.arrival == "burst":
            how = "1 request" if self.total == 1 else f"{self.total} simultaneous arrivals"
        elif self.arrival == "fixed":
            how = f"fixed-rate arrivals at {self.rate:g} req/s, {n}"
        elif self.arrival == "poisson":
            how = f"Poisson arrivals at {self.rate:g} req/s, {n}"
        elif self.arrival == "closed":
            how = f"closed loop, concurrency {self.concurrency}, {n}"
        else:
            how = f"Poisson {self.rate:g} req/s + bursts of {self.burst} every {self.every_s:g} s, {n}"
        return f"{self.text}: {shape}, {how}"


NAMED = ("single-128", "burst16-1024", "rate-4096", "poisson", "closed", "steady-bursts")


def parse_workload(text: str) -> WorkloadSpec:
    """Parse ``--workload`` (``ValueError`` with the accepted forms otherwise)."""
    parts = [p.strip() for p in text.strip().split(",") if p.strip()]
    if not parts:
        raise ValueError("--workload is empty; " + _forms())
    head, *kvs = parts
    name, _, arg = head.partition(":")
    opts: dict[str, str] = {}
    for kv in kvs:
        k, eq, v = kv.partition("=")
        if not eq:
            raise ValueError(
                f"--workload: {kv!r} should be key=value (keys: in, out, n, rate, burst, every, pool)"
            )
        opts[k.strip()] = v.strip()

    def num(v: str, what: str, kind: type = float) -> float:
        try:
            x = kind(v)
        except ValueError:
            raise ValueError(f"--workload: {what} must be a number, not {v!r}") from None
        if x <= 0:
            raise ValueError(f"--workload: {what} must be positive, not {v!r}")
        return float(x)

    if name == "single-128":
        w = WorkloadSpec(name, 128, 64, total=1, arrival="burst")
    elif name == "burst16-1024":
        w = WorkloadSpec(name, 1024, 64, total=16, arrival="burst")
    elif name == "rate-4096":
        w = WorkloadSpec(name, 4096, 64, total=16, arrival="fixed", rate=num(arg, "RATE") if arg else 0.5)
    elif name == "poisson":
        if not arg:
            raise ValueError("--workload poisson:RATE needs a rate in requests per second, e.g. poisson:4")
        w = WorkloadSpec(name, arrival="poisson", rate=num(arg, "RATE"))
    elif name == "closed":
        if not arg:
            raise ValueError(
                "--workload closed:CONCURRENCY needs the number of requests in flight, e.g. closed:8"
            )
        w = WorkloadSpec(name, arrival="closed", concurrency=int(num(arg, "CONCURRENCY", int)))
    elif name == "steady-bursts":
        w = WorkloadSpec(
            name, arrival="steady-bursts", rate=num(arg, "RATE") if arg else 3.0, burst=16, every_s=10.0
        )
    else:
        raise ValueError(f"unknown workload {name!r}; " + _forms())
    known = {"in", "out", "n", "rate", "burst", "every", "pool"}
    for k, v in opts.items():
        if k not in known:
            raise ValueError(f"--workload: unknown key {k!r} (keys: {', '.join(sorted(known))})")
        if k == "in":
            w.prompt_len = int(num(v, "in", int))
        elif k == "out":
            w.output_len = int(num(v, "out", int))
        elif k == "n":
            w.total = int(num(v, "n", int))
        elif k == "rate":
            w.rate = num(v, "rate")
        elif k == "burst":
            w.burst = int(num(v, "burst", int))
        elif k == "every":
            w.every_s = num(v, "every")
        elif k == "pool":
            w.pool = int(num(v, "pool", int))
    if w.arrival == "burst" and "n" in opts:
        pass  # n simultaneous
    w.text = text.strip()
    return w


def _forms() -> str:
    return (
        "use single-128, burst16-1024, rate-4096[:RATE], poisson:RATE, closed:CONCURRENCY or "
        "steady-bursts[:RATE], optionally followed by ,in=N,out=N,n=N"
    )


class LoadGenerator:
    """Releases the workload's requests as engine time passes (deterministic from the seed).

    ``start(t0)`` fixes time zero; ``poll(now)`` returns the requests that have arrived
    by ``now`` (stamped with their scheduled arrival time, so queueing inside an engine
    step counts in TTFT); ``finished(now)`` tells a closed loop that a request ended.
    """

    def __init__(self, spec: WorkloadSpec, vocab: int, seed: int = 0) -> None:
        self.spec = spec
        self.seed = seed
        npool = spec.total if spec.finite else spec.pool
        assert npool is not None
        self._prompts = np.random.default_rng([seed, 1]).integers(
            0, vocab, size=(max(1, npool), spec.prompt_len), dtype=np.int32
        )
        self._arr_rng = np.random.default_rng([seed, 2])
        self.tokens_sha256 = hashlib.sha256(self._prompts.astype("<i4").tobytes()).hexdigest()
        self.released = 0
        self._t0 = 0
        self._next_ns: int | None = None
        self._next_burst_ns: int | None = None
        self._closed_due: list[int] = []

    # -- timeline --------------------------------------------------------------------------

    def start(self, t0_ns: int) -> None:
        """Set time zero (probe clock) and schedule the first arrivals."""
        s = self.spec
        self._t0 = t0_ns
        if s.arrival in ("burst", "fixed"):
            self._next_ns = t0_ns
        elif s.arrival in ("poisson", "steady-bursts"):
            self._next_ns = t0_ns + self._exp_ns(s.rate)
        elif s.arrival == "closed":
            self._closed_due = [t0_ns] * s.concurrency
        if s.arrival == "steady-bursts":
            self._next_burst_ns = t0_ns + int(s.every_s * 1e9)

    def _exp_ns(self, rate: float) -> int:
        return int(self._arr_rng.exponential(1.0 / rate) * 1e9)

    @property
    def exhausted(self) -> bool:
        """All requests of a finite workload have been released."""
        return self.spec.total is not None and self.released >= self.spec.total

    def next_arrival_ns(self) -> int | None:
        """When the next request arrives (None: none scheduled, e.g. closed loop waiting)."""
        if self.exhausted:
            return None
        cands = [t for t in (self._next_ns, self._next_burst_ns) if t is not None]
        cands.extend(self._closed_due)
        return min(cands) if cands else None

    def _make(self, arrival_ns: int) -> Request:
        i = self.released
        self.released += 1
        prompt = self._prompts[i % len(self._prompts)].tolist()
        return Request(f"r{i}", prompt, self.spec.output_len, arrival_ns)

    def poll(self, now_ns: int) -> list[Request]:
        """Requests arrived by ``now_ns`` (oldest first)."""
        out: list[Request] = []
        s = self.spec
        while not self.exhausted:
            if s.arrival == "burst":
                if self._next_ns is None or self._next_ns > now_ns:
                    break
                out.append(self._make(self._next_ns))
                continue
            if s.arrival == "closed":
                due = [t for t in self._closed_due if t <= now_ns]
                if not due:
                    break
                t = min(due)
                self._closed_due.remove(t)
                out.append(self._make(t))
                continue
            # open loop: the earlier of the next single arrival and the next burst
            t_single = self._next_ns
            t_burst = self._next_burst_ns
            if t_burst is not None and (t_single is None or t_burst <= t_single) and t_burst <= now_ns:
                for _ in range(s.burst):
                    if self.exhausted:
                        break
                    out.append(self._make(t_burst))
                self._next_burst_ns = t_burst + int(s.every_s * 1e9)
                continue
            if t_single is None or t_single > now_ns:
                break
            out.append(self._make(t_single))
            if s.arrival == "fixed":
                self._next_ns = self._t0 + int(self.released / s.rate * 1e9)
            else:
                self._next_ns = t_single + self._exp_ns(s.rate)
        return out

    def finished(self, now_ns: int) -> None:
        """A request finished: a closed loop sends the next one at once."""
        if self.spec.arrival == "closed" and not self.exhausted:
            self._closed_due.append(now_ns)

    # -- contract --------------------------------------------------------------------------

    def contract(self) -> dict[str, str]:
        """Test-contract fields the workload determines."""
        s = self.spec
        npool = len(self._prompts)
        dataset = (
            f"synthetic: uniform random token IDs (numpy PCG64, seed [{self.seed}, 1]), "
            f"{npool} distinct prompts{' cycled' if not s.finite else ''}; "
            f"tokens sha256 {self.tokens_sha256}"
        )
        if s.arrival == "burst":
            arrival = f"all {s.total} requests at t=0"
            conc = f"{s.total} simultaneous"
        elif s.arrival == "fixed":
            arrival = f"fixed rate {s.rate:g} req/s, evenly spaced"
            conc = "open loop (set by the arrival rate)"
        elif s.arrival == "poisson":
            arrival = f"Poisson {s.rate:g} req/s (numpy PCG64, seed [{self.seed}, 2])"
            conc = "open loop (set by the arrival rate)"
        elif s.arrival == "closed":
            arrival = "closed loop: a new request when one finishes"
            conc = f"{s.concurrency} in flight"
        else:
            arrival = (
                f"Poisson {s.rate:g} req/s plus bursts of {s.burst} every {s.every_s:g} s "
                f"(numpy PCG64, seed [{self.seed}, 2])"
            )
            conc = "open loop (set by the arrival rate and the bursts)"
        total = (
            f"{s.total} requests"
            if s.finite
            else "open-ended: until the engine stops (--duration or a signal)"
        )
        return {
            "dataset": dataset,
            "prompt_template": "none: raw token IDs, no chat template",
            "output_length_policy": f"fixed {s.output_len} output tokens per request, ignore EOS",
            "concurrency": conc,
            "arrival_model": arrival,
            "total_requests_or_duration": total,
            "workload_tokens_sha256": self.tokens_sha256,
            "workload_seed": str(self.seed),
        }
