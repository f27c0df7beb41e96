"""Prometheus metrics for distbreaker: fleet-wide truth from Redis, plus this process's counts.

``REGISTRY.register(DistbreakerCollector(redis=URL, components=[policy, breaker]))``;
the metrics are listed on `DistbreakerCollector` and in the README.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._runtime.keys import DEFAULT_PREFIX
from ..breaker.core import BreakerCore
from ..breaker.events import Transition
from ..breaker.state import State
from ..errors import InjectedFault, InjectedRejection
from ._metrics import (
    DEFAULT_TOP_K,
    REJECTION_REASONS,
    Family,
    MetricsSource,
    process_families,
)
from ._pool_metrics import PoolCollector

__all__ = ["DistbreakerCollector", "PoolCollector"]


class DistbreakerCollector(Collector):
    """A prometheus_client collector of distbreaker's fleet-wide and per-process figures.

    `redis` is a URL or a sync redis-py client used for the read-only scrape
    (a short `timeout` bounds a scrape while Redis hangs). Each scrape reads Redis
    once (pipelined, read-only, see `distbreaker.readside`) and exports for every
    registered name (and, with ``discover=True``, every name found under the prefix):

    - ``distbreaker_breaker_state{name,state}``: 1 for the current fleet-wide
      state, 0 for the others; a registered breaker never called is CLOSED;
    - ``distbreaker_breaker_state_seconds{name}``: seconds since the last
      transition (server clock), for "open longer than 5 minutes" alerts;
    - ``distbreaker_breaker_transitions_total{name,from_state,to_state}``:
      transitions of the whole fleet, counted from each breaker's history stream
      (each scrape reads only the entries after the last one it counted, so the
      counter is monotonic even when the stream is trimmed or expires);
    - ``distbreaker_breaker_failure_rate_percent`` / ``_slow_call_rate_percent``
      (-1 below the minimum number of calls), ``distbreaker_breaker_window_calls``
      / ``_window_failures`` / ``_window_slow_calls``, ``_retry_in_seconds``,
      ``distbreaker_breaker_fleet_rejections_total`` and
      ``distbreaker_breaker_fleet_calls_total{name,outcome}`` (success, failure: every
      worker's calls since the keys were created, counted in the state record) and
      ``distbreaker_breaker_fleet_slow_calls_total``;
    - ``distbreaker_bulkhead_in_use`` / ``_limit`` (an adaptive bulkhead's current
      integer limit); for an adaptive bulkhead also ``_adaptive_limit`` (before
      rounding down), ``distbreaker_bulkhead_limit_info{name,why} 1`` (why it last
      moved: one of the few reasons in docs/ADAPTIVE.md), ``_limit_moved_seconds``
      (since its integer limit last changed, -1 never) and ``_limit_paused_seconds``
      (increases paused after a 429, 0 when not);
    - ``distbreaker_budget_deposits`` / ``_withdrawals`` over the window and
      ``distbreaker_budget_balance`` (for registered budgets, whose formula is known);
    - ``distbreaker_ratelimiter_available_permissions`` (negative: reserved by waiting
      calls), ``_limit`` and ``_period_seconds`` in force, and the fleet-wide counters
      ``_calls_total`` / ``_permits_total`` / ``_rejections_total``;
    - ``distbreaker_up``: 1 when Redis answered this scrape, else 0 (the fleet
      metrics are then left out; a scrape never fails because of Redis);
    - ``distbreaker_foreign_keys``: keys under the prefix the scrape could not use,
      written by another client: every key whose name part is not a valid name
      (``discover=True``), plus one per name whose keys hold a foreign type or
      content (that name also gets ``distbreaker_unreadable{name} 1``). The rest
      is exported as usual and ``distbreaker_up`` stays 1.
    - ``distbreaker_breaker_v1_state{name,state}`` (``discover=True``): the state of
      each breaker found in key schema v1, kept by workers not yet upgraded during
      a rolling deploy (they do not share state with v2 workers).

    Bounded cardinality: with ``discover=True`` and thousands of keyed names, only
    ``top_k`` discovered names (default 100; None: all) get the per-name series above:
    the unreadable ones, then OPEN / HALF_OPEN / FORCED_OPEN, DISABLED / METRICS_ONLY,
    CLOSED, each by failure rate, slow-call rate and rejections (registered names always
    get theirs). Every name is in the namespace aggregates:
    ``distbreaker_namespace_names``, ``_names_not_exported``,
    ``distbreaker_namespace_breakers{state}``,
    ``distbreaker_namespace_fleet_calls_total{outcome}``,
    ``_fleet_rejections_total``, ``_bulkhead_in_use``, ``_ratelimiter_rejections_total``.

    Per process, from the registered objects (no Redis): ``distbreaker_calls_total
    {name,outcome}``, ``distbreaker_rejections_total{name,reason}`` (open,
    half_open_full, forced_open, redis_unavailable, ramping: slow start after a recovery,
    bulkhead_full, rate_limited) and
    ``distbreaker_transitions_total{name,from_state,to_state}`` for the transitions
    this process's calls made (each is counted by exactly one process).

    Under prefork servers (gunicorn, Celery prefork) with prometheus_client's
    multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set, or ``multiprocess=True``),
    the per-process counters are prometheus_client Counters each worker updates on
    every call, in its own file of that directory; ``MultiProcessCollector`` adds
    them up, so any worker's scrape reports the whole fleet's calls. This collector
    then exports the fleet-wide figures only (see docs/guides/prometheus.md).
    """

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 discover: bool = False, timeout: float = 1.0,
                 components: Iterable[Any] = (), multiprocess: bool | None = None,
                 top_k: int | None = DEFAULT_TOP_K) -> None:
        self.source = MetricsSource(redis, prefix=prefix, discover=discover, timeout=timeout,
                                    top_k=top_k)
        if multiprocess is None:
            multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")
                                or os.environ.get("prometheus_multiproc_dir"))
        self.multiprocess = multiprocess
        if multiprocess:
            counters = _ProcessCounters()
            self.source.on_component(counters.watch)
            self.source.on_transition(counters.transition)
        self.source.register(*components)

    @property
    def prefix(self) -> str:
        return self.source.prefix

    @property
    def discover(self) -> bool:
        """Whether every name found under the prefix is exported too."""
        return self.source.discover

    @discover.setter
    def discover(self, value: bool) -> None:
        self.source.discover = value

    def register(self, *components: Any) -> None:
        """Export these breakers, bulkheads, retry budgets, policies (their parts) or
        names (str: all three components) from now on, whether or not used yet."""
        self.source.register(*components)

    def describe(self) -> list[Metric]:
        """Nothing: describing would make registration scrape Redis (prometheus_client
        calls collect() when describe() is missing)."""
        return []

    def collect(self) -> Iterator[Metric]:
        local = () if self.multiprocess else self.source.local()
        for family in (*self.source.fleet(), *local):
            yield _prometheus(family)


_OUTCOMES = {"success": "success", "error": "failure", "ignored_error": "ignored"}


class _ProcessCounters:
    """The per-process counters as prometheus_client Counters, for multiprocess mode.

    Each is counted when it happens (a breaker's or bulkhead's event, a transition
    this process made), into this process's file of ``PROMETHEUS_MULTIPROC_DIR``;
    the custom collector's scrape-time reading would only ever see the scraped
    worker's own counts. Not registered anywhere: ``MultiProcessCollector`` reads
    the files.
    """

    def __init__(self) -> None:
        calls, rejections, transitions, injected = process_families()
        self.calls = Counter(calls.name, calls.help, list(calls.labels), registry=None)
        self.rejections = Counter(rejections.name, rejections.help, list(rejections.labels),
                                  registry=None)
        self.transitions = Counter(transitions.name, transitions.help,
                                   list(transitions.labels), registry=None)
        self.injected = Counter(injected.name, injected.help, list(injected.labels),
                                registry=None)

    def watch(self, component: Any) -> None:
        if isinstance(component, BreakerCore):
            component.add_listener(self.breaker_event,
                                   kinds=(*_OUTCOMES, "not_permitted", "fault_injected"))
        else:
            component.add_listener(self.bulkhead_event, kinds=("rejected",))

    def breaker_event(self, event: Any) -> None:
        if event.kind == "fault_injected":
            kind = ("reject" if isinstance(event.error, InjectedRejection) else
                    "error" if isinstance(event.error, InjectedFault) else "latency")
            self.injected.labels(event.name, kind).inc()
            return
        if event.kind != "not_permitted":
            self.calls.labels(event.name, _OUTCOMES[event.kind]).inc()
            return
        state = getattr(event.state, "value", str(event.state))
        reason = ("injected" if isinstance(event.error, InjectedRejection) else
                  "ramping" if state == State.CLOSED.value else REJECTION_REASONS.get(state))
        if reason is not None:
            self.rejections.labels(event.name, reason).inc()

    def bulkhead_event(self, event: Any) -> None:
        self.rejections.labels(event.name, "bulkhead_full").inc()

    def transition(self, event: Transition) -> None:
        self.transitions.labels(event.name, event.from_state.value,
                                event.to_state.value).inc()


def _prometheus(family: Family) -> Metric:
    cls = GaugeMetricFamily if family.kind == "gauge" else CounterMetricFamily
    metric = cls(family.name, family.help, labels=list(family.labels))
    for labels, value in family.samples:
        metric.add_metric(list(labels), value)
    return metric
