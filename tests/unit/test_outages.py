"""Which Redis errors are a refusal or a misdirection, and their one log line each
(distbreaker/_runtime/outages.py); against real servers: tests/redis/test_refusals.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from redis.exceptions import (
    BusyLoadingError,
    InvalidResponse,
    NoPermissionError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from distbreaker._runtime import outages
from distbreaker._runtime.health import UNAVAILABLE_ERRORS


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    outages._logged.clear()
    yield
    outages._logged.clear()


@pytest.mark.parametrize(("error", "cause"), [
    (ResponseError("DB index is out of range"), outages.DB_RANGE),
    (ResponseError("unknown command 'SENTINEL', with args beginning with: 'MASTERS'"),
     outages.NOT_SENTINEL),
    (ResponseError("unknown command 'evalsha', with args beginning with: "), outages.NO_SCRIPTS),
    (ResponseError("The user executing the script can't run this command or subcommand "
                   "script: x, on @user_function:1."), outages.ACL),
    (ResponseError("BUSY Redis is busy running a script."), outages.BUSY),
    (ResponseError("READONLY You can't write against a read only replica."),
     outages.READ_ONLY),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), outages.OOM),
    (InvalidResponse('Protocol error, got "H" as reply type byte'), outages.NOT_REDIS),
    (ReadOnlyError("You can't write against a read only replica."), outages.READ_ONLY),
    (BusyLoadingError("Redis is loading the dataset in memory"), outages.LOADING),
    (NoPermissionError("this user has no permissions to run the 'evalsha' command"),
     outages.ACL),
])
def test_each_refusal_is_an_outage_with_its_cause(error: Exception,
                                                  cause: outages.Cause) -> None:
    assert outages.cause_of(error) is cause
    assert isinstance(outages.as_outage(error), UNAVAILABLE_ERRORS)


@pytest.mark.parametrize("error", [
    ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    ResponseError("DISTBREAKER_SCHEMA distbreaker:v2:{x}:cb is not a state record"),
    ResponseError("unknown command 'FOO'"),
    RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
])
def test_foreign_data_bugs_and_a_dead_redis_are_not_refusals(error: Exception) -> None:
    assert outages.cause_of(error) is None
    assert not outages.log_once(error)


def test_each_cause_is_logged_once_and_each_missing_permission_once(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="distbreaker")
    for _ in range(3):
        assert outages.log_once(ReadOnlyError("You can't write against a read only replica."))
        assert outages.log_once(ResponseError("READONLY You can't write (nested reply)"))
        assert outages.log_once(NoPermissionError("no permissions to run the 'evalsha' command"))
        assert outages.log_once(NoPermissionError("no permissions to run the 'blpop' command"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert sum(outages.READ_ONLY.fix in line for line in lines) == 1
    assert sum(outages.ACL.what in line for line in lines) == 2
