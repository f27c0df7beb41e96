"""Redis faults seen from a worker process (issues 23 and 24): a black hole is discovered
once per call, a connection burst is not an outage, a frozen Redis is rejoined soon
after it answers.

Each scenario runs in a real forked worker process against a real redis-server (behind
`TcpProxy` for the black hole); bounds are generous multiples of what is measured
(a loaded 2-core machine must pass): they tell one discovery from three, and 0.5 s
from the 2.4-4.5 s of a backoff escalated per failed call.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import distbreaker
import distbreaker.aio as aio
from distbreaker._runtime.health import shared_health
from distbreaker.demo.embedded import RedisServer
from tests.helpers.processes import private_redis_server, reap
from tests.helpers.proxy import TcpProxy

FORK = multiprocessing.get_context("fork")


def in_worker(target: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """Run `target(*args)` in a forked worker process; its return value."""
    results = FORK.Queue()

    def body() -> None:
        results.put(target(*args))

    process = FORK.Process(target=body)
    process.start()
    try:
        return results.get(timeout=timeout)
    finally:
        reap([process])


class _Warnings(logging.Handler):
    """Counts "Redis unavailable" warnings (each one is a fallback)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.outages = 0
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "Redis unavailable" in record.getMessage():
            self.outages += 1
            self.messages.append(record.getMessage())


def _watch_outages() -> _Warnings:
    handler = _Warnings()
    logging.getLogger("distbreaker").addHandler(handler)
    return handler


# -- a black-hole Redis: one discovery per call ------------------------------------------
TIMEOUT = 1.0


def _black_hole_sync(url: str, name: str, holed: Any, go: Any) -> list[float]:
    policy = distbreaker.Policy(name, redis=url, bulkhead=True, budget=True,
                                retry=False, redis_timeout=TIMEOUT)
    for _ in range(3):
        policy.call(lambda: "ok")
    holed.set()
    go.wait(30)
    took = []
    for _ in range(8):
        started = time.monotonic()
        assert policy.call(lambda: "ok") == "ok"
        took.append(time.monotonic() - started)
    return took


def _black_hole_aio(url: str, name: str, holed: Any, go: Any) -> list[float]:
    async def main() -> list[float]:
        policy = aio.Policy(name, redis=url, bulkhead=True, budget=True, retry=False,
                            redis_timeout=TIMEOUT)

        async def ok() -> str:
            return "ok"

        for _ in range(3):
            await policy.call(ok)
        holed.set()
        await asyncio.get_running_loop().run_in_executor(None, go.wait, 30)
        took = []
        for _ in range(8):
            started = time.monotonic()
            assert await policy.call(ok) == "ok"
            took.append(time.monotonic() - started)
        return took

    return asyncio.run(main())


@pytest.fixture
def server() -> Iterator[RedisServer]:
    yield from private_redis_server()


@pytest.mark.parametrize("body", [_black_hole_sync, _black_hole_aio], ids=["sync", "asyncio"])
def test_a_policy_attempt_discovers_a_black_hole_once(server: RedisServer, name: str,
                                                      body: Any) -> None:
    """Breaker, bulkhead and budget share one health: the first attempt against a
    black-holed Redis waits one redis_timeout (not three), and no later attempt waits
    more than one (a trial after the backoff; the others skip Redis)."""
    with TcpProxy(("127.0.0.1", server.port)) as proxy:
        holed, go = FORK.Event(), FORK.Event()

        def black_hole_when_warm() -> None:
            holed.wait(60)
            proxy.black_hole()
            go.set()

        threading.Thread(target=black_hole_when_warm, daemon=True).start()
        took = in_worker(body, proxy.url(), name, holed, go)
    assert TIMEOUT * 0.9 <= took[0] < 2 * TIMEOUT, took  # one discovery, not three
    assert max(took) < 2 * TIMEOUT, took
    assert min(took) < TIMEOUT / 2, took  # calls within the backoff skip Redis


# -- connection bursts are not outages -----------------------------------------------------
CALLERS = 50
LIMIT = 25
MAX_WAIT = 0.25
#: The command timeout: below the connect timeout (1 s), so a slow connect in the burst
#: would have been an outage before they were separate; above what a command on a
#: shared, loaded CI machine may take now and then (0.25 s was seen exceeded there).
BURST_TIMEOUT = 0.5


