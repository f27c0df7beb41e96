"""Retry: backoff bounds, Retry-After, what is (not) retried, deadline, budget, async twin.
Tests taking `make` run with the sync Retry and the asyncio one.

Waits go through an injected sleep that advances a fake clock: nothing sleeps for real.
The retries that draw on a real RetryBudget are in tests/redis/test_retry.py.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from distbreaker import HttpStatusError, aio
from distbreaker.breaker.state import State
from distbreaker.errors import BulkheadFull, CallNotPermitted
from distbreaker.retry.aio import Retry as AsyncRetry
from distbreaker.retry.config import RetryConfig
from distbreaker.retry.core import RetryCore
from distbreaker.retry.sync import Retry
from tests.helpers.fake_time import FakeTime, Flaky
from tests.helpers.flavours import as_coroutine


def sync_retry(fake: FakeTime, **options: Any) -> Retry:
    return Retry(sleep=fake.sleep, clock=fake.clock, **options)


class BlockingAsyncRetry:
    """The asyncio Retry behind a blocking `call` (one event loop per call)."""

    def __init__(self, retry: AsyncRetry) -> None:
        self.retry = retry

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return asyncio.run(self.retry.call(as_coroutine(fn), *args, **kwargs))


@pytest.fixture(params=["sync", "asyncio"])
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Build a Retry on a fake clock: the sync one, or the asyncio one driven blockingly."""
    def build(fake: FakeTime, **options: Any) -> Any:
        if request.param == "sync":
            return sync_retry(fake, **options)
        return BlockingAsyncRetry(AsyncRetry(sleep=fake.asleep, clock=fake.clock, **options))
    return build


