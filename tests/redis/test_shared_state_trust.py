"""The shared state holds in every Redis condition (issue 13), against a real redis-server:
an ACL without channel permission, a full Redis (noeviction), an evicted probes key,
FORCED_OPEN served from the local view, and one events channel per database."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis

from distbreaker import CallNotPermitted, CircuitBreaker, State
from distbreaker._runtime.keys import events_channel
from distbreaker._runtime.scripts import FUNCTIONS
from distbreaker.demo.embedded import RedisServer
from tests.helpers.records import count_window, read_record
from tests.helpers.redis_stats import SCRIPT_CALLS

FAST = {"sliding_window_size": 4, "minimum_number_of_calls": 4,
        "wait_duration_in_open_state": 60, "permitted_calls_in_half_open": 2,
        "half_open_lease": 5}


def boom() -> None:
    raise ConnectionError("dependency down")


def script_calls(client: redis.Redis) -> int:
    """Script calls so far (FCALL, EVALSHA, EVAL): the round trips a breaker made."""
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in SCRIPT_CALLS)


@pytest.fixture
def private_server() -> Iterator[RedisServer]:
    """A server of its own (tests here change ACLs and maxmemory)."""
    server = RedisServer(extra_args=("--enable-debug-command", "yes")).start()
    yield server
    server.stop()


def test_acl_without_channel_permission_still_trips_and_never_raises(
        private_server: RedisServer, name: str, caplog: pytest.LogCaptureFixture) -> None:
    admin = redis.Redis(port=private_server.port)
    # Redis 7's default for new users: no channel at all.
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~distbreaker:*",
                          "resetchannels", "+@all")
    url = f"redis://worker:pw@127.0.0.1:{private_server.port}/0"
    breaker = CircuitBreaker(name, redis=url, subscribe=False, **FAST)
    with caplog.at_level(logging.ERROR, logger="distbreaker"):
        raised = []
        for _ in range(20):
            try:
                breaker.call(boom)
            except ConnectionError:
                raised.append("dependency")
            except CallNotPermitted:
                raised.append("rejected")
    # the 4th failure trips it; no ResponseError ever reached the caller
    assert raised == ["dependency"] * 4 + ["rejected"] * 16
    assert breaker.state is State.OPEN
    keys = breaker.keys
    # the transition was saved once; its history entry is there, its PUBLISH was refused
    history = admin.xrange(keys.history)
    assert [(f[b"from"], f[b"to"]) for _, f in history] == [(b"CLOSED", b"OPEN")]
    state = read_record(admin, keys)
    window = [slot for slot in count_window(admin, keys) if slot is not None]
    assert state["calls"] == len(window) == 4
    assert state["failures"] == sum(failed for failed, _, _ in window) == 4
    refusals = [r for r in caplog.records if "publish" in r.getMessage()]
    assert len(refusals) == 1 and "can't publish to the channel" in refusals[0].getMessage()


def test_acl_refusing_the_script_applies_the_fail_open_policy(
        private_server: RedisServer, name: str, caplog: pytest.LogCaptureFixture) -> None:
    admin = redis.Redis(port=private_server.port)
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@read", "+ping")
    url = f"redis://reader:pw@127.0.0.1:{private_server.port}/0"
    breaker = CircuitBreaker(name, redis=url, subscribe=False, **FAST)
    with caplog.at_level(logging.ERROR, logger="distbreaker"):
        assert [breaker.call(lambda: "ok") for _ in range(3)] == ["ok"] * 3
    missing = [r for r in caplog.records if "missing a permission" in r.getMessage()]
    assert len(missing) == 1 and "'evalsha' command" in missing[0].getMessage()


def test_a_full_redis_still_rejects_for_an_open_breaker(private_server: RedisServer,
                                                        name: str) -> None:
    admin = redis.Redis(port=private_server.port)
    breaker = CircuitBreaker(name, redis=private_server.url, subscribe=False,
                             revalidate_interval=0.001, **FAST)
    assert breaker.trip() is State.OPEN
    admin.config_set("maxmemory-policy", "noeviction")
    admin.execute_command("DEBUG", "POPULATE", "20000", "filler", "200")
    admin.config_set("maxmemory", "1")  # every write that needs memory is refused
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("probe", "x")
    calls = 0

    def dependency() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    for _ in range(50):
        time.sleep(0.002)  # past revalidate_interval: every call asks Redis
        with pytest.raises(CallNotPermitted) as rejected:
            breaker.call(dependency)
        assert rejected.value.state is State.OPEN
    assert calls == 0  # no call fell back to a local breaker that knows nothing
    admin.config_set("maxmemory", "0")


def test_an_evicted_probes_key_cannot_wedge_half_open(redis_client: redis.Redis,
                                                      redis_url: str, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, subscribe=False,
                             **{**FAST, "wait_duration_in_open_state": 0.05})
    breaker.trip()
    time.sleep(0.06)
    first = breaker.acquire()
    second = breaker.acquire()
    assert first.token and second.token
    with pytest.raises(CallNotPermitted):
        breaker.acquire()
    redis_client.delete(breaker.keys.probes)  # evicted (allkeys-lru, volatile-*)
    # both slots are free again at once: nobody holds a lease Redis still knows of
    third, fourth = breaker.acquire(), breaker.acquire()
    assert third.token and fourth.token
    breaker.record(third, None, 0.001)
    breaker.record(fourth, None, 0.001)
    assert breaker.state is State.CLOSED
    # the old holders report late: their leases are gone, they count for nothing
    breaker.record(first, None, 0.001)
    breaker.record(second, ConnectionError("late"), 0.001)
    assert breaker.state is State.CLOSED


def test_forced_open_is_served_from_the_local_view_with_reason_and_actor(
        redis_client: redis.Redis, redis_url: str, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, revalidate_interval=0.3, **FAST)
    breaker.transition_to_forced_open("gateway maintenance", actor="alice@ops")
    before = script_calls(redis_client)
    for _ in range(100):
        with pytest.raises(CallNotPermitted) as rejected:
            breaker.call(lambda: "never")
        error = rejected.value
        assert error.state is State.FORCED_OPEN
        assert (error.reason, error.actor) == ("gateway maintenance", "alice@ops")
        assert error.retry_after == 0.3
    assert script_calls(redis_client) - before == 0
    time.sleep(0.31)  # the view is re-checked after revalidate_interval
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: "never")
    assert script_calls(redis_client) - before == 1


def test_each_database_has_its_own_events_channel(redis_server: RedisServer,
                                                  redis_url: str, name: str) -> None:
    db0 = CircuitBreaker(name, redis=redis_server.url, **FAST)
    db1 = CircuitBreaker(name, redis=redis_server.url.replace("/0", "/1"), **FAST)
    assert db0.keys.channel == events_channel() == "distbreaker:v2:events"
    assert db1.keys.channel == "distbreaker:v2:events:db1"
    listener = redis.Redis(port=redis_server.port).pubsub()
    listener.subscribe(events_channel())
    assert listener.get_message(timeout=1)["type"] == "subscribe"
    db0.call(lambda: "ok")          # db0 learns CLOSED (a local view to keep)
    db1.trip()                      # a tenant on db 1 trips its own breaker
    time.sleep(0.05)
    message = listener.get_message(timeout=0.2)
    assert message is None          # db 0's channel heard nothing
    assert db0.call(lambda: "ok") == "ok"
    redis.Redis(port=redis_server.port, db=1).flushdb()


def test_ganesha_refuses_a_key_ttl_that_could_expire_other_writers_events() -> None:
    from distbreaker.ganesha import GaneshaConfig

    with pytest.raises(ValueError, match="time_window \\+ interval_to_half_open = 35 s"):
        GaneshaConfig(time_window=30, interval_to_half_open=5, key_ttl=2.5)
    assert GaneshaConfig(time_window=30, interval_to_half_open=5, key_ttl=35).key_ttl == 35
    assert GaneshaConfig(key_ttl=0).key_ttl == 0


def test_ganesha_key_ttl_keeps_php_events_written_after_pythons_last_write(
        redis_client: redis.Redis, redis_url: str, name: str) -> None:
    from distbreaker.ganesha import GaneshaBreaker, GaneshaConfig

    config = GaneshaConfig(time_window=2, interval_to_half_open=1, key_ttl=3)
    breaker = GaneshaBreaker(name, redis=redis_url, config=config)
    breaker.failure()                       # Python writes: the TTL is 3 s
    failure_key = config.keys(name)[1]
    # another writer (Ganesha's PHP side) adds a failure right after, without a TTL
    redis_client.zadd(failure_key, {"php-1": time.time() * 1000})
    ttl_ms = redis_client.pttl(failure_key)
    assert ttl_ms >= (config.time_window) * 1000  # it outlives the window it counts in


@pytest.mark.parametrize("form", ["function", "eval"])
def test_a_full_redis_refuses_the_breakers_writes_in_both_forms(
        private_server: RedisServer, name: str, form: str) -> None:
    """maxmemory under noeviction binds the Function form too (no allow-oom): the writes
    are refused, the outage policy applies, nothing escapes the protected call."""
    admin = redis.Redis(port=private_server.port)
    client = redis.Redis(port=private_server.port)
    if form == "eval":
        FUNCTIONS.give_up(client, "test: the EVAL form")   # per client object
    breaker = CircuitBreaker(name, redis=client, subscribe=False, **FAST)
    assert breaker.call(lambda: "ok") == "ok"
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("probe", "x")                          # Redis is full
        for _ in range(10):
            assert breaker.call(lambda: "ok") == "ok"      # fail-open: the calls go on
    finally:
        admin.config_set("maxmemory", "0")
    assert read_record(admin, breaker.keys)["calls"] == 1  # nothing written past maxmemory
