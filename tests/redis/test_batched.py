"""Batched record mode (record_mode="batched"): CLOSED outcomes counted in the
process and flushed as counts, against a real redis-server."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import distbreaker.aio as aio
from distbreaker import CircuitBreaker
from distbreaker.breaker.batching import LOOP_FLUSHERS, THREAD_FLUSHER
from distbreaker.breaker.core import Permit
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import CallNotPermitted
from tests.helpers.batched_worker import Boom, fail, fleet_state, ok
from tests.helpers.records import corrupt
from tests.helpers.waiting import await_until, wait_until

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")
ROOT = Path(__file__).resolve().parents[2]


class ThreadCountingConnection(redis.Connection):
    """Counts requests (round trips) per sending thread."""

    requests: Counter[int] = Counter()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        ThreadCountingConnection.requests[threading.get_ident()] += 1
        super().send_packed_command(command, check_health)


def reap(processes: list[Any]) -> None:
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)


# -- agreement with exact mode ----------------------------------------------------------

SEQUENCE: list[tuple[BaseException | None, float]] = (
    [(None, 0.002)] * 7 + [(Boom("x"), 0.004), (None, 0.3), (ValueError("y"), 0.001)] * 3
    + [(None, 0.25)] * 2)


@pytest.mark.parametrize("window", ["COUNT_BASED", "TIME_BASED"])
def test_batched_and_exact_agree_on_counts_and_state(redis_url: str, redis_client: redis.Redis,
                                                      name: str, window: str) -> None:
    cfg = {"sliding_window_type": window, "sliding_window_size": 50,
           "minimum_number_of_calls": 30, "slow_call_duration": 0.2,
           "slow_call_rate_threshold": 90.0, "flush_interval": 30.0}
    exact = CircuitBreaker(f"{name}-exact", redis=redis_url, **cfg)
    batched = CircuitBreaker(f"{name}-batched", redis=redis_url, record_mode="batched", **cfg)
    for breaker in (exact, batched):
        for error, duration in SEQUENCE:
            breaker.record(Permit(), error, duration)
    batched.flush()
    assert len(SEQUENCE) == 18
    assert fleet_state(redis_client, batched) == fleet_state(redis_client, exact) == {
        "state": "CLOSED", "calls": 18, "failures": 6, "slow": 5,
        "total_ms": 7 * 2 + 3 * (4 + 300 + 1) + 2 * 250}

    # the same outcomes again: 36 calls, 12 failures (33 %), 10 slow (28 %): still CLOSED;
    # then 12 failures: 24 of 48 (50 %), both trip at the very last one
    seen: dict[str, list[Transition]] = {"exact": [], "batched": []}
    exact.add_listener(seen["exact"].append)
    batched.add_listener(seen["batched"].append)
    for breaker in (exact, batched):
        for error, duration in SEQUENCE + [(Boom("z"), 0.001)] * 12:
            breaker.record(Permit(), error, duration)
    batched.flush()
    assert fleet_state(redis_client, batched) == fleet_state(redis_client, exact)
    assert exact.state is batched.state is State.OPEN
    for transitions in seen.values():  # reported once, by the call (flush) that made it
        assert [(t.from_state, t.to_state, t.reason) for t in transitions] == [
            (State.CLOSED, State.OPEN, "failure rate 50% >= 50%")]
    assert seen["batched"][0].source == "redis"
    with pytest.raises(CallNotPermitted):  # the flush reply told this process: OPEN
        batched.call(ok)


# -- round trips -------------------------------------------------------------------------

def test_closed_calls_make_no_synchronous_round_trip(redis_url: str, name: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=ThreadCountingConnection)
    breaker = CircuitBreaker(name, redis=redis.Redis(connection_pool=pool),
                             record_mode="batched", max_batch=100, flush_interval=30.0,
                             subscribe=False)
    breaker.call(ok)  # learns the state (one acquire), the script gets cached
    breaker.flush()
    ThreadCountingConnection.requests.clear()
    before = (THREAD_FLUSHER.pipelines, THREAD_FLUSHER.sent)
    calls = 2_000
    for _ in range(calls):
        breaker.call(ok)
    caller = ThreadCountingConnection.requests[threading.get_ident()]
    breaker.flush()
    pipelines = THREAD_FLUSHER.pipelines - before[0]
    assert caller == 0  # not one request from the calling thread
    # about one pipeline per max_batch outcomes (fewer when calls outpace the flusher)
    assert 1 <= pipelines <= calls // 100 + 1
    assert THREAD_FLUSHER.sent - before[1] == calls
    assert sum(ThreadCountingConnection.requests.values()) == pipelines
    assert breaker.metrics().calls == 100  # the window size: every outcome arrived


def test_one_pipeline_carries_every_breaker_sharing_a_client(redis_url: str,
                                                             name: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=ThreadCountingConnection)
    client = redis.Redis(connection_pool=pool)
    breakers = [CircuitBreaker(f"{name}-{i}", redis=client, record_mode="batched",
                               flush_interval=30.0, subscribe=False) for i in range(5)]
    for breaker in breakers:
        breaker.call(ok)
    breakers[0].flush()
    ThreadCountingConnection.requests.clear()
    for _ in range(10):
        for breaker in breakers:
            breaker.call(ok)
    breakers[0].flush()
    assert sum(ThreadCountingConnection.requests.values()) == 1
    assert [b.metrics().calls for b in breakers] == [11] * 5


def test_open_costs_no_round_trip_until_the_wait_expires(redis_url: str, name: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=ThreadCountingConnection)
    breaker = CircuitBreaker(name, redis=redis.Redis(connection_pool=pool),
                             record_mode="batched", minimum_number_of_calls=4,
                             sliding_window_size=4, wait_duration_in_open_state=2.0,
                             subscribe=False)
    for _ in range(4):
        with pytest.raises(Boom):
            breaker.call(fail)
    breaker.flush()
    opened = time.monotonic()
    ThreadCountingConnection.requests.clear()
    for _ in range(200):  # (milliseconds, even on a loaded machine: the wait is 2 s)
        with pytest.raises(CallNotPermitted):
            breaker.call(ok)
    assert sum(ThreadCountingConnection.requests.values()) == 0
    time.sleep(max(0.0, opened + 2.1 - time.monotonic()))  # the open wait has ended
    assert breaker.call(ok) == "ok"  # a half-open probe: acquired and recorded at once
    assert sum(ThreadCountingConnection.requests.values()) == 2
    assert breaker.metrics().calls == 1


# -- Redis unreachable ----------------------------------------------------------------------------

@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def test_counts_kept_while_redis_is_briefly_down(redis_url: str, name: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=0.25)
    pool = client.connection_pool
    breaker = CircuitBreaker(name, redis=client, record_mode="batched",
                             redis_retry_max_backoff=0.2, subscribe=False)
    breaker.call(ok)
    breaker.flush()
    port = pool.connection_kwargs["port"]
    pool.connection_kwargs["port"] = free_port()  # nobody listens there: Redis "down"
    pool.reset()
    for _ in range(30):
        breaker.call(ok)  # no view after the failure: fallback acquires, batched records
    breaker.flush()
    time.sleep(0.05)
    assert THREAD_FLUSHER.acc.pending(breaker) == 30  # kept, not lost
    pool.connection_kwargs["port"] = port  # back
    pool.reset()
    wait_until(lambda: not THREAD_FLUSHER.acc.pending(breaker), interval=0.05,
               what="the kept counts are flushed")
    assert breaker.metrics().calls == 31


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_beyond_max_pending_the_outage_policy_applies(own_server: RedisServer, name: str,
                                                      policy: str) -> None:
    breaker = CircuitBreaker(name, redis=own_server.url, record_mode="batched",
                             max_batch=5, max_pending=10, minimum_number_of_calls=10,
                             sliding_window_size=10, on_redis_error=policy,
                             redis_retry_max_backoff=30.0, subscribe=False)
    try:
        breaker.call(ok)
        breaker.flush()
        seen: list[Transition] = []
        breaker.add_listener(seen.append)
        own_server.stop()
        dropped = THREAD_FLUSHER.dropped
        for _ in range(12):  # finished calls failing, each followed by a (failing) flush
            breaker.record(Permit(), Boom("x"), 0.001)
            breaker.flush()
        assert THREAD_FLUSHER.acc.pending(breaker) == 1  # 11 > max_pending went to the policy
        if policy == "fail_open":  # the local fallback breaker took the 11 failures and tripped
            assert [(t.to_state, t.source) for t in seen] == [(State.OPEN, "local")]
            assert THREAD_FLUSHER.dropped == dropped
            with pytest.raises(CallNotPermitted) as rejected:
                breaker.call(ok)
            assert rejected.value.state is State.OPEN
        else:
            assert seen == [] and THREAD_FLUSHER.dropped - dropped == 11
            with pytest.raises(CallNotPermitted) as rejected:
                breaker.call(ok)
            assert rejected.value.state == "UNKNOWN"
    finally:  # its server is gone for good: keep its last outcome from being retried
        THREAD_FLUSHER.acc.take(breaker)  # (and flushing other tests' outcomes early)


# -- asyncio ---------------------------------------------------------------------------------------

def test_asyncio_batched_breaker_flushes_per_loop_and_at_loop_end(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    async def work() -> None:
        breaker = aio.CircuitBreaker(name, redis=redis_url, record_mode="batched",
                                     flush_interval=30.0, sliding_window_size=500)

        async def call() -> str:
            return "ok"

        async def boom() -> None:
            raise Boom("x")

        for _ in range(40):
            await breaker.call(call)
        for _ in range(10):
            with pytest.raises(Boom):
                await breaker.call(boom)
        await breaker.flush()
        metrics = await breaker.metrics()
        assert (metrics.calls, metrics.failed) == (50, 10)
        for _ in range(25):
            await breaker.call(call)  # pending when asyncio.run ends

    asyncio.run(work())
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=500)
    assert fleet_state(redis_client, breaker)["calls"] == 75
    assert not LOOP_FLUSHERS.leftovers()


def test_a_policy_over_a_batched_breaker_records_without_a_round_trip(redis_url: str,
                                                                      name: str) -> None:
    from distbreaker import Policy

    pool = redis.ConnectionPool.from_url(redis_url, connection_class=ThreadCountingConnection)
    client = redis.Redis(connection_pool=pool)
    breaker = CircuitBreaker(name, redis=client, record_mode="batched", flush_interval=30.0,
                             subscribe=False)
    policy = Policy(name, redis=client, breaker=breaker)
    assert policy.call(ok) == "ok"  # learns the state
    breaker.flush()
    ThreadCountingConnection.requests.clear()
    for _ in range(50):
        assert policy.call(ok) == "ok"
    assert sum(ThreadCountingConnection.requests.values()) == 0
    breaker.flush()
    assert breaker.metrics().calls == 51


def test_asyncio_flusher_flushes_on_its_own_interval(redis_url: str, redis_client: redis.Redis,
                                                     name: str) -> None:
    """The loop's flusher task waits out `flush_interval` (asyncio.wait_for timing out:
    asyncio.TimeoutError, not the builtin one before Python 3.11) and sends the counts
    without an explicit flush, again and again."""
    async def work() -> None:
        breaker = aio.CircuitBreaker(name, redis=redis_url, record_mode="batched",
                                     flush_interval=0.02, sliding_window_size=500,
                                     subscribe=False)

        async def call() -> str:
            return "ok"

        for round_ in (1, 2):
            for _ in range(5):
                await breaker.call(call)
            await await_until(lambda r=round_: (fleet_state(redis_client, breaker)["calls"] if
                                                redis_client.exists(breaker.keys.state)
                                                else 0) >= 5 * r,
                              what="the flusher task flushes")
        task = LOOP_FLUSHERS.current()._task
        assert task is not None and not task.done()

    asyncio.run(work())


def test_one_failing_breaker_in_a_pipeline_does_not_double_count_the_others(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    """A pipeline is not a transaction: when one breaker's reply is an error, the
    others' scripts have run already and must not be sent a second time."""
    client = redis.Redis.from_url(redis_url)
    good = CircuitBreaker(f"{name}-good", redis=client, record_mode="batched",
                          flush_interval=30.0, subscribe=False)
    bad = CircuitBreaker(f"{name}-bad", redis=client, record_mode="batched",
                         flush_interval=30.0, subscribe=False)
    for breaker in (good, bad):
        breaker.call(ok)
    good.flush()
    corrupt(redis_client, bad.keys, state=99)  # an unknown state code: SchemaError
    dropped = THREAD_FLUSHER.dropped
    for _ in range(3):
        good.call(ok)
        bad.call(ok)
    good.flush()
    assert fleet_state(redis_client, good)["calls"] == 4
    assert THREAD_FLUSHER.dropped - dropped == 3
    assert THREAD_FLUSHER.acc.pending(good) == THREAD_FLUSHER.acc.pending(bad) == 0


