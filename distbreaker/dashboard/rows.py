"""The dashboard's fleet rows without I/O: the compact row each browser gets, what counts as
a change (so only changed rows are sent), fleet-wide rates from two reads of counters, and
window latency from a state record's window.

A fleet row is the `ls` row cut down to what the pages show (a 10,000-name snapshot stays
a few MB): the breaker's state, times, rates and probes, the number of workers that
reported into it in the last minute (their config hellos, in the meta hash), the
bulkhead, the retry budget, the rate limiter, and the dashboard's own figures (``rates``,
``rl_rates``, ``latency``). Times are absolute (server ms): the page counts "for" and
"next call" itself, so a row that did not change is never sent again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._runtime import state_record

#: (server ms, counter, counter, ...): one read of a name's cumulative counters.
Counters = tuple[int, ...]

#: Fields left out when two rows are compared: they move with time alone (the page
#: counts them from the absolute times in the row).
VOLATILE = frozenset({"retry_in_s", "moved_ago_s", "paused_for_s", "interval_s", "read_at"})


def row_key(row: Mapping[str, Any]) -> str:
    """The row's identity on the page: its name, ``v1:<name>`` for key schema v1 rows."""
    return "v1:" + row["name"] if row.get("schema") == "v1" else row["name"]


def per_second(before: Counters | None, now: Counters,
               names: Sequence[str]) -> dict[str, float] | None:
    """Per-second differences of two reads (server ms first, then counters named by
    `names`); None without an earlier read, or when a counter went back (the keys expired
    and were created again)."""
    if before is None or now[0] <= before[0] or len(before) != len(now):
        return None
    seconds = (now[0] - before[0]) / 1000
    moved = [b - a for a, b in zip(before[1:], now[1:], strict=True)]
    if min(moved, default=0) < 0:
        return None
    out = {name: _round(value / seconds) for name, value in zip(names, moved, strict=True)}
    out["interval_s"] = seconds
    return out


def rates(before: Counters | None, now: Counters) -> dict[str, float] | None:
    """A breaker's fleet-wide figures per second between two reads of (server ms,
    calls_total, failures_total, slow_total, rejected)."""
    found = per_second(before, now, ("calls", "failure", "slow", "rejected"))
    if found is None:
        return None
    found["success"] = _round(found["calls"] - found["failure"])
    return found


def _round(value: float) -> float:
    """Four significant digits: a rate that did not really change compares equal."""
    return float(f"{value:.4g}")


