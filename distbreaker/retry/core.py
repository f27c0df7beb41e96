"""Retry with capped exponential backoff, full jitter, Retry-After, a deadline and a budget.

Pure (no sleeping, no I/O): `RetryCore` decides after each failure, and
`retry_flow` is the one retry loop, as steps (Run, Deposit, Withdraw, Sleep)
that the sync and asyncio drivers (`retry.sync.run_flow`, `retry.aio.run_flow`)
execute for `Retry` and for `Policy` alike.

What is retried: an `Exception` (never KeyboardInterrupt or CancelledError)
that is an instance of `retry_on`, not of `ignore` (default: CallNotPermitted
and BulkheadFull: a rejection is not a failure worth repeating; SchemaError:
foreign data in Redis stays there), whose HTTP
status, when it carries one, is TRANSIENT for `http_classifier` (so 4xx and a
429 without Retry-After are final), and for which `retry_predicate`, if given,
returns true.

When the retry budget is exhausted the failure is final: the ORIGINAL error is
re-raised (so ``except`` clauses, the breaker and the fallback see what the
dependency said), with the attribute ``retry_budget_exhausted = True`` and, on
Python 3.11+, a note saying so. `RetryBudgetExhausted` is raised only by
`RetryBudget.withdraw()` for callers that drive the budget themselves.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from .._runtime.classify import DEFAULT_HTTP_CLASSIFIER, HttpVerdict, retry_after_of
from .._runtime.events import Event, Listeners
from .config import Jitter, RetryConfig, build_retry_config

#: The event kinds a Retry's listeners get (per process): retry (`attempt` that
#: failed, `delay` before the next, `error`), exhausted (the last `error`, `attempt`,
#: `reason`: max attempts, deadline, budget exhausted, retry-after too long).
EVENT_KINDS = ("retry", "exhausted")

#: Why a transient failure was not retried: the retries ran out ("not transient" and
#: cancellations are plain failures, not exhaustion).
_EXHAUSTED = ("max attempts", "deadline", "budget exhausted", "retry-after too long")


class Decision(NamedTuple):
    """Whether to retry after a failed attempt, after how long, and why (for logs/tests)."""

    retry: bool
    delay: float
    reason: str


class RetryCore:
    """The pure decision logic: classification, backoff, Retry-After, deadline."""

    def __init__(self, config: RetryConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng if rng is not None else random.Random()
        self.classifier = config.http_classifier or DEFAULT_HTTP_CLASSIFIER

    def is_transient(self, exc: BaseException) -> bool:
        cfg = self.config
        if not isinstance(exc, Exception) or isinstance(exc, cfg.ignore):
            return False
        if not isinstance(exc, cfg.retry_on):
            return False
        verdict = self.classifier.classify_error(exc)
        if verdict is not None and verdict is not HttpVerdict.TRANSIENT:
            return False
        return cfg.retry_predicate is None or bool(cfg.retry_predicate(exc))

    def backoff(self, retry_index: int) -> float:
        """The wait before retry number `retry_index` (0 = the first retry)."""
        cfg = self.config
        try:
            ceiling = min(cfg.cap, cfg.base * cfg.multiplier ** retry_index)
        except OverflowError:
            ceiling = cfg.cap
        if cfg.jitter is Jitter.FULL:
            return self.rng.uniform(0.0, ceiling)
        if cfg.jitter is Jitter.EQUAL:
            return ceiling / 2 + self.rng.uniform(0.0, ceiling / 2)
        return ceiling

    def decide(self, exc: BaseException, attempt: int, started: float, now: float,
               wall_now: float | None = None) -> Decision:
        """After failed attempt number `attempt` (1-based) of a call begun at `started`."""
        cfg = self.config
        if not self.is_transient(exc):
            return Decision(False, 0.0, "not transient")
        if attempt >= cfg.max_attempts:
            return Decision(False, 0.0, "max attempts")
        delay = retry_after_of(exc, wall_now) if cfg.respect_retry_after else None
        if delay is not None:
            if cfg.max_retry_after is not None and delay > cfg.max_retry_after:
                return Decision(False, delay, "retry-after too long")
        else:
            delay = self.backoff(attempt - 1)
        if cfg.deadline is not None and now + delay >= started + cfg.deadline:
            return Decision(False, delay, "deadline")
        return Decision(True, delay, "transient")

    @staticmethod
    def mark_exhausted(exc: BaseException, budget_name: str) -> None:
        """Tag the original error as final because the retry budget said no."""
        try:
            exc.retry_budget_exhausted = True  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(f"distbreaker: not retried, retry budget {budget_name!r} is exhausted")


@dataclasses.dataclass(frozen=True)
class Run:
    """Make attempt number `attempt` (1-based). Send back the exception it raised;
    an attempt that returns ends the call (the driver returns its result)."""

    attempt: int


@dataclasses.dataclass(frozen=True)
class Deposit:
    """Deposit once in the retry budget (once per logical call, before the first Run)."""


@dataclasses.dataclass(frozen=True)
class Withdraw:
    """Ask the retry budget for one retry; send back whether it granted it."""


@dataclasses.dataclass(frozen=True)
class Sleep:
    """Wait `seconds` before the next attempt."""

    seconds: float


Step = Run | Deposit | Withdraw | Sleep


class GiveUp(NamedTuple):
    """How a flow ends: the error the driver re-raises, and why it is final."""

    error: BaseException
    reason: str


RetryFlow = Generator[Step, Any, GiveUp]


def retry_flow(decide: Callable[[BaseException, int, float], Decision],
               clock: Callable[[], float], budget: str | None, deposit: bool,
               events: Listeners | None = None, name: str = "") -> RetryFlow:
    """The one retry loop, as steps a driver executes (see `advance` for the protocol).

    `decide(error, attempt, started)` judges a failure of the call begun at
    `clock()` = `started`; `budget` is the retry budget's name (None: no budget,
    so no Deposit and no Withdraw); `deposit`: yield a Deposit before the first Run.
    `events` (with `name`) get the retry / exhausted events, when somebody listens.
    """
    started = clock()
    if deposit and budget is not None:
        yield Deposit()
    attempt = 1
    while True:
        error = yield Run(attempt)
        if not isinstance(error, Exception):  # KeyboardInterrupt, CancelledError, ...
            return GiveUp(error, "not an Exception")
        decision = decide(error, attempt, started)
        if not decision.retry:
            return _gave_up(events, name, error, attempt, decision.reason)
        if budget is not None and not (yield Withdraw()):
            RetryCore.mark_exhausted(error, budget)
            return _gave_up(events, name, error, attempt, "budget exhausted")
        if events is not None and "retry" in events.wanted:
            events.emit(Event("retry", "retry", name, error=error, attempt=attempt,
                              delay=decision.delay, reason=decision.reason))
        del error  # its traceback holds the driver's frame, which holds this flow
        yield Sleep(decision.delay)
        attempt += 1


def _gave_up(events: Listeners | None, name: str, error: BaseException, attempt: int,
             reason: str) -> GiveUp:
    if events is not None and reason in _EXHAUSTED and "exhausted" in events.wanted:
        events.emit(Event("exhausted", "retry", name, error=error, attempt=attempt,
                          reason=reason))
    return GiveUp(error, reason)


def advance(flow: RetryFlow, reply: Any) -> Step | None:
    """Send `reply` to `flow` and return its next step; None once the flow has given up.

    The replies: None to start and after Deposit or Sleep, the exception after a
    failed Run, the budget's answer (bool) after Withdraw. On None the driver
    re-raises the failed attempt's error.
    """
    try:
        return flow.send(reply)
    except StopIteration:
        return None


class RetryBase:
    """What the sync and asyncio Retry share: config, core, budget, clock."""

    def __init__(self, config: RetryConfig | None, budget: Any, sleep: Any,
                 clock: Callable[[], float] | None, rng: random.Random | None,
                 overrides: dict[str, Any]) -> None:
        self.config = build_retry_config(config, overrides)
        self._core = RetryCore(self.config, rng)
        self.budget = budget
        self._sleep = sleep
        self._clock = clock or time.monotonic
        self.listeners = Listeners(EVENT_KINDS, default=EVENT_KINDS)

    def add_listener(self, listener: Callable[[Event], Any], kinds: Any = None) -> None:
        """Call `listener(Event)` for this process's retry events of `kinds` (default
        both of `EVENT_KINDS`: retry, exhausted); a Policy's retry emits them too."""
        self.listeners.add(listener, kinds)

    def remove_listener(self, listener: Callable[[Event], Any]) -> None:
        self.listeners.remove(listener)

    def decide(self, error: BaseException, attempt: int, started: float,
               now: float) -> Decision:
        """Whether to retry after `attempt` failed with `error` (and after how long), at
        `now` on the clock `started` was read from: what a Policy asks of its retry."""
        return self._core.decide(error, attempt, started, now)

    def _decide(self, error: BaseException, attempt: int, started: float) -> Decision:
        return self._core.decide(error, attempt, started, self._clock())

    def _flow(self) -> RetryFlow:
        """One logical call: deposit once first, withdraw once per retry."""
        budget = None if self.budget is None else self.budget.name
        return retry_flow(self._decide, self._clock, budget, deposit=True,
                          events=self.listeners)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_attempts={self.config.max_attempts})"
