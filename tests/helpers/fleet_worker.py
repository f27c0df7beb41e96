"""Bodies of the worker processes started by tests/fleet/test_fleet.py.

They live in an importable module (not in the test file) so that the "spawn"
start method can find them. Every worker builds its own `CircuitBreaker` on
the shared Redis URL; coordination uses multiprocessing events and plain
Redis counters (keys outside distbreaker's namespace).
"""

from __future__ import annotations

import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import redis

from distbreaker import CircuitBreaker
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers.waiting import wait_until


def counter_key(name: str, what: str) -> str:
    return f"test:{name}:{what}"


def wait_for_count(client: redis.Redis, key: str, target: int, timeout: float = 60.0) -> int:
    """Poll a Redis counter until it reaches `target`; its value then (WaitTimeout after
    `timeout`: spawned workers on a loaded machine can take many seconds to start)."""
    def reached() -> int:
        value = int(client.get(key) or 0)
        return value if value >= target else 0

    return wait_until(reached, timeout=timeout, interval=0.005,
                      what=f"{key} reaches {target}",
                      describe=lambda: f"{key} = {int(client.get(key) or 0)}")


def wait_until_all_tried(client: redis.Redis, name: str, total: int,
                         timeout: float = 60.0) -> tuple[int, int]:
    """Wait until `total` calls were counted as reached or rejected; return (reached,
    rejected) as then read."""
    def counts() -> tuple[int, int]:
        return (int(client.get(counter_key(name, "reached")) or 0),
                int(client.get(counter_key(name, "rejected")) or 0))

    def all_tried() -> tuple[int, int] | None:
        reached, rejected = counts()
        return (reached, rejected) if reached + rejected >= total else None

    return wait_until(all_tried, timeout=timeout, interval=0.005,
                      what=f"{total} calls of {name} reached or rejected",
                      describe=lambda: f"(reached, rejected) = {counts()}")


def see_open_then_call(url: str, name: str, cfg: dict[str, Any], index: int, tripped: Event,
                       results: Queue) -> None:
    """Scenario (a): worker 0 trips the breaker; the others read the state, then call."""
    breaker = CircuitBreaker(name, redis=url, **cfg)
    counters = redis.Redis.from_url(url)
    reached = counter_key(name, f"reached-{index}")

    def dependency(fail: bool) -> str:
        counters.incr(reached)
        if fail:
            raise ConnectionError("dependency down")
        return "ok"

    breaker.call(dependency, False)  # warm-up: this process's local view is now CLOSED
    counters.incr(counter_key(name, "ready"))
    wait_for_count(counters, counter_key(name, "ready"), 4)
    report: dict[str, Any] = {"index": index}
    if index == 0:
        failures = 0
        while breaker.state is not State.OPEN and failures < 50:
            try:
                breaker.call(dependency, True)
            except ConnectionError:
                failures += 1
        report["failures"] = failures
        tripped.set()
    else:
        tripped.wait(20)
        counters.set(reached, 0)
        report["state"] = breaker.state.value
        rejected = []
        for _ in range(5):
            try:
                breaker.call(dependency, False)
            except CallNotPermitted as exc:
                rejected.append((str(exc.state), exc.retry_after))
        report["rejected"] = rejected
        report["reached"] = int(counters.get(reached) or 0)
    results.put(report)


def half_open_stampede(url: str, name: str, cfg: dict[str, Any], threads: int,
                       tripped: Event, go: Event, release: Event, results: Queue) -> None:
    """Scenario (b): after the open wait, `threads` threads of this process call at once.

    A call reaching the dependency counts itself in Redis and then holds its
    probe until the parent sets `release`; a rejected call counts itself too,
    so the parent knows when every thread of the fleet has tried.
    """
    breaker = CircuitBreaker(name, redis=url, **cfg)
    counters = redis.Redis.from_url(url)
    counters.incr(counter_key(name, "ready"))
    tripped.wait(20)
    assert breaker.state in (State.OPEN, State.HALF_OPEN)  # local view: the fleet is OPEN
    counters.incr(counter_key(name, "seen-open"))
    outcomes: list[str] = []

    def dependency() -> str:
        counters.incr(counter_key(name, "reached"))
        release.wait(20)
        return "ok"

    def one_call() -> None:
        go.wait(20)
        try:
            outcomes.append(breaker.call(dependency))
        except CallNotPermitted as exc:
            outcomes.append(f"rejected:{exc.state}")
            counters.incr(counter_key(name, "rejected"))

    workers = [threading.Thread(target=one_call) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    results.put(outcomes)


def fail_together(url: str, name: str, cfg: dict[str, Any], threads: int, calls: int,
                  go: Event, results: Queue) -> None:
    """Scenario (c): `threads` threads each make `calls` failing calls at the same moment."""
    breaker = CircuitBreaker(name, redis=url, **cfg)
    heard: list[Transition] = []
    breaker.add_listener(heard.append)
    counters = redis.Redis.from_url(url)
    counters.incr(counter_key(name, "ready"))
    failed = rejected = 0
    lock = threading.Lock()

    def dependency() -> None:
        raise ConnectionError("dependency down")

    def burst() -> None:
        nonlocal failed, rejected
        go.wait(20)
        for _ in range(calls):
            try:
                breaker.call(dependency)
            except ConnectionError:
                with lock:
                    failed += 1
            except CallNotPermitted:
                with lock:
                    rejected += 1

    workers = [threading.Thread(target=burst) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    results.put({"failed": failed, "rejected": rejected,
                 "opened": [(t.from_state.value, t.source) for t in heard
                            if t.to_state is State.OPEN]})


def hang_in_probe(url: str, name: str, cfg: dict[str, Any], in_call: Event) -> None:
    """Scenario (d): take a half-open probe and hang in the call until SIGKILLed."""
    breaker = CircuitBreaker(name, redis=url, **cfg)

    def dependency() -> None:
        in_call.set()
        time.sleep(60)

    breaker.call(dependency)


def use_inherited_breaker(breaker: CircuitBreaker, url: str, index: int, hold: Event,
                          results: Queue) -> None:
    """Scenario (e), fork context: use the parent's breaker object in a forked child."""
    counters = redis.Redis.from_url(url)
    outcomes: list[str] = []

    def dependency(fail: bool) -> str:
        if fail:
            raise ConnectionError("dependency down")
        return "ok"

    for i in range(6):
        try:
            outcomes.append(breaker.call(dependency, i % 2 == 1))
        except ConnectionError:
            outcomes.append("failed")
    metrics = breaker.metrics()
    counters.incr(counter_key(breaker.name, "children-done"))
    hold.wait(20)  # stay connected until the parent has listed the clients
    results.put({"index": index, "outcomes": outcomes, "calls": metrics.calls})
