"""The fleet-wide bulkhead against a real redis-server: threads, processes, leases."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis

from distbreaker._runtime.scripts import run_script
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec
from distbreaker.bulkhead.sync import Bulkhead
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import BulkheadFull, DistbreakerError, SchemaError

FORK = multiprocessing.get_context("fork")


class Dependency:
    """A slow dependency that counts its calls and the most it saw at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0
        self.current = 0
        self.peak = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            self.calls += 1
            self.current += 1
            self.peak = max(self.peak, self.current)
        time.sleep(self.seconds)
        with self._lock:
            self.current -= 1
        return "ok"


def run_at_once(count: int, fn: Callable[[], Any]) -> list[Any]:
    """Run `fn` in `count` threads released together; each result or exception."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


# -- configuration ---------------------------------------------------------------------
def test_config_validates_and_names_the_field() -> None:
    config = BulkheadConfig(max_wait_duration=timedelta(milliseconds=250), lease=2)
    assert config.max_wait_duration == 0.25 and config.lease == 2.0
    assert config.renew_interval == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="max_concurrent_calls"):
        BulkheadConfig(max_concurrent_calls=0)
    with pytest.raises(ValueError, match="max_wait_duration"):
        BulkheadConfig(max_wait_duration=-1)
    with pytest.raises(ValueError, match="lease"):
        BulkheadConfig(lease=0)
    with pytest.raises(ValueError, match="expected_workers"):
        BulkheadConfig(expected_workers=0)
    with pytest.raises(ValueError, match="key_ttl"):
        BulkheadConfig(lease=60, key_ttl=30)
    with pytest.raises(TypeError, match="unknown bulkhead option"):
        Bulkhead("x", redis="redis://127.0.0.1:1/0", max_calls=3)


def test_fallback_limit_is_the_fleet_limit_over_the_workers_and_at_least_one() -> None:
    assert BulkheadConfig(max_concurrent_calls=25).effective_fallback_limit == 25
    assert BulkheadConfig(max_concurrent_calls=25,
                          expected_workers=4).effective_fallback_limit == 6
    assert BulkheadConfig(max_concurrent_calls=3, expected_workers=8).effective_fallback_limit == 1
    assert BulkheadConfig(fallback_limit=0).effective_fallback_limit == 0


def test_bulkhead_full_carries_name_limit_and_in_use() -> None:
    error = BulkheadFull("dep", 3, 3)
    assert isinstance(error, DistbreakerError)
    assert (error.name, error.limit, error.in_use) == ("dep", 3, 3)


# -- the script ---------------------------------------------------------------------------
def test_script_owes_one_wakeup_per_free_permit_with_a_waiter(
        name: str, redis_client: redis.Redis) -> None:
    codec = BulkheadCodec(name, BulkheadConfig(max_concurrent_calls=2, lease=10))
    keys = codec.keys

    def run(call: Any) -> list[int]:
        return [int(x) for x in run_script(redis_client, codec.script, call.keys, call.args)]

    assert run(codec.acquire_call("a", 0))[0] == 1
    assert run(codec.acquire_call("b", 0))[0] == 1
    reply = run(codec.acquire_call("c", 5.0))          # full: c registers as a waiter
    assert reply[:4] == [0, 2, 2, 1]
    assert 9_000 < reply[5] <= 10_000                    # next lease deadline, in ms
    assert redis_client.llen(keys.notify) == 0
    run(codec.release_call("a"))                         # a release owes c one wake-up
    assert redis_client.llen(keys.notify) == 1
    assert run(codec.acquire_call("d", 0))[0] == 1       # a newcomer took the permit...
    assert redis_client.llen(keys.notify) == 0           # ...so the wake-up is withdrawn
    assert run(codec.acquire_call("c", 0))[:5] == [0, 2, 2, 0, 1]  # c gives up: rejected
    assert run(codec.release_call("a"))[0] == 0          # a's lease is gone: counted lost
    metrics = run(codec.metrics_call())
    assert metrics[7] == 1 and metrics[8] == 3           # lost, acquired
    for key in (keys.leases, keys.meta):
        assert 0 < redis_client.pttl(key) <= 3_600_000


def test_foreign_data_raises_schema_error(name: str, redis_url: str,
                                          redis_client: redis.Redis) -> None:
    bulkhead = Bulkhead(name, redis=redis_url)
    redis_client.set(bulkhead.keys.leases, "not a zset")
    with pytest.raises(SchemaError, match="expected a zset"):
        bulkhead.acquire()
    redis_client.delete(bulkhead.keys.leases)
    redis_client.hset(bulkhead.keys.meta, "rejected", "many")
    with pytest.raises(SchemaError, match="not a number"):
        bulkhead.acquire()


@pytest.mark.parametrize("bad", ["meta", "notify", "leases"])
def test_foreign_type_is_reported_before_anything_is_written(
        bad: str, name: str, redis_url: str, redis_client: redis.Redis) -> None:
    """Each key's foreign type is named, and the call wrote nothing (no reaping either)."""
    bulkhead = Bulkhead(name, redis=redis_url)
    keys = bulkhead.keys
    good = {"leases": lambda: redis_client.zadd(keys.leases, {"expired": 1}),
            "meta": lambda: redis_client.hset(keys.meta, mapping={"w:gone": 1, "acquired": 4}),
            "notify": lambda: redis_client.rpush(keys.notify, "1", "1")}
    for key, fill in good.items():
        if key != bad:
            fill()
    redis_client.set(getattr(keys, bad), "foreign")
    before = {key: redis_client.dump(getattr(keys, key)) for key in good}
    expected = {"leases": "zset", "meta": "hash", "notify": "list"}[bad]
    with pytest.raises(SchemaError, match=f"holds a string, expected a {expected}"):
        bulkhead.acquire()
    assert {key: redis_client.dump(getattr(keys, key)) for key in good} == before
    assert all(redis_client.pttl(getattr(keys, key)) == -1 for key in good)


