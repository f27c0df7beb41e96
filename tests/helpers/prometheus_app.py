"""A WSGI app as a user would write it for gunicorn (tests/fleet/test_prometheus_gunicorn.py):
one breaker and bulkhead built at import (before the fork, `--preload`), `/call` runs one
protected call (`?fail=1`: a failing one) and answers with the worker's pid, `/metrics`
serves prometheus_client's multiprocess registry plus the DistbreakerCollector, as
docs/guides/prometheus.md says. Configured by $DB_REDIS_URL and $DB_NAME."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from distbreaker import Bulkhead, CircuitBreaker
from distbreaker.contrib.prometheus import DistbreakerCollector

URL, NAME = os.environ["DB_REDIS_URL"], os.environ["DB_NAME"]
breaker = CircuitBreaker(NAME, redis=URL, redis_timeout=5, sliding_window_size=1000,
                         minimum_number_of_calls=1000)
bulkhead = Bulkhead(NAME, redis=URL, redis_timeout=5, max_concurrent_calls=50)
collector = DistbreakerCollector(redis=URL, components=[breaker, bulkhead], timeout=5)


def metrics() -> bytes:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(collector)
    return generate_latest(registry)


def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path == "/metrics":
        start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [metrics()]

    def work() -> str:
        if "fail=1" in environ.get("QUERY_STRING", ""):
            raise ConnectionError("dependency down")
        return "ok"

    try:
        bulkhead.call(breaker.call, work)
    except ConnectionError:
        pass
    start("200 OK", [("Content-Type", "text/plain"), ("Connection", "close")])
    return [str(os.getpid()).encode()]
