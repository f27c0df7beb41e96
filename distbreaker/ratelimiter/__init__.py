"""The fleet-wide rate limiter, Resilience4j's semantics on GCRA (config, core, sync,
asyncio)."""

from .config import RateLimiterConfig
from .sync import RateLimiter

__all__ = ["RateLimiter", "RateLimiterConfig"]