def test_success_after_transient_failures(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(ConnectionError("a"), TimeoutError("b"))
    assert make(fake, max_attempts=3).call(dep) == "ok"
    assert dep.calls == 3 and len(fake.sleeps) == 2


def test_gives_up_after_max_attempts_with_the_last_error(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down"):
        make(fake, max_attempts=4).call(dep)
    assert dep.calls == 4 and len(fake.sleeps) == 3


def test_full_jitter_backoff_stays_within_capped_exponential_bounds(
        make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=ConnectionError())
    retry = make(fake, max_attempts=7, base=0.1, multiplier=2.0, cap=1.0,
                 rng=random.Random(42))
    with pytest.raises(ConnectionError):
        retry.call(dep)
    ceilings = [min(1.0, 0.1 * 2 ** n) for n in range(6)]
    assert len(fake.sleeps) == 6
    for slept, ceiling in zip(fake.sleeps, ceilings, strict=True):
        assert 0.0 <= slept <= ceiling
    expected = random.Random(42)
    assert fake.sleeps == [expected.uniform(0, c) for c in ceilings]  # seeded: reproducible


def test_full_jitter_spreads_over_the_whole_range() -> None:
    core = RetryCore(RetryConfig(base=0.1, multiplier=2.0, cap=1.0), random.Random(7))
    samples = [core.backoff(3) for _ in range(2000)]           # ceiling 0.8
    assert min(samples) >= 0 and max(samples) <= 0.8
    assert min(samples) < 0.05 and max(samples) > 0.75
    assert sum(samples) / len(samples) == pytest.approx(0.4, abs=0.03)
    assert core.backoff(50) <= 1.0                             # capped, no overflow


def test_no_jitter_gives_the_exact_capped_ceilings(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    with pytest.raises(ConnectionError):
        make(fake, max_attempts=6, base=0.1, cap=1.0, jitter="none").call(
            Flaky(forever=ConnectionError()))
    assert fake.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])


def test_retry_after_seconds_attribute_and_header_are_honoured(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    with_attribute = ConnectionError("busy")
    with_attribute.retry_after = 7  # type: ignore[attr-defined]
    dep = Flaky(with_attribute, HttpStatusError(503, {"Retry-After": "3"}))
    assert make(fake, max_attempts=3, cap=0.5).call(dep) == "ok"
    assert fake.sleeps == [7.0, 3.0]      # not capped by the backoff cap, no jitter


def test_retry_after_http_date_is_honoured(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    dep = Flaky(HttpStatusError(429, {"Retry-After": when}))
    assert make(fake).call(dep) == "ok"
    assert len(fake.sleeps) == 1 and 28.5 <= fake.sleeps[0] <= 30.0


def test_retry_after_longer_than_max_retry_after_is_final(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(HttpStatusError(503, {"Retry-After": "120"}))
    with pytest.raises(HttpStatusError):
        make(fake, max_retry_after=60).call(dep)
    assert dep.calls == 1 and fake.sleeps == []


def test_call_not_permitted_is_never_retried_by_default(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=CallNotPermitted("dep", State.OPEN, 0.5))
    with pytest.raises(CallNotPermitted):
        make(fake, max_attempts=5).call(dep)
    assert dep.calls == 1 and fake.sleeps == []


def test_bulkhead_full_is_never_retried_by_default() -> None:
    assert BulkheadFull in RetryConfig().ignore


def test_call_not_permitted_retried_only_when_asked_and_waits_its_retry_after(
        make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(CallNotPermitted("dep", State.OPEN, 0.5))
    assert make(fake, ignore=()).call(dep) == "ok"
    assert fake.sleeps == [0.5]


def test_only_transient_errors_are_retried(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    retry = make(fake, max_attempts=5, retry_on=(ConnectionError,), ignore=(ConnectionResetError,))
    not_listed = Flaky(forever=ValueError("bad input"))
    with pytest.raises(ValueError):
        retry.call(not_listed)
    ignored = Flaky(forever=ConnectionResetError())
    with pytest.raises(ConnectionResetError):
        retry.call(ignored)
    listed = Flaky(forever=ConnectionError())
    with pytest.raises(ConnectionError):
        retry.call(listed)
    assert (not_listed.calls, ignored.calls, listed.calls) == (1, 1, 5)


def test_retry_predicate_narrows(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=ConnectionError("permanent"))
    with pytest.raises(ConnectionError):
        make(fake, retry_predicate=lambda e: "permanent" not in str(e)).call(dep)
    assert dep.calls == 1


def test_base_exceptions_are_never_retried(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        make(fake, retry_on=(BaseException,)).call(dep)
    assert dep.calls == 1


@pytest.mark.parametrize(("status", "calls"), [(400, 1), (404, 1), (422, 1), (429, 1),
                                                (500, 3), (503, 3)])
def test_http_errors_retried_only_when_transient(
        status: int, calls: int, make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(forever=HttpStatusError(status))
    with pytest.raises(HttpStatusError):
        make(fake, max_attempts=3).call(dep)
    assert dep.calls == calls


def test_a_400_like_error_from_any_library_is_not_retried(make: Callable[..., Any]) -> None:
    class ClientError(Exception):
        def __init__(self) -> None:
            super().__init__("400 Bad Request")
            self.response = type("R", (), {"status_code": 400, "headers": {}})()

    fake = FakeTime()
    dep = Flaky(forever=ClientError())
    with pytest.raises(ClientError):
        make(fake).call(dep)
    assert dep.calls == 1


def test_http_overrides_per_dependency(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    conflict = Flaky(HttpStatusError(409))
    assert make(fake, http_classifier={409: "transient"}).call(conflict) == "ok"
    unavailable = Flaky(forever=HttpStatusError(503))
    with pytest.raises(HttpStatusError):
        make(fake, http_classifier={503: "client_error"}).call(unavailable)
    assert conflict.calls == 2 and unavailable.calls == 1


def test_deadline_caps_total_time_and_never_sleeps_past_it(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    start = fake.now
    dep = Flaky(forever=ConnectionError())
    retry = make(fake, max_attempts=10, base=1.0, multiplier=1.0, jitter="none", deadline=2.5)
    with pytest.raises(ConnectionError):
        retry.call(dep)
    assert fake.sleeps == [1.0, 1.0]        # a third wait would end at 3.0 > 2.5
    assert dep.calls == 3 and fake.now - start < 2.5


def test_deadline_accounts_for_time_spent_in_attempts(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    start = fake.now

    def slow_failure() -> None:
        fake.now += 0.9
        raise ConnectionError()

    retry = make(fake, max_attempts=10, base=0.5, multiplier=1.0, jitter="none",
                 deadline=timedelta(seconds=3))
    with pytest.raises(ConnectionError):
        retry.call(slow_failure)
    # attempts end at 0.9, 2.3; a wait from 3.7 is never started; 2.3 + 0.5 < 3 was allowed
    assert fake.sleeps == [0.5, 0.5]
    assert fake.now - start == pytest.approx(3.7)


def test_retry_after_beyond_deadline_gives_up_without_sleeping(make: Callable[..., Any]) -> None:
    fake = FakeTime()
    dep = Flaky(HttpStatusError(503, {"Retry-After": "10"}))
    with pytest.raises(HttpStatusError):
        make(fake, deadline=5).call(dep)
    assert fake.sleeps == [] and dep.calls == 1


def test_decorator_form_and_coroutine_refusal() -> None:
    fake = FakeTime()
    calls = []

    @sync_retry(fake)
    def fetch(x: int) -> int:
        """Doc."""
        calls.append(x)
        if len(calls) < 2:
            raise ConnectionError()
        return x * 2

    assert fetch(21) == 42 and calls == [21, 21]
    assert fetch.__name__ == "fetch" and fetch.__doc__ == "Doc."

    async def coro() -> None:
        return None

    with pytest.raises(TypeError, match="aio"):
        Retry()(coro)


@pytest.mark.parametrize(("options", "field"), [
    ({"max_attempts": 0}, "max_attempts"), ({"base": -1}, "base"),
    ({"multiplier": 0.5}, "multiplier"), ({"jitter": "gaussian"}, "jitter"),
    ({"deadline": 0}, "deadline"), ({"cap": "1x"}, "cap"),
    ({"retry_on": (int,)}, "retry_on"), ({"retry_predicate": 3}, "retry_predicate"),
    ({"http_classifier": 5}, "http_classifier"),
])
def test_config_validation_names_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetryConfig(**options)


def test_config_is_frozen_and_accepts_timedelta() -> None:
    config = RetryConfig(base=timedelta(milliseconds=50), deadline=timedelta(seconds=2))
    assert config.base == 0.05 and config.deadline == 2.0
    with pytest.raises(AttributeError):
        config.base = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="unknown retry option"):
        Retry(max_attemps=3)


class CountingBudget:
    """A stand-in budget that allows `allowance` withdrawals."""

    name = "fake"

    def __init__(self, allowance: int) -> None:
        self.allowance = allowance
        self.deposits = 0
        self.withdrawals = 0

    def deposit(self) -> None:
        self.deposits += 1

    def try_withdraw(self) -> bool:
        if self.withdrawals >= self.allowance:
            return False
        self.withdrawals += 1
        return True


def test_one_deposit_per_logical_call_and_one_withdrawal_per_retry() -> None:
    fake = FakeTime()
    budget = CountingBudget(100)
    retry = sync_retry(fake, max_attempts=3, budget=budget)
    assert retry.call(Flaky(ConnectionError())) == "ok"
    assert retry.call(Flaky()) == "ok"
    with pytest.raises(ConnectionError):
        retry.call(Flaky(forever=ConnectionError()))
    assert budget.deposits == 3 and budget.withdrawals == 1 + 0 + 2


def test_non_transient_failures_do_not_withdraw() -> None:
    budget = CountingBudget(100)
    with pytest.raises(HttpStatusError):
        sync_retry(FakeTime(), budget=budget).call(Flaky(forever=HttpStatusError(400)))
    assert budget.withdrawals == 0


def test_async_refusals() -> None:
    with pytest.raises(TypeError, match="coroutine"):
        AsyncRetry()(lambda: None)
    with pytest.raises(TypeError, match=r"aio\.RetryBudget"):
        AsyncRetry(budget=CountingBudget(1))


def test_async_cancellation_is_not_retried() -> None:
    calls = 0

    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError()

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await AsyncRetry(retry_on=(BaseException,), sleep=FakeTime().asleep).call(cancelled)

    asyncio.run(main())
    assert calls == 1


def test_exports() -> None:
    import distbreaker

    assert [distbreaker.Retry, aio.Retry] == [Retry, AsyncRetry]
