"""The metrics distbreaker exports, without an exporter: Prometheus and OpenTelemetry
build their own instruments from these `Family` values, so both carry the same names.

`MetricsSource` holds what to export (registered breakers, bulkheads, budgets,
policies or names, and optionally every name under the prefix) and reads it:
`fleet()` reads Redis once (pipelined, read-only, see `distbreaker.readside`)
for the fleet-wide figures, `local()` reads this process's own counts (no
Redis). A read never raises because of Redis: `distbreaker_up` is 0 instead.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .._runtime.connection import sync_client
from .._runtime.keys import DEFAULT_PREFIX
from ..breaker.core import BreakerCore
from ..breaker.events import Transition
from ..breaker.state import State
from ..budget.config import MILLIONTHS
from ..budget.core import BudgetCore
from ..bulkhead.core import BulkheadCore
from ..ratelimiter.core import RateLimiterCore
from ..readside import (
    V1,
    Scan,
    foreign_key_count,
    read_history_after,
    read_shadows_many,
    read_summaries,
    scan,
)

__all__ = ["DEFAULT_TOP_K", "REJECTION_REASONS", "Family", "MetricsSource", "catalog",
           "interest", "process_families"]

_REJECTION_REASONS = {"OPEN": "open", "HALF_OPEN": "half_open_full",
                      "FORCED_OPEN": "forced_open", "UNKNOWN": "redis_unavailable",
                      "RAMPING": "ramping", "INJECTED": "injected"}
#: The `reason` label of a rejection, by the state that rejected it.
REJECTION_REASONS = dict(_REJECTION_REASONS)
_STATES = [s.value for s in State]
#: Per-name series for at most this many discovered names by default (`top_k`).
DEFAULT_TOP_K = 100


@dataclasses.dataclass
class Family:
    """One metric: its name (Prometheus counters get ``_total`` on exposition), kind
    ("gauge" or "counter"), help text, label names and samples."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = dataclasses.field(default_factory=list)

    def add(self, labels: Iterable[str], value: float) -> None:
        self.samples.append((tuple(labels), value))


def _gauge(name: str, help: str, *labels: str) -> Family:
    return Family(name, "gauge", help, labels)


def _counter(name: str, help: str, *labels: str) -> Family:
    return Family(name, "counter", help, labels)


#: The components a policy may hold, in export order.
_PARTS = ("breaker", "bulkhead", "budget", "rate_limiter")


def is_bulkhead(item: Any) -> bool:
    return isinstance(item, BulkheadCore)


