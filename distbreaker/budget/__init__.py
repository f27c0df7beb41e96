"""The fleet-wide retry budget, Finagle style (config, core, sync, asyncio)."""

from .config import BudgetConfig
from .sync import RetryBudget

__all__ = ["BudgetConfig", "RetryBudget"]
