"""Prometheus at 1,000 keyed names (issue 26): with discovery, per-name series stay
bounded by `top_k` (the names that most need a look), and the namespace aggregates
still count every name; a registered name keeps its series whatever top_k leaves out."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from distbreaker.contrib.prometheus import DistbreakerCollector

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
COUNT = 1000


def scrape(collector: DistbreakerCollector) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


@pytest.fixture
def states(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> dict[str, int]:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    bench = importlib.import_module("bench_cli_scale")
    client = redis.Redis.from_url(redis_url)
    made = bench.seed_breakers(client, bench.scale_names(COUNT), key_ttl=600)
    client.close()
    return made  # type: ignore[no-any-return]


def test_series_stay_bounded_and_aggregates_count_every_name(redis_url: str,
                                                             states: dict[str, int]) -> None:
    collector = DistbreakerCollector(redis_url, discover=True, top_k=25,
                                     components=["payments"])
    samples = scrape(collector)
    named = {labels["name"] for _, labels, _ in samples if "name" in labels}
    assert len(named) == 26 and "payments" in named  # 25 discovered + the registered one
    per_name = [s for s in samples if "name" in s[1]]
    assert len(per_name) < 26 * 40  # a fixed number of series per exported name
    top = {labels["name"] for name, labels, v in samples
           if name == "distbreaker_breaker_state" and labels["state"] == "OPEN" and v == 1}
    assert len(top) == 25  # OPEN ones first (3 in 10 names are OPEN)
    rates = [v for name, labels, v in samples
             if name == "distbreaker_breaker_failure_rate_percent"
             and labels["name"] != "payments"]
    assert min(rates) == max(rates) == 70.0  # the highest failure rate seeded
    agg = {(name, tuple(sorted(labels.items()))): v for name, labels, v in samples
           if name.startswith("distbreaker_namespace_")}
    assert agg[("distbreaker_namespace_names", ())] == COUNT + 1
    assert agg[("distbreaker_namespace_names_not_exported", ())] == COUNT - 25
    assert agg[("distbreaker_namespace_breakers", (("state", "OPEN"),))] == states["OPEN"]
    assert agg[("distbreaker_namespace_breakers", (("state", "CLOSED"),))] == \
        states["CLOSED"] + 1  # payments: registered, never called
    calls = sum(v for (name, _), v in agg.items()
                if name == "distbreaker_namespace_fleet_calls_total")
    assert calls == 20 * COUNT
    assert agg[("distbreaker_namespace_fleet_rejections_total", ())] > 0


def test_top_k_none_exports_every_name(redis_url: str, states: dict[str, int]) -> None:
    samples = scrape(DistbreakerCollector(redis_url, discover=True, top_k=None))
    assert len({labels["name"] for _, labels, _ in samples if "name" in labels}) == COUNT
    with pytest.raises(ValueError, match="top_k"):
        DistbreakerCollector(redis_url, top_k=-1)
