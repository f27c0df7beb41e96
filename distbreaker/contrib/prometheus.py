"""Prometheus metrics for distbreaker: fleet-wide truth from Redis, plus this process's counts.

```python
from prometheus_client import REGISTRY
from distbreaker.contrib.prometheus import DistbreakerCollector

collector = DistbreakerCollector(redis=URL)
collector.register(breaker, bulkhead, budget)    # or a Policy, or plain names
REGISTRY.register(collector)
```

Each scrape reads Redis once (pipelined, read-only, see `distbreaker.readside`)
and exports for every registered name (and, with ``discover=True``, every name
found under the prefix):

- ``distbreaker_breaker_state{name,state}``: 1 for the current fleet-wide
  state, 0 for the others; a registered breaker that was never called is
  exported as CLOSED;
- ``distbreaker_breaker_state_seconds{name}``: seconds since the last
  transition (server clock), for "open longer than 5 minutes" alerts;
- ``distbreaker_breaker_transitions_total{name,from_state,to_state}``:
  transitions of the whole fleet, counted from each breaker's history stream
  (each scrape reads only the entries after the last one it counted, so the
  counter is monotonic even when the stream is trimmed or expires; it starts
  from the history kept when the collector first sees the name);
- ``distbreaker_breaker_failure_rate_percent`` / ``_slow_call_rate_percent``
  (-1 below the minimum number of calls), ``distbreaker_breaker_window_calls``
  / ``_window_failures`` / ``_window_slow_calls``, ``_retry_in_seconds``, and
  ``distbreaker_breaker_fleet_rejections_total``;
- ``distbreaker_bulkhead_in_use`` / ``_limit``;
- ``distbreaker_budget_deposits`` / ``_withdrawals`` over the window and
  ``distbreaker_budget_balance`` (with a registered budget's settings, else with
  the settings the last writer stored in the hash);
- ``distbreaker_up``: 1 when Redis answered this scrape, else 0 (the fleet
  metrics are then left out; a scrape never fails because of Redis).

Per process (from the registered objects themselves, no Redis):
``distbreaker_calls_total{name,outcome}``, ``distbreaker_rejections_total
{name,reason}`` (reason: open, half_open_full, forced_open, redis_unavailable,
bulkhead_full) and ``distbreaker_transitions_total{name,from_state,to_state}``
for the transitions this process's calls made (each transition is counted by
exactly one process, so summing over processes gives the fleet's count).
Under gunicorn/Celery prefork, use prometheus_client's multiprocess mode or
one scrape target per worker, as for any per-process counter.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._runtime.connection import sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..breaker.core import BreakerCore
from ..breaker.events import Transition
from ..breaker.state import State
from ..budget.config import MILLIONTHS
from ..budget.core import BudgetCore
from ..readside import read_history_after, read_summaries, scan_names

__all__ = ["DistbreakerCollector"]

_REJECTION_REASONS = {"OPEN": "open", "HALF_OPEN": "half_open_full",
                      "FORCED_OPEN": "forced_open", "UNKNOWN": "redis_unavailable"}
_STATES = [s.value for s in State]


class DistbreakerCollector(Collector):
    """A prometheus_client collector of distbreaker's fleet-wide and per-process figures.

    `redis` is a URL or a sync redis-py client used for the read-only scrape
    (a short `timeout` bounds a scrape while Redis hangs).
    """

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 discover: bool = False, timeout: float = 1.0,
                 components: Iterable[Any] = ()) -> None:
        self._client = sync_client(redis, timeout)
        self.prefix = prefix
        self.discover = discover
        self._lock = threading.Lock()
        self._names: dict[str, set[str]] = {}
        self._breakers: list[BreakerCore] = []
        self._bulkheads: list[Any] = []
        self._budgets: dict[str, BudgetCore] = {}
        self._transitions: Counter[tuple[str, str, str]] = Counter()
        #: Fleet transitions counted from the history streams, and the last id counted.
        self._fleet_moves: Counter[tuple[str, str, str]] = Counter()
        self._history_ids: dict[str, str] = {}
        self.register(*components)

    # -- registration ------------------------------------------------------------------
    def register(self, *components: Any) -> None:
        """Export these breakers, bulkheads, retry budgets, policies (their parts) or
        names (str: all three components) from now on, whether or not used yet."""
        for item in components:
            if isinstance(item, str):
                self._add_name(item, "breaker", "bulkhead", "budget")
            elif isinstance(item, BreakerCore):
                self._add_breaker(item)
            elif isinstance(item, BudgetCore):
                self._add_name(item.name, "budget")
                with self._lock:
                    self._budgets.setdefault(item.name, item)
            elif _is_bulkhead(item):
                self._add_name(item.name, "bulkhead")
                with self._lock:
                    self._bulkheads.append(item)
            elif any(hasattr(item, part) for part in ("breaker", "bulkhead", "budget")):
                parts = [getattr(item, p, None) for p in ("breaker", "bulkhead", "budget")]
                self.register(*(p for p in parts if p is not None))
            else:
                raise TypeError(f"cannot export {item!r}: expected a breaker, bulkhead, "
                                "retry budget, policy or name")

    def _add_name(self, name: str, *parts: str) -> None:
        with self._lock:
            self._names.setdefault(name, set()).update(parts)

    def _add_breaker(self, breaker: BreakerCore) -> None:
        self._add_name(breaker.name, "breaker")
        with self._lock:
            if any(b is breaker for b in self._breakers):
                return
            self._breakers.append(breaker)
        breaker.add_listener(self._on_transition)

    def _on_transition(self, event: Transition) -> None:
        with self._lock:
            self._transitions[(event.name, event.from_state.value, event.to_state.value)] += 1

    # -- the scrape -------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        """Nothing: describing would make registration scrape Redis (prometheus_client
        calls collect() when describe() is missing)."""
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._fleet()
        yield from self._local()

    def _fleet(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("distbreaker_up", "1 when Redis answered this scrape, else 0")
        try:
            rows = self._read()
        except Exception:  # a scrape must never fail because Redis did
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _FleetMetrics(rows, self._budget_configs()).families()
        yield self._fleet_transitions()

    def _read(self) -> list[dict[str, Any]]:
        with self._lock:
            names = {n: set(parts) for n, parts in self._names.items()}
        if self.discover:
            for name, parts in scan_names(self._client, self.prefix).items():
                names.setdefault(name, set()).update(parts)
        if not names:
            self._client.ping()  # so distbreaker_up still tells whether Redis answers
        rows = list(read_summaries(self._client, self.prefix, names))
        for row in rows:
            if "breaker" in names[row["name"]] and row["breaker"] is None and not row["error"]:
                row["state"] = State.CLOSED.value  # registered, never called: CLOSED
                row["never_called"] = True
        self._count_history([r["name"] for r in rows if r["breaker"] is not None])
        return rows

    def _count_history(self, names: list[str]) -> None:
        """Add the history entries written since the last scrape to the fleet counter."""
        with self._lock:
            after = {n: self._history_ids.get(n, "0") for n in names}
        found = read_history_after(self._client, self.prefix, after)
        with self._lock:
            for name, events in found.items():
                for event in events:
                    seen = self._history_ids.get(name, "0")
                    if event["id"] is None or _stream_id(event["id"]) <= _stream_id(seen):
                        continue  # counted by a concurrent scrape
                    self._fleet_moves[(name, event["from"], event["to"])] += 1
                    self._history_ids[name] = event["id"]

    def _fleet_transitions(self) -> Metric:
        family = CounterMetricFamily(
            "distbreaker_breaker_transitions", "Transitions of the whole fleet, counted from "
            "the breakers' history streams", labels=["name", "from_state", "to_state"])
        with self._lock:
            moves = sorted(self._fleet_moves.items())
        for (name, src, dst), value in moves:
            family.add_metric([name, src, dst], value)
        return family

    def _budget_configs(self) -> dict[str, BudgetCore]:
        with self._lock:
            return dict(self._budgets)

    def _local(self) -> Iterator[Metric]:
        calls = CounterMetricFamily("distbreaker_calls", "Calls this process ran through a "
                                    "breaker, by outcome", labels=["name", "outcome"])
        rejections = CounterMetricFamily("distbreaker_rejections", "Calls this process did not "
                                         "run, by reason", labels=["name", "reason"])
        transitions = CounterMetricFamily(
            "distbreaker_transitions", "Transitions made by this process's calls",
            labels=["name", "from_state", "to_state"])
        with self._lock:
            breakers, bulkheads = list(self._breakers), list(self._bulkheads)
            moves = dict(self._transitions)
        outcome_sums: Counter[tuple[str, str]] = Counter()
        rejection_sums: Counter[tuple[str, str]] = Counter()
        for breaker in breakers:
            codec = breaker._codec
            for outcome in ("success", "failure", "ignored"):
                outcome_sums[(breaker.name, outcome)] += codec.outcomes.get(outcome, 0)
            for state, reason in _REJECTION_REASONS.items():
                rejection_sums[(breaker.name, reason)] += codec.rejections.get(state, 0)
        for bulkhead in bulkheads:
            rejection_sums[(bulkhead.name, "bulkhead_full")] += bulkhead._codec.rejected_here
        for (name, outcome), value in sorted(outcome_sums.items()):
            calls.add_metric([name, outcome], value)
        for (name, reason), value in sorted(rejection_sums.items()):
            rejections.add_metric([name, reason], value)
        for (name, src, dst), value in sorted(moves.items()):
            transitions.add_metric([name, src, dst], value)
        yield calls
        yield rejections
        yield transitions


def _stream_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as numbers, so ids compare in stream order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


def _is_bulkhead(item: Any) -> bool:
    codec = getattr(item, "_codec", None)
    return codec is not None and hasattr(codec, "rejected_here") and hasattr(item, "name")


class _FleetMetrics:
    """The gauge families of one scrape's rows (pure: no I/O)."""

    def __init__(self, rows: list[dict[str, Any]], budgets: dict[str, BudgetCore]) -> None:
        self.rows = rows
        self.budgets = budgets

    def families(self) -> Iterator[Metric]:
        g = GaugeMetricFamily
        state = g("distbreaker_breaker_state", "Fleet-wide breaker state (1 for the current "
                  "state)", labels=["name", "state"])
        state_seconds = g("distbreaker_breaker_state_seconds", "Seconds since the breaker's "
                          "last transition (server clock)", labels=["name"])
        fields = {
            "failure_rate": g("distbreaker_breaker_failure_rate_percent", "Failure rate of "
                              "the window (-1 below the minimum number of calls)",
                              labels=["name"]),
            "slow_rate": g("distbreaker_breaker_slow_call_rate_percent", "Slow-call rate of "
                           "the window (-1 below the minimum number of calls)", labels=["name"]),
            "calls": g("distbreaker_breaker_window_calls", "Calls in the window (probes "
                       "reported, in HALF_OPEN)", labels=["name"]),
            "failures": g("distbreaker_breaker_window_failures", "Failed calls in the window",
                          labels=["name"]),
            "slow": g("distbreaker_breaker_window_slow_calls", "Slow calls in the window",
                      labels=["name"]),
            "retry_in_s": g("distbreaker_breaker_retry_in_seconds", "Seconds until a call may "
                            "be tried (-1: held FORCED_OPEN)", labels=["name"]),
        }
        fleet_rejected = CounterMetricFamily("distbreaker_breaker_fleet_rejections", "Calls "
                                             "rejected fleet-wide by Redis (since the key was "
                                             "created)", labels=["name"])
        in_use = g("distbreaker_bulkhead_in_use", "Bulkhead permits held fleet-wide",
                   labels=["name"])
        limit = g("distbreaker_bulkhead_limit", "Fleet-wide bulkhead limit", labels=["name"])
        deposits = g("distbreaker_budget_deposits", "Requests counted by the retry budget "
                     "in its window", labels=["name"])
        withdrawals = g("distbreaker_budget_withdrawals", "Retries taken from the retry "
                        "budget in its window", labels=["name"])
        balance = g("distbreaker_budget_balance", "Retries the fleet may still make now",
                    labels=["name"])
        unreadable = g("distbreaker_unreadable", "1 when a name's keys hold foreign data",
                       labels=["name"])
        for row in self.rows:
            name = row["name"]
            if row["error"]:
                unreadable.add_metric([name], 1)
                continue
            if row["state"] is not None:
                for value in _STATES:
                    state.add_metric([name, value], 1 if value == row["state"] else 0)
            breaker = row["breaker"]
            if breaker is not None:
                state_seconds.add_metric([name], breaker["in_state_s"])
                for field, family in fields.items():
                    value = breaker[field]
                    family.add_metric([name], -1 if value is None else value)
                fleet_rejected.add_metric([name], breaker["rejected"])
            elif row.get("never_called"):
                for field, family in fields.items():
                    family.add_metric([name], -1 if field.endswith("rate") else 0)
            bulkhead = row["bulkhead"]
            if bulkhead is not None:
                in_use.add_metric([name], bulkhead["in_use"])
                if bulkhead["limit"] is not None:
                    limit.add_metric([name], bulkhead["limit"])
            self._budget(row, deposits, withdrawals, balance)
        yield state
        yield state_seconds
        yield from fields.values()
        yield from (fleet_rejected, in_use, limit, deposits, withdrawals, balance, unreadable)

    def _budget(self, row: dict[str, Any], deposits: GaugeMetricFamily,
                withdrawals: GaugeMetricFamily, balance: GaugeMetricFamily) -> None:
        name = row["name"]
        budget = row["budget"] or {}
        d, w = budget.get("deposits") or 0, budget.get("withdrawals") or 0
        if row["budget"] is not None or name in self.budgets:
            deposits.add_metric([name], d)
            withdrawals.add_metric([name], w)
        core = self.budgets.get(name)
        if core is not None:  # budget.lua's formula, with this process's settings
            cfg = core.config
            allowed = (cfg.reserve_millionths + cfg.percent_millionths * d) // MILLIONTHS
            balance.add_metric([name], allowed - w)
        elif budget.get("balance") is not None:  # with the settings stored in the hash
            balance.add_metric([name], budget["balance"])
