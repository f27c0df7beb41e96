"""distbreaker.contrib.celery under Celery's eager mode (task_always_eager), as in users' tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry

from distbreaker import CallNotPermitted, CircuitBreaker, Policy, RetryBudget
from distbreaker.contrib.celery import protect
from distbreaker.errors import BulkheadFull


@pytest.fixture
def memory(request: pytest.FixtureRequest) -> str:
    return f"memory://{request.node.nodeid}"


@pytest.fixture(params=[True, False], ids=["propagates", "result"])
def app(request: pytest.FixtureRequest) -> Iterator[Celery]:
    app = Celery("eager-test", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=request.param,
                    broker_url="memory://", result_backend="cache+memory://")
    yield app


def _outcome(app: Celery, task: Any, *args: Any) -> BaseException | Any:
    """What the caller sees: the raised error (propagating) or the result's error."""
    if app.conf.task_eager_propagates:
        try:
            return task.delay(*args).get()
        except BaseException as error:
            return error
    result = task.delay(*args)
    return result.result


def test_an_open_breaker_raises_the_rejection_instead_of_recursing(app: Celery,
                                                                   memory: str) -> None:
    breaker = CircuitBreaker("payments", redis=memory)
    breaker.trip("down")
    runs = []

    @app.task(bind=True, max_retries=None)
    @protect(breaker)
    def charge(self: Any, order: int) -> str:
        runs.append(order)
        return f"charged {order}"

    outcome = _outcome(app, charge, 7)
    assert isinstance(outcome, CallNotPermitted)
    assert outcome.name == "payments"
    assert runs == []
    breaker.reset()
    assert _outcome(app, charge, 8) == "charged 8"
    assert isinstance(charge.apply(args=(9,)).result, str)


def test_a_full_bulkhead_raises_too(app: Celery, memory: str) -> None:
    policy = Policy("db", redis=memory, breaker=None, bulkhead={"max_concurrent_calls": 1})
    held = policy.bulkhead.acquire()

    @app.task(bind=True, max_retries=None)
    @protect(policy)
    def query(self: Any) -> str:
        return "rows"

    try:
        assert isinstance(_outcome(app, query), BulkheadFull)
    finally:
        policy.bulkhead.release(held)


def test_transient_errors_go_through_celerys_eager_retry_within_the_budget(app: Celery,
                                                                      memory: str) -> None:
    budget = RetryBudget("flaky", redis=memory, percent_can_retry=0.0,
                         min_retries_per_sec=0.2, ttl=10)   # a floor of 2 retries
    runs = []

    @app.task(bind=True, max_retries=None)
    @protect(None, budget=budget, retry_on=(ConnectionError,))
    def flaky(self: Any) -> str:
        runs.append(self.request.retries)
        raise ConnectionError("upstream down")

    outcome = _outcome(app, flaky)
    if app.conf.task_eager_propagates:  # Celery's own behaviour: its Retry is raised
        assert isinstance(outcome, Retry)
        assert isinstance(outcome.exc, ConnectionError)
        assert runs == [0]
        return
    assert isinstance(outcome, ConnectionError)      # run again at once, then final
    assert getattr(outcome, "retry_budget_exhausted", False)
    assert runs == [0, 1, 2]
