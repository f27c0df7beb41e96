"""Batched record mode: bodies of the worker processes (importable for spawn, runnable as a
script) and what the parent reads back from Redis."""

from __future__ import annotations

import contextlib
import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.subscriber import SUBSCRIBERS
from distbreaker.breaker.core import Step
from distbreaker.errors import CallNotPermitted
from tests.helpers.waiting import wait_until


class Boom(Exception):
    pass


def fail() -> None:
    raise Boom("dependency down")


def ok() -> str:
    return "ok"


def fleet_state(client: redis.Redis, breaker: CircuitBreaker) -> dict[str, int | str]:
    """The fleet's state and counts as stored in Redis (what the flushes have sent)."""
    # imported here: run as a script (`python batched_worker.py`) `tests` is not importable
    from tests.helpers.records import read_record

    record = read_record(client, breaker.keys)
    return {"state": record["state"], **{f: int(record[f]) for f in
                                         ("calls", "failures", "slow", "total_ms")}}


def fleet_member(url: str, name: str, cfg: dict[str, Any], failures: int, successes: int,
                 subscribed: Barrier, flushed: Barrier, results: Queue) -> None:
    """Make a few calls (too few to trip alone), flush, then report whether the
    fleet's OPEN reached this process without another call of its own."""
    breaker = CircuitBreaker(name, redis=url, **cfg)
    subscriber = SUBSCRIBERS.watch(breaker)
    assert subscriber is not None and subscriber.ready.wait(10)
    breaker.call(ok)  # learn the fleet state once (CLOSED): a batched call from now on
    successes -= 1
    subscribed.wait(20)
    for _ in range(failures):
        try:
            breaker.call(fail)
        except Boom:
            pass
    for _ in range(successes):
        breaker.call(ok)
    breaker.flush()
    flushed.wait(20)
    # the view is dropped by pub/sub, or was refreshed by the flush (the call below
    # then says which; a view still PERMIT after 20 s is reported as "permitted")
    with contextlib.suppress(AssertionError):
        wait_until(lambda: breaker._codec.step(time.monotonic()) is not Step.PERMIT,
                   interval=0.005)
    try:
        breaker.call(ok)
        results.put("permitted")
    except CallNotPermitted as rejection:
        results.put(f"rejected:{rejection.state}")


def record_and_exit(url: str, name: str, calls: int) -> None:
    """A process that records outcomes and exits normally, never flushing itself."""
    breaker = CircuitBreaker(name, redis=url, record_mode="batched", flush_interval=30.0,
                             sliding_window_size=1000)
    for _ in range(calls):
        breaker.call(ok)


if __name__ == "__main__":  # python batched_worker.py URL NAME CALLS
    record_and_exit(sys.argv[1], sys.argv[2], int(sys.argv[3]))
