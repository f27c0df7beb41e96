"""A worker process for tests/fleet/test_operator_reach.py: THREADS threads (or asyncio
tasks) calling one exact-mode breaker, ROUNDS times until each has been rejected (OPEN)
and then permitted again; prints, as JSON, the wall-clock time at which each thread's
first permitted call after its rejections started running (after its acquire), per round;
counts the threads rejected (test:NAME:rejecting:ROUND) and let through again
(test:NAME:permitted:ROUND) in Redis.

Usage: python reach_worker.py URL NAME THREADS ASYNC(0|1) ROUNDS
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import redis

from distbreaker import CallNotPermitted, CircuitBreaker
from distbreaker import aio as dbaio

URL, NAME, THREADS, ASYNC = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
ROUNDS = int(sys.argv[5])
# A 60 s wait and a 60 s revalidate_interval: only the pushed transition ends the
# local OPEN view within the test's bound.
CONFIG = {"wait_duration_in_open_state": 60, "sliding_window_size": 10,
          "minimum_number_of_calls": 10, "revalidate_interval": 60}
PAUSE = 0.005  # between calls: 32 threads must not starve the machine's two cores
GIVE_UP = 90.0


def sync_thread(breaker: CircuitBreaker, ready: redis.Redis,
                out: list[tuple[int, float]]) -> None:
    started: list[float] = []
    for round_ in range(ROUNDS):
        rejected = False
        deadline = time.monotonic() + GIVE_UP
        while time.monotonic() < deadline:
            started.clear()
            try:
                breaker.call(lambda: started.append(time.time()))
            except CallNotPermitted:
                if not rejected:
                    rejected = True
                    ready.incr(f"test:{NAME}:rejecting:{round_}")
            else:
                if rejected:
                    out.append((round_, started[0]))
                    ready.incr(f"test:{NAME}:permitted:{round_}")
                    break
            time.sleep(PAUSE)


async def async_task(breaker: dbaio.CircuitBreaker, ready: redis.Redis,
                     out: list[tuple[int, float]]) -> None:
    started: list[float] = []

    async def note() -> None:
        started.append(time.time())

    for round_ in range(ROUNDS):
        rejected = False
        deadline = time.monotonic() + GIVE_UP
        while time.monotonic() < deadline:
            started.clear()
            try:
                await breaker.call(note)
            except CallNotPermitted:
                if not rejected:
                    rejected = True
                    ready.incr(f"test:{NAME}:rejecting:{round_}")
            else:
                if rejected:
                    out.append((round_, started[0]))
                    ready.incr(f"test:{NAME}:permitted:{round_}")
                    break
            await asyncio.sleep(PAUSE)


def main() -> None:
    ready = redis.Redis.from_url(URL)
    out: list[tuple[int, float]] = []
    if ASYNC:
        async def run() -> None:
            breaker = dbaio.CircuitBreaker(NAME, redis=URL, **CONFIG)
            await asyncio.gather(*(async_task(breaker, ready, out) for _ in range(THREADS)))
        asyncio.run(run())
    else:
        breaker = CircuitBreaker(NAME, redis=URL, **CONFIG)
        threads = [threading.Thread(target=sync_thread, args=(breaker, ready, out))
                   for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
