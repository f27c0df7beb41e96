"""The composed policy against a real redis-server: ordering, bulkhead trap, retry storm.

Tests taking `flavour` run with the sync and the asyncio Policy; what only the asyncio one
has is in test_policy_aio.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker, HttpStatusError, Retry
from distbreaker.breaker.state import State
from distbreaker.errors import BulkheadFull, CallNotPermitted
from distbreaker.policy.sync import Policy
from tests.helpers.dependency import Dependency, run_requests
from tests.helpers.flavours import Flavour
from tests.helpers.redis_stats import round_trips

NO_SLEEP = {"base": 0.0, "cap": 0.0}


@dataclasses.dataclass
class Response:
    """The shape of an httpx/requests response the policy classifies."""

    status_code: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


def ordering_breaker(name: str, url: str) -> dict[str, Any]:
    return {"sliding_window_size": 6, "minimum_number_of_calls": 6,
            "failure_rate_threshold": 50, "wait_duration_in_open_state": 60}


def test_retry_outside_breaker_with_rejections_retried(name: str, redis_url: str) -> None:
    dep = Dependency(ConnectionError("down"))
    breaker = CircuitBreaker(name, redis=redis_url, **ordering_breaker(name, redis_url))
    attempts_on_open = 0

    def attempt() -> Any:
        nonlocal attempts_on_open
        try:
            return breaker.call(dep)
        except CallNotPermitted:
            attempts_on_open += 1
            raise

    retry = Retry(max_attempts=3, ignore=(), sleep=lambda s: None, **NO_SLEEP)
    run_requests(lambda: retry.call(attempt), 6)
    assert dep.calls == 6
    assert attempts_on_open == 12


def test_breaker_outside_retry_lets_every_retry_through(name: str, redis_url: str) -> None:
    dep = Dependency(ConnectionError("down"))
    breaker = CircuitBreaker(name, redis=redis_url, **ordering_breaker(name, redis_url))
    retry = Retry(max_attempts=3, sleep=lambda s: None, **NO_SLEEP)
    run_requests(lambda: breaker.call(lambda: retry.call(dep)), 6)
    assert dep.calls == 18


def test_default_policy_stops_at_the_breaker_without_retrying(name: str, redis_url: str,
                                                               flavour: Flavour) -> None:
    dep = Dependency(ConnectionError("down"))
    policy = flavour.policy(name, redis=redis_url, breaker=ordering_breaker(name, redis_url),
                            retry={"max_attempts": 3, **NO_SLEEP}, sleep=flavour.no_sleep)
    outcomes = run_requests(lambda: policy.call(dep), 6)
    assert dep.calls == 6  # one attempt per request: no retry
    assert outcomes == ["failed", "failed", "rejected", "rejected", "rejected", "rejected"]
    assert policy.breaker.state is State.OPEN


def test_the_bulkhead_trap_does_not_open_the_breaker(name: str, redis_url: str,
                                                      flavour: Flavour) -> None:
    """Ten threads (sync) or tasks (asyncio) at once: the seven BulkheadFull are neither
    retried nor counted as the dependency's failures."""
    dep = flavour.dependency("ok", delay=0.3)
    policy = flavour.policy(name, redis=redis_url,
                            breaker={"sliding_window_size": 10, "minimum_number_of_calls": 5},
                            bulkhead={"max_concurrent_calls": 3}, retry={"max_attempts": 3})
    results = flavour.call_at_once(10, policy, dep)
    assert sorted("full" if isinstance(r, BulkheadFull) else r for r in results) == \
        ["full"] * 7 + ["ok"] * 3
    assert dep.calls == 3 and dep.peak == 3
    metrics = policy.breaker.metrics()
    assert metrics.state is State.CLOSED
    assert metrics.failed == 0 and metrics.calls == 3


def storm_policy(flavour: Flavour, name: str, url: str, **breaker: Any) -> Policy:
    options = {"sliding_window_size": 10, "minimum_number_of_calls": 5,
               "failure_rate_threshold": 50, "wait_duration_in_open_state": 60}
    options.update(breaker)
    return flavour.policy(name, redis=url, breaker=options,
                          bulkhead={"max_concurrent_calls": 10},
                          retry={"max_attempts": 3, **NO_SLEEP},
                          budget={"percent_can_retry": 0.2, "min_retries_per_sec": 0,
                                  "ttl": 10},
                          sleep=flavour.no_sleep)


def test_retry_storm_is_stopped_by_the_breaker(name: str, redis_url: str,
                                               flavour: Flavour) -> None:
    dep = Dependency(Response(503))
    policy = storm_policy(flavour, name, redis_url)
    outcomes = []
    for _ in range(50):
        try:
            policy.call(dep)
        except CallNotPermitted:
            outcomes.append("rejected")
        except HttpStatusError as error:
            assert error.status_code == 503
            outcomes.append("503")
    assert dep.calls <= 6  # the threshold (5), never hundreds
    assert outcomes.count("503") <= 5
    assert outcomes.count("rejected") == 50 - outcomes.count("503")
    assert policy.breaker.state is State.OPEN


def test_budget_alone_caps_retries_when_the_breaker_never_opens(name: str, redis_url: str,
                                                              flavour: Flavour) -> None:
    dep = Dependency(Response(503))
    policy = storm_policy(flavour, name, redis_url, failure_rate_threshold=100,
                          minimum_number_of_calls=10**6, sliding_window_size=100)
    for _ in range(50):
        with pytest.raises(HttpStatusError):
            policy.call(dep)
    # 50 first attempts + 20 % of 50 requests in retries
    assert dep.calls == 60
    assert policy.breaker.state is State.CLOSED


