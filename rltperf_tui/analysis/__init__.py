"""Offline analysis of recordings and bundles (summary, report, compare)."""
