"""The synchronous Ganesha-mode breaker: I/O only, decisions in `ganesha.core`.

The methods are in `_shell_sync.py`, generated from `_shell_aio.py` by scripts/unasync.py.
"""

from __future__ import annotations

from ._shell_sync import GaneshaShell


class GaneshaBreaker(GaneshaShell):
    """A breaker that shares an ackintosh/ganesha (PHP) fleet's Redis keys and decisions.

    Each operation is one Lua script, so Python workers never lose their own events to
    member collisions and "tripped" fires once per trip among them; PHP workers keep
    Ganesha's own behaviour (a half-open that lets every request through, a check-then-set
    that may fire "tripped" once per PHP process). While Redis is unreachable
    `is_available()` answers True (fail open) and outcomes are dropped.
    """