def test_429_without_retry_after_opens_the_breaker_on_the_first_call(
        name: str, redis_url: str, flavour: Flavour) -> None:
    dep = Dependency(Response(429))
    policy = storm_policy(flavour, name, redis_url)
    with pytest.raises(HttpStatusError):
        policy.call(dep)
    assert dep.calls == 1
    assert policy.breaker.state is State.OPEN
    with pytest.raises(CallNotPermitted):
        policy.call(dep)
    assert dep.calls == 1


def test_a_400_is_neither_retried_nor_counted(name: str, redis_url: str,
                                              flavour: Flavour) -> None:
    dep = Dependency(Response(400))
    policy = storm_policy(flavour, name, redis_url)
    assert policy.call(dep).status_code == 400
    raising = Dependency(HttpStatusError(400))
    with pytest.raises(HttpStatusError):
        policy.call(raising)
    assert dep.calls == 1 and raising.calls == 1
    assert policy.breaker.metrics().calls == 0


def test_fallback_gets_the_error_but_not_client_errors(name: str, redis_url: str,
                                                       flavour: Flavour) -> None:
    seen: list[BaseException] = []

    def fallback(error: BaseException) -> str:
        seen.append(error)
        return "queued"

    policy = flavour.policy(name, redis=redis_url, fallback=fallback)
    assert policy.call(Dependency(ConnectionError("down"))) == "queued"
    assert isinstance(seen[0], ConnectionError)
    with pytest.raises(HttpStatusError):
        policy.call(Dependency(HttpStatusError(404)))
    asked = flavour.policy(name, redis=redis_url, fallback=fallback,
                           fallback_on_client_error=True)
    assert asked.call(Dependency(HttpStatusError(404))) == "queued"


def test_full_policy_costs_two_round_trips_per_attempt_in_closed(
        name: str, redis_url: str, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 5},
                    retry={"max_attempts": 2},
                    budget={"percent_can_retry": 0.2, "min_retries_per_sec": 1})
    policy.call(lambda: "warm-up")  # learns CLOSED, loads scripts
    sent: list[int] = []
    original = policy._client.connection_pool.get_connection

    def counting(*args: Any, **kwargs: Any) -> Any:
        connection = original(*args, **kwargs)
        sent.append(1)
        return connection

    scripts: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        parts = [command] if isinstance(command, (bytes, str)) else command
        data = b"".join(p if isinstance(p, bytes) else bytes(p) for p in parts)
        scripts.append(data.count(b"\r\nFCALL\r\n"))  # script calls in this request
        return send(self, command, *args, **kwargs)

    # (the client is this process's shared client of the URL: undone after the test)
    monkeypatch.setattr(policy._client.connection_pool, "get_connection", counting)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", sending)
    before = round_trips(redis_client)
    for _ in range(20):
        assert policy.call(lambda: "ok") == "ok"
    # one acquire, then ONE merged call (deposit, release, record: lua/finish.lua)
    assert len(sent) == 40
    assert sum(scripts) == 40 and max(scripts) == 1  # (other sends: connection set-up)
    # the server ran them as 40 script calls (server-wide: at least ours)
    assert round_trips(redis_client) - before >= 20 * 2


def test_a_locally_rejected_call_costs_no_round_trip_and_deposits_nothing(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 5},
                    retry={"max_attempts": 2},
                    budget={"percent_can_retry": 0.2, "min_retries_per_sec": 0})
    assert policy.call(lambda: "ok") == "ok"     # one deposit, learns CLOSED
    policy.breaker.trip("test")
    with pytest.raises(CallNotPermitted):
        policy.call(lambda: "never")             # learns OPEN
    before = round_trips(redis_client)
    for _ in range(20):
        with pytest.raises(CallNotPermitted):
            policy.call(lambda: "never")
    assert round_trips(redis_client) == before
    reply = policy.budget._run(policy.budget.carrying_args("balance"))
    assert reply.deposits == 1


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_one_failing_reply_in_the_pipeline_does_not_undo_the_others(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    from distbreaker.errors import SchemaError

    policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 2},
                    breaker={"sliding_window_size": 1, "minimum_number_of_calls": 1},
                    budget={"percent_can_retry": 0.2})
    seen: list[Any] = []
    policy.breaker.add_listener(seen.append)
    redis_client.set(policy.budget.keys.slices, "foreign")   # the deposit will fail

    def down() -> None:
        raise ConnectionError("down")

    with pytest.raises(SchemaError):
        policy.call(down)
    # the record in the same pipeline ran and its reply was applied: the trip it
    # made reached this process's listeners and its view (the next call fails fast)
    assert [(e.from_state, e.to_state) for e in seen] == [(State.CLOSED, State.OPEN)]
    before = round_trips(redis_client)
    with pytest.raises(CallNotPermitted):
        policy.call(down)
    assert round_trips(redis_client) == before
    assert policy.bulkhead.metrics().in_use == 0


def test_close_closes_what_the_policy_built_and_leaves_what_it_was_given(
        flavour: Flavour, redis_url: str, name: str) -> None:
    """Batched outcomes of a breaker the policy built are sent by its close; a breaker
    given as an instance stays open (the caller closes it)."""
    policy = flavour.policy(name, redis=redis_url, breaker={
        "record_mode": "batched", "flush_interval": 60, "redis_timeout": 5.0})
    for _ in range(4):
        policy.call(lambda: "ok")
    reader = CircuitBreaker(name, redis=redis_url, redis_timeout=5.0)
    assert reader.metrics().calls == 0  # still pending in this process
    if flavour.is_async:
        policy.aclose()
    else:
        policy.close()
    assert reader.metrics().calls == 4
    given = flavour.breaker(name + "-given", redis=redis_url, redis_timeout=5.0)
    other = flavour.policy(name + "-given", redis=redis_url, breaker=given.target
                           if flavour.is_async else given)
    assert other.owned == []
    reader.close()
