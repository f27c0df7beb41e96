"""The fleet-wide pool for asyncio: `distbreaker.Pool` with awaited I/O.

The methods are in `_shell_aio.py` (the source scripts/unasync.py writes the sync copy from).
"""

from __future__ import annotations

from ._shell_aio import PoolShell, PoolUse

__all__ = ["Pool", "PoolUse"]


class Pool(PoolShell):
    """Async twin of `distbreaker.Pool` (same script, keys and records):
    ``async with pool.use() as pick:``."""
