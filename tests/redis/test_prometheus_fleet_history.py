"""distbreaker_breaker_state_seconds and distbreaker_breaker_transitions_total: read from
Redis (the history stream), so they count transitions made by other processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker.contrib.prometheus import DistbreakerCollector

ROOT = Path(__file__).resolve().parents[2]


def samples(registry: CollectorRegistry, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == metric:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def moves(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    found = samples(registry, "distbreaker_breaker_transitions_total")
    return {(dict(k)["from_state"], dict(k)["to_state"]): v for k, v in found.items()
            if dict(k)["name"] == name}


def trip_in_another_process(url: str, name: str) -> None:
    code = textwrap.dedent(f"""
        from distbreaker import CircuitBreaker
        b = CircuitBreaker({name!r}, redis={url!r}, sliding_window_size=4,
                           minimum_number_of_calls=4, wait_duration_in_open_state=30)
        for _ in range(4):
            try:
                b.call(lambda: 1 / 0)
            except ZeroDivisionError:
                pass
        assert b.state.value == "OPEN"
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_fleet_transitions_are_counted_from_the_history_of_every_process(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    trip_in_another_process(redis_url, name)
    assert moves(registry, name) == {("CLOSED", "OPEN"): 1}
    assert moves(registry, name) == {("CLOSED", "OPEN"): 1}  # counted once, not per scrape
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=4,
                             minimum_number_of_calls=4, wait_duration_in_open_state=30)
    breaker.reset("fixed", "ops")
    trip_in_another_process(redis_url, name)
    assert moves(registry, name) == {("CLOSED", "OPEN"): 2, ("OPEN", "CLOSED"): 1}
    redis_client.delete(BreakerKeys.build(name).history)  # trimmed or expired
    assert moves(registry, name) == {("CLOSED", "OPEN"): 2, ("OPEN", "CLOSED"): 1}
    breaker.transition_to_forced_open("maintenance", "ops")
    assert moves(registry, name)[("OPEN", "FORCED_OPEN")] == 1


def test_a_new_collector_starts_from_the_kept_history(redis_url: str, name: str) -> None:
    trip_in_another_process(redis_url, name)
    CircuitBreaker(name, redis=redis_url, sliding_window_size=4, minimum_number_of_calls=4,
                   wait_duration_in_open_state=30).reset("fixed", "ops")
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[name]))
    assert moves(registry, name) == {("CLOSED", "OPEN"): 1, ("OPEN", "CLOSED"): 1}


def test_state_seconds_is_the_time_since_the_last_transition(redis_url: str,
                                                             name: str) -> None:
    trip_in_another_process(redis_url, name)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    time.sleep(0.3)
    first = samples(registry, "distbreaker_breaker_state_seconds")[(("name", name),)]
    assert 0.3 <= first < 30
    CircuitBreaker(name, redis=redis_url, sliding_window_size=4, minimum_number_of_calls=4,
                   wait_duration_in_open_state=30).transition_to_disabled("quiet", "ops")
    second = samples(registry, "distbreaker_breaker_state_seconds")[(("name", name),)]
    assert second < first
