"""Shared drivers and the worker bodies that tests start in real processes."""
