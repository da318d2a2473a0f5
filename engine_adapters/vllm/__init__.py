"""rltperf for vLLM: the HTTP adapter (``vllm+http://``) and the in-engine plugin.

- ``adapter.py``: ``VllmAdapter`` — /metrics scraping, metadata, captures through vLLM's
  profiler (``capture.py``), percentiles from histograms (``histograms.py``).
- ``plugin.py``: the ``vllm.general_plugins`` entry point, inert unless ``RLTPERF_PROBE``
  is set; ``hooks.py`` holds everything that depends on vLLM's internals.

Importing this package imports neither vllm nor torch.
"""
