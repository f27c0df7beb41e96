"""A process that loses Redis keeps the last fleet state it saw (issue 23).

Real worker processes, a real redis-server that is killed (then restarted) or made full
(maxmemory with noeviction): a known OPEN stays OPEN until its wait ends, then each
process sends at most the configured probes, recorded by its local fallback.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker, Policy, aio
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import CallNotPermitted
from tests.helpers.processes import collect, reap
from tests.helpers.waiting import wait_until

FORK = multiprocessing.get_context("fork")
WORKERS = 6
#: Phases the parent announces: the workers count dependency calls per phase.
BEFORE, DOWN, AFTER, STOP = 0, 1, 2, 3


class Down(Exception):
    pass


def _worker(url: str, name: str, config: dict[str, Any], phase: Any, ready: Any,
            results: Any) -> None:
    """Call a failing dependency through a CircuitBreaker and a Policy until STOP; report
    how many calls reached it in each phase."""
    breaker = CircuitBreaker(f"{name}-cb", redis=url, **config)
    policy = Policy(f"{name}-p", redis=url, breaker=config, retry=False)
    reached = {"cb": [0, 0, 0], "policy": [0, 0, 0]}
    calls = 0

    def dependency(kind: str) -> None:
        reached[kind][min(phase.value, AFTER)] += 1
        raise Down("dependency down")

    while phase.value != STOP:
        for kind, run in (("cb", breaker.call), ("policy", policy.call)):
            try:
                run(dependency, kind)
            except (Down, CallNotPermitted):
                pass
        calls += 1
        if calls == 20:
            ready.release()
        time.sleep(0.002)
    results.put(reached)


def _worker_aio(url: str, name: str, config: dict[str, Any], phase: Any, ready: Any,
                results: Any) -> None:
    """`_worker` with the asyncio CircuitBreaker and Policy."""

    async def main() -> None:
        breaker = aio.CircuitBreaker(f"{name}-cb", redis=url, **config)
        policy = aio.Policy(f"{name}-p", redis=url, breaker=config, retry=False)
        reached = {"cb": [0, 0, 0], "policy": [0, 0, 0]}
        calls = 0

        async def dependency(kind: str) -> None:
            reached[kind][min(phase.value, AFTER)] += 1
            raise Down("dependency down")

        while phase.value != STOP:
            for kind, run in (("cb", breaker.call), ("policy", policy.call)):
                try:
                    await run(dependency, kind)
                except (Down, CallNotPermitted):
                    pass
            calls += 1
            if calls == 20:
                ready.release()
            await asyncio.sleep(0.002)
        results.put(reached)

    asyncio.run(main())


WORKERS_OF = {"sync": _worker, "asyncio": _worker_aio}


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.stop()


def _run_fleet(server: RedisServer, name: str, config: dict[str, Any],
               fault: Any, heal: Any, down_for: float, reap_list: list[Any],
               flavour: str = "sync") -> list[Any]:
    phase = FORK.Value("i", BEFORE)
    ready = FORK.Semaphore(0)
    results = FORK.Queue()
    workers = [FORK.Process(target=WORKERS_OF[flavour], args=(
        server.url, name, config, phase, ready, results)) for _ in range(WORKERS)]
    reap_list += workers
    for process in workers:
        process.start()
    for _ in workers:  # every worker has seen the OPEN breakers
        assert ready.acquire(timeout=60)
    fault()
    phase.value = DOWN
    time.sleep(down_for)
    phase.value = AFTER
    heal()
    time.sleep(0.3)
    phase.value = STOP
    reached = collect(results, WORKERS, timeout=60)
    reap(workers)
    return reached


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_known_open_survives_a_redis_kill(server: RedisServer, name: str,
                                            reap: list[Any], flavour: str) -> None:
    """Both breakers OPEN with 60 s left; Redis killed for 2 s: no process sends more
    than 3 calls to the failing dependency (it was 76-137 per process)."""
    config = {"wait_duration_in_open_state": 60.0, "revalidate_interval": 0.2,
              "permitted_calls_in_half_open": 3, "redis_timeout": 5.0,
              "redis_retry_max_backoff": 0.2}
    for suffix in ("cb", "p"):
        CircuitBreaker(f"{name}-{suffix}", redis=server.url, **config).trip("test")
    reached = _run_fleet(server, name, config, server.kill, server.start, 2.0, reap,
                         flavour)
    for process in reached:
        assert process["cb"][DOWN] <= 3, reached
        assert process["policy"][DOWN] <= 3, reached
        assert process["cb"][BEFORE] == 0 and process["policy"][BEFORE] == 0, reached


def test_a_full_redis_keeps_the_stored_open_and_probes_locally(server: RedisServer, name: str,
                                                               reap: list[Any]) -> None:
    """Redis full (noeviction): the stored OPEN's wait ends, the probe's write is refused;
    each process probes locally within permitted_calls_in_half_open (2), the local
    fallback records the failed probes and stays OPEN; the stored state stays OPEN."""
    config = {"wait_duration_in_open_state": 60.0, "revalidate_interval": 0.2,
              "permitted_calls_in_half_open": 2, "redis_timeout": 5.0,
              "redis_retry_max_backoff": 0.2}
    admin = redis.Redis.from_url(server.url)
    for suffix in ("cb", "p"):  # the stored wait ends 1.5 s from now
        CircuitBreaker(f"{name}-{suffix}", redis=server.url, **config).trip("test", for_=1.5)

    def fill() -> None:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)  # below what is used: every write is refused

    def unfill() -> None:
        admin.config_set("maxmemory", 0)

    reached = _run_fleet(server, name, config, fill, unfill, 3.0, reap)
    for process in reached:
        assert process["cb"][DOWN] <= 2, reached
        assert process["policy"][DOWN] <= 2, reached
    assert sum(p["cb"][DOWN] for p in reached) >= 1, reached  # the probes did run
    # the stored state never moved (every write was refused): still OPEN in Redis
    admin.config_set("maxmemory", 0)
    stored = CircuitBreaker(f"{name}-cb", redis=server.url, **config)
    wait_until(lambda: stored.state in (State.OPEN, State.HALF_OPEN),
               what="the stored state is read")
    admin.close()
