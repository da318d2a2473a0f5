"""The live model of a monitored target, without a screen (imports no Textual).

- ``aggregator.TargetStats``: one target's records in, windows out (over
  ``stream_state``, ``step_windows``, ``step_rings``; results in ``window_stats``);
- ``triggers``: rules over live figures that ask for captures by themselves.

The screen (``rltperf_tui.tui``), ``rltperf watch``, ``--jsonl`` and ``rltperf record``
all read targets through this package.  See docs/ARCHITECTURE.md.
"""
