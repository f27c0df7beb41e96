"""The asyncio Ganesha-mode breaker: awaited I/O only, decisions in `ganesha.core`.

The methods are in `_shell_aio.py` (the source scripts/unasync.py writes the sync copy from).
"""

from __future__ import annotations

from ._shell_aio import GaneshaShell


class GaneshaBreaker(GaneshaShell):
    """The asyncio twin of `distbreaker.GaneshaBreaker` (awaited methods, same keys)."""
