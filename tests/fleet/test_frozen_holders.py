"""Holders frozen (SIGSTOP) during their calls past their lease: the documented bound is
the limit (`max_concurrent_calls`, `permitted_calls_in_half_open`) + the number of
frozen holders, exactly (docs/OPERATIONS.md "Leases and paused holders")."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from distbreaker.breaker.sync import CircuitBreaker
from distbreaker.bulkhead.sync import Bulkhead
from distbreaker.errors import BulkheadFull, CallNotPermitted
from tests.helpers.processes import reap as join_or_kill
from tests.helpers.waiting import wait_until

FORK = multiprocessing.get_context("fork")
LIMIT = 3
FROZEN = 2
LEASE = 1.0


def _enter(counters: Any, lock: Any) -> None:
    with lock:
        counters[0] += 1
        counters[1] = max(counters[1], counters[0])


def _leave(counters: Any, lock: Any) -> None:
    with lock:
        counters[0] -= 1


def _holder(url: str, name: str, counters: Any, lock: Any, inside: Any, leave: Any) -> None:
    """Takes a permit, says so, and stays in its call until told (it is frozen there)."""
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=LIMIT, lease=LEASE,
                        max_wait_duration=30, redis_timeout=5)

    def call() -> None:
        _enter(counters, lock)
        inside.release()
        leave.wait(120)
        _leave(counters, lock)

    bulkhead.call(call)


def _others(url: str, name: str, counters: Any, lock: Any, stop: Any) -> None:
    """Three threads calling through the bulkhead until stopped."""
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=LIMIT, lease=LEASE,
                        max_wait_duration=0.2, redis_timeout=5)

    def call() -> None:
        _enter(counters, lock)
        time.sleep(0.05)
        _leave(counters, lock)

    def loop() -> None:
        while not stop.is_set():
            try:
                bulkhead.call(call)
            except BulkheadFull:
                pass

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_the_fleet_runs_at_most_the_limit_plus_the_frozen_holders(
        name: str, redis_url: str, reap: list[Any]) -> None:
    counters = FORK.Array("i", [0, 0])  # in calls now, peak
    lock = FORK.Lock()
    inside, leave, stop = FORK.Semaphore(0), FORK.Event(), FORK.Event()
    holders = [FORK.Process(target=_holder, args=(redis_url, name, counters, lock, inside,
                                                  leave)) for _ in range(FROZEN)]
    reap += holders
    for process in holders:
        process.start()
    for _ in holders:
        assert inside.acquire(timeout=60)
    for process in holders:  # frozen mid-call: their renewals stop, their leases end
        assert process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
    others = [FORK.Process(target=_others, args=(redis_url, name, counters, lock, stop))
              for _ in range(3)]
    reap += others
    for process in others:
        process.start()
    try:
        wait_until(lambda: counters[1] >= LIMIT + FROZEN, timeout=60,
                   what="the frozen holders' permits are handed on")
        time.sleep(1.0)  # more callers than permits keep trying: the bound holds
    finally:
        for process in holders:
            assert process.pid is not None
            os.kill(process.pid, signal.SIGCONT)
        leave.set()
        stop.set()
        join_or_kill(holders + others)
    assert counters[1] == LIMIT + FROZEN


# -- half-open probes ---------------------------------------------------------------------
PERMITTED = 2
PROBE_CONFIG: dict[str, Any] = {
    "permitted_calls_in_half_open": PERMITTED, "half_open_lease": LEASE,
    "wait_duration_in_open_state": 0.2, "sliding_window_size": 4,
    "minimum_number_of_calls": 4, "redis_timeout": 5}


def _probe_holder(url: str, name: str, counters: Any, lock: Any, inside: Any,
                  leave: Any) -> None:
    """Calls until it holds a probe, then stays in that call until told (frozen there)."""
    breaker = CircuitBreaker(name, redis=url, **PROBE_CONFIG)

    def call() -> None:
        _enter(counters, lock)
        inside.release()
        leave.wait(120)
        _leave(counters, lock)

    while True:
        try:
            breaker.call(call)
            return
        except CallNotPermitted:
            time.sleep(0.01)


def _failing_probers(url: str, name: str, counters: Any, lock: Any, stop: Any) -> None:
    """Three threads probing a dependency that fails after 0.1 s, until stopped."""
    breaker = CircuitBreaker(name, redis=url, **PROBE_CONFIG)

    def call() -> None:
        _enter(counters, lock)
        time.sleep(0.1)
        _leave(counters, lock)
        raise RuntimeError("down")

    def loop() -> None:
        while not stop.is_set():
            try:
                breaker.call(call)
            except (CallNotPermitted, RuntimeError):
                time.sleep(0.01)

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_probes_run_at_most_the_permitted_plus_the_frozen_holders(
        name: str, redis_url: str, reap: list[Any]) -> None:
    """A probe holder frozen mid-call past its half_open_lease: its slot is handed on,
    so the dependency sees at most permitted_calls_in_half_open + 1 probes at once."""
    CircuitBreaker(name, redis=redis_url, **PROBE_CONFIG).trip("test", for_=0.2)
    counters = FORK.Array("i", [0, 0])
    lock = FORK.Lock()
    inside, leave, stop = FORK.Semaphore(0), FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_probe_holder, args=(redis_url, name, counters, lock,
                                                      inside, leave))
    reap.append(holder)
    holder.start()
    assert inside.acquire(timeout=60)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGSTOP)
    probers = [FORK.Process(target=_failing_probers, args=(redis_url, name, counters, lock,
                                                           stop)) for _ in range(2)]
    reap += probers
    for process in probers:
        process.start()
    try:
        wait_until(lambda: counters[1] >= PERMITTED + 1, timeout=60,
                   what="the frozen probe's slot is handed on")
        time.sleep(1.5)  # more half-open episodes: the bound holds
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        leave.set()
        stop.set()
        join_or_kill([holder, *probers])
    assert counters[1] == PERMITTED + 1
