"""Retry with capped exponential backoff, full jitter, Retry-After, a deadline and a budget.

`RetryConfig` and `RetryCore` are pure (no sleeping, no I/O) and shared by the
sync `Retry` here and the asyncio `distbreaker.aio.Retry`; the two shells only
sleep (or await) and talk to the budget.

What is retried: an `Exception` (never KeyboardInterrupt or CancelledError)
that is an instance of `retry_on`, not of `ignore` (default: CallNotPermitted
and BulkheadFull: a rejection is not a failure worth repeating), whose HTTP
status, when it carries one, is TRANSIENT for `http_classifier` (so 4xx and a
429 without Retry-After are final), and for which `retry_predicate`, if given,
returns true.

When the retry budget is exhausted the failure is final: `Retry` re-raises the
ORIGINAL error (so ``except`` clauses, the breaker and the fallback see what the
dependency said), with the attribute ``retry_budget_exhausted = True`` and, on
Python 3.11+, a note saying so. `RetryBudgetExhausted` is raised only by
`RetryBudget.withdraw()` for callers that drive the budget themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import random
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from . import errors
from .classify import DEFAULT_HTTP_CLASSIFIER, HttpClassifier, HttpVerdict, retry_after_of
from .config import Seconds, check_int, exception_types, merge_options, to_seconds

T = TypeVar("T")


class Jitter(str, Enum):
    """How a backoff ceiling becomes a wait: FULL random in [0, c], EQUAL in [c/2, c], NONE c."""

    FULL = "full"
    EQUAL = "equal"
    NONE = "none"


def default_ignore() -> tuple[type[BaseException], ...]:
    """Rejections by the breaker or the bulkhead: retrying them only adds load."""
    found = [errors.CallNotPermitted]
    bulkhead_full = getattr(errors, "BulkheadFull", None)
    if isinstance(bulkhead_full, type):
        found.append(bulkhead_full)
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class RetryConfig:
    """Retry settings (durations in seconds, float or timedelta).

    `max_attempts` counts the first call. The n-th retry (n = 0, 1, ...) waits
    `min(cap, base * multiplier**n)` shaped by `jitter`, or exactly the
    Retry-After the error carries; a Retry-After longer than `max_retry_after`
    (None: no limit) makes the failure final. `deadline` caps the whole logical
    call: a wait that would end at or past it is not started.
    """

    max_attempts: int = 3
    base: Seconds = 0.1
    multiplier: float = 2.0
    cap: Seconds = 10.0
    jitter: Jitter | str = Jitter.FULL
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    ignore: tuple[type[BaseException], ...] = dataclasses.field(default_factory=default_ignore)
    deadline: Seconds | None = None
    retry_predicate: Callable[[BaseException], bool] | None = None
    respect_retry_after: bool = True
    max_retry_after: Seconds | None = 60.0
    http_classifier: HttpClassifier | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_int(self.max_attempts, "max_attempts", 1, 10_000)
        for field in ("base", "cap"):
            put(self, field, to_seconds(getattr(self, field), field))
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (
                math.isfinite(m) and 1 <= m <= 1000):
            raise ValueError(f"multiplier must be a number in [1, 1000], got {m!r}")
        put(self, "multiplier", float(m))
        try:
            put(self, "jitter", Jitter(self.jitter))
        except ValueError:
            raise ValueError(f"jitter must be 'full', 'equal' or 'none', "
                             f"got {self.jitter!r}") from None
        put(self, "retry_on", exception_types(self.retry_on, "retry_on"))
        put(self, "ignore", exception_types(self.ignore, "ignore"))
        for field in ("deadline", "max_retry_after"):
            if getattr(self, field) is not None:
                put(self, field, to_seconds(getattr(self, field), field))
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds or None, got {self.deadline!r}")
        if self.retry_predicate is not None and not callable(self.retry_predicate):
            raise ValueError(f"retry_predicate must be callable or None, "
                             f"got {self.retry_predicate!r}")
        if not isinstance(self.respect_retry_after, bool):
            raise ValueError(f"respect_retry_after must be a bool, "
                             f"got {self.respect_retry_after!r}")
        classifier = self.http_classifier
        if classifier is not None and not isinstance(classifier, HttpClassifier):
            if not isinstance(classifier, dict):
                raise ValueError(f"http_classifier must be an HttpClassifier or a "
                                 f"{{status: verdict}} dict, got {classifier!r}")
            put(self, "http_classifier", HttpClassifier(classifier))

    def replace(self, **changes: Any) -> RetryConfig:
        return dataclasses.replace(self, **changes)


def build_retry_config(config: RetryConfig | None, overrides: dict[str, Any]) -> RetryConfig:
    """Merge constructor keyword overrides into a retry config."""
    return merge_options(RetryConfig, config, overrides, "retry")


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

    def _decide(self, error: BaseException, attempt: int, started: float) -> Decision:
        return self._core.decide(error, attempt, started, self._clock())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_attempts={self.config.max_attempts})"


class Retry(RetryBase):
    """Retry a sync callable: ``@Retry(max_attempts=3)`` or ``retry.call(fn, *args)``.

    With `budget` (a `distbreaker.RetryBudget`) every logical call deposits
    once and every retry withdraws once; an exhausted budget makes the failure
    final (the original error is raised, see the module docstring). `sleep`,
    `clock` and `rng` are injectable for tests.
    """

    def __init__(self, config: RetryConfig | None = None, *, budget: Any = None,
                 sleep: Callable[[float], Any] = time.sleep,
                 clock: Callable[[], float] | None = None, rng: random.Random | None = None,
                 **overrides: Any) -> None:
        super().__init__(config, budget, sleep, clock, rng, overrides)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)`, retrying transient failures."""
        started = self._clock()
        if self.budget is not None:
            self.budget.deposit()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(*args, **kwargs)
            except Exception as error:
                decision = self._decide(error, attempt, started)
                if not decision.retry:
                    raise
                if self.budget is not None and not self.budget.try_withdraw():
                    self._core.mark_exhausted(error, self.budget.name)
                    raise
                self._sleep(decision.delay)

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.Retry to decorate a coroutine function")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper
