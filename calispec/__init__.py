"""Calispec: a disaggregated serving system for Calibrated Speculative Decoding."""

__version__ = "0.1.0"
