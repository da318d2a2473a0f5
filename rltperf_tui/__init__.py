"""rltperf monitor: CLI, aggregator, Textual app and offline analysis.

Never imports torch or vllm at import time (a test enforces it).
"""

from engine_adapters import __version__

__all__ = ["__version__"]
