"""The quorum-gated trip with real processes: one worker whose calls all fail (say, a
broken network path of its own) cannot open the breaker for the fleet; it opens its own
view only. Failures from a second worker open it fleet-wide."""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers import quorum_worker
from tests.helpers.cli import run
from tests.helpers.processes import collect, join_all
from tests.helpers.quorum_worker import QUORUM
from tests.helpers.waiting import wait_until

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


def test_a_healthy_worker_is_never_rejected_while_the_quorum_is_pending(
        name: str, redis_url: str, reap: list[Any]) -> None:
    """The issue's minimal repro: window 10, minimum 5, 2 workers needed; one process
    fails 5 calls; a fresh healthy process keeps being served."""
    config = {"sliding_window_size": 10, "minimum_number_of_calls": 5,
              "min_failing_workers": 2, "wait_duration_in_open_state": 30.0,
              "redis_timeout": 5.0}
    results = SPAWN.Queue()
    worker = SPAWN.Process(target=quorum_worker.fail_with_config,
                           args=(redis_url, name, 5, config, results))
    reap.append(worker)
    worker.start()
    ((seen, state),) = collect(results, 1)
    join_all([worker])
    assert seen == ["failed"] * 5 and state == "CLOSED"
    healthy = CircuitBreaker(name, redis=redis_url, **config)
    served = [healthy.call(lambda: "served") for _ in range(20)]
    assert served == ["served"] * 20
    assert healthy.state is State.CLOSED


def _fleet(redis_url: str, name: str, bad: int, reap: list[Any],
           seconds: float = 3.0) -> list[Any]:
    results = SPAWN.Queue()
    start_at = time.time() + 4.0  # spawned interpreters import distbreaker first
    workers = [SPAWN.Process(target=quorum_worker.run_for,
                             args=(redis_url, name, i < bad, start_at, seconds, results))
               for i in range(8)]
    reap.extend(workers)
    for worker in workers:
        worker.start()
    reports = collect(results, 8, timeout=60.0)
    join_all(workers)
    return reports


@pytest.mark.parametrize("bad", [1, 2])
def test_fewer_bad_workers_than_the_quorum_never_reject_the_healthy_ones(
        name: str, redis_url: str, reap: list[Any], bad: int) -> None:
    reports = _fleet(redis_url, name, bad, reap)
    healthy = [r for r in reports if not r[0]]
    assert len(healthy) == 8 - bad
    assert all(r[1] > 0 for r in healthy), reports
    assert sum(r[3] for r in healthy) == 0, reports
    # the fleet's rate was exceeded (the scenario is meaningful: the bad workers' own
    # views opened on a quorum-pending reply), yet it stays CLOSED
    assert all(any("this worker only" in why for why in r[4]) for r in reports if r[0]), \
        reports
    observer = CircuitBreaker(name, redis=redis_url, **quorum_worker.FLEET)
    assert observer.state is State.CLOSED
    # operators see why: show, ls and ls --json name the pending quorum
    pending = f"quorum pending: {bad} of 3 workers failing"
    shown = run(redis_url, "show", name)
    assert shown.exit_code == 0 and pending in shown.output, shown.output
    listed = run(redis_url, "ls")
    assert pending in listed.output, listed.output
    (row,) = [r for r in json.loads(run(redis_url, "ls", "--json").output)["breakers"]
              if r["name"] == name]
    assert row["breaker"]["quorum"]["pending"] is True
    assert row["breaker"]["quorum"]["failing_workers"] == bad


def test_bad_workers_reaching_the_quorum_open_the_breaker_fleet_wide(
        name: str, redis_url: str, reap: list[Any]) -> None:
    observer = CircuitBreaker(name, redis=redis_url, **quorum_worker.FLEET)
    reports = _fleet(redis_url, name, 3, reap, seconds=2.0)
    assert sum(1 for r in reports if r[0]) == 3
    wait_until(lambda: observer.state is State.OPEN, what="the fleet opens")
    healthy_reasons = {reason for r in reports if not r[0] for reason in r[4]}
    assert not any("this worker only" in reason for reason in healthy_reasons), reports
