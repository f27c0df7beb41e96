"""What the docker-compose fleet shares: one Policy per process, one breaker for all.

The gunicorn workers (app.py) and the Celery worker (tasks.py) build their
policies from the same configs, so they share one breaker, bulkhead and retry
budget named $BREAKER_NAME in $REDIS_URL without config drift. Every process
builds its own Policy after it starts (gunicorn imports the app in each worker
when not run with --preload; distbreaker also resets itself after a fork).
"""

from __future__ import annotations

import os

from distbreaker import BreakerConfig, BudgetConfig, BulkheadConfig, Policy, RetryConfig
from distbreaker.demo.fleet import Response, http_get

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
UPSTREAM_URL = os.environ.get("UPSTREAM_URL", "http://localhost:8080")
NAME = os.environ.get("BREAKER_NAME", "payments")

BREAKER = BreakerConfig(sliding_window_type="COUNT_BASED", sliding_window_size=20,
                        minimum_number_of_calls=10, failure_rate_threshold=50,
                        slow_call_rate_threshold=50, slow_call_duration=0.5,
                        wait_duration_in_open_state=float(os.environ.get("OPEN_WAIT", "5")),
                        permitted_calls_in_half_open=3, half_open_lease=10.0)
BULKHEAD = BulkheadConfig(max_concurrent_calls=8, max_wait_duration=0.1, lease=10.0,
                          expected_workers=6)
BUDGET = BudgetConfig(percent_can_retry=0.2, min_retries_per_sec=1.0, ttl=10.0)


def make_policy(http_retries: int) -> Policy:
    """The fleet's policy with `http_retries` attempts, drawn from the shared budget.

    1: no retries here and no budget in the Policy (the Celery task retries and
    draws from the same budget itself, see tasks.py).
    """
    if http_retries <= 1:
        return Policy(NAME, redis=REDIS_URL, breaker=BREAKER, bulkhead=BULKHEAD)
    return Policy(NAME, redis=REDIS_URL, breaker=BREAKER, bulkhead=BULKHEAD,
                  retry=RetryConfig(max_attempts=http_retries, base=0.05, cap=0.5),
                  budget=BUDGET)


def charge() -> Response:
    """One call to the flaky upstream (a 503 is returned; the Policy classifies it)."""
    return http_get(UPSTREAM_URL + "/charge", timeout=2.0)
