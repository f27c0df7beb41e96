"""Celery tasks whose outbound call is protected by a fleet-wide breaker and retry budget.

```python
from distbreaker import CircuitBreaker, RetryBudget
from distbreaker.contrib.celery import protect

breaker = CircuitBreaker("payments", redis=URL, wait_duration_in_open_state=30)
budget = RetryBudget("payments", redis=URL)

@app.task(bind=True, max_retries=None)           # the budget bounds the retries
@protect(breaker, budget=budget, retry_on=(ConnectionError, TimeoutError))
def charge(self, order_id):
    return gateway.charge(order_id)
```

- The breaker **rejects** (``CallNotPermitted``; a Policy's ``BulkheadFull``
  too): the task is re-queued with ``self.retry(countdown=...)``, the countdown
  being the rejection's ``retry_after`` (seconds until a probe may be tried)
  plus up to `jitter` of it, never below `min_countdown`; FORCED_OPEN and other
  rejections without a known wait use `unknown_countdown`. Nothing is retried
  before a probe can be: no hot loop, no immediate failure, and the jitter
  spreads the re-queued tasks so HALF_OPEN is not met by a herd. Re-queues are
  not retries of the dependency and draw nothing from the budget
  (`max_deferrals` bounds them if you want a bound; Celery counts them in
  ``request.retries`` too).
- The call **fails** with an error in `retry_on`: one withdrawal from the
  fleet-wide `budget` per Celery retry. Budget exhausted: the task fails with
  the original error (marked ``retry_budget_exhausted = True``). Otherwise it
  is retried after an exponential backoff with jitter (Celery's
  ``max_retries`` still applies). Share the budget with the HTTP client's
  `Policy` / `Retry` and every retry layer draws from the same fleet-wide
  allowance, so Celery retries x HTTP retries x distbreaker retries cannot
  multiply. Each task deposits once, on its first delivery (``deposit=False``
  when the task's own `Policy` deposits in the same budget).

- **Eager mode** (``task_always_eager=True``, ``task.apply()``, common in
  tests): a rejection is raised as is (``CallNotPermitted`` / ``BulkheadFull``;
  with ``task_eager_propagates=False`` it is the EagerResult's error). Celery
  runs an eager retry at once, in the same stack, ignoring its countdown, so a
  re-queue would meet the same OPEN breaker again and again until
  RecursionError. Errors in `retry_on` still go through Celery's eager retry:
  with ``task_eager_propagates=True`` Celery raises its ``Retry``, otherwise it
  runs the task again at once, bounded by the budget and ``max_retries``.

`breaker` may be anything with ``.call(fn, *args, **kwargs)``: a
`CircuitBreaker`, a `Policy` or None (budgeted retries only). The decorated
function's first argument is the bound task (``bind=True``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..breaker.state import State
from ..errors import BulkheadFull, CallNotPermitted

__all__ = ["backoff_countdown", "protect", "rejection_countdown"]

P = ParamSpec("P")
T = TypeVar("T")


def rejection_countdown(rejection: BaseException, *, min_countdown: float = 1.0,
                        jitter: float = 0.1, unknown_countdown: float = 60.0,
                        rand: Callable[[], float] = random.random) -> float:
    """Seconds to re-queue a rejected task for: when a probe may be tried, plus jitter.

    The jitter only ever adds (up to `jitter` x the wait), so no re-queued task
    comes back before the breaker can let it through.
    """
    if isinstance(rejection, CallNotPermitted):
        wait = rejection.retry_after
        if wait <= 0 and rejection.state in (State.FORCED_OPEN, State.FORCED_OPEN.value):
            wait = unknown_countdown
        elif wait <= 0 and rejection.state == "UNKNOWN":   # fail_closed: Redis unreachable
            wait = min_countdown
    else:
        wait = min_countdown                               # BulkheadFull: a slot soon frees
    wait = max(min_countdown, wait)
    return wait * (1.0 + jitter * rand())


def backoff_countdown(retries: int, *, base: float = 1.0, cap: float = 60.0,
                      rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff for the `retries`-th retry, jittered over its upper half."""
    ceiling = min(cap, base * 2.0 ** min(retries, 32))
    return ceiling / 2 + rand() * ceiling / 2


def protect(breaker: Any = None, *, budget: Any = None,
            retry_on: tuple[type[BaseException], ...] = (),
            backoff: float = 1.0, backoff_max: float = 60.0,
            min_countdown: float = 1.0, jitter: float = 0.1,
            unknown_countdown: float = 60.0, max_deferrals: int | None = None,
            deposit: bool = True,
            ) -> Callable[[Callable[Concatenate[Any, P], T]], Callable[Concatenate[Any, P], T]]:
    """Decorate a bound task's function (see the module docstring).

    The decorated function keeps its signature (`task` first) for type checkers.
    """
    if min_countdown <= 0 or jitter < 0 or backoff <= 0:
        raise ValueError("min_countdown and backoff must be > 0, jitter >= 0")

    def decorate(fn: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[Any, P], T]:
        @functools.wraps(fn)
        def run(task: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
            if budget is not None and deposit and not task.request.retries:
                budget.deposit()   # once per logical task: its first delivery
            try:
                if breaker is None:
                    return fn(task, *args, **kwargs)
                result: T = breaker.call(fn, task, *args, **kwargs)  # breaker: Any
                return result
            except (CallNotPermitted, BulkheadFull) as rejection:
                if getattr(task.request, "is_eager", False):
                    raise  # eager: a re-queue would re-run at once against the same state
                countdown = rejection_countdown(
                    rejection, min_countdown=min_countdown, jitter=jitter,
                    unknown_countdown=unknown_countdown)
                raise task.retry(exc=rejection, countdown=countdown,
                                 max_retries=max_deferrals) from rejection
            except retry_on as error:
                if budget is not None and not budget.try_withdraw():
                    error.retry_budget_exhausted = True  # type: ignore[attr-defined]
                    raise
                countdown = backoff_countdown(task.request.retries, base=backoff,
                                              cap=backoff_max)
                raise task.retry(exc=error, countdown=countdown) from error

        return run

    return decorate
