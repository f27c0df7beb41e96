"""The pure parts of working with thousands of names (issue 26): selectors' globs, the
`ls --top` ranking, the Prometheus top-K choice and its namespace aggregates."""

from __future__ import annotations

from typing import Any

from distbreaker.contrib._metrics import _namespace_families, interest
from distbreaker.readside import is_selector, matching, rank, rank_key


def test_a_selector_is_a_name_with_glob_characters() -> None:
    assert is_selector("llm:*") and is_selector("tenant:?1") and is_selector("a[bc]")
    assert not is_selector("llm:gpt-4o") and not is_selector("{x}")


def test_globs_match_case_sensitively_and_sort() -> None:
    names = ["tenant:b", "tenant:a", "Tenant:c", "llm:gpt", "llm:*", "pay:1"]
    assert matching(names, ["tenant:*"]) == ["tenant:a", "tenant:b"]
    assert matching(names, ["llm:[*]"]) == ["llm:*"]  # a literal *
    assert matching(names, ["pay:?", "llm:g*"]) == ["llm:gpt", "pay:1"]
    assert matching(names, []) == sorted(names)


def breaker(name: str, state: str = "CLOSED", **fields: Any) -> dict[str, Any]:
    b = {"state": state, "failure_rate": -1.0, "slow_rate": -1.0, "rejected": 0, "calls": 0,
         "calls_total": 0, "failures_total": 0, **fields}
    return {"name": name, "state": state, "breaker": b, "bulkhead": None, "budget": None,
            "rate_limiter": None, "error": None}


def test_top_ranks_highest_first_ties_by_name_without_breakers_left_out() -> None:
    briefs: dict[str, Any] = {
        "b": breaker("b", failure_rate=50.0)["breaker"],
        "a": breaker("a", failure_rate=50.0)["breaker"],
        "c": breaker("c", failure_rate=90.0, rejected=1)["breaker"],
        "d": breaker("d", rejected=7)["breaker"],
        "none": None}
    assert rank(briefs, "failure-rate", 3) == ["c", "a", "b"]
    assert rank(briefs, "rejections", 2) == ["d", "c"]
    assert rank(briefs, "calls", 10)[:1] == ["a"]  # all 0: by name
    rows = [breaker("x", failure_rate=10.0), breaker("y", failure_rate=20.0)]
    assert [r["name"] for r in sorted(rows, key=lambda r: rank_key(r, "failure-rate"))] == \
        ["y", "x"]


def test_the_top_k_puts_what_needs_a_look_first() -> None:
    rows = [breaker("closed-bad", failure_rate=40.0), breaker("open-a", "OPEN",
                                                              failure_rate=60.0),
            breaker("open-b", "OPEN", failure_rate=90.0), breaker("held", "FORCED_OPEN"),
            breaker("disabled", "DISABLED"), breaker("fine"),
            {**breaker("foreign"), "state": None, "breaker": None, "error": "WRONGTYPE"},
            {**breaker("bulkhead-only"), "state": None, "breaker": None,
             "bulkhead": {"in_use": 3}}]
    order = [r["name"] for r in sorted(rows, key=interest)]
    assert order == ["foreign", "open-b", "open-a", "held", "disabled", "closed-bad", "fine",
                     "bulkhead-only"]


def test_namespace_aggregates_count_every_row() -> None:
    rows = [breaker("a", "OPEN", calls_total=10, failures_total=6, rejected=4),
            breaker("b", calls_total=5, failures_total=1),
            {**breaker("c"), "state": None, "breaker": None, "bulkhead": {"in_use": 2},
             "rate_limiter": {"rejected": 9}}]
    families = {f.name: dict(f.samples) for f in _namespace_families(rows, 1)}
    assert families["distbreaker_namespace_names"] == {(): 3}
    assert families["distbreaker_namespace_names_not_exported"] == {(): 1}
    assert families["distbreaker_namespace_breakers"][("OPEN",)] == 1
    assert families["distbreaker_namespace_breakers"][("CLOSED",)] == 1
    assert families["distbreaker_namespace_fleet_calls"] == {("success",): 8, ("failure",): 7}
    assert families["distbreaker_namespace_fleet_rejections"] == {(): 4}
    assert families["distbreaker_namespace_bulkhead_in_use"] == {(): 2}
    assert families["distbreaker_namespace_ratelimiter_rejections"] == {(): 9}
