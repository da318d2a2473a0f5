"""Engine side of rltperf, one folder per side the code runs on (docs/ARCHITECTURE.md):

- ``definitions/``: the bottom layer both sides import (schema, framing, figures, ceilings).
- ``probe/``: runs inside the engine (probe, publisher, capture, devices, Prometheus
  exporter, the vLLM plugin).
- ``monitor/``: the monitor's adapters (tcp, replay, vLLM over HTTP).
- ``reference/``: the reference looped engine and its load generator.

Nothing here imports Textual; the monitor (``rltperf_tui``) imports this package, never
the other way round.
"""

__version__ = "0.1.0"
