"""The registry against a real redis-server: fleet-wide state across processes, keyed
instances, policies end to end, and the asyncio registry across event loops."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import distbreaker.aio
from distbreaker import CallNotPermitted, CircuitBreaker, Registry, State
from distbreaker.registry.aio import LoopBoundClient

CONFIG = """\
redis: ${REDIS_URL}
breakers:
  configs:
    default: {sliding_window_size: 4, minimum_number_of_calls: 4,
              wait_duration_in_open_state: 30s}
  instances:
    payments: {minimum_number_of_calls: 2, critical: true}
bulkheads: {instances: {payments: {max_concurrent_calls: 2}}}
budgets: {instances: {payments: {min_retries_per_sec: 0.1, percent_can_retry: 0.0, ttl: 10s}}}
policies:
  instances:
    payments: {breaker: payments, bulkhead: payments, budget: payments,
               retry: {max_attempts: 3, base: 1ms, cap: 1ms, retry_on: [ConnectionError]}}
"""

PROBE = """
import json, sys
from distbreaker import Registry
registry = Registry.from_file(sys.argv[1])
breaker = registry.breaker("payments")
print(json.dumps({"state": breaker.state.value,
                  "minimum": breaker.config.minimum_number_of_calls}))
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "resilience.yaml"
    path.write_text(CONFIG)
    return path


def _fail(*_: object) -> None:
    raise ConnectionError("upstream down")


def test_a_breaker_tripped_through_one_registry_is_open_in_another_process(
        redis_url: str, config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    registry = Registry.from_file(config_file)
    breaker = registry.breaker("payments")
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(_fail)
    assert breaker.state is State.OPEN
    env = {**os.environ, "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS": "3"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(config_file)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == {"state": "OPEN", "minimum": 3}
    registry.close()


def test_a_registry_policy_retries_within_its_budget_then_opens(
        redis_url: str, config_file: Path) -> None:
    registry = Registry.from_file(config_file, environ={"REDIS_URL": redis_url})
    policy = registry.policy("payments")
    attempts = []

    def flaky() -> None:
        attempts.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        policy.call(flaky)
    assert len(attempts) == 2  # the second failure opened the breaker: no third attempt
    assert registry.breaker("payments").state is State.OPEN
    with pytest.raises(CallNotPermitted):
        policy.call(flaky)
    assert registry.bulkhead("payments").metrics().in_use == 0


def test_keyed_breakers_have_their_own_fleet_state(redis_url: str, config_file: Path) -> None:
    registry = Registry.from_file(config_file, environ={"REDIS_URL": redis_url})
    tenant_a = registry.breaker("llm", key="a")
    tenant_b = registry.breaker("llm", key="b")
    tenant_a.trip("tenant a's quota")
    assert tenant_a.state is State.OPEN
    assert tenant_b.state is State.CLOSED
    assert tenant_b.call(lambda: "ok") == "ok"
    again = Registry.from_file(config_file, environ={"REDIS_URL": redis_url})
    assert again.breaker("llm", key="a").state is State.OPEN  # the fleet's, not the object's


def test_one_connection_serves_every_component(redis_url: str, config_file: Path,
                                               redis_client: object) -> None:
    """Every component's commands share one connection; the transitions subscriber
    (pub/sub needs a connection of its own) may hold one more, taken from the same pool."""
    known = {c["id"] for c in redis_client.client_list()}  # type: ignore[attr-defined]
    registry = Registry.from_file(config_file, environ={"REDIS_URL": redis_url})
    registry.policy("payments").call(lambda: "ok")
    registry.breaker("other").call(lambda: "ok")
    registry.bulkhead("payments").metrics()
    registry.budget("payments").balance()
    new = [c for c in redis_client.client_list()  # type: ignore[attr-defined]
           if c["id"] not in known]
    commands = [c for c in new if int(c["sub"]) + int(c["psub"]) + int(c["ssub"]) == 0]
    subscribers = [c for c in new if c not in commands]
    assert len(commands) == 1, new
    assert len(subscribers) <= 1, new
    registry.close()


def test_asyncio_registry_serves_several_event_loops(redis_url: str,
                                                     config_file: Path) -> None:
    registry = distbreaker.aio.Registry.from_file(config_file,
                                                  environ={"REDIS_URL": redis_url})
    assert isinstance(registry.client, LoopBoundClient)
    policy = registry.policy("payments")
    assert isinstance(policy, distbreaker.aio.Policy)
    assert policy.breaker is registry.breaker("payments")

    async def ok() -> str:
        return "ok"

    async def down() -> None:
        raise ConnectionError("down")

    async def first() -> State:
        assert await policy.call(ok) == "ok"
        with pytest.raises(ConnectionError):  # 1 of 2 calls failed: 50 %, the breaker opens
            await registry.breaker("payments").call(down)
        state = await registry.breaker("payments").get_state()
        await registry.aclose()
        return state

    async def second() -> State:
        with pytest.raises(CallNotPermitted):
            await policy.call(ok)
        tenant = registry.breaker("llm", key="t")
        assert await tenant.call(ok) == "ok"
        state = await registry.breaker("payments").get_state()
        await registry.aclose()
        return state

    assert asyncio.run(first()) is State.OPEN
    assert asyncio.run(second()) is State.OPEN   # a new loop: a new client, same fleet state


def test_close_closes_what_the_registry_built_so_batched_outcomes_are_not_lost(
        redis_url: str) -> None:
    registry = Registry.from_dict({"breakers": {"instances": {"batched": {
        "record_mode": "batched", "flush_interval": 60, "redis_timeout": 5.0}}}},
        redis=redis_url, environ={})
    breaker = registry.breaker("batched")
    for _ in range(5):
        breaker.call(lambda: "ok")
    reader = CircuitBreaker("batched", redis=redis_url, redis_timeout=5.0)
    assert reader.metrics().calls == 0  # still pending in this process (flushed each minute)
    registry.close()
    assert reader.metrics().calls == 5
    reader.close()
