"""The one decorator body every component shares: refuse the other flavour's functions
at decoration time (nothing connects), then hand each call to the component's `call`.

Typed with ParamSpec so a decorated function keeps its signature for type checkers:
`@breaker def f(x: int) -> str` stays `(x: int) -> str`, and the asyncio flavour keeps
`(x: int) -> Coroutine[Any, Any, str]`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def decorate_sync(call: Callable[Concatenate[Callable[P, T], P], T], fn: Callable[P, T],
                  kind: str) -> Callable[P, T]:
    """Wrap plain function `fn` so each call runs as `call(fn, *args, **kwargs)`.

    `kind` names the component (e.g. "CircuitBreaker") for the error that points a
    coroutine function to `distbreaker.aio`.
    """
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"use distbreaker.aio.{kind} to decorate a coroutine function")

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return call(fn, *args, **kwargs)

    return wrapper


def decorate_async(call: Callable[Concatenate[Callable[P, Awaitable[T]], P], Awaitable[T]],
                   fn: Callable[P, Awaitable[T]],
                   kind: str) -> Callable[P, Coroutine[Any, Any, T]]:
    """Wrap coroutine function `fn` so each call awaits `call(fn, *args, **kwargs)`.

    The wrapper is itself a coroutine function (frameworks that check
    `inspect.iscoroutinefunction` still see one).
    """
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"distbreaker.aio.{kind} decorates coroutine functions; "
                        f"use distbreaker.{kind} for a plain function")

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return await call(fn, *args, **kwargs)

    return wrapper
