"""Batched record mode across real processes: a fleet tripping on its combined rate,
the half-open probe cap, and outcomes still pending at a fork or at exit."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import redis

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from tests.helpers import batched_worker
from tests.helpers.batched_worker import fleet_state, ok
from tests.helpers.processes import reap
from tests.helpers.stampede import half_open_stampede

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")
ROOT = Path(__file__).resolve().parents[2]


# -- a fleet -----------------------------------------------------------------------------

def test_a_fleet_trips_on_the_fleet_wide_failure_rate(redis_url: str, name: str) -> None:
    processes_n = 4
    cfg = {"record_mode": "batched", "sliding_window_size": 20,
           "minimum_number_of_calls": 20, "wait_duration_in_open_state": 30.0}
    subscribed, flushed = SPAWN.Barrier(processes_n), SPAWN.Barrier(processes_n)
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=batched_worker.fleet_member,
                               args=(redis_url, name, cfg, 3, 2, subscribed, flushed, results))
                 for _ in range(processes_n)]
    for process in processes:
        process.start()
    try:
        outcomes = sorted(results.get(timeout=60) for _ in range(processes_n))
    finally:
        reap(processes)
    assert [p.exitcode for p in processes] == [0] * processes_n
    # 5 calls each (60 % failures) never reach the minimum of 20 in one process;
    # the fleet's 20 do, and every process then rejects without a call of its own
    assert outcomes == ["rejected:OPEN"] * processes_n
    metrics = CircuitBreaker(name, redis=redis_url, **cfg).metrics()
    assert (metrics.state, metrics.calls, metrics.failed) == (State.OPEN, 20, 12)


def test_half_open_probe_cap_holds_across_batched_processes(redis_url: str,
                                                            redis_client: redis.Redis,
                                                            name: str) -> None:
    processes_n = 4
    cfg = {"record_mode": "batched", "wait_duration_in_open_state": 0.4,
           "permitted_calls_in_half_open": 3, "half_open_lease": 20.0}
    run = half_open_stampede(redis_url, redis_client, name, cfg, processes_n, threads=4)
    assert run.exitcodes == [0] * processes_n
    assert run.probes_in_flight == 3
    assert (run.reached, run.rejected) == (3, run.total - 3)
    assert sorted(run.outcomes) == ["ok"] * 3 + ["rejected:HALF_OPEN"] * (run.total - 3)
    # the probes were recorded by their calls (no flush involved): CLOSED already
    assert run.breaker.state is State.CLOSED


# -- fork and exit ---------------------------------------------------------------------------

def _child_records(breaker: CircuitBreaker, calls: int) -> None:
    for _ in range(calls):
        breaker.call(ok)


def test_outcomes_pending_at_fork_are_counted_once(redis_url: str, redis_client: redis.Redis,
                                                   name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, record_mode="batched",
                             flush_interval=30.0, sliding_window_size=1000)
    for _ in range(7):
        breaker.call(ok)  # pending in the parent at the fork
    child = FORK.Process(target=_child_records, args=(breaker, 5))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    # the child flushed its own 5 on its way out (multiprocessing exit), not the parent's 7
    assert fleet_state(redis_client, breaker)["calls"] == 5
    breaker.flush()
    assert fleet_state(redis_client, breaker)["calls"] == 12

    # a bare os.fork() child that flushes and leaves with os._exit: same accounting
    for _ in range(3):
        breaker.call(ok)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _child_records(breaker, 4)
            breaker.flush()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert fleet_state(redis_client, breaker)["calls"] == 16
    breaker.flush()
    assert fleet_state(redis_client, breaker)["calls"] == 19


def test_outcomes_pending_at_exit_arrive(redis_url: str, redis_client: redis.Redis,
                                         name: str) -> None:
    worker = ROOT / "tests" / "helpers" / "batched_worker.py"
    subprocess.run([sys.executable, str(worker), redis_url, name, "250"],
                   check=True, timeout=60, cwd=ROOT)
    # 250 < max_batch and a 30 s interval: nothing but the exit flush sent them
    assert fleet_state(redis_client, CircuitBreaker(name, redis=redis_url))["calls"] == 250
