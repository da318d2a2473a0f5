"""Screens of the live monitor."""
