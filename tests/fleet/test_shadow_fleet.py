"""Shadow configs fleet-wide (issue 27): sync and asyncio worker processes that declare
the same shadow config all feed the one shadow in Redis; it trips on the fleet's outcomes
and counts what it would have rejected, while every worker's every call is admitted."""

from __future__ import annotations

import multiprocessing

import redis

from distbreaker import CircuitBreaker
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX
from tests.helpers import shadow_worker
from tests.helpers.processes import collect, reap

SPAWN = multiprocessing.get_context("spawn")
CONFIG = {"sliding_window_size": 30, "minimum_number_of_calls": 30,
          "failure_rate_threshold": 50, "redis_timeout": 5.0, "subscribe": False,
          "shadow": {"tight": {"minimum_number_of_calls": 20, "failure_rate_threshold": 20}}}


def test_worker_processes_feed_one_shadow(redis_url: str, redis_client: redis.Redis,
                                          name: str) -> None:
    first = CircuitBreaker(name, redis=redis_url, **CONFIG)
    first.call(lambda: None)  # declares the shadow (its hello), then every call feeds it
    first.close()
    flavours = ["sync", "sync", "asyncio"]
    started, phase = SPAWN.Barrier(len(flavours)), SPAWN.Barrier(len(flavours))
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=shadow_worker.member,
                               args=(redis_url, name, CONFIG, 6, 2, flavour, started, phase,
                                     results))
                 for flavour in flavours]
    for process in processes:
        process.start()
    try:
        admitted = collect(results, len(flavours), timeout=60)
    finally:
        reap(processes)
    assert [p.exitcode for p in processes] == [0] * len(flavours)
    assert admitted == [8, 8, 8]  # the shadow never rejects a call
    (s,) = view.read_shadows(redis_client, DEFAULT_PREFIX, name)
    # 1 + 18 successes, then 6 failures from three processes: at 24 calls, 5 failed
    # (20.8 % >= 20 %) it trips; the last failure it would have rejected
    assert (s["name"], s["source"], s["seen"], s["seen_failures"]) == ("tight", "declared",
                                                                       25, 6)
    assert (s["trips"], s["rejected"], s["avoided"], s["state"]) == (1, 1, 1, "OPEN")
    assert CircuitBreaker(name, redis=redis_url, **CONFIG).state.value == "CLOSED"
