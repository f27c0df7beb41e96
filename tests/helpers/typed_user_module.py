"""A user module as `mypy --strict` sees it: every public decorator, sync and asyncio,
and the Registry lookups used as decorators.

tests/unit/test_typing.py type-checks it (and imports it: decorating connects to
nothing). Each decorated function must keep its parameters and return type, so the
`assert_type` lines and the typed assignments fail mypy if a decorator erases them to
`Callable[..., Any]`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import distbreaker
import distbreaker.aio
from distbreaker.contrib.celery import protect

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # checked by mypy only (its bundled stubs), never run on 3.10
    from typing_extensions import assert_type

URL = "redis://127.0.0.1:1/0"  # never contacted: decorating makes no call

breaker = distbreaker.CircuitBreaker("dep", redis=URL)
bulkhead = distbreaker.Bulkhead("dep", redis=URL)
retry = distbreaker.Retry()
policy = distbreaker.Policy("dep", redis=URL)
ganesha = distbreaker.GaneshaBreaker("svc", redis=URL)
limiter = distbreaker.RateLimiter("dep", redis=URL)

abreaker = distbreaker.aio.CircuitBreaker("dep", redis=URL)
abulkhead = distbreaker.aio.Bulkhead("dep", redis=URL)
aretry = distbreaker.aio.Retry()
apolicy = distbreaker.aio.Policy("dep", redis=URL)
aganesha = distbreaker.aio.GaneshaBreaker("svc", redis=URL)
alimiter = distbreaker.aio.RateLimiter("dep", redis=URL)

registry = distbreaker.Registry.from_dict({"redis": URL})
aregistry = distbreaker.aio.Registry.from_dict({"redis": URL})


@breaker
def breaker_fn(x: int, *, label: str = "") -> str:
    return f"{label}{x}"


@bulkhead
def bulkhead_fn(x: int) -> str:
    return str(x)


@limiter
def limiter_fn(x: int) -> str:
    return str(x)


@retry
def retry_fn(x: int) -> str:
    return str(x)


@policy
def policy_fn(x: int) -> str:
    return str(x)


@ganesha
def ganesha_fn(x: int) -> str:
    return str(x)


@breaker
@retry
def stacked_fn(x: int) -> list[int]:
    return [x]


@abreaker
async def abreaker_fn(x: int, *, label: str = "") -> str:
    return f"{label}{x}"


@abulkhead
async def abulkhead_fn(x: int) -> str:
    return str(x)


@alimiter
async def alimiter_fn(x: int) -> str:
    return str(x)


@aretry
async def aretry_fn(x: int) -> str:
    return str(x)


@apolicy
async def apolicy_fn(x: int) -> str:
    return str(x)


@aganesha
async def aganesha_fn(x: int) -> str:
    return str(x)


@registry.breaker("reg")
def registry_breaker_fn(x: int) -> str:
    return str(x)


@registry.policy("reg")
def registry_policy_fn(x: int) -> str:
    return str(x)


@aregistry.policy("reg")
async def aregistry_policy_fn(x: int) -> str:
    return str(x)


@protect(breaker)
def celery_task(task: Any, order_id: int) -> str:
    return str(order_id)


def plain(x: int) -> str:
    return str(x)


async def coroutine(x: int) -> str:
    return str(x)


# The decorated functions fit where the originals do (checked by assignment).
sync_fns: list[Callable[[int], str]] = [bulkhead_fn, retry_fn, policy_fn, ganesha_fn,
                                        breaker_fn, limiter_fn]
async_fns: list[Callable[[int], Awaitable[str]]] = [abulkhead_fn, aretry_fn, apolicy_fn,
                                                    aganesha_fn, abreaker_fn, alimiter_fn]
task_fn: Callable[[Any, int], str] = celery_task


def sync_types_kept() -> None:
    """Never run (it would call Redis): mypy checks the exact types."""
    assert_type(breaker_fn(1, label="a"), str)
    assert_type(bulkhead_fn(1), str)
    assert_type(limiter_fn(1), str)
    assert_type(limiter.call(plain, 1), str)
    assert_type(registry.rate_limiter("reg"), distbreaker.RateLimiter)
    assert_type(retry_fn(1), str)
    assert_type(policy_fn(1), str)
    assert_type(ganesha_fn(1), str)
    assert_type(stacked_fn(1), list[int])
    assert_type(celery_task(None, 1), str)
    assert_type(registry_breaker_fn(1), str)
    assert_type(registry_policy_fn(1), str)
    assert_type(registry.breaker("reg"), distbreaker.CircuitBreaker)
    assert_type(registry.bulkhead("reg"), distbreaker.Bulkhead)
    assert_type(registry.budget("reg"), distbreaker.RetryBudget)
    assert_type(registry.retry("reg"), distbreaker.Retry)
    assert_type(aregistry.breaker("reg"), distbreaker.aio.CircuitBreaker)
    # `call` checks its arguments against the function's parameters, too.
    assert_type(breaker.call(plain, 1), str)
    assert_type(bulkhead.call(plain, 1), str)
    assert_type(retry.call(plain, 1), str)
    assert_type(policy.call(plain, 1), str)
    assert_type(ganesha.call(plain, x=1), str)


async def asyncio_types_kept() -> None:
    """Never run: a decorated coroutine function still returns a coroutine of its result."""
    coroutines = [abreaker_fn(1, label="a"), abulkhead_fn(1), aretry_fn(1), apolicy_fn(1),
                  aganesha_fn(1), aregistry_policy_fn(1), alimiter_fn(1)]
    assert_type(coroutines, list[Coroutine[Any, Any, str]])
    results = [await abreaker.call(coroutine, 1), await abulkhead.call(coroutine, 1),
               await aretry.call(coroutine, 1), await apolicy.call(coroutine, 1),
               await aganesha.call(coroutine, x=1), await alimiter.call(coroutine, 1),
               await coroutines[0]]
    assert_type(results, list[str])
