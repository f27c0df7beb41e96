"""An adaptive bulkhead's limit and why it last moved, as `show`, `ls`, `watch` and the
Prometheus collector show it: a real adaptive Bulkhead against a real redis-server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from distbreaker import Bulkhead, Overloaded
from distbreaker.bulkhead.adaptive import AdaptiveLimit
from distbreaker.contrib.prometheus import DistbreakerCollector
from tests.helpers.cli import run

# every outcome reported (sample_rate 1): the test reads the averages after one call
LIMIT = AdaptiveLimit(min_limit=2, max_limit=20, initial_limit=8, backoff_ratio=0.5,
                      sample_rate=1.0)


@pytest.fixture
def adaptive(redis_url: str, name: str) -> Iterator[Bulkhead]:
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=4, adaptive=LIMIT)
    yield bulkhead
    bulkhead.close()


def overload(bulkhead: Bulkhead, retry_after: float) -> None:
    """One call that the dependency answers with a 429 and a Retry-After."""
    bulkhead.release(bulkhead.acquire(), Overloaded("slow down", retry_after=retry_after))


def test_show_and_ls_json_carry_the_limit_and_why_it_moved(
        redis_url: str, name: str, adaptive: Bulkhead) -> None:
    permit = adaptive.acquire()
    shown = json.loads(run(redis_url, "show", name, "--json").stdout)["bulkhead"]
    assert shown["limit"] == 8
    assert shown["adaptive"]["limit"] == 8.0 and shown["adaptive"]["why"] == "initial"
    assert shown["adaptive"]["moved_at_ms"] is None  # not moved since it started
    adaptive.release(permit)

    overload(adaptive, retry_after=30.0)  # 8 * 0.5 = 4, increases paused for 30 s
    doc = json.loads(run(redis_url, "show", name, "--json").stdout)
    a, now = doc["bulkhead"]["adaptive"], doc["server_time_ms"]
    assert doc["bulkhead"]["limit"] == 4 and a["limit"] == 4.0
    assert a["why"] == "overload (429): increases paused"
    assert 0 <= now - a["moved_at_ms"] < 10_000 and a["moved_ago_s"] >= 0
    assert 20_000 < a["paused_until_ms"] - now <= 30_000 and 20 < a["paused_for_s"] <= 30
    # one success closes no window (24 successes do): no latency measured yet
    assert a["rtt_short_ms"] is None and a["rtt_long_ms"] is None

    row = json.loads(run(redis_url, "ls", "--json").stdout)["breakers"][0]
    assert row["name"] == name and row["bulkhead"]["limit"] == 4
    listed = row["bulkhead"]["adaptive"]
    assert set(listed) == {"limit", "why", "moved_at_ms", "moved_ago_s", "paused_until_ms",
                           "paused_for_s", "rtt_short_ms", "rtt_long_ms"}
    assert listed["paused_until_ms"] == a["paused_until_ms"]
    assert {k: listed[k] for k in ("limit", "why", "moved_at_ms", "rtt_short_ms")} == \
        {k: a[k] for k in ("limit", "why", "moved_at_ms", "rtt_short_ms")}


def test_text_views_say_why_the_limit_moved(
        redis_url: str, name: str, adaptive: Bulkhead) -> None:
    overload(adaptive, retry_after=30.0)
    shown = run(redis_url, "show", name).stdout
    assert "adaptive:  limit 4, last moved " in shown
    assert ": overload (429): increases paused; increases paused for " in shown
    listed = run(redis_url, "ls").stdout
    assert "0/4 (429 pause " in listed
    watched = run(redis_url, "watch", "--iterations", "1").stdout
    assert "0/4 (429 pause" in watched and "adaptive: why it" in watched


def test_a_fixed_bulkhead_has_no_adaptive_object(redis_url: str, name: str) -> None:
    fixed = Bulkhead(name, redis=redis_url, max_concurrent_calls=3)
    try:
        fixed.release(fixed.acquire(), ConnectionError("down"))
        doc = json.loads(run(redis_url, "show", name, "--json").stdout)
        assert doc["bulkhead"]["limit"] == 3 and doc["bulkhead"]["adaptive"] is None
        assert "adaptive:" not in run(redis_url, "show", name).stdout
    finally:
        fixed.close()


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_prometheus_exports_the_limit_and_why(redis_url: str, name: str,
                                              adaptive: Bulkhead) -> None:
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[adaptive]))
    adaptive.release(adaptive.acquire())  # a success while not in use: stays at 8
    samples = scrape(registry)
    assert samples[("distbreaker_bulkhead_limit", (("name", name),))] == 8
    assert samples[("distbreaker_bulkhead_adaptive_limit", (("name", name),))] == 8.0
    assert samples[("distbreaker_bulkhead_limit_info",
                    (("name", name), ("why", "initial")))] == 1
    assert samples[("distbreaker_bulkhead_limit_moved_seconds", (("name", name),))] == -1
    assert samples[("distbreaker_bulkhead_limit_paused_seconds", (("name", name),))] == 0

    adaptive.release(adaptive.acquire(), ConnectionError("down"))  # 8 * 0.5 = 4
    samples = scrape(registry)
    assert samples[("distbreaker_bulkhead_limit", (("name", name),))] == 4
    assert samples[("distbreaker_bulkhead_adaptive_limit", (("name", name),))] == 4.0
    info = {labels: v for (metric, labels), v in samples.items()
            if metric == "distbreaker_bulkhead_limit_info"}
    assert info == {(("name", name), ("why", "failure or timeout")): 1}  # one series per name
    assert 0 <= samples[("distbreaker_bulkhead_limit_moved_seconds", (("name", name),))] < 10


def test_prometheus_leaves_out_adaptive_families_for_a_fixed_bulkhead(
        redis_url: str, name: str) -> None:
    fixed = Bulkhead(name, redis=redis_url, max_concurrent_calls=3)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[fixed]))
    try:
        fixed.release(fixed.acquire())
        samples = scrape(registry)
        assert samples[("distbreaker_bulkhead_limit", (("name", name),))] == 3
        assert not [key for key in samples if key[0].startswith("distbreaker_bulkhead_ad")
                    or key[0].startswith("distbreaker_bulkhead_limit_")]
    finally:
        fixed.close()


def test_otel_exports_an_adaptive_bulkhead_declared_in_yaml(redis_url: str, tmp_path) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from distbreaker import Registry
    from distbreaker.contrib.otel import DistbreakerInstrumentor

    path = tmp_path / "resilience.yaml"
    path.write_text("redis: ${REDIS_URL}\n"
                    "bulkheads:\n  instances:\n    llm:\n"
                    "      adaptive: {min_limit: 1, max_limit: 10, initial_limit: 6,"
                    " backoff_ratio: 0.5}\n")
    registry = Registry.from_file(path, environ={"REDIS_URL": redis_url})
    reader = InMemoryMetricReader()
    DistbreakerInstrumentor(registry=registry,
                            meter_provider=MeterProvider(metric_readers=[reader]))
    bulkhead = registry.bulkhead("llm")
    try:
        bulkhead.release(bulkhead.acquire(), TimeoutError("slow"))  # 6 * 0.5 = 3
        points = {m.name: [(dict(p.attributes), p.value) for p in m.data.data_points]
                  for r in reader.get_metrics_data().resource_metrics
                  for s in r.scope_metrics for m in s.metrics}
        assert points["distbreaker_bulkhead_limit"] == [({"name": "llm"}, 3)]
        assert points["distbreaker_bulkhead_adaptive_limit"] == [({"name": "llm"}, 3.0)]
        assert points["distbreaker_bulkhead_limit_info"] == [
            ({"name": "llm", "why": "failure or timeout"}, 1)]
    finally:
        registry.close()


def test_prometheus_counts_calls_slow_start_turned_down(redis_url: str, name: str) -> None:
    from distbreaker import CallNotPermitted, CircuitBreaker

    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=2,
                             minimum_number_of_calls=2, wait_duration_in_open_state=0.05,
                             permitted_calls_in_half_open=1, ramp_duration=60, ramp_start=0.01)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[breaker]))
    try:
        for _ in range(2):
            with pytest.raises(ConnectionError):
                breaker.call(fail_once)
        time.sleep(0.1)
        breaker.call(lambda: None)  # the probe succeeds: HALF_OPEN -> CLOSED, slow start
        ramping = 0
        for _ in range(50):
            try:
                breaker.call(lambda: None)
            except CallNotPermitted as error:
                assert error.reason == "ramping" and 0 < error.retry_after <= 1
                ramping += 1
        assert ramping > 0  # 1 % of calls admitted at first
        samples = scrape(registry)
        assert samples[("distbreaker_rejections_total",
                        (("name", name), ("reason", "ramping")))] == ramping
    finally:
        breaker.close()


def fail_once() -> None:
    raise ConnectionError("down")
