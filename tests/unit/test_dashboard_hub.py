"""The dashboard hub's pure parts: a stream's filter, the fleet rates between two reads,
the latency percentiles (the browser tests show them end to end)."""

from __future__ import annotations

from distbreaker.dashboard.hub import Filter, percentile, rates

SNAPSHOT = {"prefix": "p", "server_time_ms": 1, "rows": [{"name": "a"}, {"name": "b"}],
            "spark": {"a": [[1, 0, 0]], "b": [[1, 0, 0]]}}


def test_a_filter_keeps_the_names_and_kinds_asked_for() -> None:
    everything = Filter()
    assert everything.apply("update", SNAPSHOT) is SNAPSHOT
    only_a = Filter(frozenset({"a"}), frozenset({"transition", "snapshot"}))
    assert only_a.apply("update", SNAPSHOT) is None                   # not a kind it wants
    shown = only_a.apply("snapshot", SNAPSHOT)
    assert shown is not None and [r["name"] for r in shown["rows"]] == ["a"]
    assert list(shown["spark"]) == ["a"] and len(SNAPSHOT["rows"]) == 2  # a copy
    assert only_a.apply("transition", {"name": "b"}) is None
    assert only_a.apply("transition", {"name": "a"}) == {"name": "a"}
    assert Filter(frozenset({"a"})).apply("status", {"redis": "ok"}) == {"redis": "ok"}


def test_rates_are_the_counters_difference_per_second() -> None:
    assert rates(None, (1000, 5, 1, 0, 0)) is None
    found = rates((1000, 5, 1, 0, 0), (3000, 25, 6, 2, 4))
    assert found == {"calls": 10.0, "success": 7.5, "failure": 2.5, "slow": 1.0,
                     "rejected": 2.0, "interval_s": 2.0}
    assert rates((1000, 50, 1, 0, 0), (3000, 3, 0, 0, 0)) is None  # keys expired


def test_percentiles_by_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (50, 99)
    assert percentile([7], 0.99) == 7


def test_a_named_stream_gets_only_its_rows_and_pools_of_an_update() -> None:
    update = {"rows": [{"name": "a"}, {"name": "b"}], "removed": ["c", "v1:a"],
              "pools": [{"pool": "llm"}, {"pool": "db"}], "pools_removed": ["llm", "x"]}
    shown = Filter(frozenset({"a", "llm"})).apply("update", update)
    assert shown is not None
    assert [r["name"] for r in shown["rows"]] == ["a"] and shown["removed"] == ["v1:a"]
    assert shown["pools"] == [{"pool": "llm"}] and shown["pools_removed"] == ["llm"]
    assert Filter(frozenset({"zzz"})).apply("update", update) is None   # nothing for it