def test_bad_meta_field_is_reported_before_reaping(name: str, redis_url: str,
                                                  redis_client: redis.Redis) -> None:
    bulkhead = Bulkhead(name, redis=redis_url)
    redis_client.zadd(bulkhead.keys.leases, {"expired": 1})
    redis_client.hset(bulkhead.keys.meta, "lost", "many")
    with pytest.raises(SchemaError, match="not a number"):
        bulkhead.acquire()
    assert redis_client.zrange(bulkhead.keys.leases, 0, -1) == [b"expired"]


def script_commands(client: redis.Redis) -> int:
    """Commands run inside scripts since the last CONFIG RESETSTAT."""
    outside = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_info", "cmdstat_config|resetstat")
    return sum(v["calls"] for k, v in client.info("commandstats").items() if k not in outside)


def test_script_spends_few_commands_per_acquire_and_release(name: str) -> None:
    """No TYPE checks on the happy path; no ZSCORE while a permit is free."""
    with RedisServer() as server:  # private: nothing else runs commands on it
        client = redis.Redis.from_url(server.url)
        codec = BulkheadCodec(name, BulkheadConfig(max_concurrent_calls=2))

        def counted(call: Any) -> tuple[list[int], int]:
            client.config_resetstat()
            reply = run_script(client, codec.script, call.keys, call.args)
            return reply, script_commands(client)

        counted(codec.metrics_call())  # loads the script
        reply, acquire = counted(codec.acquire_call("a", 0))
        assert reply[0] == 1
        reply, release = counted(codec.release_call("a"))
        assert reply[0] == 1
        reply, idle = counted(codec.metrics_call())
        # acquire: TIME HGETALL LLEN ZREMRANGEBYSCORE ZCARD ZADD HINCRBY HSET(limit, first
        # call only) PEXPIRE x2 ZRANGE; release: TIME HGETALL LLEN ZREMRANGEBYSCORE ZCARD
        # ZREM PEXPIRE; metrics on an idle bulkhead: the five reads.
        assert (acquire, release, idle) == (11, 7, 5)
        client.close()


# -- threads ------------------------------------------------------------------------------
def test_ten_threads_max_three_no_wait(name: str, redis_url: str) -> None:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=3)
    dep = Dependency(0.3)
    results = run_at_once(10, lambda: bulkhead.call(dep))
    full = [r for r in results if isinstance(r, BulkheadFull)]
    assert results.count("ok") == 3 and len(full) == 7
    assert all(e.limit == 3 and e.in_use == 3 and not e.local for e in full)
    assert dep.calls == 3 and dep.peak == 3
    metrics = bulkhead.metrics()
    assert (metrics.in_use, metrics.available, metrics.rejected, metrics.acquired) == (0, 3, 7, 3)
    assert metrics.rejected_here == 7


def test_decorator_and_context_manager(name: str, redis_url: str) -> None:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=1)

    @bulkhead
    def double(x: int) -> int:
        return 2 * x

    assert double(21) == 42
    with bulkhead as permit:
        assert permit.token and bulkhead.metrics().in_use == 1
        with pytest.raises(BulkheadFull):
            double(1)
    assert bulkhead.metrics().in_use == 0 and permit.released and not permit.lost


