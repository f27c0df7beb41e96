"""Redis Sentinel: ``redis+sentinel://`` URLs and Sentinel-managed clients, and a real
failover (one primary, one replica, one sentinel, all local) under protected calls."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.sentinel import Sentinel

from distbreaker import CircuitBreaker, aio
from distbreaker._runtime.connection import (
    SentinelURL,
    async_client,
    parse_sentinel_url,
    sync_client,
)
from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import library
from distbreaker.demo.embedded import EmbeddedSentinel
from distbreaker.policy.sync import Policy
from tests.helpers.records import read_record
from tests.helpers.waiting import wait_until

# A window far larger than the calls made, so the stored `calls` only ever grows.
WINDOW = {"sliding_window_size": 100_000, "minimum_number_of_calls": 100_000,
          "redis_retry_max_backoff": 0.5}


# -- URL parsing ------------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "expected"), [
    ("redis+sentinel://127.0.0.1:26380/mymaster",
     SentinelURL(sentinels=(("127.0.0.1", 26380),), service="mymaster")),
    ("redis+sentinel://s1,s2:5000,[::1]:26390,[::2]/svc/3",
     SentinelURL(sentinels=(("s1", 26379), ("s2", 5000), ("::1", 26390), ("::2", 26379)),
                 service="svc", db=3)),
    ("rediss+sentinel://app:s%40cret@h:1/svc?sentinel_password=sp&sentinel_username=su",
     SentinelURL(sentinels=(("h", 1),), service="svc", username="app", password="s@cret",
                 ssl=True, sentinel_username="su", sentinel_password="sp")),
    ("redis+sentinel://:pw@h/svc",
     SentinelURL(sentinels=(("h", 26379),), service="svc", password="pw")),
])
def test_sentinel_urls_are_parsed(url: str, expected: SentinelURL) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("redis+sentinel://h:1", "must end in /<service name>"),
    ("redis+sentinel://h:1/svc/0/extra", "must end in /<service name>"),
    ("redis+sentinel://h:1/svc/zero", "bad database number"),
    ("redis+sentinel://h:port/svc", "bad port"),
    ("redis+sentinel:///svc", "names no sentinel host"),
])
def test_bad_sentinel_urls_name_the_problem(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircuitBreaker("sentinel-url", redis=url)


def test_other_urls_are_not_sentinel_urls() -> None:
    assert parse_sentinel_url("redis://localhost:6379/0") is None
    assert parse_sentinel_url("rediss://localhost/0") is None


def test_clients_from_sentinel_urls_are_lazy_and_typed() -> None:
    """Nothing connects at construction (no sentinel listens on port 1)."""
    client = sync_client("redis+sentinel://127.0.0.1:1/svc", 0.25)
    assert isinstance(client, redis.Redis)
    assert type(client.connection_pool).__name__ == "SentinelConnectionPool"
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.25
    aclient = async_client("redis+sentinel://127.0.0.1:1/svc", 0.25)
    assert isinstance(aclient, redis.asyncio.Redis)
    assert aclient.connection_pool.max_connections == 32  # queues instead of raising
    with pytest.raises(TypeError, match="master_for"):
        CircuitBreaker("sentinel-object", redis=Sentinel([("127.0.0.1", 1)]))


def test_a_breaker_on_an_unreachable_sentinel_fails_open_at_once(name: str) -> None:
    """No client-side retry backoff: redis-py's default retries took ~4 s per lookup, in
    the call. Refused connections fail in milliseconds, so 3 s is a generous bound that
    still tells the two apart on a loaded machine."""
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc"
    breaker = CircuitBreaker(name, redis=url)
    started = time.monotonic()
    assert breaker.call(lambda: "served") == "served"
    assert time.monotonic() - started < 3.0
    assert breaker._health.down  # MasterNotFoundError is a ConnectionError

    async def served() -> str:
        return "served"

    async def scenario() -> float:
        abreaker = aio.CircuitBreaker(name, redis=url)
        started = time.monotonic()
        assert await abreaker.call(served) == "served"
        assert abreaker._health.down
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 3.0


# -- a real failover ----------------------------------------------------------------------------
@pytest.fixture
def sentinel_env() -> Iterator[EmbeddedSentinel]:
    with EmbeddedSentinel(down_after_ms=1000, failover_timeout_ms=3000) as env:
        yield env


class Loop:
    """Runs one protected call over and over in a thread; collects what escaped."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.done = 0
        self.escaped: list[BaseException] = []
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.call()
            except BaseException as exc:  # anything escaping a protected call is a failure
                self.escaped.append(exc)
            self.worst = max(self.worst, time.monotonic() - started)
            self.done += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def stored_calls(port: int, name: str) -> int:
    with redis.Redis(port=port, socket_timeout=2) as client:
        return int(read_record(client, BreakerKeys.build(name)).get("calls", 0))


