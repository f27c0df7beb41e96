"""The dashboard's fleet rows without I/O: latency of count and time windows from a record's
window bytes, what counts as a change, reporting workers, rates from two reads."""

from __future__ import annotations

import struct

from distbreaker._runtime.record_layout import FAILED, PRESENT, WINDOW_OFFSET
from distbreaker.dashboard.rows import (
    comparable,
    fleet_row,
    is_empty,
    per_second,
    row_key,
    weighted_percentile,
    window_end,
    window_latency,
    workers,
)

HEADER = b"\0" * WINDOW_OFFSET


def count_window(ms: list[int | None], failed: int = 0) -> bytes:
    slots = [0 if m is None else PRESENT | m | (FAILED if i < failed else 0)
             for i, m in enumerate(ms)]
    return HEADER + b"".join(struct.pack(">I", s) for s in slots)


def time_window(seconds: list[tuple[int, int, int, int, int]]) -> bytes:
    return HEADER + b"".join(struct.pack(">5I", *s) for s in seconds)


def test_a_count_window_gives_exact_percentiles_of_every_call() -> None:
    raw = count_window([*range(1, 101), None, None], failed=3)
    found = window_latency(raw, "COUNT_BASED", 102, 0)
    assert found == {"p50_ms": 50, "p99_ms": 99, "mean_ms": 50.5, "calls": 100}
    assert window_latency(count_window([None] * 4), "COUNT_BASED", 4, 0) is None
    assert window_end("COUNT_BASED", 10) == WINDOW_OFFSET + 40 - 1
    assert window_end("TIME_BASED", 10) == WINDOW_OFFSET + 200 + 2 * 2 - 1


def test_a_time_window_gives_percentiles_of_its_per_second_means() -> None:
    now_ms = 1_000_500
    # (epoch second, calls, failures, slow, total ms): 98 calls at 10 ms, 2 at 500 ms,
    # and a stale second (older than the 10 s window) that must not count
    raw = time_window([(1000, 98, 0, 0, 980), (999, 2, 0, 2, 1000), (980, 50, 0, 0, 50_000),
                       (0, 0, 0, 0, 0)])
    found = window_latency(raw, "TIME_BASED", 4, now_ms)
    assert found is not None
    assert (found["p50_ms"], found["p99_ms"], found["calls"]) == (10, 500, 100)
    assert found["mean_ms"] == round((980 + 1000) / 100, 1)
    assert found["per"] == "second"           # said on the page: "~" percentiles
    assert window_latency(time_window([(0, 0, 0, 0, 0)]), "TIME_BASED", 1, now_ms) is None
    assert weighted_percentile([(1.0, 1), (2.0, 1)], 0.5) == 1.0


def test_reporting_workers_add_up_over_the_configs_deployed() -> None:
    breaker = {"configs": [{"workers": 3}, {"workers": 2}, {"workers": 0}]}
    assert workers(breaker) == 5
    assert workers({"configs": []}) == 0
    assert workers({}) is None                # v1 keys: no rollout hash


def breaker(**changes: object) -> dict[str, object]:
    base = {"state": "CLOSED", "since_ms": 1, "open_until_ms": None, "override_until_ms": None,
            "retry_in_s": 0.0, "calls": 5, "failure_rate": -1.0, "slow_rate": -1.0,
            "rejected": 0, "half_open": {"issued": 0, "done": 0, "failed": 0, "slow": 0},
            "config": {"sliding_window_type": "COUNT_BASED", "sliding_window_size": 10,
                       "minimum_number_of_calls": 5, "permitted_calls_in_half_open": 2,
                       "wait_duration_in_open_state_s": 60.0, "wire": "x" * 200},
            "quorum": None, "config_drift": None, "configs": [{"workers": 2}],
            "window": {"calls": 5}}
    return {**base, **changes}


def test_a_fleet_row_is_compact_and_compares_without_what_moves_with_time() -> None:
    row = {"name": "a", "schema": "v2", "state": "CLOSED", "error": None,
           "breaker": breaker(), "bulkhead": None, "budget": None, "rate_limiter": None,
           "rates": {"calls": 1.0, "interval_s": 2.0}}
    shown = fleet_row(row)
    assert "wire" not in shown["breaker"]["config"] and shown["breaker"]["workers"] == 2
    assert "error" not in shown and "bulkhead" not in shown   # nulls left out
    later = fleet_row({**row, "breaker": breaker(retry_in_s=3.0),
                       "rates": {"calls": 1.0, "interval_s": 2.5}})
    assert comparable(later) == comparable(shown)             # only time moved
    moved = fleet_row({**row, "breaker": breaker(calls=6)})
    assert comparable(moved) != comparable(shown)
    assert row_key(row) == "a" and row_key({"name": "a", "schema": "v1"}) == "v1:a"
    assert is_empty({"name": "a"}) and not is_empty({"name": "a", "error": "foreign"})


def test_rates_per_second_between_two_reads() -> None:
    assert per_second(None, (1000, 5), ("calls",)) is None
    assert per_second((1000, 5), (3000, 25), ("calls",)) == {"calls": 10.0, "interval_s": 2.0}
    assert per_second((1000, 50), (3000, 3), ("calls",)) is None    # counters went back
    assert per_second((1000, 50), (3000, 53), ("calls",))["calls"] == 1.5  # type: ignore[index]
