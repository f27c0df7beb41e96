"""The Celery app a real worker runs in tests/fleet/test_contrib_celery.py.

`DISTBREAKER_CELERY_REDIS` is the test's redis-server (``redis://host:port``):
db 0 holds distbreaker's keys and the deliveries log, db 1 is the broker,
db 2 the result backend. Each delivery of a task appends one JSON line to
``deliveries:<key>`` (before the protected call, so re-queued deliveries that
the breaker rejected are logged too).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from distbreaker import CircuitBreaker, RetryBudget
from distbreaker.contrib.celery import protect

BASE = os.environ.get("DISTBREAKER_CELERY_REDIS", "redis://127.0.0.1:6379")
DATA = f"{BASE}/0"

app = Celery("tests.helpers.celery_app", broker=f"{BASE}/1", backend=f"{BASE}/2")
app.conf.update(worker_hijack_root_logger=False, worker_prefetch_multiplier=8,
                broker_connection_retry_on_startup=True, task_acks_late=False,
                result_expires=600)

#: Test (a): a breaker the test trips; its wait is short so the re-queue comes back soon.
DEFER_BREAKER = {"wait_duration_in_open_state": 2.0, "permitted_calls_in_half_open": 1,
                 "sliding_window_size": 10, "minimum_number_of_calls": 10}
#: Test (b): a breaker that never trips (the budget alone bounds the retries) and a
#: budget allowing exactly 3 retries in 60 s fleet-wide (no share of deposits).
RETRY_BREAKER = {"sliding_window_size": 100, "minimum_number_of_calls": 100}
RETRY_BUDGET = {"percent_can_retry": 0.0, "min_retries_per_sec": 0.05, "ttl": 60.0}
BUDGET_ALLOWANCE = 3

defer_breaker = CircuitBreaker("celery-defer", redis=DATA, **DEFER_BREAKER)
retry_breaker = CircuitBreaker("celery-retry", redis=DATA, **RETRY_BREAKER)
retry_budget = RetryBudget("celery-retry", redis=DATA, **RETRY_BUDGET)

_log = redis.Redis.from_url(DATA)


def log_delivery(task: Any, key: str) -> None:
    request = task.request
    _log.rpush(f"deliveries:{key}", json.dumps({
        "at": time.time(), "retries": request.retries, "eta": request.eta, "pid": os.getpid()}))


@protect(defer_breaker, min_countdown=0.5)
def _charge(task: Any, key: str) -> str:
    return f"charged {key}"


@app.task(bind=True, max_retries=None)
def charge(self: Any, key: str) -> str:
    """Logs the delivery, then makes the protected call."""
    log_delivery(self, key)
    return _charge(self, key)


@protect(retry_breaker, budget=retry_budget, retry_on=(ConnectionError,), backoff=0.2,
         backoff_max=0.4)
def _flaky(task: Any, key: str) -> str:
    raise ConnectionError(f"upstream down for {key}")


@app.task(bind=True, max_retries=None)
def flaky(self: Any, key: str) -> str:
    """Always fails with a transient error: only the retry budget stops its retries."""
    log_delivery(self, key)
    return _flaky(self, key)
