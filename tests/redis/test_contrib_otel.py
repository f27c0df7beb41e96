"""distbreaker.contrib.otel with the OpenTelemetry SDK's in-memory reader and exporter."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from distbreaker import BulkheadFull, CallNotPermitted, Registry
from distbreaker.contrib.flask import Distbreaker
from distbreaker.contrib.otel import DistbreakerInstrumentor, add_rejection_event
from distbreaker.contrib.prometheus import DistbreakerCollector

CONFIG = {"breakers": {"instances": {"payments": {"sliding_window_size": 2,
                                                  "minimum_number_of_calls": 2}}},
          "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 3}}},
          "budgets": {"instances": {"payments": {}}}}


#: Families exported only for an adaptive bulkhead.
ADAPTIVE_ONLY = {"distbreaker_bulkhead_adaptive_limit", "distbreaker_bulkhead_limit_info",
                 "distbreaker_bulkhead_limit_moved_seconds",
                 "distbreaker_bulkhead_limit_paused_seconds"}


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [(dict(p.attributes), p.value)
                                      for p in metric.data.data_points]
    return found


def _tracer() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def _fail() -> None:
    raise ConnectionError("down")


def test_metrics_have_the_prometheus_names_and_the_fleet_values(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    reader = InMemoryMetricReader()
    DistbreakerInstrumentor(registry=registry,
                            meter_provider=MeterProvider(metric_readers=[reader]))
    breaker = registry.breaker("payments")
    breaker.call(lambda: "ok")
    with pytest.raises(ConnectionError):
        breaker.call(_fail)
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: "never")
    registry.bulkhead("payments").acquire()
    points = _points(reader)
    assert points["distbreaker_up"] == [({}, 1)]
    state = {a["state"]: v for a, v in points["distbreaker_breaker_state"]
             if a["name"] == "payments"}
    assert state["OPEN"] == 1 and state["CLOSED"] == 0
    calls = {a["outcome"]: v for a, v in points["distbreaker_calls"]}
    assert (calls["success"], calls["failure"]) == (1, 1)
    rejected = {a["reason"]: v for a, v in points["distbreaker_rejections"]
                if a["name"] == "payments"}
    assert rejected["open"] == 1
    assert points["distbreaker_transitions"] == [
        ({"name": "payments", "from_state": "CLOSED", "to_state": "OPEN"}, 1)]
    assert points["distbreaker_bulkhead_in_use"] == [({"name": "payments"}, 1)]
    assert points["distbreaker_breaker_failure_rate_percent"] == [({"name": "payments"}, 50.0)]

    prometheus = CollectorRegistry()
    prometheus.register(DistbreakerCollector(redis_url, components=[
        breaker, registry.bulkhead("payments"), registry.budget("payments")]))
    prometheus_names = {family.name for family in prometheus.collect()}
    # families without samples in this run (Prometheus lists them empty, OTel not at all)
    assert prometheus_names <= set(points) | {
        "distbreaker_unreadable", "distbreaker_breaker_v1_state",
        "distbreaker_injected_faults",  # no fault injected in this run
        *ADAPTIVE_ONLY,  # a fixed bulkhead: tests/redis/test_adaptive_visibility.py
        *(n for n in prometheus_names if n.startswith("distbreaker_ratelimiter_"))}  # none
    assert set(points) <= prometheus_names


def test_redis_down_is_up_zero_and_the_collection_still_succeeds() -> None:
    reader = InMemoryMetricReader()
    DistbreakerInstrumentor("redis://127.0.0.1:1/0", timeout=0.05, components=["payments"],
                            meter_provider=MeterProvider(metric_readers=[reader]))
    points = _points(reader)
    assert points["distbreaker_up"] == [({}, 0)]
    assert "distbreaker_breaker_state" not in points


def test_span_events_on_transitions_and_rejections(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    DistbreakerInstrumentor(registry=registry, meter_provider=MeterProvider())
    tracer, exporter = _tracer()
    breaker = registry.breaker("payments")
    with tracer.start_as_current_span("charge"):
        breaker.call(lambda: "ok")
        with pytest.raises(ConnectionError):
            breaker.call(_fail)
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "distbreaker.transition"]
    assert dict(event.attributes) == {
        "distbreaker.name": "payments", "distbreaker.from_state": "CLOSED",
        "distbreaker.to_state": "OPEN", "distbreaker.reason": event.attributes[
            "distbreaker.reason"], "distbreaker.source": "redis"}

    app = Flask(__name__)
    resilience = Distbreaker(app, registry)

    @app.get("/pay")
    def pay() -> str:
        return resilience.registry.breaker("payments").call(lambda: "paid")

    with tracer.start_as_current_span("request"):
        assert app.test_client().get("/pay").status_code == 503
        add_rejection_event(BulkheadFull("payments", 3, 3))
    request = exporter.get_finished_spans()[-1]
    rejections = [dict(e.attributes) for e in request.events
                  if e.name == "distbreaker.rejection"]
    assert rejections[0]["distbreaker.kind"] == "circuit_open"
    assert rejections[0]["distbreaker.state"] == "OPEN"
    assert rejections[0]["distbreaker.retry_after"] > 0
    assert rejections[1]["distbreaker.kind"] == "bulkhead_full"
