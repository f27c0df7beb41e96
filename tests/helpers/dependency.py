"""A fake dependency (sync and asyncio) and the loop that tallies protected calls.

One copy for every test that calls "a dependency" through a breaker, a bulkhead or a
policy: it counts the calls that reached it and the most that ran at once, can be made
slow, can fail (raise its answer, or `error` while not `healthy`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from distbreaker.errors import CallNotPermitted

#: The seed article's breaker: 5 calls in a count window of 10, 50 %, 1 s open, 2 probes.
SEED = {"sliding_window_type": "COUNT_BASED", "sliding_window_size": 10,
        "minimum_number_of_calls": 5, "failure_rate_threshold": 50,
        "wait_duration_in_open_state": 1.0, "permitted_calls_in_half_open": 2}


class _Counting:
    """What both flavours share: the tallies and the answer."""

    def __init__(self, answer: Any = "ok", delay: float = 0.0, healthy: bool = True,
                 error: BaseException | None = None) -> None:
        self.answer = answer
        self.delay = delay
        self.healthy = healthy
        self.error = error if error is not None else ConnectionError("gateway down")
        self.calls = 0
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def _enter(self) -> None:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.peak = max(self.peak, self.running)

    def _leave(self) -> Any:
        with self._lock:
            self.running -= 1

    def _answer(self) -> Any:
        if not self.healthy:
            raise self.error
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class Dependency(_Counting):
    """A thread-safe sync dependency."""

    def __call__(self) -> Any:
        self._enter()
        try:
            if self.delay:
                time.sleep(self.delay)
            return self._answer()
        finally:
            self._leave()


class AsyncDependency(_Counting):
    """A coroutine dependency; `entered` is set once a call has reached it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entered = asyncio.Event()

    async def __call__(self) -> Any:
        self._enter()
        self.entered.set()
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._answer()
        finally:
            self._leave()


def _rejected(error: CallNotPermitted, with_state: bool) -> str:
    return f"rejected:{error.state}" if with_state else "rejected"


def outcome(call: Callable[[], Any], failure: type[BaseException] = ConnectionError,
            with_state: bool = False) -> str:
    """Run one protected call: "ok", "failed" (it raised `failure`) or "rejected"
    ("rejected:STATE" with `with_state`)."""
    try:
        call()
    except CallNotPermitted as error:
        return _rejected(error, with_state)
    except failure:
        return "failed"
    return "ok"


async def outcome_async(call: Callable[[], Awaitable[Any]],
                        failure: type[BaseException] = ConnectionError,
                        with_state: bool = False) -> str:
    """`outcome` for a coroutine call."""
    try:
        await call()
    except CallNotPermitted as error:
        return _rejected(error, with_state)
    except failure:
        return "failed"
    return "ok"


def run_requests(call: Callable[[], Any], count: int,
                 failure: type[BaseException] = ConnectionError) -> list[str]:
    """`count` protected calls one after the other; each one's `outcome`."""
    return [outcome(call, failure) for _ in range(count)]
