"""`record_result` (Resilience4j's recordResult): a returned value counted as a failure,
beside the exception rules, in the breaker's call paths and the Policy, both flavours."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from distbreaker import BreakerConfig, Outcome, classify_result
from distbreaker.breaker.state import State
from tests.helpers.flavours import Flavour


@dataclass
class Response:
    status_code: int


def is_503(result: Any) -> bool:
    return isinstance(result, Response) and result.status_code == 503


def test_a_recorded_result_is_a_failure_and_still_returned(flavour: Flavour, name: str,
                                                          redis_url: str) -> None:
    # Resilience4j: 5 calls, failureRateThreshold 50: 3 results recorded as failures
    # and 2 successes is 60 %: OPEN; each recorded result is returned to its caller.
    breaker = flavour.breaker(name, redis=redis_url, sliding_window_size=5,
                              minimum_number_of_calls=5, record_result=is_503)
    for status in (200, 503, 200, 503):
        assert breaker.call(lambda s=status: Response(s)) == Response(status)
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed) == (4, 2)
    assert breaker.call(lambda: Response(503)) == Response(503)
    assert breaker.state is State.OPEN


def test_exceptions_never_reach_record_result(flavour: Flavour, name: str,
                                             redis_url: str) -> None:
    seen: list[Any] = []

    def predicate(result: Any) -> bool:
        seen.append(result)
        return False

    breaker = flavour.breaker(name, redis=redis_url, minimum_number_of_calls=10,
                              record_result=predicate, ignore_exceptions=(KeyError,))

    def fail(exc: BaseException) -> Any:
        raise exc

    with pytest.raises(ValueError):
        breaker.call(fail, ValueError("boom"))      # recorded by the exception rules
    with pytest.raises(KeyError):
        breaker.call(fail, KeyError("ignored"))     # ignored wins, as before
    assert breaker.call(lambda: None) is None       # None is never tested (Resilience4j)
    assert breaker.call(lambda: 7) == 7
    assert seen == [7]
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed) == (3, 1)


def test_a_failing_predicate_counts_the_call_as_a_success(name: str, redis_url: str) -> None:
    def broken(result: Any) -> bool:
        raise RuntimeError("bug in the predicate")

    config = BreakerConfig(record_result=broken)
    assert classify_result(config, 1) is Outcome.SUCCESS
    assert classify_result(BreakerConfig(record_result=bool), 1) is Outcome.FAILURE
    assert classify_result(BreakerConfig(), 1) is Outcome.SUCCESS


def test_record_result_must_be_callable() -> None:
    with pytest.raises(ValueError, match="record_result must be callable"):
        BreakerConfig(record_result=503)  # type: ignore[arg-type]


def test_the_policy_applies_record_result(flavour: Flavour, name: str, redis_url: str) -> None:
    @dataclass
    class Reply:
        error: str | None = None

    policy = flavour.policy(name, redis=redis_url, breaker={
        "sliding_window_size": 4, "minimum_number_of_calls": 4,
        "record_result": lambda r: isinstance(r, Reply) and r.error is not None})
    assert policy.call(lambda: Reply()) == Reply()
    for _ in range(2):
        assert policy.call(lambda: Reply("quota")) == Reply("quota")
    metrics = policy.breaker.metrics()
    assert (metrics.calls, metrics.failed) == (3, 2)
    policy.call(lambda: Reply())
    assert policy.breaker.state is State.OPEN  # 2 of 4: 50 % >= 50 %
