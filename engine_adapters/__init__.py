"""Engine side of rltperf: record schema, wire, in-engine probe, adapters, reference engine.

Nothing here imports Textual; the monitor (``rltperf_tui``) imports this package, never
the other way round.
"""

__version__ = "0.1.0"
