"""Prometheus metrics for distbreaker: fleet-wide truth from Redis, plus this process's counts.

``REGISTRY.register(DistbreakerCollector(redis=URL, components=[policy, breaker]))``;
the metrics are listed on `DistbreakerCollector` and in the README.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._runtime.keys import DEFAULT_PREFIX
from ._metrics import Family, MetricsSource

__all__ = ["DistbreakerCollector"]


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
      / ``_window_failures`` / ``_window_slow_calls``, ``_retry_in_seconds``, and
      ``distbreaker_breaker_fleet_rejections_total``;
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

    Per process, from the registered objects (no Redis): ``distbreaker_calls_total
    {name,outcome}``, ``distbreaker_rejections_total{name,reason}`` (open,
    half_open_full, forced_open, redis_unavailable, ramping: slow start after a recovery,
    bulkhead_full, rate_limited) and
    ``distbreaker_transitions_total{name,from_state,to_state}`` for the transitions
    this process's calls made (each is counted by exactly one process). Under
    prefork servers use prometheus_client's multiprocess mode or one target per worker.
    """

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 discover: bool = False, timeout: float = 1.0,
                 components: Iterable[Any] = ()) -> None:
        self.source = MetricsSource(redis, prefix=prefix, discover=discover, timeout=timeout,
                                    components=components)

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
        for family in (*self.source.fleet(), *self.source.local()):
            yield _prometheus(family)


def _prometheus(family: Family) -> Metric:
    cls = GaugeMetricFamily if family.kind == "gauge" else CounterMetricFamily
    metric = cls(family.name, family.help, labels=list(family.labels))
    for labels, value in family.samples:
        metric.add_metric(list(labels), value)
    return metric