def percentile(values: Sequence[int], share: float) -> int:
    """The nearest-rank percentile of sorted `values` (share 0.5: the median)."""
    return values[max(0, min(len(values) - 1, -(-int(share * 1000) * len(values) // 1000) - 1))]


def weighted_percentile(pairs: Sequence[tuple[float, int]], share: float) -> float:
    """The nearest-rank percentile of values given with their counts, sorted by value."""
    total = sum(n for _, n in pairs)
    rank = max(1, -(-int(share * 1000) * total // 1000))
    seen = 0
    for value, n in pairs:
        seen += n
        if seen >= rank:
            return value
    return pairs[-1][0]


def window_end(window_type: str, size: int) -> int:
    """The last byte of a state record's window (what a latency read GETRANGEs)."""
    width = (state_record.COUNT_SLOT_BYTES * size if window_type == "COUNT_BASED"
             else state_record.time_window_bytes(size))
    return state_record.WINDOW_OFFSET + width - 1


def window_latency(raw: bytes, window_type: str, size: int,
                   now_ms: int) -> dict[str, Any] | None:
    """Fleet-wide call latency over a breaker's window, from its record's window bytes.

    A count window's ring keeps every call's ms: exact p50 / p99. A time window keeps per
    second only the calls and their summed ms, so its p50 / p99 are those of the
    per-second mean latencies, each second weighted by its calls (``"per": "second"``):
    the spread between seconds, not within one; its mean is exact. None without calls."""
    if window_type == "COUNT_BASED":
        ms = sorted(slot[2] for slot in state_record.count_slots(raw, size) if slot is not None)
        if not ms:
            return None
        return {"p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99),
                "mean_ms": round(sum(ms) / len(ms), 1), "calls": len(ms)}
    now_s = now_ms // 1000
    seconds = sorted((total / calls, calls) for sec, calls, _, _, total
                     in state_record.time_seconds(raw, size) if 0 <= now_s - sec < size)
    if not seconds:
        return None
    calls = sum(n for _, n in seconds)
    return {"p50_ms": round(weighted_percentile(seconds, 0.5), 1),
            "p99_ms": round(weighted_percentile(seconds, 0.99), 1),
            "mean_ms": round(sum(m * n for m, n in seconds) / calls, 1), "calls": calls,
            "per": "second"}


def workers(breaker: Mapping[str, Any]) -> int | None:
    """Worker instances that reported into a breaker in the last minute: each says hello
    with its config at its first call and every 20 s (the rollout hash); None for v1."""
    configs = breaker.get("configs")
    if configs is None:
        return None
    return sum(int(c.get("workers") or 0) for c in configs)


def fleet_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The `ls` row (with the dashboard's ``rates``, ``rl_rates``, ``latency``) cut down to
    what the fleet page shows."""
    out: dict[str, Any] = {"name": row["name"], "schema": row.get("schema", "v2"),
                           "state": row.get("state"), "error": row.get("error"),
                           "breaker": None, "bulkhead": row.get("bulkhead"),
                           "budget": None, "rate_limiter": None,
                           "rates": row.get("rates"), "rl_rates": row.get("rl_rates"),
                           "latency": row.get("latency")}
    b = row.get("breaker")
    if b is not None:
        config = b["config"]
        quorum = b.get("quorum")
        out["breaker"] = {
            "state": b["state"], "since_ms": b["since_ms"], "open_until_ms": b["open_until_ms"],
            "override_until_ms": b["override_until_ms"], "retry_in_s": b["retry_in_s"],
            "calls": b["calls"], "failure_rate": b["failure_rate"],
            "slow_rate": b["slow_rate"], "rejected": b["rejected"],
            "half_open": {"issued": b["half_open"]["issued"], "done": b["half_open"]["done"]},
            "config": {k: config[k] for k in (
                "sliding_window_type", "sliding_window_size", "minimum_number_of_calls",
                "permitted_calls_in_half_open", "wait_duration_in_open_state_s")},
            "quorum": {"pending": quorum["pending"], "text": quorum["text"]} if quorum else None,
            "drift": b.get("config_drift") is not None,
            "workers": workers(b), "reason": b.get("reason") or None}
    rb = row.get("budget")
    if rb is not None:
        out["budget"] = {k: rb.get(k) for k in ("deposits", "withdrawals", "balance")}
    rl = row.get("rate_limiter")
    if rl is not None:
        out["rate_limiter"] = dict(rl)
    return _compact(out)


def _compact(value: Any) -> Any:
    """Without the null fields (a missing field is null to the page): a 10,000-name
    snapshot is a third smaller."""
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items() if v is not None}
    return value


def pool_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A pool (`readside_pool.pool_row`: ``pool show --json``) as the pool view shows it:
    per member its state, why, until when, in flight, success rate, latency, ejections."""
    keep = ("member", "state", "weight", "in_flight", "ejected_until", "why", "ejections",
            "calls", "failures", "success_rate", "mean_latency", "latency_ewma", "override",
            "capped", "slow_share", "last_ejected_at")
    return {"pool": row["pool"], "members": row["members"], "ejected": row["ejected"],
            "healthy": row["healthy"], "panic": row["panic"], "read_at": row["read_at"],
            "latency_threshold": row.get("latency_threshold"),
            "rows": [{k: m.get(k) for k in keep} for m in row["rows"]]}


def comparable(row: Mapping[str, Any]) -> str:
    """The row as compared with the one last sent: without the fields that move with time
    alone (`VOLATILE`)."""
    return json.dumps(_strip(row), sort_keys=True, separators=(",", ":"))


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    return value


def is_empty(row: Mapping[str, Any]) -> bool:
    """No component has keys any more, and nothing foreign either: the row goes."""
    return not row.get("error") and all(row.get(part) is None for part in (
        "breaker", "bulkhead", "budget", "rate_limiter"))
