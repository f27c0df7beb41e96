"""The half-open stampede, driven from the parent: a fleet of processes, each with
several threads, calls at once as soon as the open wait has passed.

The worker body is `fleet_worker.half_open_stampede`; the parent trips the breaker,
waits until every process has seen OPEN, releases every thread after the open wait,
and holds the admitted probes in the dependency until every thread has tried.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from typing import Any

import redis

from distbreaker import CircuitBreaker
from tests.helpers import fleet_worker
from tests.helpers.fleet_worker import counter_key, wait_for_count, wait_until_all_tried
from tests.helpers.processes import collect, reap

SPAWN = multiprocessing.get_context("spawn")


@dataclasses.dataclass
class Stampede:
    """What the parent saw: counts from Redis while the probes were still held."""

    total: int  # calls tried, one per thread of the fleet
    reached: int  # calls that reached the dependency
    rejected: int  # calls rejected with CallNotPermitted
    probes_in_flight: int  # breaker metric once every thread had tried
    outcomes: list[str]  # every thread's result ("ok" or "rejected:STATE")
    exitcodes: list[int | None]
    breaker: CircuitBreaker  # the parent's breaker on the same name


def half_open_stampede(redis_url: str, client: redis.Redis, name: str, cfg: dict[str, Any],
                       processes: int, threads: int) -> Stampede:
    """Run the stampede with `processes` x `threads` callers on breaker `name`."""
    tripped, go, release = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
    results = SPAWN.Queue()
    workers = [SPAWN.Process(target=fleet_worker.half_open_stampede,
                             args=(redis_url, name, cfg, threads, tripped, go, release, results))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    outcomes: list[str] = []
    try:
        try:
            assert wait_for_count(client, counter_key(name, "ready"), processes) == processes
            breaker = CircuitBreaker(name, redis=redis_url, **cfg)
            breaker.trip()
            tripped_at = time.monotonic()
            tripped.set()
            assert wait_for_count(client, counter_key(name, "seen-open"),
                                  processes) == processes
            open_wait = float(cfg["wait_duration_in_open_state"])
            time.sleep(max(0.0, tripped_at + open_wait + 0.05 - time.monotonic()))
            go.set()
            total = processes * threads
            reached, rejected = wait_until_all_tried(client, name, total)
            # every thread of the fleet has tried; the probes are still in flight
            probes_in_flight = breaker.metrics().probes_in_flight
        finally:
            release.set()
        outcomes = [o for batch in collect(results, processes) for o in batch]
    finally:
        reap(workers)
    return Stampede(total, reached, rejected, probes_in_flight, outcomes,
                    [w.exitcode for w in workers], breaker)