def test_waiters_get_in_as_permits_free_up(name: str, redis_url: str,
                                           redis_client: redis.Redis) -> None:
    holders = Bulkhead(name, redis=redis_url, max_concurrent_calls=2)
    waiters = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, max_wait_duration=2.0)
    held = [holders.acquire(), holders.acquire()]
    waited: list[float] = []

    def wait_for_permit() -> None:
        started = time.monotonic()
        permit = waiters.acquire()
        waited.append(time.monotonic() - started)
        waiters.release(permit)

    threads = [threading.Thread(target=wait_for_permit) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    assert holders.metrics().waiting == 2
    before = evalsha_calls(redis_client)
    time.sleep(0.2)
    assert evalsha_calls(redis_client) - before <= 1   # blocked on BLPOP, not polling
    for permit in held:
        holders.release(permit)
    for thread in threads:
        thread.join(5)
    assert len(waited) == 2 and all(0.35 <= w < 0.6 for w in waited)
    metrics = holders.metrics()
    assert (metrics.in_use, metrics.waiting, metrics.rejected, metrics.acquired) == (0, 0, 0, 4)


def test_waiter_gives_up_after_max_wait(name: str, redis_url: str,
                                        redis_client: redis.Redis) -> None:
    holder = Bulkhead(name, redis=redis_url, max_concurrent_calls=1)
    waiter = Bulkhead(name, redis=redis_url, max_concurrent_calls=1, max_wait_duration=0.4)
    permit = holder.acquire()
    before = evalsha_calls(redis_client)
    started = time.monotonic()
    with pytest.raises(BulkheadFull) as caught:
        waiter.acquire()
    elapsed = time.monotonic() - started
    # Redis checks blocking timeouts on its timer (1/hz = 100 ms by default).
    assert 0.4 <= elapsed < 0.4 + 0.15
    assert caught.value.waited == pytest.approx(elapsed, abs=0.01)
    assert evalsha_calls(redis_client) - before <= 3   # register, (wake), final try
    metrics = holder.metrics()
    assert (metrics.in_use, metrics.waiting, metrics.rejected) == (1, 0, 1)
    holder.release(permit)


# -- processes ---------------------------------------------------------------------------
def _process_worker(url: str, name: str, threads: int, ready: Any, go: Any,
                    counters: Any, lock: Any) -> None:
    """One worker process: `threads` threads calling a 300 ms dependency at once."""
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=3)
    bulkhead.metrics()  # connect before the start signal

    def dependency() -> None:
        with lock:
            counters[0] += 1                           # calls
            counters[1] += 1                           # running now
            counters[2] = max(counters[2], counters[1])  # peak
        time.sleep(0.3)
        with lock:
            counters[1] -= 1

    def one() -> None:
        go.wait()
        try:
            bulkhead.call(dependency)
            with lock:
                counters[3] += 1
        except BulkheadFull:
            with lock:
                counters[4] += 1

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    ready.release()
    for worker in workers:
        worker.join()


def run_four_processes(worker: Any, redis_url: str, name: str) -> list[int]:
    """Start 4 forked processes running 3+3+2+2 concurrent callers of `worker`, released
    together; return the shared counters [calls, running, peak, ok, full]."""
    ready, go, lock = FORK.Semaphore(0), FORK.Event(), FORK.Lock()
    counters = FORK.Array("i", 5, lock=False)
    processes = [FORK.Process(target=worker,
                              args=(redis_url, name, callers, ready, go, counters, lock))
                 for callers in (3, 3, 2, 2)]
    for process in processes:
        process.start()
    for _ in processes:
        assert ready.acquire(timeout=10)
    go.set()
    for process in processes:
        process.join(10)
        assert process.exitcode == 0
    return list(counters[:])


def test_four_processes_share_the_limit(name: str, redis_url: str) -> None:
    calls, running, peak, ok, full = run_four_processes(_process_worker, redis_url, name)
    assert (ok, full) == (3, 7)
    assert calls == 3 and peak == 3 and running == 0


def _hold_forever(bulkhead: Bulkhead, acquired: Any) -> None:
    bulkhead.acquire()
    acquired.release()
    time.sleep(60)


