"""A worker process for tests/fleet/test_operator_reach.py: THREADS threads calling one exact-mode
breaker until each has been rejected (OPEN) and then permitted again; prints, as JSON,
the wall-clock time of each thread's first permitted call after its rejections.

Usage: python reach_worker.py URL NAME THREADS ASYNC(0|1)
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
CONFIG = {"wait_duration_in_open_state": 60, "sliding_window_size": 10,
          "minimum_number_of_calls": 10}
PAUSE = 0.005  # between calls: 32 threads must not starve the machine's two cores
GIVE_UP = 30.0


def sync_thread(breaker: CircuitBreaker, ready: redis.Redis, out: list[float]) -> None:
    rejected = False
    deadline = time.monotonic() + GIVE_UP
    while time.monotonic() < deadline:
        try:
            breaker.call(lambda: None)
        except CallNotPermitted:
            if not rejected:
                rejected = True
                ready.incr(f"test:{NAME}:rejecting")
        else:
            if rejected:
                out.append(time.time())
                return
        time.sleep(PAUSE)


async def async_task(breaker: dbaio.CircuitBreaker, ready: redis.Redis, out: list[float]) -> None:
    async def nothing() -> None:
        return None

    rejected = False
    deadline = time.monotonic() + GIVE_UP
    while time.monotonic() < deadline:
        try:
            await breaker.call(nothing)
        except CallNotPermitted:
            if not rejected:
                rejected = True
                ready.incr(f"test:{NAME}:rejecting")
        else:
            if rejected:
                out.append(time.time())
                return
        await asyncio.sleep(PAUSE)


def main() -> None:
    ready = redis.Redis.from_url(URL)
    out: list[float] = []
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
