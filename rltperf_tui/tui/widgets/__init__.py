"""Panels of the live monitor (one widget per module)."""
