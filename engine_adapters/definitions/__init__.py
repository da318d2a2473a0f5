"""The bottom layer both sides import: what a record, a frame, a figure and a ceiling are.

- ``records.py``: the tagged ``msgspec`` schema that travels everywhere.
- ``wire.py``: framing (4-byte length + msgpack) for sockets and recordings.
- ``figures.py``: the window's definition (idle, MBU, tokens/s, excluded time: each
  ratio one function on scalars and arrays) and the latency percentiles of pooled
  samples (``pct``).
- ``roofline.py``: roofline arithmetic (achieved GB/s, intensity, balance, the roof,
  ceiling time, verdict).
- ``histograms.py``: percentiles of Prometheus histograms (bounded by their buckets).
- ``server_window.py`` / ``server_history.py`` / ``cost.py``: a metrics endpoint's (vLLM's
  ``/metrics``) window and replicas' totals, trends and totals since attach, and cost.
- ``ceilings.py`` / ``calibrate.py``: peak bandwidth and FLOP/s, and how they are measured.
- ``contract.py``: host identity and the reproducible test contract.

Nothing here imports from ``probe``, ``monitor``, ``reference`` or ``rltperf_tui``.
"""
