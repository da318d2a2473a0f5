"""rltperf inside vLLM: the ``vllm.general_plugins`` entry point (``plugin.py``).

``plugin.py`` is inert unless ``RLTPERF_PROBE`` is set; ``hooks.py`` holds everything that
depends on vLLM's internals. Importing this package imports neither vllm nor torch.
"""
