"""The fleet-wide rate limiter on a real redis-server (lua/ratelimiter.lua). Tests taking
`flavour` run with the sync and the asyncio RateLimiter."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest
import redis

import distbreaker
import distbreaker.aio
from distbreaker._runtime.scripts import load_script, run_script
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import RedisUnavailable, RequestNotPermitted, SchemaError
from distbreaker.ratelimiter.config import RateLimiterConfig
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import await_until, wait_until

SCRIPT = load_script("ratelimiter")


def granted(limiter: Any, tries: int, permits: int = 1, **kw: Any) -> int:
    """How many of `tries` immediate acquires (timeout 0) were granted."""
    return sum(bool(limiter.try_acquire(permits, timeout=0, **kw)) for _ in range(tries))


def test_a_full_bucket_grants_the_limit_at_once_then_refuses(redis_url: str, name: str,
                                                            flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=10,
                                   limit_refresh_period=3600, timeout_duration=0,
                                   redis_timeout=5)
    assert granted(limiter, 25) == 10
    with pytest.raises(RequestNotPermitted) as refused:
        limiter.acquire()
    assert refused.value.permits == 1 and not refused.value.local
    assert 300 < refused.value.retry_after <= 360   # one permit per 360 s
    m = limiter.metrics()
    assert (m.calls, m.permits, m.rejected, m.available_permissions) == (10, 10, 16, 0)
    assert m.rejected_here == 16


def test_a_waiting_call_is_granted_within_its_timeout(redis_url: str, name: str,
                                                      flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=1,
                                   limit_refresh_period=4, timeout_duration=20,
                                   redis_timeout=5)
    limiter.drain()                        # empty now: the next permit comes in 4 s
    started = time.monotonic()
    limiter.acquire()                      # reserved, then slept until it was due
    assert time.monotonic() - started >= 1.0   # (unless this machine stalled for 3 s)
    m = limiter.metrics()
    assert (m.calls, m.waited) == (1, 1)


def test_reservations_queue_in_the_order_they_reached_redis(redis_url: str, name: str,
                                                            flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=1,
                                   limit_refresh_period=1, timeout_duration=30,
                                   redis_timeout=5)
    reservations = [limiter.reserve() for _ in range(5)]
    waits = [r.wait for r in reservations]
    assert waits[0] == 0 and all(r.source == "redis" for r in reservations)
    runs = [r.run_at_ms for r in reservations]
    assert all(b - a >= 999 for a, b in itertools.pairwise(runs))   # one per second
    assert all(b > a for a, b in itertools.pairwise(waits))      # first come, first served
    m = limiter.metrics()
    assert m.available_permissions < 0                       # reserved by the waiters
    with pytest.raises(RequestNotPermitted):
        limiter.reserve(timeout=1)                           # the queue is longer than 1 s
    assert limiter.metrics().calls == 5


def test_weighted_permits_spend_their_weight(redis_url: str, name: str,
                                             flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=1000,
                                   limit_refresh_period=3600, timeout_duration=0,
                                   redis_timeout=5)
    assert granted(limiter, 5, permits=300) == 3             # 900 of 1000 tokens
    assert granted(limiter, 1, permits=100) == 1
    assert granted(limiter, 1, permits=1) == 0
    with pytest.raises(RequestNotPermitted) as too_big:
        limiter.acquire(1001)
    assert "burst" in too_big.value.reason and too_big.value.retry_after == 0
    assert limiter.metrics().permits == 1000


def test_drain_spends_what_the_bucket_holds(redis_url: str, name: str,
                                            flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=10,
                                   limit_refresh_period=3600, timeout_duration=0,
                                   redis_timeout=5)
    assert granted(limiter, 3) == 3
    assert limiter.drain().available_permissions == 0
    assert granted(limiter, 3) == 0


def test_a_changed_limit_governs_every_worker_until_reset(redis_url: str, name: str,
                                                          flavour: Flavour) -> None:
    one = flavour.rate_limiter(name, redis_url, limit_for_period=5, limit_refresh_period=60,
                               timeout_duration=0, redis_timeout=5)
    other = flavour.rate_limiter(name, redis_url, limit_for_period=50,
                                 limit_refresh_period=60, timeout_duration=0,
                                 redis_timeout=5)
    changed = one.change_limit_for_period(2)
    assert changed.overridden and changed.limit_for_period == 2 and changed.burst == 2
    assert granted(other, 10) == 2                  # the stored limit, not other's own 50
    assert other.reset_limit().limit_for_period == 50
    assert not other.metrics().overridden


def test_keyed_instances_have_their_own_buckets(redis_url: str, name: str,
                                                flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=2,
                                   limit_refresh_period=60, timeout_duration=0,
                                   redis_timeout=5)
    assert granted(limiter, 5, key="tenant-a") == 2
    assert granted(limiter, 5, key="tenant-b") == 2
    assert granted(limiter, 5) == 2
    assert limiter.metrics(key="tenant-a").calls == 2
    assert limiter.bucket_key("tenant-a").endswith(f"{{{name}:tenant-a}}:rl")


def test_fail_open_limits_each_process_to_its_share(name: str, flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, f"redis://127.0.0.1:{free_port()}/0",
                                   limit_for_period=12, limit_refresh_period=60,
                                   timeout_duration=0, expected_workers=4)
    assert granted(limiter, 10) == 3                 # 12 // 4 while Redis is unreachable
    assert limiter.local_fallback_active
    with pytest.raises(RequestNotPermitted) as refused:
        limiter.acquire()
    assert refused.value.local
    with pytest.raises(RedisUnavailable):
        limiter.metrics()


def test_fail_closed_refuses_while_redis_is_unreachable(name: str, flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, f"redis://127.0.0.1:{free_port()}/0",
                                   on_redis_error="fail_closed")
    with pytest.raises(RequestNotPermitted) as refused:
        limiter.acquire()
    assert "fail_closed" in refused.value.reason


def test_back_on_redis_after_an_outage(name: str, flavour: Flavour) -> None:
    with RedisServer() as server:
        limiter = flavour.rate_limiter(name, server.url, limit_for_period=3,
                                       limit_refresh_period=60, timeout_duration=0,
                                       redis_timeout=5)
        assert granted(limiter, 5) == 3
        server.kill()
        assert granted(limiter, 1) == 1 and limiter.local_fallback_active   # fresh local bucket
        server.start()

        def back() -> bool:
            limiter.try_acquire(timeout=0)
            return not limiter.local_fallback_active

        wait_until(back, interval=0.05, what="the limiter uses Redis again")
        assert limiter.metrics().calls >= 1


@pytest.mark.keys_without_ttl("writes foreign data into the bucket key by hand")
def test_foreign_data_is_a_schema_error(redis_url: str, redis_client: redis.Redis,
                                        name: str, flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, redis_timeout=5)
    redis_client.set(limiter.keys.bucket, "x")
    with pytest.raises(SchemaError):
        limiter.acquire()
    redis_client.delete(limiter.keys.bucket)
    redis_client.hset(limiter.keys.bucket, mapping={"v": "9", "tat": "0"})
    with pytest.raises(SchemaError):
        limiter.acquire()


def test_script_rejects_bad_arguments(redis_client: redis.Redis) -> None:
    key = "distbreaker:v2:{x}:rl"
    for args in (["acquire", "0", "1000", "1", "60000", "1", "0"],
                 ["acquire", "10", "1000", "10", "60000", "0", "0"],
                 ["acquire", "10000000", "10000000", "1", "60000", "1", "0"],  # > 9e12
                 ["nope", "10", "1000", "10", "60000"],
                 ["set", "10", "1000", "10", "60000", "0", "1", "1"]):
        with pytest.raises(ValueError):
            run_script(redis_client, SCRIPT, [key], args)
    assert not redis_client.exists(key)


def test_the_key_expires_when_idle(redis_url: str, redis_client: redis.Redis, name: str,
                                   flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, redis_timeout=5, key_ttl=20,
                                   timeout_duration=1, limit_refresh_period=1)
    limiter.acquire()
    assert 0 < redis_client.pttl(limiter.keys.bucket) <= 20_000


def test_events_reach_listeners(redis_url: str, name: str, flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=1,
                                   limit_refresh_period=60, timeout_duration=0,
                                   redis_timeout=5)
    seen: list[distbreaker.Event] = []
    limiter.add_listener(seen.append)
    limiter.try_acquire()
    limiter.try_acquire()
    assert [e.kind for e in seen] == ["permitted", "rejected"]
    assert isinstance(seen[1].error, RequestNotPermitted) and seen[0].component == "ratelimiter"


def test_change_timeout_duration_applies_to_this_process(redis_url: str, name: str,
                                                         flavour: Flavour) -> None:
    limiter = flavour.rate_limiter(name, redis_url, limit_for_period=1,
                                   limit_refresh_period=60, timeout_duration=0,
                                   redis_timeout=5)
    assert granted(limiter, 1) == 1
    assert not limiter.try_acquire()
    limiter.change_timeout_duration(120)
    assert 50 < limiter.reserve().wait <= 60       # now it may wait for the next permit
    assert limiter.timeout_duration == 120


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="limit_for_period"):
        RateLimiterConfig(limit_for_period=0)
    with pytest.raises(ValueError, match="key_ttl"):
        RateLimiterConfig(timeout_duration=3600, key_ttl=60)
    with pytest.raises(ValueError, match="on_redis_error"):
        RateLimiterConfig(on_redis_error="maybe")
    assert RateLimiterConfig(limit_for_period=7).effective_burst == 7


def test_sync_decorator_and_with_block(redis_url: str, name: str) -> None:
    limiter = distbreaker.RateLimiter(name, redis_url, limit_for_period=2,
                                      limit_refresh_period=60, timeout_duration=0,
                                      redis_timeout=5)

    @limiter
    def work(x: int) -> int:
        return x * 2

    assert work(2) == 4
    with limiter:
        pass
    with pytest.raises(RequestNotPermitted):
        work(3)


def test_sync_threads_waiting_are_all_served(redis_url: str, name: str) -> None:
    limiter = distbreaker.RateLimiter(name, redis_url, limit_for_period=5,
                                      limit_refresh_period=0.5, timeout_duration=10,
                                      redis_timeout=5)
    done: list[float] = []

    def one() -> None:
        limiter.acquire()
        done.append(time.monotonic())

    threads = [threading.Thread(target=one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(done) == 12 and limiter.metrics().calls == 12


def test_asyncio_decorator_context_and_cancelled_waiter(redis_url: str, name: str) -> None:
    async def main() -> None:
        limiter = distbreaker.aio.RateLimiter(name, redis_url, limit_for_period=1,
                                              limit_refresh_period=60, timeout_duration=120,
                                              redis_timeout=5)

        @limiter
        async def work() -> str:
            return "ok"

        assert await work() == "ok"
        waiter = asyncio.ensure_future(limiter.acquire())
        await await_until(lambda: limiter.waiting_here == 1, what="the waiter sleeps")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert limiter.waiting_here == 0
        other = distbreaker.aio.RateLimiter(name + "-b", redis_url, redis_timeout=5)
        async with other:
            pass
        assert (await other.metrics()).calls == 1
        await limiter.aclose()
        await other.aclose()

    asyncio.run(main())



# -- in a Policy: Retry( CircuitBreaker( RateLimiter( Bulkhead( call ) ) ) ) --------------
def test_policy_refusals_are_neither_retried_nor_counted_by_the_breaker(
        redis_url: str, name: str, flavour: Flavour) -> None:
    calls: list[int] = []
    policy = flavour.policy(name, redis=redis_url,
                            breaker={"sliding_window_size": 10, "minimum_number_of_calls": 2},
                            rate_limiter={"limit_for_period": 3, "limit_refresh_period": 60,
                                          "timeout_duration": 0},
                            bulkhead={"max_concurrent_calls": 5},
                            retry={"max_attempts": 3}, sleep=flavour.no_sleep)
    outcomes = []
    for i in range(6):
        try:
            outcomes.append(policy.call(lambda i=i: calls.append(i) or "ok"))
        except RequestNotPermitted:
            outcomes.append("limited")
    assert outcomes == ["ok"] * 3 + ["limited"] * 3
    assert len(calls) == 3                                   # no retry of a refusal
    breaker = policy.breaker.metrics()
    assert breaker.calls == 3 and breaker.failed == 0         # refusals are not failures
    assert policy.rate_limiter.metrics().rejected == 3


def test_an_open_breaker_takes_no_rate_limiter_permit(redis_url: str, name: str,
                                                      flavour: Flavour) -> None:
    policy = flavour.policy(name, redis=redis_url,
                            rate_limiter={"limit_for_period": 3, "limit_refresh_period": 60,
                                          "timeout_duration": 0})
    policy.breaker.transition_to_forced_open()
    with pytest.raises(distbreaker.CallNotPermitted):
        policy.call(lambda: "ok")
    m = policy.rate_limiter.metrics()
    assert m.calls == 0 and m.rejected == 0


def test_a_weighted_policy_takes_its_weight_per_attempt(redis_url: str, name: str) -> None:
    policy = distbreaker.Policy(name, redis=redis_url, redis_timeout=5,
                                rate_limiter={"limit_for_period": 1000,
                                              "limit_refresh_period": 60,
                                              "timeout_duration": 0})
    heavy = policy.weighted(400)
    assert heavy.call(lambda: 1) == 1 and heavy.call(lambda: 2) == 2
    with pytest.raises(RequestNotPermitted):
        heavy.call(lambda: 3)
    assert policy.rate_limiter.metrics().permits == 800
    with pytest.raises(ValueError):
        distbreaker.Policy(name + "-x", redis=redis_url).weighted(2)

    async def main() -> None:
        apolicy = distbreaker.aio.Policy(name + "-a", redis=redis_url, redis_timeout=5,
                                         rate_limiter={"limit_for_period": 10,
                                                       "limit_refresh_period": 60,
                                                       "timeout_duration": 0})
        assert await apolicy.weighted(7).call(_answer) == 42
        assert (await apolicy.rate_limiter.metrics()).permits == 7
        await apolicy.rate_limiter.aclose()
        await apolicy.breaker.aclose()

    asyncio.run(main())


async def _answer() -> int:
    return 42


# -- from a registry (YAML) ------------------------------------------------------------------
REGISTRY_YAML = """
redis: ${REDIS_URL}
rate_limiters:
  configs:
    default: {limit_refresh_period: 1m, timeout_duration: 0s}
  instances:
    llm: {limit_for_period: 10000, burst: 10000, critical: true}
    partner: {limit_for_period: 2}
