"""Benchmarks behind ``rltperf bench …``: each prints its figures (and JSON with --json)."""

from pathlib import Path

import engine_adapters

SOURCE_ROOT = Path(engine_adapters.__file__).resolve().parents[1]
"""The folder holding the packages (a checkout, or site-packages): benchmark children get
it on ``PYTHONPATH``, and stored test data is found under it."""
