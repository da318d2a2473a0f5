"""Monitor side: adapters that turn a target string into a stream of records.

``tcp.py`` (an rltperf probe), ``replay.py`` (a recording), ``vllm/`` (a vLLM server over
HTTP: /metrics, metadata, captures through vLLM's profiler). ``registry.py`` selects one
through the ``rltperf.adapters`` entry points; ``base.py`` is the adapter contract.
These run in the monitor process and never import ``engine_adapters.probe``.
"""