def test_fail_open_outage_feeds_the_local_breaker_at_once() -> None:
    """While Redis is down, batched outcomes protect through the local breaker right away."""
    from distbreaker.demo.embedded import free_port

    breaker = CircuitBreaker("batched-outage", redis=f"redis://127.0.0.1:{free_port()}/0",
                             record_mode="batched", subscribe=False,
                             sliding_window_size=4, minimum_number_of_calls=4)
    outcomes = []
    for _ in range(7):
        try:
            breaker.call(lambda: 1 / 0)
        except ZeroDivisionError:
            outcomes.append("failed")
        except CallNotPermitted:
            outcomes.append("rejected")
    assert outcomes == ["failed"] * 4 + ["rejected"] * 3


def test_the_flusher_thread_outlives_a_failing_round(redis_url: str, name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that raises (once an infinite wait, from a race with a flush on another
    thread) is logged; the process's flusher goes on and later outcomes still arrive."""
    breaker = CircuitBreaker(name, redis=redis_url, record_mode="batched",
                             flush_interval=0.01, redis_timeout=5.0)
    breaker.call(lambda: None)
    breaker.flush()
    real, failed = THREAD_FLUSHER.acc.due_in, []

    def due_in_once_broken() -> float:
        if not failed:
            failed.append(True)
            raise OverflowError("timestamp out of range for platform time_t")
        return real()

    monkeypatch.setattr(THREAD_FLUSHER.acc, "due_in", due_in_once_broken)
    breaker.call(lambda: None)
    wait_until(lambda: bool(failed), what="the round failed once")
    for _ in range(3):
        breaker.call(lambda: None)
    wait_until(lambda: breaker.metrics().calls == 5, timeout=30,
               what="the flusher sent the later outcomes")
    breaker.close()
