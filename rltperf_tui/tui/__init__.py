"""The Textual screen of the live monitor: the app (``app.py``, ``app_actions.py``), its
per-target state and ingest workers (``targets.py``), the panels (``widgets/``), the
help screen (``screens/``) and the layout (``app.tcss``).

It draws what ``rltperf_tui.live`` computes and never the other way round: nothing
under ``rltperf_tui.live`` imports this package or Textual.
"""
