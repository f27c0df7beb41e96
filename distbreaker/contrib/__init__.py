"""Integrations with the libraries a Python fleet already uses.

Each submodule imports its library on import (install the matching extra):
`distbreaker.contrib.httpx`, `distbreaker.contrib.requests`, ...
"""
