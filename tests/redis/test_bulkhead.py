"""The fleet-wide bulkhead against a real redis-server: the script, concurrent callers,
waiters, leases, Redis down. Tests taking `flavour` run with the sync and the asyncio
bulkhead; what only one has is in this file (sync) or test_bulkhead_aio.py."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis

from distbreaker._runtime.scripts import run_script
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec
from distbreaker.bulkhead.sync import Bulkhead
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import BulkheadFull, SchemaError
from tests.helpers.flavours import Flavour
from tests.helpers.redis_stats import round_trips, script_commands
from tests.helpers.waiting import wait_until

FORK = multiprocessing.get_context("fork")


# -- the script ---------------------------------------------------------------------------
def test_script_owes_one_wakeup_per_free_permit_with_a_waiter(
        name: str, redis_client: redis.Redis) -> None:
    codec = BulkheadCodec(name, BulkheadConfig(max_concurrent_calls=2, lease=10))
    keys = codec.keys

    def run(call: Any) -> list[int]:
        raw = run_script(redis_client, codec.script, call.keys, call.args)
        return [raw] if isinstance(raw, int) else [int(x) for x in raw]  # hot path: 1

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


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_foreign_data_raises_schema_error(name: str, redis_url: str, redis_client: redis.Redis,
                                          flavour: Flavour) -> None:
    bulkhead = flavour.bulkhead(name, redis=redis_url)
    redis_client.set(bulkhead.keys.leases, "not a zset")
    with pytest.raises(SchemaError, match="expected a zset"):
        bulkhead.acquire()
    redis_client.delete(bulkhead.keys.leases)
    redis_client.hset(bulkhead.keys.meta, "acquired", "many")  # the counter acquire moves
    with pytest.raises(SchemaError, match="field acquired is not a number"):
        bulkhead.acquire()
    redis_client.hset(bulkhead.keys.meta, mapping={"acquired": 0, "rejected": "many"})
    # a counter an op does not move is named by those that read it (metrics, a refusal)
    with pytest.raises(SchemaError, match="field rejected is not a number"):
        bulkhead.metrics()


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
@pytest.mark.parametrize("bad", ["meta", "notify", "leases"])
def test_foreign_type_is_reported_before_anything_is_written(
        bad: str, name: str, redis_url: str, redis_client: redis.Redis,
        flavour: Flavour) -> None:
    """Each key's foreign type is named, and the call wrote nothing (no reaping either)."""
    bulkhead = flavour.bulkhead(name, redis=redis_url)
    keys = bulkhead.keys
    good = {"leases": lambda: redis_client.zadd(keys.leases, {"expired": 1}),
            "meta": lambda: redis_client.hset(keys.meta, mapping={"w:gone": 1, "waiters": 1,
                                                                  "acquired": 4}),
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


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_bad_meta_field_is_reported_before_reaping(name: str, redis_url: str,
                                                  redis_client: redis.Redis,
                                                  flavour: Flavour) -> None:
    bulkhead = flavour.bulkhead(name, redis=redis_url)
    redis_client.zadd(bulkhead.keys.leases, {"expired": 1})
    redis_client.hset(bulkhead.keys.meta, "acquired", "many")
    with pytest.raises(SchemaError, match="not a number"):
        bulkhead.acquire()
    assert redis_client.zrange(bulkhead.keys.leases, 0, -1) == [b"expired"]


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
        reply, first = counted(codec.acquire_call("a", 0))
        assert reply == 1                 # the hot paths answer the integer 1
        reply, release = counted(codec.release_call("a"))
        assert reply == 1
        reply, again = counted(codec.acquire_call("b", 0))
        assert reply == 1
        counted(codec.release_call("b"))
        # every lease released: the zset stays with its keep-alive member and its TTL
        assert client.zrange(codec.keys.leases, 0, -1, withscores=True) == [(b"~", 0.0)]
        assert client.pttl(codec.keys.leases) > 0
        reply, idle = counted(codec.metrics_call())
        # the hot paths. First acquire: TIME HMGET ZCOUNT HINCRBY ZADD (the lease and the
        # keep-alive member), then the TTL refresh of new keys: ZREMRANGEBYSCORE
        # HSET(ttl_until, limit) PEXPIRE x2; release: TIME HGET(waiters) ZSCORE (the
        # lease is live) ZREM (the zset stays: its keep-alive member); the next acquire:
        # TIME HMGET ZCOUNT HINCRBY ZADD, no PEXPIREAT (the zset kept its TTL); metrics
        # on an idle bulkhead (the general path): the three reads, then the reap of the
        # keep-alive member (ZREMRANGEBYSCORE, ZRANGE). No waiter registered: neither
        # HGETALL nor LLEN.
        assert (first, release, again, idle) == (9, 4, 5, 5)
        assert client.exists(codec.keys.leases) == 0  # the reap left nothing behind
        client.close()


# -- threads and tasks -----------------------------------------------------------------
def test_ten_callers_max_three_no_wait(name: str, redis_url: str, flavour: Flavour) -> None:
    """Ten threads (sync) or ten tasks (asyncio) at once: three get in, seven are full."""
    bulkhead = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=3)
    dep = flavour.dependency(delay=0.3)
    results = flavour.call_at_once(10, bulkhead, dep)
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
    """Two threads wait on a full bulkhead, blocked on BLPOP (not polling); each release
    wakes one: both get in, long before their 30 s patience would have ended."""
    holders = Bulkhead(name, redis=redis_url, max_concurrent_calls=2)
    waiters = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, max_wait_duration=30.0)
    held = [holders.acquire(), holders.acquire()]
    events: list[str] = []

    def wait_for_permit() -> None:
        permit = waiters.acquire()
        events.append("got in")
        waiters.release(permit)

    threads = [threading.Thread(target=wait_for_permit) for _ in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: holders.metrics().waiting == 2, what="both threads wait")
    before = round_trips(redis_client)
    time.sleep(0.2)
    assert round_trips(redis_client) - before <= 1   # blocked on BLPOP, not polling
    assert events == []
    events.append("released")
    for permit in held:
        holders.release(permit)
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert events == ["released", "got in", "got in"]
    metrics = holders.metrics()
    assert (metrics.in_use, metrics.waiting, metrics.rejected, metrics.acquired) == (0, 0, 0, 4)