policies:
  instances:
    llm: {rate_limiter: llm, breaker: true}
"""


def test_a_registry_builds_rate_limiters_and_policies_from_yaml(
        redis_url: str, tmp_path: Any) -> None:
    path = tmp_path / "distbreaker.yaml"
    path.write_text(REGISTRY_YAML)
    environ = {"REDIS_URL": redis_url, "DISTBREAKER_RATE_LIMITER_PARTNER_LIMIT_FOR_PERIOD": "3"}
    registry = distbreaker.Registry.from_file(path, environ=environ)
    llm = registry.rate_limiter("llm")
    assert llm.config.limit_for_period == 10000 and llm.config.limit_refresh_period == 60
    assert registry.rate_limiter("llm") is llm
    partner = registry.rate_limiter("partner")
    assert partner.config.limit_for_period == 3            # the environment wins
    assert granted(partner, 5) == 3
    keyed = registry.rate_limiter("partner", key="tenant-9")
    assert keyed.name == "partner:tenant-9" and granted(keyed, 5) == 3
    policy = registry.policy("llm")
    assert policy.rate_limiter is llm
    assert policy.weighted(4000).call(lambda: "ok") == "ok"
    assert llm.metrics().permits == 4000
    health = registry.health()
    report = health.to_dict()["components"]["rate_limiter:llm"]
    assert report["status"] == "UP" and report["details"]["calls"] == 1
    assert health.ready

    async def main() -> None:
        aregistry = distbreaker.aio.Registry.from_file(path, environ=environ)
        limiter = aregistry.rate_limiter("partner")
        assert isinstance(limiter, distbreaker.aio.RateLimiter)
        assert not await limiter.try_acquire()              # the 3 of the sync one are spent
        await aregistry.aclose()

    asyncio.run(main())
    registry.close()


def test_a_registry_names_a_bad_rate_limiter_setting(redis_url: str) -> None:
    with pytest.raises(distbreaker.RegistryConfigError, match="limit_for_period"):
        distbreaker.Registry({"redis": redis_url,
                              "rate_limiters": {"instances": {"x": {"limit_for_period": 0}}}})
    with pytest.raises(distbreaker.RegistryConfigError, match="rate_limiter"):
        distbreaker.Registry({"redis": redis_url,
                              "policies": {"instances": {"p": {"rate_limiter": "nope"}}}})


# -- the CLI's rows (readside) ------------------------------------------------------------------
def test_ls_and_show_report_the_rate_limiter(redis_url: str, name: str) -> None:
    import json

    from tests.helpers.cli import run

    limiter = distbreaker.RateLimiter(name, redis_url, limit_for_period=10,
                                      limit_refresh_period=3600, timeout_duration=0,
                                      redis_timeout=5)
    assert granted(limiter, 12, permits=2) == 5
    listed = json.loads(run(redis_url, "ls", "--json").stdout)
    row = next(r for r in listed["breakers"] if r["name"] == name)
    rl = row["rate_limiter"]
    assert (rl["limit_for_period"], rl["limit_refresh_period_ms"], rl["burst"]) == \
        (10, 3_600_000, 10)
    assert (rl["available"], rl["calls"], rl["permits"], rl["rejected"]) == (0, 5, 10, 7)
    assert row["state"] is None and row["breaker"] is None
    text = run(redis_url, "ls").stdout
    assert "RATE" in text and "0/10 per 1h" in text
    limiter.change_limit_for_period(20)
    shown = json.loads(run(redis_url, "show", name, "--json").stdout)
    assert shown["rate_limiter"]["overridden"] and shown["rate_limiter"]["limit_for_period"] == 20
    assert "changed by an operator" in run(redis_url, "show", name).stdout
    from click.testing import CliRunner

    from distbreaker.cli import cli

    watched = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["--url", redis_url, "watch", "--interval", "0.05", "--iterations", "1"])
    assert watched.exit_code == 0, watched.output
    header = next(line for line in watched.stdout.splitlines() if line.startswith("NAME"))
    assert "RATE" in header.split()
    row = next(line for line in watched.stdout.splitlines() if line.startswith(name))
    assert "/20 per 1h" in row and row.rstrip().endswith("-")   # RATE, then BUDGET


def test_prometheus_exports_the_rate_limiter(redis_url: str, name: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from distbreaker.contrib.prometheus import DistbreakerCollector

    limiter = distbreaker.RateLimiter(name, redis_url, limit_for_period=4,
                                      limit_refresh_period=3600, timeout_duration=0,
                                      redis_timeout=5)
    assert granted(limiter, 6, permits=2) == 2
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[limiter]))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}
    one = (("name", name),)
    assert samples[("distbreaker_ratelimiter_available_permissions", one)] == 0
    assert samples[("distbreaker_ratelimiter_limit", one)] == 4
    assert samples[("distbreaker_ratelimiter_period_seconds", one)] == 3600
    assert samples[("distbreaker_ratelimiter_calls_total", one)] == 2
    assert samples[("distbreaker_ratelimiter_permits_total", one)] == 4
    assert samples[("distbreaker_ratelimiter_rejections_total", one)] == 4
    assert samples[("distbreaker_rejections_total",
                    (("name", name), ("reason", "rate_limited")))] == 4
