"""The Prometheus collector, scraped in the text exposition format."""

from __future__ import annotations

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from distbreaker import Bulkhead, CircuitBreaker, Policy, RetryBudget
from distbreaker._runtime.keys import BreakerKeys
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.errors import BulkheadFull, CallNotPermitted

CFG = {"sliding_window_size": 4, "minimum_number_of_calls": 4, "failure_rate_threshold": 50,
       "wait_duration_in_open_state": 30}


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the text exposition, keyed by (sample name, sorted labels)."""
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, metric: str, **labels: str) -> float:
    return samples[(metric, tuple(sorted(labels.items())))]


def fail() -> None:
    raise ConnectionError("upstream down")


def run(breaker: CircuitBreaker, fn) -> None:
    try:
        breaker.call(fn)
    except (ConnectionError, CallNotPermitted):
        pass


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_registered_breaker_is_closed_before_its_first_call(
        redis_url: str, redis_client: redis.Redis, name: str,
        registry: CollectorRegistry) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **CFG)
    registry.register(DistbreakerCollector(redis_url, components=[breaker]))
    samples = scrape(registry)
    assert value(samples, "distbreaker_up") == 1
    assert value(samples, "distbreaker_breaker_state", name=name, state="CLOSED") == 1
    for other in ("OPEN", "HALF_OPEN", "FORCED_OPEN", "DISABLED", "METRICS_ONLY"):
        assert value(samples, "distbreaker_breaker_state", name=name, state=other) == 0
    assert value(samples, "distbreaker_breaker_window_calls", name=name) == 0
    assert value(samples, "distbreaker_breaker_failure_rate_percent", name=name) == -1
    assert not redis_client.keys("*")  # the scrape itself wrote nothing


def test_fleet_state_rates_and_process_counters(redis_url: str, name: str,
                                                registry: CollectorRegistry) -> None:
    # (subscribe=False: `here` keeps a stale view of the trip `elsewhere` makes, as a worker
    # without pub/sub would, so every kind of rejection below is counted once)
    here = CircuitBreaker(name, redis=redis_url, subscribe=False, **CFG)
    elsewhere = CircuitBreaker(name, redis=redis_url, subscribe=False, **CFG)  # not registered
    collector = DistbreakerCollector(redis_url)
    collector.register(here)
    registry.register(collector)

    here.call(lambda: None)
    run(here, fail)
    samples = scrape(registry)
    assert value(samples, "distbreaker_breaker_window_calls", name=name) == 2
    assert value(samples, "distbreaker_breaker_window_failures", name=name) == 1
    assert value(samples, "distbreaker_breaker_failure_rate_percent", name=name) == -1  # < min

    run(elsewhere, fail)
    run(elsewhere, fail)      # 3 failures of 4: the other worker trips it
    run(here, fail)           # still runs (stale CLOSED view); its reply says OPEN
    run(here, fail)           # rejected locally (known OPEN wait)
    run(CircuitBreaker(name, redis=redis_url, **CFG), fail)   # a fresh worker: Redis rejects
    samples = scrape(registry)
    assert value(samples, "distbreaker_breaker_state", name=name, state="OPEN") == 1
    assert value(samples, "distbreaker_breaker_state", name=name, state="CLOSED") == 0
    assert value(samples, "distbreaker_breaker_failure_rate_percent", name=name) == 75
    assert value(samples, "distbreaker_breaker_window_calls", name=name) == 4
    assert 20 < value(samples, "distbreaker_breaker_retry_in_seconds", name=name) <= 30
    assert value(samples, "distbreaker_breaker_fleet_rejections_total", name=name) == 1
    # per process: only what this process did
    assert value(samples, "distbreaker_calls_total", name=name, outcome="success") == 1
    assert value(samples, "distbreaker_calls_total", name=name, outcome="failure") == 2
    assert value(samples, "distbreaker_rejections_total", name=name, reason="open") == 1
    assert ("distbreaker_transitions_total",
            (("from_state", "CLOSED"), ("name", name), ("to_state", "OPEN"))) not in samples

    here.reset()
    here.transition_to_forced_open()
    samples = scrape(registry)
    assert value(samples, "distbreaker_breaker_state", name=name, state="FORCED_OPEN") == 1
    assert value(samples, "distbreaker_breaker_retry_in_seconds", name=name) == -1
    assert value(samples, "distbreaker_transitions_total", name=name, from_state="OPEN",
                 to_state="CLOSED") == 1
    assert value(samples, "distbreaker_transitions_total", name=name, from_state="CLOSED",
                 to_state="FORCED_OPEN") == 1


def test_bulkhead_and_budget(redis_url: str, name: str, registry: CollectorRegistry) -> None:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=2)
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0.5, min_retries_per_sec=0.1,
                         ttl=30)
    registry.register(DistbreakerCollector(redis_url, components=[bulkhead, budget]))
    samples = scrape(registry)   # registered, never used
    assert value(samples, "distbreaker_budget_balance", name=name) == 3      # 0.1/s x 30 s
    assert value(samples, "distbreaker_budget_deposits", name=name) == 0

    permits = [bulkhead.acquire(), bulkhead.acquire()]
    with pytest.raises(BulkheadFull):
        bulkhead.acquire()
    budget.deposit(10)
    assert budget.try_withdraw() and budget.try_withdraw()
    samples = scrape(registry)
    assert value(samples, "distbreaker_bulkhead_in_use", name=name) == 2
    assert value(samples, "distbreaker_bulkhead_limit", name=name) == 2
    assert value(samples, "distbreaker_rejections_total", name=name, reason="bulkhead_full") == 1
    assert value(samples, "distbreaker_budget_deposits", name=name) == 10
    assert value(samples, "distbreaker_budget_withdrawals", name=name) == 2
    assert value(samples, "distbreaker_budget_balance", name=name) == 3 + 5 - 2
    assert value(samples, "distbreaker_budget_balance", name=name) == budget.balance()
    for permit in permits:
        bulkhead.release(permit)
    assert value(scrape(registry), "distbreaker_bulkhead_in_use", name=name) == 0


def test_policy_and_discovery(redis_url: str, name: str, registry: CollectorRegistry) -> None:
    policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 3})
    other = CircuitBreaker(f"{name}-other", redis=redis_url, **CFG)
    other.trip()
    registry.register(DistbreakerCollector(redis_url, components=[policy], discover=True))
    samples = scrape(registry)
    assert value(samples, "distbreaker_breaker_state", name=name, state="CLOSED") == 1
    assert value(samples, "distbreaker_breaker_state", name=f"{name}-other", state="OPEN") == 1
    policy.call(lambda: "ok")
    samples = scrape(registry)
    assert value(samples, "distbreaker_calls_total", name=name, outcome="success") == 1
    assert value(samples, "distbreaker_bulkhead_limit", name=name) == 3


def test_redis_down_does_not_break_the_scrape(name: str, registry: CollectorRegistry) -> None:
    dead = "redis://127.0.0.1:1/0"
    breaker = CircuitBreaker(name, redis=dead, redis_timeout=0.05, **CFG)
    registry.register(DistbreakerCollector(dead, timeout=0.05, components=[breaker]))
    for _ in range(5):
        run(breaker, fail)   # the local fallback breaker trips after 4
    samples = scrape(registry)
    assert value(samples, "distbreaker_up") == 0
    assert not any(key[0] == "distbreaker_breaker_state" for key in samples)
    assert value(samples, "distbreaker_calls_total", name=name, outcome="failure") == 4
    assert value(samples, "distbreaker_rejections_total", name=name, reason="open") == 1
    assert value(samples, "distbreaker_transitions_total", name=name, from_state="CLOSED",
                 to_state="OPEN") == 1


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_foreign_data_marks_one_name_unreadable(redis_url: str, redis_client: redis.Redis,
                                                name: str, registry: CollectorRegistry) -> None:
    good = CircuitBreaker(name, redis=redis_url, **CFG)
    registry.register(DistbreakerCollector(redis_url, components=[good, f"{name}-bad"]))
    redis_client.set(BreakerKeys.build(f"{name}-bad", "distbreaker").state, "garbage")
    samples = scrape(registry)
    assert value(samples, "distbreaker_up") == 1
    assert value(samples, "distbreaker_unreadable", name=f"{name}-bad") == 1
    assert value(samples, "distbreaker_breaker_state", name=name, state="CLOSED") == 1


def test_registering_rejects_unknown_objects(redis_url: str) -> None:
    with pytest.raises(TypeError):
        DistbreakerCollector(redis_url).register(object())