class MetricsSource:
    """What to export and how to read it (see the module docstring)."""

    def __init__(self, redis: Any = None, *, prefix: str = DEFAULT_PREFIX,
                 discover: bool = False, timeout: float = 1.0,
                 components: Iterable[Any] = (), top_k: int | None = DEFAULT_TOP_K) -> None:
        self.client = sync_client(redis, timeout)
        self.prefix = prefix
        self.discover = discover
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or top_k < 0):
            raise ValueError(f"top_k must be an integer >= 0 or None, got {top_k!r}")
        #: At most this many discovered names get per-name series (None: every name).
        self.top_k = top_k
        self._lock = threading.Lock()
        self._names: dict[str, set[str]] = {}
        self._breakers: list[BreakerCore] = []
        self._bulkheads: list[Any] = []
        self._budgets: dict[str, BudgetCore] = {}
        self._limiters: list[RateLimiterCore] = []
        self._transitions: Counter[tuple[str, str, str]] = Counter()
        #: Fleet transitions counted from the history streams, and the last id counted.
        self._fleet_moves: Counter[tuple[str, str, str]] = Counter()
        self._history_ids: dict[str, str] = {}
        self._listeners: list[Any] = []
        self._watchers: list[Any] = []
        self.register(*components)

    # -- registration ------------------------------------------------------------------
    def on_transition(self, listener: Any) -> None:
        """Also call `listener(Transition)` for the registered breakers' transitions."""
        self._listeners.append(listener)

    def on_component(self, watcher: Any) -> None:
        """Also call `watcher(component)` for each breaker and bulkhead registered, from
        now on and for those already registered (an exporter hooks its events)."""
        with self._lock:
            self._watchers.append(watcher)
            known = [*self._breakers, *self._bulkheads]
        for component in known:
            watcher(component)

    def _watch(self, component: Any) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher(component)

    def register(self, *components: Any) -> None:
        """Export these breakers, bulkheads, retry budgets, policies (their parts) or
        names (str: all three components) from now on, whether or not used yet."""
        for item in components:
            if isinstance(item, str):
                self._add_name(item, "breaker", "bulkhead", "budget", "rate_limiter")
            elif isinstance(item, BreakerCore):
                self._add_breaker(item)
            elif isinstance(item, BudgetCore):
                self._add_name(item.name, "budget")
                with self._lock:
                    self._budgets.setdefault(item.name, item)
            elif is_bulkhead(item):
                self._add_name(item.name, "bulkhead")
                with self._lock:
                    new = not any(b is item for b in self._bulkheads)
                    if new:
                        self._bulkheads.append(item)
                if new:
                    self._watch(item)
            elif isinstance(item, RateLimiterCore):
                self._add_name(item.name, "rate_limiter")
                with self._lock:
                    if not any(r is item for r in self._limiters):
                        self._limiters.append(item)
            elif any(hasattr(item, part) for part in _PARTS):
                parts = [getattr(item, p, None) for p in _PARTS]
                self.register(*(p for p in parts if p is not None))
            else:
                raise TypeError(f"cannot export {item!r}: expected a breaker, bulkhead, "
                                "retry budget, rate limiter, policy or name")

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
        self._watch(breaker)

    def _on_transition(self, event: Any) -> None:
        if not isinstance(event, Transition):
            return
        with self._lock:
            self._transitions[(event.name, event.from_state.value, event.to_state.value)] += 1
        for listener in self._listeners:
            listener(event)

    # -- reading ---------------------------------------------------------------------------
    def fleet(self) -> list[Family]:
        """``distbreaker_up`` and, when Redis answered, the fleet-wide families."""
        up, foreign = _up(), _foreign()
        try:
            rows, legacy, found = self._read()
            shown = self._bounded(rows)
            self._count_history([r["name"] for r in shown if r["breaker"] is not None])
        except Exception:  # a scrape must never fail because Redis did
            up.add((), 0)
            return [up]
        up.add((), 1)
        foreign.add((), foreign_key_count(found, rows + legacy))
        names = {r["name"] for r in shown}
        with self._lock:
            budgets = dict(self._budgets)
            moves = {k: v for k, v in self._fleet_moves.items() if k[0] in names}
        # shadow configs: read only for shown breakers whose record says they have some
        shadowed = [r["name"] for r in shown if (r.get("breaker") or {}).get("shadowed")]
        try:
            shadows = read_shadows_many(self.client, self.prefix, shadowed)
        except Exception:  # a scrape must never fail because Redis did
            shadows = {}
        return [up, *_fleet_families(shown, budgets), _fleet_transitions(moves), foreign,
                _v1_states(legacy), *_namespace_families(rows, len(rows) - len(shown)),
                *(_shadow_families(shadows) if shadows else ())]

    def _bounded(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows that get per-name series: every registered name, and the `top_k`
        discovered ones that most need a look (`interest`); the namespace aggregates
        cover every row."""
        if self.top_k is None:
            return rows
        with self._lock:
            registered = set(self._names)
        found = [r for r in rows if r["name"] not in registered]
        if len(found) <= self.top_k:
            return rows
        chosen = {r["name"] for r in sorted(found, key=interest)[:self.top_k]}
        return [r for r in rows if r["name"] in registered or r["name"] in chosen]

    def _count_history(self, names: list[str]) -> None:
        """Add the history entries written since the last read to the fleet counter (the
        counter stays monotonic when the stream is trimmed or expires)."""
        with self._lock:
            after = {n: self._history_ids.get(n, "0") for n in names}
        found = read_history_after(self.client, self.prefix, after)
        with self._lock:
            for name, events in found.items():
                for event in events:
                    seen = self._history_ids.get(name, "0")
                    if event["id"] is None or _stream_id(event["id"]) <= _stream_id(seen):
                        continue  # counted by a concurrent read
                    if not event.get("kind"):  # a restart or override note is no transition
                        self._fleet_moves[(name, event["from"], event["to"])] += 1
                    self._history_ids[name] = event["id"]

    def _read(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Scan]:
        """The rows of the registered (and discovered) names, the rows of the v1 breakers
        discovered (workers not yet upgraded), and what the scan found: its invalid name
        parts are counted, never exported as labels."""
        with self._lock:
            names = {n: set(parts) for n, parts in self._names.items()}
        found = Scan()
        if self.discover:
            found = scan(self.client, self.prefix)
            for name, parts in found.names.items():
                names.setdefault(name, set()).update(parts)
        if not names:
            self.client.ping()  # so distbreaker_up still tells whether Redis answers
        rows = list(read_summaries(self.client, self.prefix, names))
        for row in rows:
            if "breaker" in names[row["name"]] and row["breaker"] is None and not row["error"]:
                row["state"] = State.CLOSED.value  # registered, never called: CLOSED
                row["never_called"] = True
        legacy = {n: parts for n, parts in found.legacy.items() if "breaker" in parts}
        legacy_rows = list(read_summaries(self.client, self.prefix,
                                          {n: {"breaker"} for n in legacy}, schema=V1))
        return rows, legacy_rows, found

    def local(self) -> list[Family]:
        """This process's calls, rejections and transitions (no Redis)."""
        calls, rejections, transitions, injected = _local_families()
        with self._lock:
            breakers, bulkheads = list(self._breakers), list(self._bulkheads)
            limiters = list(self._limiters)
            moves = dict(self._transitions)
        outcome_sums: Counter[tuple[str, str]] = Counter()
        rejection_sums: Counter[tuple[str, str]] = Counter()
        for breaker in breakers:
            counts = breaker.local_counts()
            for outcome in ("success", "failure", "ignored"):
                outcome_sums[(breaker.name, outcome)] += counts.outcomes.get(outcome, 0)
            for state, reason in _REJECTION_REASONS.items():
                rejection_sums[(breaker.name, reason)] += counts.rejections.get(state, 0)
            for kind, value in sorted(breaker.injected.items()):
                injected.add((breaker.name, kind), value)
        for bulkhead in bulkheads:
            rejection_sums[(bulkhead.name, "bulkhead_full")] += bulkhead.local_counts().rejected
        for limiter in limiters:
            rejection_sums[(limiter.name, "rate_limited")] += limiter.rejected_here
        for (name, outcome), value in sorted(outcome_sums.items()):
            calls.add((name, outcome), value)
        for (name, reason), value in sorted(rejection_sums.items()):
            rejections.add((name, reason), value)
        for (name, src, dst), value in sorted(moves.items()):
            transitions.add((name, src, dst), value)
        return [calls, rejections, transitions, injected]


#: States that need a look first, then the ones an operator holds, then CLOSED.
_STATE_RANK = {"FORCED_OPEN": 0, "OPEN": 0, "HALF_OPEN": 0, "DISABLED": 1, "METRICS_ONLY": 1,
               "CLOSED": 2}


def interest(row: dict[str, Any]) -> tuple[Any, ...]:
    """Sort key of a row for the top-K export, most interesting first: unreadable
    (foreign data), then OPEN / HALF_OPEN / FORCED_OPEN, DISABLED / METRICS_ONLY, CLOSED,
    names without a breaker; within a rank the highest failure rate, slow-call rate,
    Redis rejections, bulkhead use and rate-limiter refusals; then the name."""
    breaker = row.get("breaker") or {}
    bulkhead = row.get("bulkhead") or {}
    limiter = row.get("rate_limiter") or {}
    return (0 if row.get("error") else 1, _STATE_RANK.get(row.get("state") or "", 3),
            -(breaker.get("failure_rate") or 0), -(breaker.get("slow_rate") or 0),
            -(breaker.get("rejected") or 0), -(bulkhead.get("in_use") or 0),
            -(limiter.get("rejected") or 0), row["name"])


def _namespace_families(rows: list[dict[str, Any]], left_out: int) -> list[Family]:
    """Aggregates over every name read (label-free, or by state / outcome): they keep
    their meaning whatever `top_k` leaves out."""
    names = _gauge("distbreaker_namespace_names", "Names under the prefix this read "
                   "exported or aggregated (registered and discovered)")
    omitted = _gauge("distbreaker_namespace_names_not_exported", "Names left without "
                     "per-name series by top_k (they are in the namespace aggregates)")
    states = _gauge("distbreaker_namespace_breakers", "Breakers in each fleet-wide state",
                    "state")
    calls = _counter("distbreaker_namespace_fleet_calls", "Calls every worker recorded in "
                     "every breaker of the namespace (since each key was created), by "
                     "outcome", "outcome")
    rejected = _counter("distbreaker_namespace_fleet_rejections", "Calls Redis rejected "
                        "fleet-wide in every breaker of the namespace")
    in_use = _gauge("distbreaker_namespace_bulkhead_in_use", "Bulkhead permits held in "
                    "every bulkhead of the namespace")
    limited = _counter("distbreaker_namespace_ratelimiter_rejections", "Calls every rate "
                       "limiter of the namespace refused fleet-wide")
    names.add((), len(rows))
    omitted.add((), left_out)
    by_state = Counter(r["state"] for r in rows if r["state"] is not None)
    for value in _STATES:
        states.add((value,), by_state.get(value, 0))
    done = failed = refused = held = limits = 0
    for row in rows:
        breaker = row.get("breaker") or {}
        done += breaker.get("calls_total") or 0
        failed += breaker.get("failures_total") or 0
        refused += breaker.get("rejected") or 0
        held += (row.get("bulkhead") or {}).get("in_use") or 0
        limits += (row.get("rate_limiter") or {}).get("rejected") or 0
    calls.add(("success",), done - failed)
    calls.add(("failure",), failed)
    rejected.add((), refused)
    in_use.add((), held)
    limited.add((), limits)
    return [names, omitted, states, calls, rejected, in_use, limited]


def _up() -> Family:
    return _gauge("distbreaker_up", "1 when Redis answered this scrape, else 0")


def _foreign() -> Family:
    return _gauge("distbreaker_foreign_keys", "Keys under the prefix this read could not "
                  "use: every key whose name part is not a valid name (with discover), plus "
                  "one per name whose keys hold a foreign type or content")


def _v1_states(rows: list[dict[str, Any]]) -> Family:
    """The state of each breaker found in key schema v1 (with discover): the half of the
    fleet not yet upgraded during a rolling deploy, which trips on its own."""
    family = _gauge("distbreaker_breaker_v1_state", "Breaker state kept by workers still on "
                    "key schema v1 (1 for the current state; discover only; a rolling deploy "
                    "from v1 to v2)", "name", "state")
    for row in rows:
        if row["state"] is not None:
            for value in _STATES:
                family.add((row["name"], value), 1 if value == row["state"] else 0)
    return family


def _local_families() -> list[Family]:
    return [_counter("distbreaker_calls", "Calls this process ran through a breaker, by "
                     "outcome", "name", "outcome"),
            _counter("distbreaker_rejections", "Calls this process did not run, by reason",
                     "name", "reason"),
            _counter("distbreaker_transitions", "Transitions made by this process's calls",
                     "name", "from_state", "to_state"),
            _counter("distbreaker_injected_faults", "An operator's injected faults this "
                     "process applied (distbreaker inject), by kind: error, latency, reject; "
                     "never counted as real rejections", "name", "kind")]


def process_families() -> list[Family]:
    """The per-process families (calls, rejections, transitions, injected faults),
    without samples."""
    return _local_families()


def catalog() -> list[Family]:
    """Every family distbreaker exports (no samples), in export order."""
    return [_up(), *_fleet_families([], {}), _fleet_transitions({}), _foreign(),
            _v1_states([]), *_namespace_families([], 0), *_shadow_families({}),
            *_local_families()]


def _shadow_families(shadows: dict[str, list[dict[str, Any]]]) -> list[Family]:
    """Each breaker's shadow configs (docs/guides/shadow.md): what each would have done
    on the live outcomes (pure: no I/O). Counters count since the shadow was set."""
    state = _gauge("distbreaker_shadow_state", "A shadow config's would-be state (1 for the "
                   "current one); it never rejects a call", "name", "shadow", "state")
    open_s = _gauge("distbreaker_shadow_open_seconds", "Seconds a shadow config would have "
                    "been open (OPEN or HALF_OPEN) since it was set", "name", "shadow")
    counters = {key: _counter(f"distbreaker_shadow_{metric}", text, "name", "shadow")
                for key, metric, text in (
                    ("trips", "trips", "Times a shadow config would have tripped"),
                    ("rejected", "rejected", "Calls a shadow config would have rejected"),
                    ("avoided", "failures_avoided", "Failures among the calls a shadow "
                                                    "config would have rejected"),
                    ("seen", "calls", "Outcomes fed to a shadow config"))}
    for name, views in sorted(shadows.items()):
        for s in views:
            for value in ("CLOSED", "OPEN", "HALF_OPEN"):
                state.add((name, s["name"], value), 1 if s["state"] == value else 0)
            open_s.add((name, s["name"]), s["time_open_ms"] / 1000)
            for key, family in counters.items():
                family.add((name, s["name"]), s[key])
    return [state, open_s, *counters.values()]


def _fleet_transitions(moves: dict[tuple[str, str, str], int]) -> Family:
    family = _counter("distbreaker_breaker_transitions", "Transitions of the whole fleet, "
                      "counted from the breakers' history streams", "name", "from_state",
                      "to_state")
    for labels, value in sorted(moves.items()):
        family.add(labels, value)
    return family


def _stream_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>") as numbers, so ids compare in stream order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


#: The fleet-wide families (name, kind, help, labels), in export order.
_BREAKER_FIELDS = {
    "failure_rate": ("distbreaker_breaker_failure_rate_percent", "Failure rate of the window "
                     "(-1 below the minimum number of calls)"),
    "slow_rate": ("distbreaker_breaker_slow_call_rate_percent", "Slow-call rate of the window "
                  "(-1 below the minimum number of calls)"),
    "calls": ("distbreaker_breaker_window_calls", "Calls in the window (probes reported, in "
              "HALF_OPEN)"),
    "failures": ("distbreaker_breaker_window_failures", "Failed calls in the window"),
    "slow": ("distbreaker_breaker_window_slow_calls", "Slow calls in the window"),
    "retry_in_s": ("distbreaker_breaker_retry_in_seconds", "Seconds until a call may be tried "
                   "(-1: held FORCED_OPEN)"),
}


def _fleet_families(rows: list[dict[str, Any]], budgets: dict[str, BudgetCore]) -> list[Family]:
    """The gauge families of one read's rows (pure: no I/O)."""
    state = _gauge("distbreaker_breaker_state", "Fleet-wide breaker state (1 for the current "
                   "state)", "name", "state")
    state_seconds = _gauge("distbreaker_breaker_state_seconds", "Seconds since the breaker's "
                           "last transition (server clock)", "name")
    fields = {key: _gauge(name, text, "name") for key, (name, text) in _BREAKER_FIELDS.items()}
    fleet_rejected = _counter("distbreaker_breaker_fleet_rejections", "Calls rejected "
                              "fleet-wide by Redis (since the key was created)", "name")
    fleet_calls = _counter("distbreaker_breaker_fleet_calls", "Calls every worker recorded "
                           "(since the key was created), by outcome: the same from any "
                           "process's scrape", "name", "outcome")
    fleet_slow = _counter("distbreaker_breaker_fleet_slow_calls", "Slow calls every worker "
                          "recorded (since the key was created)", "name")
    in_use = _gauge("distbreaker_bulkhead_in_use", "Bulkhead permits held fleet-wide", "name")
    limit = _gauge("distbreaker_bulkhead_limit", "Fleet-wide bulkhead limit (an adaptive "
                   "one's current integer limit)", "name")
    adaptive = _gauge("distbreaker_bulkhead_adaptive_limit", "An adaptive bulkhead's "
                      "limit before rounding down", "name")
    limit_info = _gauge("distbreaker_bulkhead_limit_info", "1, labelled with why an adaptive "
                        "bulkhead's limit last moved", "name", "why")
    moved = _gauge("distbreaker_bulkhead_limit_moved_seconds", "Seconds since an adaptive "
                   "bulkhead's integer limit last changed (-1: never since it started)", "name")
    paused = _gauge("distbreaker_bulkhead_limit_paused_seconds", "Seconds an adaptive "
                    "bulkhead's increases stay paused after a 429 (0: not paused)", "name")
    deposits = _gauge("distbreaker_budget_deposits", "Requests counted by the retry budget "
                      "in its window", "name")
    withdrawals = _gauge("distbreaker_budget_withdrawals", "Retries taken from the retry "
                         "budget in its window", "name")
    balance = _gauge("distbreaker_budget_balance", "Retries the fleet may still make now",
                     "name")
    limiter_families = _limiter_families()
    unreadable = _gauge("distbreaker_unreadable", "1 when a name's keys hold foreign data",
                        "name")
    configs = _gauge("distbreaker_breaker_config_workers", "Workers running each deployed "
                     "config of a breaker (hellos in the last minute); in_force 1 for the "
                     "config in force", "name", "fingerprint", "in_force")
    for row in rows:
        name = row["name"]
        if row["error"]:
            unreadable.add((name,), 1)
            continue
        if row["state"] is not None:
            for value in _STATES:
                state.add((name, value), 1 if value == row["state"] else 0)
        breaker = row["breaker"]
        if breaker is not None:
            for field, family in fields.items():
                value = breaker[field]
                family.add((name,), -1 if value is None else value)
            fleet_rejected.add((name,), breaker["rejected"])
            if breaker.get("calls_total") is not None:
                failed = breaker["failures_total"]
                fleet_calls.add((name, "success"), breaker["calls_total"] - failed)
                fleet_calls.add((name, "failure"), failed)
                fleet_slow.add((name,), breaker.get("slow_total") or 0)
            state_seconds.add((name,), breaker["in_state_s"])
            for c in breaker.get("configs") or ():
                configs.add((name, c["fingerprint"], "1" if c["in_force"] else "0"),
                            c["workers"])
        elif row.get("never_called"):
            for field, family in fields.items():
                family.add((name,), -1 if field.endswith("rate") else 0)
            for outcome in ("success", "failure"):
                fleet_calls.add((name, outcome), 0)
            fleet_slow.add((name,), 0)
        bulkhead = row["bulkhead"]
        if bulkhead is not None:
            in_use.add((name,), bulkhead["in_use"])
            if bulkhead["limit"] is not None:
                limit.add((name,), bulkhead["limit"])
            a = bulkhead.get("adaptive")
            if a is not None:
                adaptive.add((name,), a["limit"])
                limit_info.add((name, a["why"]), 1)
                moved.add((name,), -1 if a["moved_ago_s"] is None else a["moved_ago_s"])
                paused.add((name,), a["paused_for_s"])
        budget = row["budget"] or {}
        d, w = budget.get("deposits") or 0, budget.get("withdrawals") or 0
        if row["budget"] is not None or name in budgets:
            deposits.add((name,), d)
            withdrawals.add((name,), w)
        core = budgets.get(name)
        if core is not None:  # budget.lua's formula, with this process's settings
            cfg = core.config
            balance.add((name,), (cfg.reserve_millionths + cfg.percent_millionths * d)
                        // MILLIONTHS - w)
        elif budget.get("balance") is not None:  # with the settings stored in the hash
            balance.add((name,), budget["balance"])
        if row.get("rate_limiter") is not None:
            _add_limiter(limiter_families, name, row["rate_limiter"])
    return [state, state_seconds, *fields.values(), fleet_rejected, fleet_calls, fleet_slow,
            in_use, limit, adaptive, limit_info, moved, paused, deposits, withdrawals, balance,
            *limiter_families.values(), unreadable, configs]


#: A rate limiter row's field -> (family, kind, help); readside.decode_rate_limiter.
_LIMITER_FIELDS = {
    "available": ("distbreaker_ratelimiter_available_permissions", "gauge", "Permits the "
                  "rate limiter could grant now (negative: reserved by waiting calls)"),
    "limit_for_period": ("distbreaker_ratelimiter_limit", "gauge", "Permits per period in "
                         "force (an operator's limit when one is set)"),
    "limit_refresh_period_ms": ("distbreaker_ratelimiter_period_seconds", "gauge",
                                "The rate limiter's period in force"),
    "calls": ("distbreaker_ratelimiter_calls", "counter", "Calls granted fleet-wide (since "
              "the key was created)"),
    "permits": ("distbreaker_ratelimiter_permits", "counter", "Permits granted fleet-wide "
                "(the calls' weights; since the key was created)"),
    "rejected": ("distbreaker_ratelimiter_rejections", "counter", "Calls the rate limiter "
                 "refused fleet-wide (since the key was created)"),
}


def _limiter_families() -> dict[str, Family]:
    return {field: (_gauge if kind == "gauge" else _counter)(name, text, "name")
            for field, (name, kind, text) in _LIMITER_FIELDS.items()}


def _add_limiter(families: dict[str, Family], name: str, row: dict[str, Any]) -> None:
    for field, family in families.items():
        value = row.get(field)
        if value is not None:
            family.add((name,), value / 1000 if field.endswith("_ms") else value)
