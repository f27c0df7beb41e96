"""The fleet-wide retry budget for asyncio: `distbreaker.RetryBudget` with awaited I/O.

The methods are in `_shell_aio.py` (the source scripts/unasync.py writes the sync copy from).
"""

from __future__ import annotations

from ._shell_aio import BudgetShell


class RetryBudget(BudgetShell):
    """Async twin of `distbreaker.RetryBudget` (same script, keys and fallback)."""
