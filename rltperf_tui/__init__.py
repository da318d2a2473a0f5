"""rltperf monitor."""
