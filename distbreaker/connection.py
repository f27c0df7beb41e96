"""Turning the `redis=` argument into a client with short timeouts.

A URL builds a client whose socket and connect timeouts are the config's
`redis_timeout` and that never retries on its own (distbreaker's backoff
decides). An existing client is used as given: its timeouts are the user's.
redis-py's connection pools notice a fork and open fresh connections in the
child, so a breaker created before gunicorn/Celery forks is safe to use after.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

DEFAULT_URL = "redis://localhost:6379/0"
ASYNC_MAX_CONNECTIONS = 32
ASYNC_POOL_WAIT = 1.0  # seconds a call may queue for a free asyncio connection


def _url_options(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout,
            "retry_on_timeout": False, "health_check_interval": 0}


def sync_client(target: Any, timeout: float) -> Any:
    """A sync redis-py client from a URL, or the given client (None: localhost)."""
    if target is None:
        target = DEFAULT_URL
    if isinstance(target, str):
        return redis.Redis.from_url(target, **_url_options(timeout))
    if isinstance(target, redis.asyncio.Redis):
        raise TypeError("this is the sync breaker; use distbreaker.aio for an asyncio client")
    if not hasattr(target, "evalsha"):
        raise TypeError(f"redis must be a URL or a redis-py client, got {type(target).__name__}")
    return target


def async_client(target: Any, timeout: float) -> Any:
    """An asyncio redis-py client from a URL, or the given client (None: localhost)."""
    if target is None:
        target = DEFAULT_URL
    if isinstance(target, str):
        # redis.asyncio's default pool raises MaxConnectionsError (a ConnectionError) at once
        # beyond 100 calls in flight, which would pass for a Redis outage. Queue for one of a
        # few connections instead (opening many at once is slower than sharing few); the
        # queue is local, so its wait is bounded separately from the tight Redis timeouts.
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            target, max_connections=ASYNC_MAX_CONNECTIONS,
            timeout=max(ASYNC_POOL_WAIT, timeout), **_url_options(timeout))
        return redis.asyncio.Redis.from_pool(pool)
    if isinstance(target, redis.Redis):
        raise TypeError("this is the asyncio breaker; use distbreaker.CircuitBreaker "
                        "for a sync client")
    if not hasattr(target, "evalsha"):
        raise TypeError(f"redis must be a URL or a redis-py client, got {type(target).__name__}")
    return target
