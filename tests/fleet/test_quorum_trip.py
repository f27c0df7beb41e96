"""The quorum-gated trip with real processes: one worker whose calls all fail (say, a
broken network path of its own) cannot open the breaker for the fleet; it opens its own
view only. Failures from a second worker open it fleet-wide."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers import quorum_worker
from tests.helpers.processes import collect, join_all
from tests.helpers.quorum_worker import QUORUM

SPAWN = multiprocessing.get_context("spawn")


def run_worker(redis_url: str, name: str, failures: int, reap: list[Any]) -> tuple[Any, str]:
    results = SPAWN.Queue()
    worker = SPAWN.Process(target=quorum_worker.fail_then_report,
                           args=(redis_url, name, failures, results))
    reap.append(worker)
    worker.start()
    (report,) = collect(results, 1)
    join_all([worker])
    return report


def test_one_failing_worker_opens_only_its_own_view(name: str, redis_url: str,
                                                    reap: list[Any]) -> None:
    (seen, state) = run_worker(redis_url, name, 5, reap)
    # Two failures reach the minimum and the threshold, but from one worker only: the
    # fleet stays CLOSED and that worker rejects locally from then on.
    assert seen[:2] == ["failed", "failed"]
    assert all(s.startswith("rejected:open for this worker only") for s in seen[2:]), seen
    assert state == "CLOSED"
    healthy = CircuitBreaker(name, redis=redis_url, **QUORUM)
    assert healthy.call(lambda: "served") == "served"
    assert healthy.state is State.CLOSED


def test_failures_from_two_workers_open_the_breaker_for_everyone(
        name: str, redis_url: str, reap: list[Any]) -> None:
    run_worker(redis_url, name, 2, reap)            # worker 1: over the threshold alone
    (seen, state) = run_worker(redis_url, name, 1, reap)  # worker 2 makes the quorum
    assert seen == ["failed"] and state == "OPEN"
    bystander = CircuitBreaker(name, redis=redis_url, **QUORUM)
    with pytest.raises(CallNotPermitted) as rejected:
        bystander.call(lambda: "never runs")
    assert rejected.value.state is State.OPEN


def test_a_default_config_trips_on_one_worker_as_before(name: str, redis_url: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=4,
                             minimum_number_of_calls=2)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            breaker.call(lambda: 1 / 0)
    assert breaker.state is State.OPEN
    # the default wire string is unchanged (12 fields): older clients see no drift
    assert breaker.config.to_wire() == "1;C;4;2;50;100;60000;10;0;60000;3600000;60000"
