"""The fleet-wide rate limiter for asyncio: `distbreaker.RateLimiter` with awaited I/O.

The methods are in `_shell_aio.py` (the source scripts/unasync.py writes the sync copy from).
"""

from __future__ import annotations

from ._shell_aio import RateLimiterShell

__all__ = ["RateLimiter"]


class RateLimiter(RateLimiterShell):
    """Async twin of `distbreaker.RateLimiter` (same script, keys and fallback); a waiting
    call sleeps with ``asyncio.sleep``."""
