"""The core behaviour tests, on a real 3-primary Redis Cluster through redis-py's
RedisCluster clients (sync and asyncio): the seed scenario, the half-open probe cap,
the bulkhead limit under threads, the retry budget, a composed Policy, pub/sub events,
the history stream and the CLI's scan of every primary."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.cluster import RedisCluster

from distbreaker import Bulkhead, CircuitBreaker, RetryBudget, aio
from distbreaker._runtime.keys import BreakerKeys, events_channel
from distbreaker.breaker.state import State
from distbreaker.cli.app import cli
from distbreaker.demo.embedded import EmbeddedCluster
from distbreaker.errors import CallNotPermitted
from distbreaker.policy.sync import Policy
from distbreaker.readside import decode_event_message, read_history
from tests.helpers.dependency import SEED, Dependency, outcome_async, run_requests
from tests.helpers.waiting import wait_until


def test_seed_scenario_on_the_cluster(cluster_client: RedisCluster, name: str) -> None:
    breaker = CircuitBreaker(name, redis=cluster_client, **SEED)
    dep = Dependency(healthy=False)
    assert run_requests(lambda: breaker.call(dep), 8) == ["failed"] * 5 + ["rejected"] * 3
    assert dep.calls == 5 and breaker.state is State.OPEN
    assert breaker.metrics().failure_rate == 100.0
    time.sleep(1.05)
    dep.healthy = True
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.HALF_OPEN
    assert breaker.call(dep) == "ok"
    assert breaker.state is State.CLOSED
    assert dep.calls == 7
    assert not breaker._health.down  # every call went to the cluster, none to the fallback


def test_half_open_hands_out_only_the_permitted_probes(cluster_client: RedisCluster,
                                                       name: str) -> None:
    breaker = CircuitBreaker(name, redis=cluster_client, **SEED)
    breaker.trip()
    time.sleep(1.05)
    granted: list[Any] = []
    rejected = 0
    lock = threading.Lock()
    gate = threading.Barrier(8)

    def probe() -> None:
        nonlocal rejected
        other = CircuitBreaker(name, redis=cluster_client, **SEED)  # like another worker
        gate.wait()
        try:
            permit = other.acquire()
        except CallNotPermitted:
            with lock:
                rejected += 1
        else:
            with lock:
                granted.append(permit)

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(granted) == 2 and rejected == 6
    assert breaker.state is State.HALF_OPEN
    assert cluster_client.zcard(BreakerKeys.build(name).probes) == 2


def test_bulkhead_limit_holds_across_threads(cluster_client: RedisCluster, name: str) -> None:
    running = peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.1)
        with lock:
            running -= 1

    bulkhead = Bulkhead(name, redis=cluster_client, max_concurrent_calls=3,
                        max_wait_duration=10)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(3):
                bulkhead.call(work)
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert peak == 3  # the limit was reached and never passed
    metrics = bulkhead.metrics()
    assert metrics.in_use == 0


def test_bulkhead_waits_longer_than_the_socket_timeout(cluster_client: RedisCluster,
                                                       name: str) -> None:
    """BLPOP on a cluster client is bounded by its nodes' socket timeout (1 s here), so a
    2 s wait is several bounded blocks, not a timeout mistaken for an outage."""
    bulkhead = Bulkhead(name, redis=cluster_client, max_concurrent_calls=1,
                        max_wait_duration=60)
    held = bulkhead.acquire()
    releaser = threading.Timer(2.0, bulkhead.release, args=(held,))
    releaser.start()
    started = time.monotonic()
    permit = bulkhead.acquire()
    waited = time.monotonic() - started
    bulkhead.release(permit)
    releaser.join()
    # woken by the release (not let in at the first 1 s socket timeout, not given up)
    assert 1.8 < waited < 60
    assert not bulkhead._codec.health.down


def test_retry_budget_allowance(cluster_client: RedisCluster, name: str) -> None:
    budget = RetryBudget(name, redis=cluster_client, percent_can_retry=0.2,
                         min_retries_per_sec=0)
    for _ in range(50):
        budget.deposit()
    assert budget.balance() == 10
    taken = 0
    while budget.try_withdraw():
        taken += 1
    assert taken == 10 and budget.last_source == "redis"


def test_rate_limiter_keyed_instances_on_the_cluster(cluster_client: RedisCluster,
                                                     name: str) -> None:
    from distbreaker import RateLimiter

    limiter = RateLimiter(name, redis=cluster_client, limit_for_period=3,
                          limit_refresh_period=3600, timeout_duration=0)
    for key in (None, "a", "b", "c"):  # each instance its own hash tag, maybe another node
        assert sum(limiter.try_acquire(key=key) for _ in range(5)) == 3
        assert limiter.metrics(key=key).calls == 3
    assert not limiter.local_fallback_active


def test_policy_call_retries_within_the_budget(cluster_client: RedisCluster, name: str) -> None:
    attempts = 0

    def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts % 2:
            raise ConnectionError("blip")
        return "ok"

    policy = Policy(name, redis=cluster_client,
                    breaker={"sliding_window_size": 20, "minimum_number_of_calls": 20},
                    bulkhead={"max_concurrent_calls": 2},
                    retry={"max_attempts": 2, "base": 0.0, "cap": 0.0},
                    budget={"percent_can_retry": 1.0, "min_retries_per_sec": 0},
                    sleep=lambda s: None)
    assert [policy.call(flaky) for _ in range(5)] == ["ok"] * 5
    assert attempts == 10
    metrics = policy.breaker.metrics()
    assert (metrics.calls, metrics.failed) == (10, 5)
    assert policy.bulkhead is not None and policy.bulkhead.metrics().in_use == 0


def _wait_message(pubsub: Any) -> dict[str, Any]:
    def event() -> dict[str, Any] | None:
        message = pubsub.get_message(timeout=0.2)
        if message and message.get("type") == "message":
            return decode_event_message(message["data"])
        return None

    return wait_until(event, interval=0, what="a transition event is received")


def test_events_reach_subscribers_on_every_node_and_the_history(
        cluster: EmbeddedCluster, cluster_client: RedisCluster, name: str) -> None:
    """PUBLISH from inside a script is broadcast over the cluster bus."""
    channel = events_channel()
    nodes = [redis.Redis(port=port) for port in cluster.ports]
    per_node = [node.pubsub(ignore_subscribe_messages=True) for node in nodes]
    for pubsub in per_node:
        pubsub.subscribe(channel)
    cluster_pubsub = cluster_client.pubsub(ignore_subscribe_messages=True)
    cluster_pubsub.subscribe(channel)
    try:
        time.sleep(0.1)
        breaker = CircuitBreaker(name, redis=cluster_client, **SEED)
        breaker.trip(reason="cluster pubsub test", actor="pytest")
        for pubsub in [cluster_pubsub, *per_node]:
            event = _wait_message(pubsub)
            assert (event["name"], event["from"], event["to"]) == (name, "CLOSED", "OPEN")
            assert event["reason"] == "cluster pubsub test"
        history = read_history(cluster_client, "distbreaker", name, 10)
        assert [(e["from"], e["to"], e["actor"]) for e in history] == [
            ("CLOSED", "OPEN", "pytest")]
    finally:
        cluster_pubsub.close()
        for pubsub, node in zip(per_node, nodes, strict=True):
            pubsub.close()
            node.close()


def test_cli_ls_and_show_scan_every_primary(cluster: EmbeddedCluster,
                                             cluster_client: RedisCluster, name: str) -> None:
    prefix = f"clitest{name.replace('-', '')}"
    by_node: dict[str, str] = {}
    i = 0
    while len(by_node) < 3:  # one breaker on each primary
        candidate = f"{name}-{i}"
        node = cluster_client.get_node_from_key(BreakerKeys.build(candidate, prefix).state)
        by_node.setdefault(node.name, candidate)
        i += 1
    for candidate in by_node.values():
        breaker = CircuitBreaker(candidate, redis=cluster_client, prefix=prefix, **SEED)
        breaker.call(lambda: None)
    opened = next(iter(by_node.values()))
    CircuitBreaker(opened, redis=cluster_client, prefix=prefix, **SEED).trip()

    result = CliRunner().invoke(cli, ["--url", cluster.url, "--prefix", prefix, "ls", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r["state"] for r in json.loads(result.stdout)["breakers"]}
    assert rows == {n: ("OPEN" if n == opened else "CLOSED") for n in by_node.values()}
    for candidate in by_node.values():
        shown = CliRunner().invoke(cli, ["--url", cluster.url, "--prefix", prefix, "show",
                                         candidate, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["breaker"]["calls"] == 1

    def cli_json(*args: str) -> list[dict[str, Any]]:
        done = CliRunner().invoke(cli, ["--url", cluster.url, "--prefix", prefix, *args,
                                        "--json"])
        assert done.exit_code == 0, done.output
        return [json.loads(line) for line in done.stdout.splitlines()]

    # many names: the brief read, a page, a selector's dry run and action (pipelines
    # across the primaries)
    top = json.loads(CliRunner().invoke(cli, ["--url", cluster.url, "--prefix", prefix, "ls",
                                              "--top", "1", "--by", "calls", "--json",
                                              "--state", "closed"]).stdout)
    assert [r["state"] for r in top["breakers"]] == ["CLOSED"]
    page = json.loads(CliRunner().invoke(cli, ["--url", cluster.url, "--prefix", prefix, "ls",
                                               "--limit", "1", "--page", "2", "--json"]).stdout)
    assert [r["name"] for r in page["breakers"]] == sorted(by_node.values())[1:2]
    plans = cli_json("close", f"{name}-*", "--dry-run")
    assert sorted(p["name"] for p in plans) == sorted(by_node.values())
    assert [p["name"] for p in plans if p["would_change"]] == [opened]
    closed = cli_json("close", f"{name}-*", "--yes", "--reason", "cluster selector")
    assert {r["name"]: r["changed"] for r in closed} == {
        n: n == opened for n in by_node.values()}


def test_asyncio_breaker_and_policy_on_an_async_cluster_client(cluster: EmbeddedCluster,
                                                               name: str) -> None:
    async def scenario() -> None:
        client = cluster.async_client(socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            breaker = aio.CircuitBreaker(name, redis=client, **SEED)
            dep = Dependency(healthy=False)

            async def call() -> str:
                return dep()

            outcomes = [await outcome_async(lambda: breaker.call(call)) for _ in range(7)]
            assert outcomes == ["failed"] * 5 + ["rejected"] * 2
            assert await breaker.get_state() is State.OPEN
            assert not breaker._health.down
            policy = aio.Policy(name + "-policy", redis=client,
                                bulkhead={"max_concurrent_calls": 2, "max_wait_duration": 10},
                                budget={"min_retries_per_sec": 1})

            async def ok() -> str:
                await asyncio.sleep(0.6)  # 3 rounds of 2: waiters block past the 1 s timeout
                return "ok"

            assert await asyncio.gather(*(policy.call(ok) for _ in range(6))) == ["ok"] * 6
            metrics = await policy.breaker.metrics()
            assert metrics.calls == 6
            assert policy.bulkhead is not None and not policy.bulkhead._codec.health.down
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_sync_and_async_cluster_clients_are_checked(cluster: EmbeddedCluster) -> None:
    with pytest.raises(TypeError, match="asyncio breaker"):
        aio.CircuitBreaker("typecheck", redis=cluster.client())
    with pytest.raises(TypeError, match="sync breaker"):
        CircuitBreaker("typecheck", redis=cluster.async_client())


def test_a_plain_url_to_a_cluster_node_gives_one_clear_error(cluster: EmbeddedCluster,
                                                             cluster_client: RedisCluster,
                                                             name: str) -> None:
    """MOVED is a misconfiguration, not an outage: it names the fix instead of failing open."""
    elsewhere = next(f"{name}-{i}" for i in range(100)
                     if cluster_client.get_node_from_key(BreakerKeys.build(f"{name}-{i}").state)
                     .port != cluster.ports[0])
    breaker = CircuitBreaker(elsewhere, redis=cluster.url)
    with pytest.raises(TypeError, match=r"pass a redis\.cluster\.RedisCluster client"):
        breaker.call(lambda: None)


def test_check_passes_on_every_components_slot(cluster_client: RedisCluster, name: str) -> None:
    """check()'s write-free script is routed by the component's key, like its calls."""
    for component in (CircuitBreaker(name, redis=cluster_client),
                      Bulkhead(name, redis=cluster_client, max_concurrent_calls=2),
                      RetryBudget(name, redis=cluster_client),
                      Policy(f"{name}-p", redis=cluster_client)):
        component.check()


def test_a_pool_is_read_on_the_cluster(cluster_client: RedisCluster, name: str) -> None:
    """`distbreaker pool show` and the dashboard read a pool's status on a cluster too."""
    from distbreaker import Pool
    from distbreaker.readside_pool import read_pool

    pool = Pool(name, members=["a:80", "b:80"], redis=cluster_client)
    pick = pool.pick()
    assert pick is not None
    pool.record(pick, None)
    status = read_pool(cluster_client, "distbreaker", name)
    assert status is not None and {m.member for m in status.members} == {"a:80", "b:80"}
