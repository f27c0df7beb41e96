"""The composed policy: Retry( CircuitBreaker( Bulkhead( call ) ) ), fallback outermost."""

from .sync import Policy

__all__ = ["Policy"]