def test_waiter_gives_up_after_max_wait(name: str, redis_url: str, redis_client: redis.Redis,
                                        flavour: Flavour) -> None:
    holder = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1)
    waiter = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1,
                              max_wait_duration=0.4)
    permit = holder.acquire()
    before = round_trips(redis_client)
    started = time.monotonic()
    with pytest.raises(BulkheadFull) as caught:
        waiter.acquire()
    elapsed = time.monotonic() - started
    # It waited its whole patience, then gave up (when exactly is up to Redis's timer,
    # 1/hz, and the machine's load: only a generous upper bound).
    assert caught.value.waited >= 0.4 and 0.4 <= elapsed < 0.4 + 10
    assert round_trips(redis_client) - before <= 3   # register, (wake), final try
    metrics = holder.metrics()
    assert (metrics.in_use, metrics.waiting, metrics.rejected) == (1, 0, 1)
    holder.release(permit)


# -- leases -----------------------------------------------------------------------------------
def test_renewal_keeps_a_long_call_alive_past_the_lease(name: str, redis_url: str,
                                                        flavour: Flavour) -> None:
    # (a 1.2 s lease renewed every 0.4 s: a loaded machine still renews in time)
    bulkhead = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=1.2)
    other = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=1.2)
    with bulkhead as permit:
        for _ in range(4):                     # 4 s, more than three leases
            flavour.sleep(1.0)
            with pytest.raises(BulkheadFull):
                other.acquire()
    assert not permit.lost
    metrics = bulkhead.metrics()
    assert (metrics.in_use, metrics.lost, metrics.rejected) == (0, 0, 4)


def test_a_lost_lease_is_reported(name: str, redis_url: str, redis_client: redis.Redis,
                                  caplog: pytest.LogCaptureFixture, flavour: Flavour) -> None:
    bulkhead = flavour.bulkhead(name, redis=redis_url, max_concurrent_calls=1, lease=0.3)
    with caplog.at_level(logging.WARNING, logger="distbreaker"), bulkhead as permit:
        redis_client.delete(bulkhead.keys.leases)
        # until a renewal (every lease / 3) ran: flavour.sleep lets the asyncio one run
        wait_until(lambda: permit.lost or flavour.sleep(0.05), interval=0,
                   what="the renewal finds the lease lost")
    assert "was lost" in caplog.text
    metrics = bulkhead.metrics()
    assert metrics.lost == 1 and metrics.lost_here == 1 and metrics.in_use == 0


# -- Redis down --------------------------------------------------------------------------------
def test_redis_down_enforces_the_local_fallback_limit(name: str, flavour: Flavour) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"      # nothing listens there
    bulkhead = flavour.bulkhead(name, redis=url, max_concurrent_calls=6, expected_workers=3)
    dep = flavour.dependency(delay=0.2)
    results = flavour.call_at_once(5, bulkhead, dep)
    full = [r for r in results if isinstance(r, BulkheadFull)]
    assert results.count("ok") == 2 and len(full) == 3
    assert all(e.local and e.limit == 2 for e in full)
    assert dep.peak == 2
    waiting = flavour.bulkhead(name, redis=url, max_concurrent_calls=6, expected_workers=6,
                               max_wait_duration=0.5)
    results = flavour.call_at_once(2, waiting, dep)
    assert results == ["ok", "ok"]          # the second waited for the first (limit 1)
    closed = flavour.bulkhead(name, redis=url, max_concurrent_calls=6, fallback_limit=0)
    with pytest.raises(BulkheadFull):
        closed.call(dep)


def test_local_fallback_then_back_to_the_fleet_limit(name: str, flavour: Flavour) -> None:
    server = RedisServer().start()
    try:
        bulkhead = flavour.bulkhead(name, redis=server.url, max_concurrent_calls=2,
                                    expected_workers=2, redis_retry_max_backoff=0.05)
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
            if LosesOneReply.lose and args[0] in ("FCALL", "EVALSHA", "EVAL") \
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
