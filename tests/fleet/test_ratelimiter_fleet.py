"""The rate limiter's limit shared by real (forked) processes, sync threads and asyncio
tasks, with workers SIGKILLed mid-run; and waiting callers of several processes served
in the order they asked.

Each permitted call is logged by one atomic script (the "protected call"), and the log
is checked against the rate limiter's exact guarantee (tests/helpers/ratelimits.py).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import threading
from typing import Any

import redis
import redis.asyncio

from distbreaker.errors import RequestNotPermitted
from distbreaker.ratelimiter.aio import RateLimiter as AsyncRateLimiter
from distbreaker.ratelimiter.sync import RateLimiter
from tests.helpers.ratelimits import LOG, busiest_period, read_log, violations
from tests.helpers.waiting import wait_until

FORK = multiprocessing.get_context("fork")
LIMIT, PERIOD_MS = 30, 1000
SETTINGS = {"limit_for_period": LIMIT, "limit_refresh_period": PERIOD_MS / 1000,
            "timeout_duration": 1.0, "redis_timeout": 5}

def weight_of(i: int) -> int:
    return 1 + i % 3          # weighted permits: 1, 2, 3 tokens


def _sync_worker(url: str, name: str, log: str, stop: str, threads: int) -> None:
    limiter = RateLimiter(name, redis=url, **SETTINGS)
    client = redis.Redis.from_url(url)
    record = client.register_script(LOG)

    def loop(t: int) -> None:
        i = t
        while not client.exists(stop):
            weight = weight_of(i)
            i += 1
            try:
                reserved = limiter.reserve(weight)
            except RequestNotPermitted:
                threading.Event().wait(0.05)       # the queue is a timeout long: later
                continue
            if reserved.wait > 0:
                threading.Event().wait(reserved.wait)
            record(keys=[log], args=[f"{reserved.run_at_ms},{weight}"])

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _async_worker(url: str, name: str, log: str, stop: str, tasks: int) -> None:
    async def main() -> None:
        limiter = AsyncRateLimiter(name, redis=url, **SETTINGS)
        client = redis.asyncio.Redis.from_url(url)
        record = client.register_script(LOG)

        async def loop(t: int) -> None:
            i = t
            while not await client.exists(stop):
                weight = weight_of(i)
                i += 1
                try:
                    reserved = await limiter.reserve(weight)
                except RequestNotPermitted:
                    await asyncio.sleep(0.05)
                    continue
                await asyncio.sleep(reserved.wait)
                await record(keys=[log], args=[f"{reserved.run_at_ms},{weight}"])

        await asyncio.gather(*(loop(t) for t in range(tasks)))

    asyncio.run(main())


def start(kind: str, url: str, name: str, reap: list[Any]) -> Any:
    target = _sync_worker if kind == "sync" else _async_worker
    process = FORK.Process(target=target, args=(url, name, f"{name}:log", f"{name}:stop", 4),
                           daemon=True)
    process.start()
    reap.append(process)
    return process


def test_the_fleet_never_exceeds_the_limit_even_when_workers_are_killed(
        redis_url: str, redis_client: redis.Redis, name: str, reap: list[Any]) -> None:
    log = f"{name}:log"
    fleet = [start(kind, redis_url, name, reap) for kind in ("sync", "asyncio") * 2]
    wait_until(lambda: redis_client.llen(log) >= 2 * LIMIT, timeout=60,
               what="the fleet saturated the limit once")
    for victim in fleet[:2]:                      # killed mid-run (waiting or calling)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
    fleet += [start(kind, redis_url, name, reap) for kind in ("sync", "asyncio")]
    mark = redis_client.llen(log)
    wait_until(lambda: redis_client.llen(log) >= mark + 3 * LIMIT, timeout=90,
               what="the replacements ran for a while")
    redis_client.set(f"{name}:stop", 1)
    for process in fleet[2:]:
        process.join(30)
        assert process.exitcode == 0
    entries = read_log(redis_client, log)
    assert violations(entries, LIMIT, PERIOD_MS, burst=LIMIT) == []
    # the limit was the bottleneck: some period's worth of calls used the whole limit
    assert busiest_period(entries, PERIOD_MS) >= LIMIT


def _queued(url: str, name: str, flavour: str, log: str, asked: Any) -> None:
    settings = {"limit_for_period": 1, "limit_refresh_period": 0.3, "timeout_duration": 30,
                "redis_timeout": 5}
    client = redis.Redis.from_url(url)
    if flavour == "sync":
        limiter = RateLimiter(name, redis=url, **settings)
        reserved = limiter.reserve()
        asked.release()
        assert reserved.wait <= settings["timeout_duration"]
        threading.Event().wait(reserved.wait)
    else:
        async def main() -> Any:
            limiter = AsyncRateLimiter(name, redis=url, **settings)
            reserved = await limiter.reserve()
            asked.release()
            assert reserved.wait <= settings["timeout_duration"]
            await asyncio.sleep(reserved.wait)
            return reserved
        reserved = asyncio.run(main())
    client.register_script(LOG)(keys=[log], args=[f"{reserved.run_at_ms},{os.getpid()}"])


def test_waiting_callers_of_several_processes_are_served_in_the_order_they_asked(
        redis_url: str, redis_client: redis.Redis, name: str, reap: list[Any]) -> None:
    log = f"{name}:log"
    RateLimiter(name, redis=redis_url, limit_for_period=1, limit_refresh_period=0.3,
                redis_timeout=5).drain()
    order = []
    for i in range(6):                  # each asks after the previous one's reservation
        asked = FORK.Semaphore(0)
        process = FORK.Process(target=_queued, daemon=True,
                               args=(redis_url, name, ("sync", "asyncio")[i % 2], log, asked))
        process.start()
        reap.append(process)
        assert asked.acquire(timeout=30)
        order.append(process.pid)
    for process in reap:
        process.join(60)
        assert process.exitcode == 0
    entries = read_log(redis_client, log)
    by_run_time = [pid for _, pid, _ in sorted(entries)]
    assert by_run_time == order                          # first asked, first served
    assert all(ran >= at for at, _, ran in entries)      # none ran before its turn
    runs = sorted(at for at, _, _ in entries)
    assert all(b - a >= 299 for a, b in itertools.pairwise(runs))  # one per 0.3 s


def test_the_check_is_not_vacuous() -> None:
    """The exact check flags one permit too many, and a call that ran early."""
    period = 1000
    # a full bucket of 10 at once, then one per 100 ms: exactly at the bound
    at_limit = [(0, 1, 0)] * 10 + [(t * 100, 1, t * 100) for t in range(1, 10)]
    assert violations(at_limit, 10, period, burst=10) == []
    assert violations([*at_limit, (500, 1, 500)], 10, period, burst=10) != []
    assert violations([(100, 1, 99)], 10, period, burst=10) == ["ran at 99 before its run "
                                                                 "time 100"]
    assert busiest_period(at_limit, period) == 19
