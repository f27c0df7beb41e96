"""The fleet-wide pool: members sharing one health record each in Redis, Envoy's outlier
detection decided fleet-wide, and the choice of a member (config, core, sync, asyncio)."""

from .config import PoolConfig
from .sync import Pool

__all__ = ["Pool", "PoolConfig"]
