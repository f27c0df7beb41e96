"""Reads and operator actions while Redis is down raise `RedisUnavailable`, which is
also a redis-py ConnectionError, names the component and carries the Redis error."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

import distbreaker
import distbreaker.aio
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import DistbreakerError, RedisUnavailable
from tests.helpers.flavours import Flavour

FAST = {"redis_timeout": 0.2, "redis_retry_max_backoff": 0.2}


def reads(flavour: Flavour, name: str, url: str) -> list[tuple[str, Callable[[], Any]]]:
    """(component, call) for every read and operator action that goes to Redis only."""
    breaker = flavour.breaker(name, redis=url, **FAST)
    bulkhead = flavour.bulkhead(name, redis=url, **FAST)
    budget = flavour.budget(name, redis=url, **FAST)
    return [("circuit breaker", breaker.get_state),
            ("circuit breaker", lambda: breaker.state),
            ("circuit breaker", breaker.metrics),
            ("circuit breaker", lambda: breaker.trip("ops")),
            ("circuit breaker", breaker.reset),
            ("circuit breaker", breaker.transition_to_forced_open),
            ("bulkhead", bulkhead.metrics),
            ("retry budget", budget.reset)]


def test_reads_and_operator_actions_raise_redis_unavailable_on_a_killed_redis(
        flavour: Flavour, name: str) -> None:
    srv = RedisServer().start()
    try:
        calls = reads(flavour, name, srv.url)
        assert calls[0][1]() is State.CLOSED  # Redis up: answered
        assert calls[6][1]().in_use == 0
        srv.kill()
        for component, read in calls:
            with pytest.raises(RedisUnavailable) as caught:
                read()
            error = caught.value
            assert isinstance(error, DistbreakerError)
            assert isinstance(error, RedisConnectionError)       # old except clauses work
            assert isinstance(error, redis.ConnectionError)
            assert isinstance(error.__cause__, RedisConnectionError)
            assert not isinstance(error.__cause__, RedisUnavailable)
            assert error.component == f"{component} {name!r}"
            assert name in str(error)
    finally:
        srv.stop()


def test_protected_calls_still_fail_open_while_reads_raise(flavour: Flavour,
                                                           name: str) -> None:
    srv = RedisServer().start()
    try:
        breaker = flavour.breaker(name, redis=srv.url, **FAST)
        srv.kill()
        assert breaker.call(lambda: "ok") == "ok"   # never RedisUnavailable
        with pytest.raises(RedisUnavailable):
            breaker.get_state()
    finally:
        srv.stop()


def test_redis_unavailable_pickles_and_is_exported_by_both_facades() -> None:
    error = RedisUnavailable("bulkhead 'db'", "ConnectionError: refused")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RedisUnavailable and str(copy) == str(error)
    assert (copy.component, copy.detail) == (error.component, error.detail)
    assert distbreaker.RedisUnavailable is distbreaker.aio.RedisUnavailable is RedisUnavailable
