"""Benchmarks behind ``rltperf bench …``: each prints its figures (and JSON with --json)."""
