"""PolicyCore's decisions about one attempt: what it owes Redis, what it raises,
when it trips the breaker, and the retry flow a policy runs. Pure: fake components."""

from __future__ import annotations

from typing import Any

import pytest

from distbreaker import HttpClassifier, HttpStatusError, HttpVerdict, Outcome
from distbreaker.policy.core import PolicyCore, Ran
from distbreaker.retry.core import GiveUp, Run, Withdraw
from distbreaker.retry.sync import Retry


class FakeBreaker:
    name = "api.example.com:tenant-a"

    def owed_record(self, permit: Any, error: BaseException | None, duration: float,
                    outcome: Outcome | None) -> tuple[Any, ...]:
        return ("record", permit, error, outcome)

    def result_outcome(self, result: Any) -> Outcome | None:
        return None  # no record_result


class FakeBulkhead:
    pass


class FakeBudget:
    name = "payments"

    def owed_deposit(self) -> tuple[str]:
        return ("deposit",)


class Core(PolicyCore):
    _kinds = (FakeBreaker, FakeBulkhead, Retry, FakeBudget, object)


def make(breaker: Any = True, retry: Any = None, budget: Any = True) -> Core:
    core = Core()
    core._setup("payments", None, "test",
                (FakeBreaker() if breaker is True else breaker, None, retry,
                 FakeBudget() if budget is True else budget, None),
                None, False, None)
    return core


class Response:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.headers = headers or {}


def ran(result: Any = None, error: BaseException | None = None) -> Ran:
    attempt = Ran()
    attempt.ended(result, error)
    return attempt


def test_the_first_attempt_owes_the_deposit_then_the_release_then_the_record() -> None:
    core, attempt = make(), ran("ok")
    owed = core.owed_after(attempt, 1, "permit", ("release",))  # type: ignore[arg-type]
    assert owed == [("deposit",), ("release",), ("record", "permit", None, Outcome.SUCCESS)]


def test_a_retry_owes_no_deposit_and_nothing_is_owed_for_absent_components() -> None:
    assert make().owed_after(ran("ok"), 2, "permit", None) == [
        None, ("record", "permit", None, Outcome.SUCCESS)]
    assert make(breaker=None, budget=None).owed_after(ran("ok"), 1, None, None) == [None]


def test_a_returned_error_response_becomes_the_attempts_error_and_a_failure() -> None:
    response = Response(503)
    attempt = ran(response)
    _, _, record = make().owed_after(attempt, 1, "permit", None)
    assert isinstance(attempt.error, HttpStatusError) and attempt.error.status_code == 503
    assert attempt.error.response is response  # type: ignore[attr-defined]
    assert record == ("record", "permit", attempt.error, Outcome.FAILURE)
    with pytest.raises(HttpStatusError):
        attempt.unwrap()


def test_a_returned_client_error_response_is_returned_and_ignored_by_the_breaker() -> None:
    response = Response(404)
    attempt = ran(response)
    _, _, record = make().owed_after(attempt, 1, "permit", None)
    assert attempt.error is None and attempt.unwrap() is response
    assert record == ("record", "permit", None, Outcome.IGNORED)


def make_hard_stop_503() -> Core:
    """A policy whose host says 503 + Retry-After when a quota is spent: a hard stop."""
    core = Core()
    core._setup("payments", None, "test", (FakeBreaker(), None, None, FakeBudget(), None),
                None, False, HttpClassifier({503: "hard_stop"}))
    return core


def test_a_429_without_retry_after_trips_the_breaker_and_is_ignored_by_its_window() -> None:
    core, attempt = make(), ran(error=HttpStatusError(429))
    _, _, record = core.owed_after(attempt, 1, "permit", None)
    assert record[3] is Outcome.IGNORED
    assert core.trip_reason(attempt) == ("hard stop: HTTP 429 without Retry-After "
                                         f"(key {core.breaker.name!r})")
    assert core.trip_for(attempt) is None                         # the open wait
    assert make(breaker=None).trip_reason(attempt) is None        # nothing to trip
    assert core.trip_reason(ran(error=HttpStatusError(429, {"Retry-After": "2"}))) is None
    held = make_hard_stop_503()
    attempt = ran(error=HttpStatusError(503, {"Retry-After": "30"}))
    assert held.trip_reason(attempt) == ("hard stop: HTTP 503 with Retry-After 30s "
                                         "(key 'api.example.com:tenant-a')")
    assert held.trip_for(attempt) == 30.0                        # OPEN for that long
    assert core.trip_reason(ran(error=ConnectionError())) is None
    assert core.trip_reason(ran("ok")) is None


class CountingClassifier(HttpClassifier):
    """Counts the verdicts asked for (a raised error's goes through `classify` too)."""

    calls = 0

    def classify(self, status: int, headers: Any = None) -> HttpVerdict:
        self.calls += 1
        return super().classify(status, headers)


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda: ran(Response(200)), id="returned-200"),
    pytest.param(lambda: ran(Response(404)), id="returned-404"),
    pytest.param(lambda: ran(Response(503)), id="returned-503"),
    pytest.param(lambda: ran(Response(429)), id="returned-429-hard-stop"),
    pytest.param(lambda: ran(error=HttpStatusError(503)), id="raised-503"),
    pytest.param(lambda: ran(error=HttpStatusError(429)), id="raised-429-hard-stop"),
])
def test_each_attempt_is_classified_once(attempt: Any) -> None:
    """settle_response, owed_after (the breaker's outcome) and trip_reason share one
    verdict per attempt, in the order a policy's attempt asks them."""
    classifier = CountingClassifier()
    core = Core()
    core._setup("payments", None, "test", (FakeBreaker(), None, None, FakeBudget(), None),
                None, False, classifier)
    this = attempt()
    core.settle_response(this)
    core.owed_after(this, 1, "permit", None)
    core.trip_reason(this)
    assert classifier.calls == 1


def test_unwrap_raises_the_error_once_and_then_forgets_it() -> None:
    error = ConnectionError("down")
    attempt = ran(error=error)
    with pytest.raises(ConnectionError) as caught:
        attempt.unwrap()
    assert caught.value is error and attempt.error is None
    assert ran(result=42).unwrap() == 42


def test_the_policy_flow_never_deposits_but_withdraws_for_each_retry() -> None:
    """The first attempt's pipeline carries the deposit, so the flow has no Deposit step."""
    flow = make(retry=Retry(max_attempts=3))._flow()
    assert next(flow) == Run(1)
    assert flow.send(ConnectionError()) == Withdraw()


def test_without_a_retry_the_policy_flow_gives_up_after_the_first_failure() -> None:
    flow = make()._flow()
    assert next(flow) == Run(1)
    error = ConnectionError()
    with pytest.raises(StopIteration) as stop:
        flow.send(error)
    assert stop.value.value == GiveUp(error, "no retry")


def test_the_budget_comes_from_the_retry_when_not_given() -> None:
    budget = FakeBudget()
    retry = Retry(max_attempts=2)
    retry.budget = budget
    assert make(retry=retry, budget=None).budget is budget
