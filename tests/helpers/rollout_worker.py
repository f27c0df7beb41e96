"""A worker process of the config rollout fleet test: calls one breaker with a given
config until told to stop, then closes it (a graceful shutdown: its goodbye leaves the
rollout hash) and reports (module level: spawn needs an importable target)."""

from __future__ import annotations

import time
import warnings
from typing import Any

from distbreaker import CircuitBreaker
from distbreaker.errors import CallNotPermitted, ConfigDriftWarning

#: Config A; B differs only in its failure threshold (the window is kept).
A = {"sliding_window_size": 50, "minimum_number_of_calls": 10,
     "failure_rate_threshold": 50.0, "wait_duration_in_open_state": 60.0,
     "redis_timeout": 5.0}
B = {**A, "failure_rate_threshold": 30.0}


def run(url: str, name: str, config: dict[str, Any], stop: Any, results: Any) -> None:
    breaker = CircuitBreaker(name, redis=url, **config)
    calls = rejections = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigDriftWarning)
        while not stop.is_set():
            try:
                breaker.call(lambda: "ok")
                calls += 1
            except CallNotPermitted:
                rejections += 1
            time.sleep(0.005)
        drift = sum(1 for w in caught if issubclass(w.category, ConfigDriftWarning))
    breaker.close()
    results.put((config["failure_rate_threshold"], calls, rejections, drift))
