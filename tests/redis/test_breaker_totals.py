"""The fleet-wide call counters of the state record (`calls_total`, `failures_total`):
every recorded call of every worker, in every state that records, on the hot path and
the general one, count and time windows, exact and batched mode; a reset empties the
window but never lowers them (they are counters for Prometheus)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker import readside as view
from distbreaker.errors import CallNotPermitted


def breaker_row(client: redis.Redis, name: str) -> dict[str, Any]:
    rows = {r["name"]: r for r in view.read_rows(client, "distbreaker",
                                                  view.scan(client, "distbreaker"))}
    return dict(rows[name]["breaker"])


def totals(client: redis.Redis, name: str) -> tuple[int, int]:
    b = breaker_row(client, name)
    return b["calls_total"], b["failures_total"]


def calls(breaker: CircuitBreaker, ok: int, failed: int) -> None:
    def fail() -> None:
        raise ConnectionError("down")

    for _ in range(ok):
        breaker.call(lambda: None)
    for _ in range(failed):
        with pytest.raises(ConnectionError):
            breaker.call(fail)


@pytest.mark.parametrize("window", [{}, {"sliding_window_type": "TIME_BASED",
                                         "sliding_window_size": 10}])
def test_every_workers_calls_add_up_and_a_reset_keeps_them(
        redis_url: str, redis_client: redis.Redis, name: str, window: dict[str, Any]) -> None:
    cfg = {"minimum_number_of_calls": 100, "redis_timeout": 5, **window}
    workers = [CircuitBreaker(name, redis=redis_url, **cfg) for _ in range(3)]
    for i, worker in enumerate(workers):
        calls(worker, ok=5 + i, failed=i)        # hot path (successes) and general path
    assert totals(redis_client, name) == (5 + 6 + 7 + 0 + 1 + 2, 3)
    workers[0].reset()
    calls(workers[1], ok=1, failed=1)
    assert totals(redis_client, name) == (23, 4)
    for worker in workers:
        worker.close()


def test_batched_outcomes_and_half_open_probes_count(redis_url: str,
                                                      redis_client: redis.Redis,
                                                      name: str) -> None:
    batched = CircuitBreaker(name, redis=redis_url, record_mode="batched", redis_timeout=5,
                             minimum_number_of_calls=100, flush_interval=0.05)
    calls(batched, ok=4, failed=2)
    batched.flush()
    assert totals(redis_client, name) == (6, 2)
    batched.close()
    exact = CircuitBreaker(name, redis=redis_url, redis_timeout=5, minimum_number_of_calls=2,
                           sliding_window_size=2, wait_duration_in_open_state=0.05,
                           permitted_calls_in_half_open=1)
    exact.reset()
    calls(exact, ok=0, failed=2)                  # trips: OPEN
    with pytest.raises(CallNotPermitted):
        exact.call(lambda: None)
    time.sleep(0.1)
    calls(exact, ok=1, failed=0)                  # the half-open probe closes it
    assert totals(redis_client, name) == (6 + 3, 2 + 2)
    exact.close()


def test_slow_calls_are_counted_in_every_state_that_records(redis_url: str,
                                                          redis_client: redis.Redis,
                                                          name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, redis_timeout=5, minimum_number_of_calls=100,
                             slow_call_duration=0.01)
    calls(breaker, ok=3, failed=0)
    assert breaker_row(redis_client, name)["slow_total"] == 0
    for _ in range(2):
        breaker.call(time.sleep, 0.03)                      # slow successes
    with pytest.raises(ConnectionError):
        breaker.call(lambda: (time.sleep(0.03), (_ for _ in ()).throw(ConnectionError()))[1])
    row = breaker_row(redis_client, name)
    assert (row["calls_total"], row["failures_total"], row["slow_total"]) == (6, 1, 3)
    breaker.reset()
    breaker.call(time.sleep, 0.03)
    assert breaker_row(redis_client, name)["slow_total"] == 4   # never lowered by a reset
    breaker.close()
