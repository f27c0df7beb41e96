"""A worker process of tests/fleet/test_shadow_fleet.py: one breaker declaring a shadow
config, its calls in two phases between barriers (all successes, then all failures), so
the fleet's outcomes reach the shadow in a known order of phases."""

from __future__ import annotations

import asyncio
from typing import Any


def boom() -> None:
    raise ConnectionError("down")


def member(url: str, name: str, config: dict[str, Any], ok: int, failed: int,
           flavour: str, started: Any, phase: Any, results: Any) -> None:
    """`ok` successes, wait for every worker, `failed` failures; puts how many of its calls
    the live breaker admitted."""
    if flavour == "asyncio":
        results.put(asyncio.run(_member_async(url, name, config, ok, failed, started, phase)))
        return
    from distbreaker import CircuitBreaker

    breaker = CircuitBreaker(name, redis=url, **config)
    started.wait(timeout=60)
    admitted = 0
    for _ in range(ok):
        breaker.call(lambda: None)
        admitted += 1
    phase.wait(timeout=60)
    for _ in range(failed):
        try:
            breaker.call(boom)
        except ConnectionError:
            admitted += 1
    breaker.close()
    results.put(admitted)


async def _member_async(url: str, name: str, config: dict[str, Any], ok: int, failed: int,
                        started: Any, phase: Any) -> int:
    from distbreaker.aio import CircuitBreaker

    async def fine() -> None:
        return None

    async def broken() -> None:
        boom()

    breaker = CircuitBreaker(name, redis=url, **config)
    await asyncio.to_thread(started.wait, 60)
    admitted = 0
    for _ in range(ok):
        await breaker.call(fine)
        admitted += 1
    await asyncio.to_thread(phase.wait, 60)
    for _ in range(failed):
        try:
            await breaker.call(broken)
        except ConnectionError:
            admitted += 1
    await breaker.aclose()
    return admitted
