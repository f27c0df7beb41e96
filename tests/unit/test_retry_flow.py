"""The retry flow (retry.core.retry_flow) step by step, and the two drivers that run it.

Pure: no Redis, no real sleeping. The flow is fed by hand; the drivers get a
recording budget and sleep.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import traceback
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from distbreaker.errors import CallNotPermitted
from distbreaker.retry import aio as retry_aio
from distbreaker.retry import sync as retry_sync
from distbreaker.retry.config import RetryConfig
from distbreaker.retry.core import (
    Decision,
    Deposit,
    GiveUp,
    RetryCore,
    RetryFlow,
    Run,
    Sleep,
    Withdraw,
    advance,
    retry_flow,
)


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def flow_for(clock: Clock, budget: str | None = None, deposit: bool = False,
             **config: Any) -> RetryFlow:
    core = RetryCore(RetryConfig(jitter="none", base=0.1, multiplier=2.0, **config))
    return retry_flow(lambda error, attempt, started: core.decide(error, attempt, started,
                                                                  clock()),
                      clock, budget, deposit)


def given_up(flow: RetryFlow, reply: Any) -> GiveUp:
    with pytest.raises(StopIteration) as stop:
        flow.send(reply)
    assert isinstance(stop.value.value, GiveUp)
    return stop.value.value


def test_without_a_budget_the_flow_alternates_runs_and_backoff_sleeps() -> None:
    flow = flow_for(Clock(), max_attempts=3)
    assert next(flow) == Run(1)
    assert flow.send(ConnectionError("a")) == Sleep(pytest.approx(0.1))
    assert flow.send(None) == Run(2)
    assert flow.send(ConnectionError("b")) == Sleep(pytest.approx(0.2))
    assert flow.send(None) == Run(3)
    last = ConnectionError("c")
    assert given_up(flow, last) == GiveUp(last, "max attempts")


def test_a_budgeted_call_deposits_once_first_and_withdraws_before_every_retry() -> None:
    flow = flow_for(Clock(), budget="payments", deposit=True, max_attempts=3)
    assert next(flow) == Deposit()
    assert flow.send(None) == Run(1)
    assert flow.send(TimeoutError()) == Withdraw()
    assert flow.send(True) == Sleep(pytest.approx(0.1))
    assert flow.send(None) == Run(2)
    assert flow.send(TimeoutError()) == Withdraw()


def test_without_deposit_the_flow_still_withdraws_but_never_deposits() -> None:
    """The Policy's flow: its first attempt's pipeline carries the deposit."""
    flow = flow_for(Clock(), budget="payments", deposit=False)
    assert next(flow) == Run(1)
    assert flow.send(ConnectionError()) == Withdraw()


def test_deposit_without_a_budget_yields_no_deposit() -> None:
    flow = flow_for(Clock(), budget=None, deposit=True)
    assert next(flow) == Run(1)
    assert flow.send(ConnectionError()) == Sleep(pytest.approx(0.1))


def test_a_refused_withdrawal_ends_the_call_with_the_original_error_marked() -> None:
    flow = flow_for(Clock(), budget="payments", deposit=True)
    next(flow)
    assert flow.send(None) == Run(1)
    error = ConnectionError("down")
    assert flow.send(error) == Withdraw()
    assert given_up(flow, False) == GiveUp(error, "budget exhausted")
    assert error.retry_budget_exhausted is True  # type: ignore[attr-defined]
    if sys.version_info >= (3, 11):
        assert "retry budget 'payments' is exhausted" in error.__notes__[-1]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), asyncio.CancelledError(),
                                   SystemExit(1)])
def test_a_base_exception_is_never_retried_nor_judged(error: BaseException) -> None:
    judged: list[BaseException] = []

    def decide(failure: BaseException, attempt: int, started: float) -> Decision:
        judged.append(failure)
        return Decision(True, 0.0, "transient")

    flow = retry_flow(decide, Clock(), "payments", deposit=False)
    assert next(flow) == Run(1)
    assert given_up(flow, error) == GiveUp(error, "not an Exception")
    assert judged == []


def test_a_final_error_ends_the_call_with_the_decision_reason_and_no_withdrawal() -> None:
    flow = flow_for(Clock(), budget="payments")
    next(flow)
    rejected = CallNotPermitted("payments", "open", retry_after=1.0)
    assert given_up(flow, rejected) == GiveUp(rejected, "not transient")


def test_the_deadline_counts_from_the_start_of_the_flow() -> None:
    clock = Clock()
    flow = flow_for(clock, deadline=1.0, max_attempts=10)
    assert next(flow) == Run(1)                       # started = 50.0
    clock.now = 50.85
    assert flow.send(ConnectionError()) == Sleep(pytest.approx(0.1))   # ends at 50.95
    clock.now = 50.95
    assert flow.send(None) == Run(2)
    error = ConnectionError()
    assert given_up(flow, error) == GiveUp(error, "deadline")           # would end at 51.15


def test_the_decide_function_sees_attempt_numbers_and_the_start_time() -> None:
    seen: list[tuple[int, float]] = []

    def decide(error: BaseException, attempt: int, started: float) -> Decision:
        seen.append((attempt, started))
        return Decision(attempt < 3, 0.5, "transient" if attempt < 3 else "max attempts")

    clock = Clock()
    flow = retry_flow(decide, clock, None, deposit=False)
    for attempt in (1, 2):
        assert advance(flow, None) == Run(attempt)
        clock.now += 1
        assert advance(flow, ConnectionError()) == Sleep(0.5)
    assert advance(flow, None) == Run(3)
    assert advance(flow, ConnectionError()) is None   # advance: None once the flow gave up
    assert seen == [(1, 50.0), (2, 50.0), (3, 50.0)]


# -- the drivers ---------------------------------------------------------------------------


class Recorder:
    """A budget and a sleep that write what the driver asked of them into `events`."""

    def __init__(self, grants: Iterator[bool]) -> None:
        self.name = "payments"
        self.events: list[str] = []
        self.grants = grants

    def deposit(self) -> None:
        self.events.append("deposit")

    def try_withdraw(self) -> bool:
        granted = next(self.grants)
        self.events.append(f"withdraw {granted}")
        return granted

    def sleep(self, seconds: float) -> None:
        self.events.append(f"sleep {seconds:.1f}")


class AsyncRecorder(Recorder):
    async def deposit(self) -> None:  # type: ignore[override]
        super().deposit()

    async def try_withdraw(self) -> bool:  # type: ignore[override]
        return super().try_withdraw()

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        super().sleep(seconds)


class Tracked(ConnectionError):
    """A ConnectionError one can hold a weak reference to."""


def failing(recorder: Recorder, failures: int,
            errors: list[weakref.ref[Tracked]] | None = None) -> Any:
    """An attempt function: fails `failures` times (keeping only weak references to
    its errors in `errors`), then returns its attempt number."""

    def new_error(number: int) -> Tracked:
        error = Tracked(f"attempt {number}")
        if errors is not None:
            errors.append(weakref.ref(error))
        return error

    def attempt(number: int) -> int:
        recorder.events.append(f"run {number}")
        if number <= failures:
            raise new_error(number)  # not kept in a local: that would be a cycle of its own
        return number

    return attempt


def drive(recorder: Recorder, attempt: Any, flow: RetryFlow | None = None) -> Any:
    """Run `flow` (default: budgeted, 3 attempts) with the driver matching `recorder`."""
    if flow is None:
        flow = flow_for(Clock(), budget=recorder.name, deposit=True, max_attempts=3)
    if not isinstance(recorder, AsyncRecorder):
        return retry_sync.run_flow(flow, attempt, recorder, recorder.sleep)

    async def attempt_async(number: int) -> Any:
        return attempt(number)

    return asyncio.run(retry_aio.run_flow(flow, attempt_async, recorder, recorder.sleep))


RECORDERS = [pytest.param(Recorder, id="sync"), pytest.param(AsyncRecorder, id="asyncio")]


@pytest.mark.parametrize("kind", RECORDERS)
def test_the_driver_executes_the_steps_in_order_and_returns_the_result(kind: Any) -> None:
    recorder = kind(iter([True, True]))
    assert drive(recorder, failing(recorder, failures=2)) == 3
    assert recorder.events == ["deposit", "run 1", "withdraw True", "sleep 0.1",
                               "run 2", "withdraw True", "sleep 0.2", "run 3"]


@pytest.mark.parametrize("kind", RECORDERS)
def test_the_driver_reraises_the_original_error_with_its_traceback(kind: Any) -> None:
    recorder = kind(iter([True, False]))
    with pytest.raises(Tracked, match="attempt 2") as caught:
        drive(recorder, failing(recorder, failures=5))
    assert recorder.events == ["deposit", "run 1", "withdraw True", "sleep 0.1",
                               "run 2", "withdraw False"]
    assert caught.value.retry_budget_exhausted is True  # type: ignore[attr-defined]
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "attempt"                     # raised where the dependency failed
    assert "advance" not in frames and "retry_flow" not in frames


@pytest.mark.parametrize("kind", RECORDERS)
@pytest.mark.parametrize("failures", [2, 5], ids=["succeeds", "gives-up"])
def test_no_retried_error_outlives_the_call(kind: Any, failures: int) -> None:
    """No reference cycle through the driver's frame or the flow: with the garbage
    collector off, every retried error is freed once the call is over (the one
    raised to the caller is not checked: asyncio.run keeps that one in a cycle)."""
    recorder = kind(iter([True, True]))
    errors: list[weakref.ref[Tracked]] = []
    flow = flow_for(Clock(), max_attempts=3)
    gc.disable()
    try:
        try:
            drive(recorder, failing(recorder, failures, errors), flow)
        except Tracked:
            pass
        assert len(errors) == min(failures, 3)
        assert [ref() for ref in errors[:2]] == [None, None]
    finally:
        gc.enable()


class Halt(BaseException):
    """Stands for KeyboardInterrupt / CancelledError (which asyncio.run treats specially)."""


@pytest.mark.parametrize("kind", RECORDERS)
def test_the_driver_lets_a_base_exception_through_without_asking_the_budget(kind: Any) -> None:
    recorder = kind(iter([]))

    def attempt(number: int) -> int:
        recorder.events.append(f"run {number}")
        raise Halt

    with pytest.raises(Halt):
        drive(recorder, attempt)
    assert recorder.events == ["deposit", "run 1"]
