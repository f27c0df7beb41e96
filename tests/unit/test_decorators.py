"""Every decorator refuses the other flavour's functions at decoration time: a sync
component a coroutine function, an asyncio one a plain function (nothing connects)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import distbreaker
import distbreaker.aio as aio

URL = "redis://127.0.0.1:1/0"  # never contacted: decorating makes no call

BUILDERS: dict[str, Callable[[Any], Any]] = {
    "CircuitBreaker": lambda module: module.CircuitBreaker("dep", redis=URL),
    "Bulkhead": lambda module: module.Bulkhead("dep", redis=URL),
    "Retry": lambda module: module.Retry(),
    "Policy": lambda module: module.Policy("dep", redis=URL),
    "GaneshaBreaker": lambda module: module.GaneshaBreaker("svc", redis=URL),
}


def plain() -> str:
    return "plain"


async def coroutine() -> str:
    return "coroutine"


@pytest.mark.parametrize("component", sorted(BUILDERS))
def test_asyncio_decorators_refuse_plain_functions(component: str) -> None:
    decorate = BUILDERS[component](aio)
    with pytest.raises(TypeError, match="coroutine functions"):
        decorate(plain)
    assert decorate(coroutine).__name__ == "coroutine"


@pytest.mark.parametrize("component", sorted(BUILDERS))
def test_sync_decorators_refuse_coroutine_functions(component: str) -> None:
    decorate = BUILDERS[component](distbreaker)
    with pytest.raises(TypeError, match=r"distbreaker\.aio"):
        decorate(coroutine)
    assert decorate(plain).__name__ == "plain"