def _hog(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _burst_threads(url: str, name: str) -> dict[str, Any]:
    outages = _watch_outages()
    bulkhead = distbreaker.Bulkhead(name, redis=url, max_concurrent_calls=LIMIT,
                                    max_wait_duration=MAX_WAIT, redis_timeout=BURST_TIMEOUT)
    breaker = distbreaker.CircuitBreaker(name, redis=url, redis_timeout=BURST_TIMEOUT)
    inside, peak, waits = [0], [0], []
    lock = threading.Lock()
    start = threading.Barrier(CALLERS)

    def one() -> None:
        start.wait()
        for _ in range(3):
            started = time.monotonic()
            try:
                with bulkhead:
                    with lock:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                    breaker.call(time.sleep, 0.2)
                    with lock:
                        inside[0] -= 1
            except distbreaker.BulkheadFull:
                waits.append(time.monotonic() - started)

    threads = [threading.Thread(target=one) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"peak": peak[0], "outages": outages.messages, "full": len(waits),
            "longest_wait": max(waits, default=0.0),
            "fallback": bulkhead.local_fallback_active or breaker.local_fallback_active}


def _burst_coroutines(url: str, name: str) -> dict[str, Any]:
    outages = _watch_outages()

    async def main() -> dict[str, Any]:
        bulkhead = aio.Bulkhead(name, redis=url, max_concurrent_calls=LIMIT,
                                max_wait_duration=MAX_WAIT, redis_timeout=BURST_TIMEOUT)
        breaker = aio.CircuitBreaker(name, redis=url, redis_timeout=BURST_TIMEOUT)
        inside, peak, waits = [0], [0], []

        async def one() -> None:
            for _ in range(3):
                started = time.monotonic()
                try:
                    async with bulkhead:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                        await breaker.call(asyncio.sleep, 0.2)
                        inside[0] -= 1
                except distbreaker.BulkheadFull:
                    waits.append(time.monotonic() - started)

        await asyncio.gather(*(one() for _ in range(CALLERS)))
        return {"peak": peak[0], "outages": outages.messages, "full": len(waits),
                "longest_wait": max(waits, default=0.0),
                "fallback": bulkhead.local_fallback_active or breaker.local_fallback_active}

    return asyncio.run(main())


@pytest.mark.parametrize("target", ["redis", "memory"])
@pytest.mark.parametrize("body", [_burst_threads, _burst_coroutines],
                         ids=["threads", "coroutines"])
def test_a_connection_burst_on_a_busy_machine_is_not_an_outage(
        server: RedisServer, name: str, body: Any, target: str) -> None:
    """50 callers at once (each opening a connection, 25 waiting on BLPOP) with a CPU hog
    beside them: no fallback, never more than the limit, BulkheadFull within
    max_wait_duration (plus slack for the loaded machine, not a second)."""
    url = server.url if target == "redis" else f"memory://{name}"
    stop = FORK.Event()
    hog = FORK.Process(target=_hog, args=(stop,))
    hog.start()
    try:
        result = in_worker(body, url, name)
    finally:
        stop.set()
        reap([hog])
    assert result["outages"] == [] and not result["fallback"], result
    assert result["peak"] <= LIMIT, result
    assert result["full"] >= 1, result  # 150 calls of 0.2 s for 25 permits: some wait out
    # Bounded: a waiter gives up about when max_wait_duration ends, never after a lease or
    # a BLPOP left to run out. The slack is for a loaded CI machine (the hog, other test
    # workers: up to 4 s seen), not a measurement: scripts/bench_outage.py measures the
    # overshoot (+0.01-0.03 s on an idle machine).
    assert result["longest_wait"] < MAX_WAIT + 10.0, result


# -- a frozen Redis: back on the shared state soon after it answers ----------------------
FREEZE = 0.4


def _frozen(url: str, name: str, frozen: Any, thawed_at: Any, done: Any) -> dict[str, Any]:
    """16 callers through a Policy (breaker and bulkhead, expected_workers=1); the time
    the process is back on Redis after the parent resumed it."""
    policy = distbreaker.Policy(name, redis=url, bulkhead={"max_concurrent_calls": 25,
                                                           "redis_timeout": 0.25},
                                breaker={"redis_timeout": 0.25}, retry=False)
    health = shared_health(url, 5.0)  # the one its breaker and bulkhead share
    back: list[float] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            policy.call(time.sleep, 0.01)

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    frozen.set()
    while thawed_at.value == 0.0 or health.down or not back:
        if health.down:
            back.clear()
        elif thawed_at.value and not back:
            back.append(time.monotonic())
        time.sleep(0.005)
        if done.is_set():
            break
    stop.set()
    for thread in threads:
        thread.join()
    return {"back_after": back[0] - thawed_at.value if back else None,
            "trials": health.trials}


def test_a_frozen_redis_is_rejoined_soon_after_it_answers(server: RedisServer,
                                                          name: str) -> None:
    """SIGSTOP for 0.4 s under 16 callers: the process is back on the shared state
    within about one backoff step of Redis answering (it was 2.4-4.5 s: the backoff grew
    per failed call)."""
    frozen, done = FORK.Event(), FORK.Event()
    thawed_at = FORK.Value("d", 0.0)

    def freeze() -> None:
        frozen.wait(60)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(FREEZE)
        os.kill(server.process.pid, signal.SIGCONT)
        thawed_at.value = time.monotonic()
        time.sleep(30)
        done.set()

    threading.Thread(target=freeze, daemon=True).start()
    result = in_worker(_frozen, server.url, name, frozen, thawed_at, done)
    assert result["back_after"] is not None, result
    assert result["back_after"] < 1.0, result


def test_connect_and_pool_waits_are_separate_from_the_command_timeout() -> None:
    """A URL-built client's connect timeout and asyncio pool wait do not shrink with a
    tight redis_timeout (a burst of connects or of queued coroutines is not an outage);
    the URL's own ``socket_connect_timeout`` still wins."""
    from distbreaker._runtime.connection import (
        ASYNC_POOL_WAIT,
        CONNECT_TIMEOUT,
        async_client,
        sync_client,
    )

    sync = sync_client("redis://127.0.0.1:1/0", 0.05)
    kwargs = sync.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.05
    assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT >= 1.0
    pool = async_client("redis://127.0.0.1:1/0", 0.05).connection_pool
    assert pool.connection_kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT
    assert pool.timeout == ASYNC_POOL_WAIT >= 5.0
    tuned = sync_client("redis://127.0.0.1:1/0?socket_connect_timeout=3", 0.05)
    assert tuned.connection_pool.connection_kwargs["socket_connect_timeout"] == 3.0
