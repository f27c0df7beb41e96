"""Pool aggregates for Prometheus (`distbreaker.contrib.prometheus.PoolCollector`).

Cardinality is bounded by the number of pools: one sample per pool and figure, member
labels only when asked for (``per_member=True``, for pools of a handful of members).
Each scrape reads every pool once (one HGETALL and the server time: ``readside_pool``),
read-only; a scrape never fails because of Redis (``distbreaker_pool_up`` says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._runtime.connection import sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..pool.core import PoolStatus
from ..readside_pool import read_pool, scan_pools
from ._metrics import Family


def pool_families(statuses: Sequence[PoolStatus], per_member: bool = False) -> list[Family]:
    """The pool metrics of these pools (pure: no I/O)."""
    g = {name: Family(f"distbreaker_pool_{name}", "gauge", help, ("pool",)) for name, help in (
        ("members", "members of the pool"),
        ("ejected", "members ejected now, fleet-wide"),
        ("probing", "members back from an ejection, on probes"),
        ("capped", "members the cap (max_ejection_percent) refuses to eject now"),
        ("in_flight", "picks not yet recorded, fleet-wide"),
        ("panic", "1 while fewer than the panic threshold of members are healthy"),
        ("success_rate_percent", "success rate over the last closed interval (-1: no calls)"),
    )}
    ejections = Family("distbreaker_pool_ejections", "counter",
                       "ejections of the pool's members since they were added", ("pool",))
    member_state = Family("distbreaker_pool_member_state", "gauge",
                          "1 for the member's state (healthy, ejected, probing), 0 for the "
                          "others", ("pool", "member", "state"))
    for status in statuses:
        labels = (status.name,)
        members = status.members
        g["members"].add(labels, len(members))
        g["ejected"].add(labels, status.ejected)
        g["probing"].add(labels, sum(m.state == "probing" for m in members))
        g["capped"].add(labels, sum(m.capped and not m.ejected for m in members))
        g["in_flight"].add(labels, sum(m.in_flight for m in members))
        g["panic"].add(labels, 1 if status.panic else 0)
        rates = [m.success_rate for m in members if m.success_rate is not None]
        g["success_rate_percent"].add(labels, sum(rates) / len(rates) if rates else -1)
        ejections.add(labels, sum(m.ejections for m in members))
        if per_member:
            for m in members:
                for state in ("healthy", "ejected", "probing"):
                    member_state.add((status.name, m.member, state),
                                     1 if m.state == state else 0)
    return [*g.values(), ejections, *([member_state] if per_member else [])]


def _metric(family: Family) -> Metric:
    cls = GaugeMetricFamily if family.kind == "gauge" else CounterMetricFamily
    metric = cls(family.name, family.help, labels=list(family.labels))
    for labels, value in family.samples:
        metric.add_metric(list(labels), value)
    return metric


class PoolCollector(Collector):
    """A prometheus_client collector of every pool under the prefix (or of `pools`).

    Per pool: ``distbreaker_pool_members``, ``_ejected``, ``_probing``, ``_capped``,
    ``_in_flight``, ``_panic``, ``_success_rate_percent`` (the mean of the members'
    over the last closed interval, -1 without calls) and ``_ejections_total``; with
    ``per_member=True`` also ``distbreaker_pool_member_state{pool,member,state}``.
    ``distbreaker_pool_up`` is 1 when Redis answered the scrape.
    """

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 pools: Iterable[str] | None = None, per_member: bool = False,
                 timeout: float = 1.0) -> None:
        self._client = sync_client(redis, timeout)
        self.prefix = prefix
        self.pools = None if pools is None else list(pools)
        self.per_member = per_member

    def describe(self) -> list[Metric]:
        return []  # describing would make registration scrape Redis

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("distbreaker_pool_up", "1 when Redis answered this scrape")
        try:
            names = self.pools if self.pools is not None else scan_pools(self._client,
                                                                          self.prefix)
            statuses = [s for s in (read_pool(self._client, self.prefix, n) for n in names)
                        if s is not None]
        except Exception:  # Redis down or foreign data: the scrape itself must not fail
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for family in pool_families(statuses, self.per_member):
            yield _metric(family)
