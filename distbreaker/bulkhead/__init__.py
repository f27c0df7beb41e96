"""The fleet-wide bulkhead: a Redis semaphore of leases (config, core, sync, asyncio)."""

from .config import BulkheadConfig
from .core import BulkheadMetrics, BulkheadPermit
from .sync import Bulkhead

__all__ = ["Bulkhead", "BulkheadConfig", "BulkheadMetrics", "BulkheadPermit"]
