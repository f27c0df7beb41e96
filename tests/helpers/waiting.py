"""The suite's one poll-until helper: wait for something to become true.

Tests assert that things happen, not how fast: a loaded 2-core CI machine may take
seconds for what takes milliseconds on a quiet one. So waits are long (the default
`timeout` is 20 s) and end as soon as the condition holds; a fast machine pays
nothing for the margin. Speed is measured by the benchmark scripts, not here.

    from tests.helpers.waiting import wait_until, await_until

    wait_until(lambda: client.exists(key), what="the record is written")
    count = wait_until(lambda: int(client.get(key) or 0) >= 5 and int(client.get(key)))
    await await_until(lambda: breaker.state is State.OPEN, what="the breaker opens")

`predicate` is called until it returns something truthy, which is returned; an
exception of a type in `ignoring` (e.g. `OSError` while a server starts) counts as
"not yet". On
timeout a `WaitTimeout` (an AssertionError, so pytest shows it as a failed
assertion) names `what`, the time waited and the last value `predicate` returned
(or `describe()`, when given, for more context such as a worker's output).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 20.0


class WaitTimeout(AssertionError):
    """The condition did not hold within the timeout."""


def _failure(predicate: Callable[..., object], what: str | None, timeout: float,
             last: object, describe: Callable[[], object] | None) -> WaitTimeout:
    if what is None:
        name = getattr(predicate, "__name__", "<lambda>")
        what = "the condition holds" if name == "<lambda>" else f"{name}() holds"
    detail = f"; {describe()}" if describe is not None else ""
    return WaitTimeout(f"timed out after {timeout:g}s waiting until {what} "
                       f"(last value: {last!r}){detail}")


def wait_until(predicate: Callable[[], T], *, timeout: float = DEFAULT_TIMEOUT,
               interval: float = 0.01, what: str | None = None,
               describe: Callable[[], object] | None = None,
               ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call `predicate()` every `interval` seconds until it returns a truthy value and
    return that value; raise `WaitTimeout` if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignoring as error:
            value = error  # type: ignore[assignment]
        if value and not isinstance(value, BaseException):
            return value
        if time.monotonic() >= deadline:
            raise _failure(predicate, what, timeout, value, describe)
        time.sleep(interval)


async def await_until(predicate: Callable[[], T | Awaitable[T]], *,
                      timeout: float = DEFAULT_TIMEOUT, interval: float = 0.01,
                      what: str | None = None,
                      describe: Callable[[], object] | None = None,
                      ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """`wait_until` for a coroutine: sleeps with `asyncio.sleep`, so the event loop
    (and the tasks the condition waits for) keeps running. `predicate` may also be a
    coroutine function (`async def`), awaited on every look."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as error:
            value = error  # type: ignore[assignment]
        if value and not isinstance(value, BaseException):
            return value
        if time.monotonic() >= deadline:
            raise _failure(predicate, what, timeout, value, describe)
        await asyncio.sleep(interval)