def test_protected_calls_survive_a_failover_and_return_to_redis(
        sentinel_env: EmbeddedSentinel, name: str) -> None:
    env = sentinel_env
    by_url = CircuitBreaker(name, redis=env.url, **WINDOW)
    managed = Sentinel(env.sentinels, sentinel_kwargs={"socket_timeout": 0.25}).master_for(
        env.service, socket_timeout=0.25, socket_connect_timeout=0.25)
    policy = Policy(name + "-policy", redis=managed, breaker=WINDOW,
                    bulkhead={"max_concurrent_calls": 4, "redis_retry_max_backoff": 0.5},
                    budget={"min_retries_per_sec": 1, "redis_retry_max_backoff": 0.5})
    abreaker = aio.CircuitBreaker(name + "-aio", redis=env.url, **WINDOW)

    async def aio_ok() -> str:
        return "ok"

    breakers = (by_url, policy.breaker, abreaker)
    names = [b.name for b in breakers]
    loop = asyncio.new_event_loop()
    loops = [Loop(lambda: by_url.call(lambda: "ok")),
             Loop(lambda: policy.call(lambda: "ok")),
             Loop(lambda: loop.run_until_complete(abreaker.call(aio_ok)))]
    try:
        wait_until(lambda: stored_calls(env.primary.port, name) > 20,
                   what="calls stored on the first primary")
        env.primary.kill()  # SIGKILL: whatever was not yet replicated is lost
        killed = time.monotonic()
        env.wait_for_failover(timeout=30)
        promoted = time.monotonic() - killed
        after = {n: stored_calls(env.replica.port, n) for n in names}
        wait_until(lambda: (all(not b._health.down for b in breakers)
                            and all(stored_calls(env.replica.port, n) > after[n] + 10
                                    for n in names)),
                   timeout=60, interval=0.05,
                   what="every breaker on Redis again, its calls written through the new "
                        "primary")
        recovered = time.monotonic() - killed - promoted
    finally:
        for each in loops:
            each.stop()
        loop.close()
    print(f"\nfailover: promoted after {promoted:.1f}s, Redis used again "
          f"{recovered:.1f}s later; worst protected call "
          f"{max(each.worst for each in loops) * 1000:.0f} ms")
    assert [each.escaped for each in loops] == [[], [], []]
    assert all(each.done > 30 for each in loops)  # > 20 before, > 10 after the failover
    # The gap was served by the local fallback (Redis was tried again with backoff).
    assert all(breaker._health.trials > 0 for breaker in breakers)
    # The new primary serves the breakers' FCALLs: the library reached it (replicated,
    # or loaded again on its first "function not found").
    with redis.Redis(port=env.replica.port) as new_primary:
        assert new_primary.info("commandstats")["cmdstat_fcall"]["calls"] >= 1
        assert len(new_primary.function_list(library().name)) == 1
        assert new_primary.info("replication")["role"] == "master"


def test_a_plain_url_at_a_sentinels_port_is_an_outage_with_its_fix(
        sentinel_env: EmbeddedSentinel, name: str) -> None:
    """redis://<sentinel host>:<sentinel port>: the Sentinel answers, but runs no scripts
    (issue 23): the call runs (fail_open) and check() says to use a sentinel URL."""
    from distbreaker import CheckFailed
    from distbreaker._runtime.outages import NO_SCRIPTS

    url = f"redis://127.0.0.1:{sentinel_env.sentinel_port}/0"
    breaker = CircuitBreaker(name, redis=url, redis_timeout=5.0)
    assert breaker.call(lambda: "ran") == "ran"
    with pytest.raises(CheckFailed) as caught:
        breaker.check()
    assert caught.value.cause is NO_SCRIPTS
    assert "redis+sentinel://" in str(caught.value)
