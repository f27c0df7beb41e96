"""Retry with capped exponential backoff, jitter, Retry-After, a deadline and a budget."""

from .config import Jitter, RetryConfig
from .sync import Retry

__all__ = ["Jitter", "Retry", "RetryConfig"]
