"""One connection pool per URL: components built from the same URL and options in one
process share one client (per event loop for asyncio), and closing one of them never
closes the client the others still use."""

from __future__ import annotations

import asyncio

import redis

import distbreaker
import distbreaker.aio as aio
from distbreaker._runtime.connection import ASYNC_MAX_CONNECTIONS
from tests.helpers.waiting import wait_until

MANY = 2000
#: A handful: the shared pool's connection(s), plus the push-invalidation subscriber.
HANDFUL = 4


def connections(client: redis.Redis, label: str) -> int:
    """Server-side connections named `label` (the client_name of the URL)."""
    return sum(1 for c in client.client_list() if c.get("name") == label)


def test_many_sync_breakers_from_one_url_share_a_handful_of_connections(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    label = f"pool-{name}"
    url = f"{redis_url}?client_name={label}"
    breakers = [distbreaker.CircuitBreaker(f"{name}-{i}", redis=url) for i in range(MANY)]
    for breaker in breakers:
        assert breaker.call(lambda: "ok") == "ok"
    assert 1 <= connections(redis_client, label) <= HANDFUL
    for breaker in breakers:
        breaker.close()
    wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")


def test_breakers_bulkheads_and_budgets_of_one_url_share_one_pool(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    label = f"mixed-{name}"
    url = f"{redis_url}?client_name={label}"
    items = []
    for i in range(50):
        breaker = distbreaker.CircuitBreaker(f"{name}-{i}", redis=url)
        bulkhead = distbreaker.Bulkhead(f"{name}-{i}", redis=url, max_concurrent_calls=2)
        budget = distbreaker.RetryBudget(f"{name}-{i}", redis=url)
        policy = distbreaker.Policy(f"{name}-p{i}", redis=url, bulkhead=True)
        breaker.call(lambda: "ok")
        bulkhead.call(lambda: "ok")
        budget.deposit()
        policy.call(lambda: "ok")
        items += [breaker, bulkhead, budget]
    # Policy's default redis_timeout differs from the components': a second pool.
    assert 1 <= connections(redis_client, label) <= 2 * HANDFUL


def test_many_asyncio_breakers_from_one_url_share_one_pool_per_loop(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    label = f"apool-{name}"
    url = f"{redis_url}?client_name={label}"
    breakers = [aio.CircuitBreaker(f"{name}-{i}", redis=url) for i in range(MANY)]

    async def ok() -> str:
        return "ok"

    async def scenario() -> None:
        for breaker in breakers:
            assert await breaker.call(ok) == "ok"
        assert 1 <= connections(redis_client, label) <= HANDFUL
        # All at once: the shared pool queues for its few connections.
        assert await asyncio.gather(*(b.call(ok) for b in breakers)) == ["ok"] * MANY
        assert connections(redis_client, label) <= ASYNC_MAX_CONNECTIONS + HANDFUL
        for breaker in breakers:
            await breaker.aclose()
        wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")

    asyncio.run(scenario())
    # A second loop gets its own pool (asyncio connections belong to their loop).
    asyncio.run(breakers[0].call(ok))


def test_closing_one_of_two_sync_breakers_leaves_the_other_working(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    label = f"close1-{name}"
    url = f"{redis_url}?client_name={label}"
    first = distbreaker.CircuitBreaker(f"{name}-a", redis=url)
    second = distbreaker.CircuitBreaker(f"{name}-b", redis=url)
    first.call(lambda: "ok")
    first.close()
    first.close()  # closing twice lets go once
    assert second.call(lambda: "ok") == "ok"
    assert second.metrics().calls == 1
    assert connections(redis_client, label) >= 1
    second.close()
    wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")


def test_closing_one_of_two_asyncio_breakers_leaves_the_other_working(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    label = f"aclose1-{name}"
    url = f"{redis_url}?client_name={label}"

    async def ok() -> str:
        return "ok"

    async def scenario() -> None:
        first = aio.CircuitBreaker(f"{name}-a", redis=url)
        second = aio.Bulkhead(f"{name}-b", redis=url, max_concurrent_calls=1)
        await first.call(ok)
        await second.call(ok)
        await first.aclose()
        await first.aclose()
        assert await second.call(ok) == "ok"
        assert (await second.metrics()).in_use == 0
        assert connections(redis_client, label) >= 1
        await second.aclose()
        wait_until(lambda: connections(redis_client, label) == 0, what="connections gone")

    asyncio.run(scenario())


def test_memory_urls_still_work_and_close(name: str) -> None:
    url = f"memory://{name}"
    first = distbreaker.CircuitBreaker(f"{name}-a", redis=url)
    second = distbreaker.CircuitBreaker(f"{name}-b", redis=url)
    first.call(lambda: "ok")
    first.close()
    assert second.call(lambda: "ok") == "ok"
    second.close()


def test_creating_and_closing_breakers_in_a_loop_reuses_one_listener_connection(
        name: str, redis_url: str) -> None:
    """A process that builds a breaker per request on its own bounded client: each
    close used to leave the pub/sub listener's connection held until the thread's next
    wake (up to 1 s) while the next breaker started another, so the pool ran dry
    ("Too many connections") and breakers fell back to local state."""
    client = redis.Redis.from_url(redis_url, max_connections=8)
    try:
        for i in range(300):
            # fail_closed: a call that could not reach Redis raises instead of passing.
            breaker = distbreaker.CircuitBreaker(f"{name}-{i % 5}", redis=client,
                                                 allow_fault_injection=True,
                                                 on_redis_error="fail_closed")
            assert breaker.call(lambda: "ok") == "ok"
            breaker.close()
        # The caller's connection plus one listener per kind (transitions, faults).
        assert client.connection_pool._created_connections <= 4
    finally:
        client.close()