def test_sigkilled_holders_permits_come_back_within_one_lease(name: str, redis_url: str) -> None:
    # Created (and its renewal thread started) before the fork, like a preloaded app:
    # the children must renew their own permits after the fork.
    shared = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=1.0)
    shared.release(shared.acquire())
    acquired = FORK.Semaphore(0)
    holders = [FORK.Process(target=_hold_forever, args=(shared, acquired))
               for _ in range(2)]
    for process in holders:
        process.start()
    for _ in holders:
        assert acquired.acquire(timeout=10)
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=1.0,
                        max_wait_duration=3.0)
    time.sleep(1.1)  # longer than the lease: the live holders renewed their permits
    assert bulkhead.metrics().in_use == 2
    for process in holders:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(5)
    killed = time.monotonic()
    permits = [bulkhead.acquire(), bulkhead.acquire()]
    back_after = time.monotonic() - killed
    assert back_after <= 1.0 + 0.25
    assert bulkhead.metrics().in_use == 2
    for permit in permits:
        bulkhead.release(permit)


# -- leases -----------------------------------------------------------------------------------
def test_renewal_keeps_a_long_call_alive_past_the_lease(name: str, redis_url: str) -> None:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=0.3)
    other = Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=0.3)
    with bulkhead as permit:
        for _ in range(4):                     # 1 s, more than three leases
            time.sleep(0.25)
            with pytest.raises(BulkheadFull):
                other.acquire()
    assert not permit.lost
    metrics = bulkhead.metrics()
    assert (metrics.in_use, metrics.lost, metrics.rejected) == (0, 0, 4)


def test_a_lost_lease_is_reported(name: str, redis_url: str, redis_client: redis.Redis,
                                  caplog: pytest.LogCaptureFixture) -> None:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=0.3)
    with caplog.at_level(logging.WARNING, logger="distbreaker"), bulkhead as permit:
        redis_client.delete(bulkhead.keys.leases)
        time.sleep(0.25)                       # past one renewal (every lease / 3)
        assert permit.lost
    assert "was lost" in caplog.text
    metrics = bulkhead.metrics()
    assert metrics.lost == 1 and metrics.lost_here == 1 and metrics.in_use == 0


# -- Redis down --------------------------------------------------------------------------------
def test_redis_down_enforces_the_local_fallback_limit(name: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"      # nothing listens there
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=6, expected_workers=3)
    dep = Dependency(0.2)
    results = run_at_once(5, lambda: bulkhead.call(dep))
    full = [r for r in results if isinstance(r, BulkheadFull)]
    assert results.count("ok") == 2 and len(full) == 3
    assert all(e.local and e.limit == 2 for e in full)
    assert dep.peak == 2
    closed = Bulkhead(name, redis=url, max_concurrent_calls=6, fallback_limit=0)
    with pytest.raises(BulkheadFull):
        closed.call(dep)


def test_local_fallback_then_back_to_the_fleet_limit(name: str) -> None:
    server = RedisServer().start()
    try:
        bulkhead = Bulkhead(name, redis=server.url, max_concurrent_calls=2, expected_workers=2,
                            redis_retry_max_backoff=0.05)
        first = bulkhead.acquire()
        assert not first.local
        server.kill()
        local = bulkhead.acquire()                  # Redis gone: the local limit is 1
        assert local.local
        with pytest.raises(BulkheadFull, match="local fallback"):
            bulkhead.acquire()
        bulkhead.release(local)
        bulkhead.release(first)                     # its lease would have expired anyway
        server.start()
        time.sleep(0.1)                             # past the backoff
        permits = [bulkhead.acquire(), bulkhead.acquire()]
        assert not any(p.local for p in permits)
        assert bulkhead.metrics().in_use == 2
    finally:
        server.stop()


def test_a_lease_granted_before_a_lost_reply_is_cancelled_on_the_next_acquire(
        name: str, redis_url: str) -> None:
    """Redis granted the permit but the reply timed out: the lease must not stay taken."""

    class LosesOneReply(redis.Redis):
        lose = 1

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            reply = super().execute_command(*args, **kwargs)
            if LosesOneReply.lose and args[0] in ("EVALSHA", "EVAL") \
                    and args[3 + int(args[2])] == "acquire":
                LosesOneReply.lose = 0
                raise redis.exceptions.TimeoutError("reply lost")
            return reply

    client = LosesOneReply.from_url(redis_url)
    bulkhead = Bulkhead(name, redis=client, max_concurrent_calls=1, lease=30)
    first = bulkhead.acquire()
    assert first.local                       # fell back while Redis looked unavailable
    bulkhead.release(first)
    assert bulkhead.metrics().in_use == 1    # the orphaned lease, granted in Redis
    time.sleep(0.15)                         # past the first backoff
    second = bulkhead.acquire()              # cancels the orphan, then gets the permit
    assert not second.local
    assert bulkhead.metrics().in_use == 1
    bulkhead.release(second)
    assert bulkhead.metrics().in_use == 0
