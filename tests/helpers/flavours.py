"""One test body for the sync and the asyncio flavour of a component.

A test takes the `flavour` fixture (tests/redis/conftest.py: "sync", "asyncio") and builds
its components through it. The sync flavour hands out the sync objects themselves; the
asyncio flavour hands out a `Blocking` view of the asyncio object, whose coroutine methods
run to completion on one event loop per test. So `breaker.call(fn)`, `breaker.state` and
`bulkhead.metrics()` read the same in both; `flavour.sleep` lets the loop run (lease
renewals, flushers) where a sync test would just sleep, and `flavour.call_at_once` runs
concurrent calls as threads or as tasks. Behaviour only one flavour has stays in that
flavour's own test file.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import distbreaker
import distbreaker.aio
from tests.helpers.dependency import AsyncDependency, Dependency

_ASYNC_COMPONENTS = (distbreaker.aio.CircuitBreaker, distbreaker.aio.Bulkhead,
                     distbreaker.aio.Policy, distbreaker.aio.RetryBudget,
                     distbreaker.aio.RateLimiter, distbreaker.aio.Pool)


class Blocking:
    """An asyncio component driven through blocking calls on `loop`.

    Coroutine methods return their result; attributes holding another asyncio component
    (a policy's `breaker`) come back as views too; `call` also takes a plain function.
    """

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop
        self._held: list[Any] = []

    @property
    def target(self) -> Any:
        """The asyncio object itself."""
        return self._target

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if inspect.iscoroutinefunction(value):
            def blocking(*args: Any, **kwargs: Any) -> Any:
                return self._loop.run_until_complete(value(*args, **kwargs))
            return blocking
        if isinstance(value, _ASYNC_COMPONENTS):
            return Blocking(value, self._loop)
        return value

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The protected call of `fn`, sync or coroutine function alike."""
        return self._loop.run_until_complete(self._target.call(as_coroutine(fn), *args,
                                                               **kwargs))

    @property
    def state(self) -> Any:
        return self._loop.run_until_complete(self._target.get_state())

    def __enter__(self) -> Any:
        """A bulkhead's `with` block, by acquire and release: `async with` keeps its permit
        in a context variable of its task, and each blocking call here is a task of its
        own (the `async with` form has tests of its own)."""
        if not hasattr(self._target, "release"):
            raise TypeError(f"{type(self._target).__name__}: no blocking `with` block")
        permit = self.acquire()
        self._held.append(permit)
        return permit

    def __exit__(self, *exc_info: Any) -> None:
        self.release(self._held.pop())


def as_coroutine(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`fn` as a coroutine function (awaiting its result if it returns an awaitable)."""
    async def run(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    return run


class Flavour:
    """Builds components of one flavour and closes what it built at the end of the test."""

    def __init__(self, name: str) -> None:
        if name not in ("sync", "asyncio"):
            raise ValueError(f"unknown flavour {name!r}")
        self.name = name
        self.is_async = name == "asyncio"
        self._loop = asyncio.new_event_loop() if self.is_async else None
        self._made: list[Any] = []
        #: A retry `sleep=` of this flavour that returns at once.
        self.no_sleep: Callable[[float], Any] = _no_sleep if self.is_async else _skip


    def __repr__(self) -> str:
        return f"Flavour({self.name!r})"

    # -- components ------------------------------------------------------------------
    def _make(self, sync_cls: Any, async_cls: Any, args: Any, kwargs: Any) -> Any:
        if self._loop is None:
            return sync_cls(*args, **kwargs)
        target = async_cls(*args, **kwargs)
        self._made.append(target)
        return Blocking(target, self._loop)

    def breaker(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.CircuitBreaker, distbreaker.aio.CircuitBreaker,
                          args, kwargs)

    def bulkhead(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.Bulkhead, distbreaker.aio.Bulkhead, args, kwargs)

    def policy(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.Policy, distbreaker.aio.Policy, args, kwargs)

    def budget(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.RetryBudget, distbreaker.aio.RetryBudget, args, kwargs)

    def rate_limiter(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.RateLimiter, distbreaker.aio.RateLimiter, args, kwargs)

    def pool(self, *args: Any, **kwargs: Any) -> Any:
        return self._make(distbreaker.Pool, distbreaker.aio.Pool, args, kwargs)

    def dependency(self, *args: Any, **kwargs: Any) -> Dependency | AsyncDependency:
        """A dependency of this flavour (a coroutine one for asyncio, so tasks overlap)."""
        return AsyncDependency(*args, **kwargs) if self.is_async else Dependency(*args,
                                                                                 **kwargs)

    # -- time and concurrency ----------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        """Wait; with asyncio the loop runs meanwhile (renewals, flushers, subscribers)."""
        if self._loop is None:
            time.sleep(seconds)
        else:
            self._loop.run_until_complete(asyncio.sleep(seconds))

    def call_at_once(self, count: int, component: Any, fn: Callable[..., Any]) -> list[Any]:
        """`count` concurrent `component.call(fn)`, released together (threads behind a
        barrier, or tasks); each one's result or exception."""
        if self._loop is None:
            return run_at_once(count, lambda: component.call(fn))
        calls = [component.target.call(as_coroutine(fn)) for _ in range(count)]

        async def gather() -> list[Any]:
            return list(await asyncio.gather(*calls, return_exceptions=True))
        return self._loop.run_until_complete(gather())

    def close(self) -> None:
        if self._loop is None:
            return
        for target in self._made:
            for part in (target, *(getattr(target, a, None)
                                   for a in ("breaker", "bulkhead", "rate_limiter"))):
                aclose = getattr(part, "aclose", None)
                if aclose is not None:
                    self._loop.run_until_complete(aclose())
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()


async def _no_sleep(seconds: float) -> None:
    return None


def _skip(seconds: float) -> None:
    return None


def run_at_once(count: int, fn: Callable[[], Any]) -> list[Any]:
    """Run `fn` in `count` threads released together; each result or exception."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as error:
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return results
