"""The fleet-wide rate limiter, sync front end: I/O only.

`acquire()` (or the decorator, ``with limiter:``, `call`) before each call; the bucket
lives in ``lua/ratelimiter.lua`` on Redis time, every other decision in
`ratelimiter.core`. The methods are in `_shell_sync.py`, generated from `_shell_aio.py`
by scripts/unasync.py.
"""

from __future__ import annotations

from ._shell_sync import RateLimiterShell
from .core import RateLimiterMetrics

__all__ = ["RateLimiter", "RateLimiterMetrics"]


class RateLimiter(RateLimiterShell):
    """`limit_for_period` permits per `limit_refresh_period` for the whole fleet.

    Resilience4j's RateLimiter, shared by every process using the same Redis: a call
    takes one permit (or `acquire(permits=n)`: a weight, e.g. LLM tokens), waiting up to
    `timeout_duration` for it, else `RequestNotPermitted`. Waiting calls reserve their
    permits when they ask, so they are served in the order they asked, fleet-wide, and
    a waiting call costs one round trip, not a poll. `drain()`, `change_limit()` and
    `metrics()` act on the fleet's limiter. Keyword arguments override fields of
    `config` (a `RateLimiterConfig`).
    """
