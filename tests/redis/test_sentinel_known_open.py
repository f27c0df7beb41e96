"""A known OPEN survives a Sentinel failover (issue 23): between the primary's SIGKILL and
the replica's promotion, breakers that were OPEN with 60 s left keep rejecting (their
local fallback inherits the OPEN); 240-577 calls per breaker reached the failing
dependency before."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker, aio
from distbreaker.demo.embedded import EmbeddedSentinel
from distbreaker.errors import CallNotPermitted
from distbreaker.policy.sync import Policy
from tests.helpers.waiting import wait_until

OPEN_LONG = {"wait_duration_in_open_state": 60.0, "revalidate_interval": 0.2,
             "permitted_calls_in_half_open": 3, "redis_retry_max_backoff": 0.5}


class Down(Exception):
    pass


@pytest.fixture
def sentinel_env() -> Iterator[EmbeddedSentinel]:
    with EmbeddedSentinel(down_after_ms=1000, failover_timeout_ms=3000) as env:
        yield env


class Caller:
    """Calls a failing dependency through `call` in a thread; counts what reached it
    while `counting` is set."""

    def __init__(self, call: Callable[[Callable[[], None]], Any]) -> None:
        self.call = call
        self.counting = threading.Event()
        self.reached = 0
        self.escaped: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _dependency(self) -> None:
        if self.counting.is_set():
            self.reached += 1
        raise Down

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.call(self._dependency)
            except (Down, CallNotPermitted):
                pass
            except BaseException as exc:  # anything else escaping is a failure
                self.escaped.append(exc)
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_known_open_survives_the_failover_gap(sentinel_env: EmbeddedSentinel,
                                                name: str) -> None:
    env = sentinel_env
    breaker = CircuitBreaker(name, redis=env.url, **OPEN_LONG)
    policy = Policy(name + "-policy", redis=env.url, breaker=OPEN_LONG, retry=False)
    abreaker = aio.CircuitBreaker(name + "-aio", redis=env.url, **OPEN_LONG)
    for each in (breaker, policy.breaker):
        each.trip("test")
    asyncio.run(abreaker.trip("test"))
    with redis.Redis(port=env.primary.port, socket_timeout=5) as primary:
        assert primary.wait(1, 5000) == 1  # the OPENs reached the replica

    loop = asyncio.new_event_loop()

    def via_aio(fn: Callable[[], None]) -> Any:
        async def coro() -> None:
            fn()

        return loop.run_until_complete(abreaker.call(coro))

    callers = [Caller(breaker.call), Caller(policy.call), Caller(via_aio)]
    try:
        wait_until(lambda: all(c.reached == 0 for c in callers), what="callers running")
        time.sleep(0.3)  # every breaker has its OPEN view
        for caller in callers:
            caller.counting.set()
        env.primary.kill()
        env.wait_for_failover(timeout=30)
        time.sleep(0.5)
    finally:
        for caller in callers:
            caller.stop()
        loop.close()
    print(f"\ncalls reaching the dependency from kill to promotion: "
          f"{[c.reached for c in callers]}")
    assert [c.escaped for c in callers] == [[], [], []]
    # kill -> promotion (and after: the promoted replica holds the same OPENs)
    assert all(c.reached <= 3 for c in callers), [c.reached for c in callers]
