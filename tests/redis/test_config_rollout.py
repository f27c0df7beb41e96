"""The config rollout rule (docs/OPERATIONS.md, "Changing a breaker's config"), with
several breaker objects of one process as several workers (each is its own worker
instance): a window-shape change keeps the state, explicit versions order configs, a
config in force that no worker runs any more is replaced, an operator promotes one."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.breaker.state import State
from distbreaker.errors import ConfigDriftWarning
from tests.helpers.cli import run

BASE = {"sliding_window_size": 10, "minimum_number_of_calls": 4,
        "failure_rate_threshold": 50.0, "wait_duration_in_open_state": 60.0,
        "redis_timeout": 5.0}


def make(name: str, url: str, **options: Any) -> CircuitBreaker:
    return CircuitBreaker(name, redis=url, **{**BASE, **options})


def boom() -> None:
    raise ConnectionError("down")


def fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(ConnectionError):
            breaker.call(boom)


def in_force(url: str, name: str) -> dict[str, Any]:
    shown = json.loads(run(url, "show", name, "--json").stdout)["breaker"]
    return {"fp": shown["config_in_force"]["fingerprint"], "why":
            shown["config_in_force"]["why"], "window": shown["window"]["calls"],
            "state": shown["state"], "open_until": shown["open_until_ms"],
            "size": shown["config"]["sliding_window_size"]}


def test_a_new_window_shape_starts_a_new_window_but_open_stays_open(
        name: str, redis_url: str) -> None:
    old = make(name, redis_url)
    fail(old, 4)
    before = in_force(redis_url, name)
    assert before["state"] == "OPEN" and before["window"] == 4
    new = make(name, redis_url, sliding_window_size=20)
    with pytest.raises(Exception):  # noqa: B017 - rejected: OPEN stays OPEN
        new.call(lambda: None)
    after = in_force(redis_url, name)
    assert after["fp"] == str(new._codec.fingerprint) and after["size"] == 20
    assert after["state"] == "OPEN" and after["open_until"] == before["open_until"]
    assert after["window"] == 0  # a window of another shape cannot be carried over


def test_a_threshold_change_keeps_the_window_and_takes_effect_at_once(
        name: str, redis_url: str) -> None:
    old = make(name, redis_url)
    old.call(lambda: None)
    old.call(lambda: None)
    fail(old, 1)                       # 1 of 3 failed: under 50 %
    new = make(name, redis_url, failure_rate_threshold=40.0)
    fail(new, 1)                       # 2 of 4 = 50 % >= 40 %: the new threshold trips
    assert new.state is State.OPEN
    assert in_force(redis_url, name)["why"] == "newest deployment"


def test_config_version_orders_configs_before_deploy_time(name: str, redis_url: str) -> None:
    v2 = make(name, redis_url, config_version=2)
    v2.call(lambda: None)
    v1 = make(name, redis_url, config_version=1, failure_rate_threshold=30.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v1.call(lambda: None)         # deployed later, but a lower version
    drift = [str(w.message) for w in caught if issubclass(w.category, ConfigDriftWarning)]
    assert len(drift) == 1 and "config_version 2 is in force, this process has 1" in drift[0]
    assert in_force(redis_url, name)["fp"] == str(v2._codec.fingerprint)
    v3 = make(name, redis_url, config_version=3, failure_rate_threshold=40.0)
    v3.call(lambda: None)
    state = in_force(redis_url, name)
    assert state["fp"] == str(v3._codec.fingerprint) and state["why"] == "higher config version"
    assert state["window"] == 3


def test_a_config_no_live_worker_runs_is_replaced_at_the_next_hello(
        name: str, redis_url: str) -> None:
    older = make(name, redis_url, failure_rate_threshold=30.0)
    older.call(lambda: None)
    newer = make(name, redis_url)
    newer.call(lambda: None)          # the newest deployment: in force
    assert in_force(redis_url, name)["fp"] == str(newer._codec.fingerprint)
    newer.close()                     # its only worker leaves (goodbye)
    older._codec._next_hello = 0.0    # older's next hello is due (every 20 s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        older.call(lambda: None)
    state = in_force(redis_url, name)
    assert state["fp"] == str(older._codec.fingerprint)
    assert state["why"] == "no worker runs the config in force" and state["window"] == 3


def test_an_operator_adopts_a_deployed_config_keeping_window_and_state(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    older = make(name, redis_url, failure_rate_threshold=30.0)
    older.call(lambda: None)
    newer = make(name, redis_url)
    newer.call(lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        older.call(lambda: None)
    nothing = run(redis_url, "config", "adopt", name, "--fingerprint", "123")
    assert nothing.exit_code == 1 and "no deployed config" in nothing.stderr
    adopted = json.loads(run(redis_url, "config", "adopt", name, "--json",
                             "--actor", "dana").stdout)
    assert adopted["fingerprint"] == str(older._codec.fingerprint)
    assert adopted["changed"] == [{"field": "failure_rate_threshold", "was": 50.0,
                                   "now": 30.0}]
    assert adopted["window_kept"] is True
    state = in_force(redis_url, name)
    assert state["fp"] == str(older._codec.fingerprint) and state["window"] == 3
    assert state["why"] == "operator" and state["state"] == "CLOSED"
    # it is now the newest deployment: the newer config's next hello does not take over
    newer._codec._next_hello = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        newer.call(lambda: None)
    assert in_force(redis_url, name)["fp"] == str(older._codec.fingerprint)
    assert not redis_client.exists(f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:cfgs")


def test_prometheus_counts_the_workers_of_each_deployed_config(
        name: str, redis_url: str) -> None:
    from prometheus_client import CollectorRegistry

    from distbreaker.contrib.prometheus import DistbreakerCollector

    older = make(name, redis_url, failure_rate_threshold=30.0)
    older.call(lambda: None)
    newer = [make(name, redis_url) for _ in range(2)]
    for breaker in newer:
        breaker.call(lambda: None)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[name]))
    samples = {(s.labels["fingerprint"], s.labels["in_force"]): s.value
               for family in registry.collect() for s in family.samples
               if s.name == "distbreaker_breaker_config_workers" and s.labels["name"] == name}
    assert samples == {(str(newer[0]._codec.fingerprint), "1"): 2,
                       (str(older._codec.fingerprint), "0"): 1}


def test_an_asyncio_breaker_says_hello_and_goodbye(name: str, redis_url: str,
                                                   redis_client: redis.Redis) -> None:
    import asyncio

    from distbreaker.aio import CircuitBreaker as AsyncBreaker

    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:meta"

    async def run() -> tuple[int, int]:
        breaker = AsyncBreaker(name, redis=redis_url, **BASE)
        await breaker.call(_ok)
        workers = [f for f in redis_client.hkeys(key) if f.startswith(b"w:")]
        await breaker.aclose()
        left = [f for f in redis_client.hkeys(key) if f.startswith(b"w:")]
        return len(workers), len(left)

    assert asyncio.run(run()) == (1, 0)


async def _ok() -> str:
    return "ok"


def test_deployments_in_the_same_millisecond_do_not_flip_the_config_in_force(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    old = make(name, redis_url, failure_rate_threshold=30.0)
    old.call(lambda: None)                      # A deployed, then B: B is the newer
    new = make(name, redis_url)
    new.call(lambda: None)
    assert in_force(redis_url, name)["fp"] == str(new._codec.fingerprint)
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:meta"
    deployed = {k: v for k, v in redis_client.hgetall(key).items() if k.startswith(b"d:")}
    assert len(deployed) == 2
    redis_client.hset(key, mapping=dict.fromkeys(deployed, max(deployed.values())))
    # another instance of A says hello: A is running (old), so this hello deploys
    # nothing; a tie on the deployment time must not hand A the fleet back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        make(name, redis_url, failure_rate_threshold=30.0).call(lambda: None)
    assert in_force(redis_url, name)["fp"] == str(new._codec.fingerprint)


def test_the_rollout_hash_stores_wires_only_for_configs_not_in_force(
        name: str, redis_url: str) -> None:
    """The config in force keeps its wire in the meta hash only (no `c:<fp>` copy); an
    adoption stores the replaced config's wire and drops the adopted one's; `show` lists
    every deployed config with its wire all along."""
    client = redis.Redis.from_url(redis_url)
    key = f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb:meta"
    v1 = make(name, redis_url, config_version=1)
    v1.call(lambda: None)
    fp1, wire1 = v1._codec.fingerprint, v1._codec.wire
    assert client.hget(key, f"c:{fp1}") is None        # in force: the meta hash has it
    client.hset(key, f"c:{fp1}", wire1)                # as an older client stored it
    v0 = make(name, redis_url, config_version=0, failure_rate_threshold=30.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        v0.call(lambda: None)                          # a lower version: not adopted
    fp0 = v0._codec.fingerprint
    assert client.hget(key, f"c:{fp1}") is None        # the old copy dropped at the hello
    assert client.hget(key, f"c:{fp0}") == v0._codec.wire.encode()
    v2 = make(name, redis_url, config_version=2, failure_rate_threshold=40.0)
    v2.call(lambda: None)                              # adopted: higher version
    fp2 = v2._codec.fingerprint
    assert in_force(redis_url, name)["fp"] == str(fp2)
    assert client.hget(key, f"c:{fp2}") is None
    assert client.hget(key, f"c:{fp1}") == wire1.encode()  # the replaced one's wire
    shown = json.loads(run(redis_url, "show", name, "--json").stdout)["breaker"]["configs"]
    assert {c["fingerprint"]: c["wire"] for c in shown} == {
        str(fp2): v2._codec.wire, str(fp1): wire1, str(fp0): v0._codec.wire}
    for breaker in (v0, v1, v2):
        breaker.close()
    client.close()
