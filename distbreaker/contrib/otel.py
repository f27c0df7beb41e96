"""OpenTelemetry: distbreaker's metrics through a MeterProvider, and span events.

```python
from distbreaker.contrib.otel import DistbreakerInstrumentor

DistbreakerInstrumentor(registry=registry)          # or redis=URL, components=[...]
```

Metrics carry the names of the Prometheus collector
(`distbreaker.contrib.prometheus`), so dashboards work with either exporter:
``distbreaker_breaker_state{name,state}``, ``distbreaker_breaker_failure_rate_percent``,
..., ``distbreaker_up`` as observable gauges read from Redis at collection
time (once per collection, read-only, pipelined), and this process's
``distbreaker_calls{name,outcome}``, ``distbreaker_rejections{name,reason}``
and ``distbreaker_transitions{name,from_state,to_state}`` as observable
counters (an OTel Prometheus exporter adds ``_total``, as prometheus_client does).
Nothing runs on the protected call's path but the transition listener.

Span events, on the span current where they happen:
``distbreaker.transition`` (name, from_state, to_state, reason, source) for
every transition this process's calls make, and ``distbreaker.rejection``
(name, kind ``circuit_open`` / ``bulkhead_full``, state, retry_after) when the
web integrations (ASGI, Django, Flask) or the aiohttp client integration see a
rejection, or when you call `add_rejection_event(error)`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from .._runtime.keys import DEFAULT_PREFIX
from ..breaker.events import Transition
from ..errors import CallNotPermitted
from ._metrics import DEFAULT_TOP_K, Family, MetricsSource, catalog

__all__ = ["DistbreakerInstrumentor", "add_rejection_event", "add_transition_event"]

SCOPE = "distbreaker"


def add_transition_event(event: Transition, span: Any = None) -> None:
    """Add a ``distbreaker.transition`` event to `span` (default: the current span)."""
    span = span if span is not None else trace.get_current_span()
    if span.is_recording():
        span.add_event("distbreaker.transition", {
            "distbreaker.name": event.name, "distbreaker.from_state": event.from_state.value,
            "distbreaker.to_state": event.to_state.value, "distbreaker.reason": event.reason,
            "distbreaker.source": event.source})


def add_rejection_event(error: BaseException, span: Any = None) -> None:
    """Add a ``distbreaker.rejection`` event for a CallNotPermitted / BulkheadFull."""
    span = span if span is not None else trace.get_current_span()
    if not span.is_recording():
        return
    breaker = isinstance(error, CallNotPermitted)
    state = getattr(error, "state", None)
    span.add_event("distbreaker.rejection", {
        "distbreaker.name": str(getattr(error, "name", "")),
        "distbreaker.kind": "circuit_open" if breaker else "bulkhead_full",
        "distbreaker.state": str(getattr(state, "value", state) or "FULL"),
        "distbreaker.retry_after": float(getattr(error, "retry_after", 0.0) or 0.0)})


class DistbreakerInstrumentor:
    """Registers distbreaker's instruments with `meter_provider` (default: the global one).

    `registry` (sync or asyncio) instruments every component it builds, now and
    later; its Redis URL (or sync client) serves the metric reads unless `redis`
    is given. `components` and `register()` add breakers, bulkheads, budgets,
    policies or names. `max_age` bounds how stale one collection's fleet read
    may be for the instruments read after the first. With `discover`, at most `top_k`
    discovered names get per-name points, as with the Prometheus collector
    (docs/guides/prometheus.md, "Thousands of names"); the namespace aggregates count
    every name.
    """

    def __init__(self, redis: Any = None, *, registry: Any = None, meter_provider: Any = None,
                 prefix: str | None = None, discover: bool = False, timeout: float = 1.0,
                 components: Iterable[Any] = (), max_age: float = 1.0,
                 top_k: int | None = DEFAULT_TOP_K) -> None:
        if redis is None and registry is not None:
            redis = _reader_target(registry)
        if prefix is None:
            prefix = registry.spec.prefix if registry is not None else DEFAULT_PREFIX
        self.source = MetricsSource(redis, prefix=prefix, discover=discover, timeout=timeout,
                                    components=components, top_k=top_k)
        self.source.on_transition(add_transition_event)
        self.max_age = max_age
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}
        self._read_at = -float("inf")
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
        families = catalog()
        self._first = families[0].name
        self.instruments = [self._instrument(meter, family) for family in families]
        if registry is not None:
            registry.on_component(self._on_component)
            for _ in registry.components():  # builds the declared ones: exported before use
                pass

    def register(self, *components: Any) -> None:
        """Export these components (or names) too."""
        self.source.register(*components)

    def _on_component(self, kind: str, component: Any) -> None:
        if kind != "retry":
            self.source.register(component)

    def _instrument(self, meter: Any, family: Family) -> Any:
        create = (meter.create_observable_gauge if family.kind == "gauge"
                  else meter.create_observable_counter)
        return create(family.name, callbacks=[self._callback(family.name)],
                      description=family.help)

    def _callback(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            family = self._snapshot(refresh=name == self._first).get(name)
            if family is None:
                return []
            return [Observation(value, dict(zip(family.labels, labels, strict=True)))
                    for labels, value in family.samples]
        return observe

    def _snapshot(self, refresh: bool) -> dict[str, Family]:
        """One read per collection: the first instrument's callback reads, the others
        reuse it (or read again if it is older than `max_age`)."""
        with self._lock:
            now = time.monotonic()
            if refresh or now - self._read_at > self.max_age:
                self._families = {f.name: f for f in (*self.source.fleet(),
                                                      *self.source.local())}
                self._read_at = now
            return self._families


def _reader_target(registry: Any) -> Any:
    """What the registry's client was built from, if a sync reader can use it."""
    target = registry.redis
    if target is not None and not isinstance(target, str) and _is_async(target):
        raise TypeError("this registry was given an asyncio client: pass redis= a URL or a "
                        "sync client for the metric reads")
    return target


def _is_async(client: Any) -> bool:
    import redis.asyncio
    import redis.asyncio.cluster

    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster))
