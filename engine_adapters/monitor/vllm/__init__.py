"""The ``vllm+http://`` adapter: a vLLM server seen from the monitor over HTTP.

- ``adapter.py``: ``VllmAdapter`` — /metrics scraping (``metrics.py``), metadata
  (``info.py``), captures through vLLM's profiler (``capture.py``); percentiles come from
  ``engine_adapters.definitions.histograms``.
- The in-engine plugin (the probe inside vLLM's EngineCore) is ``engine_adapters.probe.vllm``.

Importing this package imports neither vllm nor torch.
"""
