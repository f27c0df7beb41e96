"""A worker process of the outcome-recording fleet test: calls one breaker (config
`LIVE`, no recording of its own: a lax one, which never trips on 70 % failures) against
a dependency that fails 70 % of its calls while `failing` is set, until `stop` is set
(module level: spawn needs an importable target)."""

from __future__ import annotations

import random
import time
from typing import Any

from distbreaker import CircuitBreaker
from distbreaker.errors import CallNotPermitted

LIVE = {"sliding_window_size": 100, "minimum_number_of_calls": 100,
        "failure_rate_threshold": 90.0, "redis_timeout": 5.0}
#: What the replay shows would have protected the fleet.
TIGHT = {"sliding_window_size": 20, "minimum_number_of_calls": 10,
         "failure_rate_threshold": 50.0, "wait_duration_in_open_state": 0.5,
         "permitted_calls_in_half_open": 2}


def run(url: str, name: str, failing: Any, stop: Any, results: Any) -> None:
    breaker = CircuitBreaker(name, redis=url, **LIVE)
    rng = random.Random()

    def dependency() -> str:
        if failing.is_set() and rng.random() < 0.7:
            raise ConnectionError("dependency down")
        return "ok"

    calls = 0
    while not stop.is_set():
        try:
            breaker.call(dependency)
        except (ConnectionError, CallNotPermitted):
            pass
        calls += 1
        time.sleep(0.005)
    breaker.close()
    results.put(calls)
