"""Hostile keys are ERROR rows naming the key, on every read surface (issue 23): a lease
or probe with an infinite score (`ZADD ...:bh inf x` made `show` die with
OverflowError), a foreign type at the keys a summary does not read (`:cb:events`,
`:cb:fw`, `:bh:notify`), a budget count out of range (`D` = "1.5e400"); and the
scripts name the key too: a foreign-typed `:cb:fw` (a SchemaError that named no key),
the budget's `D` (silently accepted before)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from distbreaker import Bulkhead, CircuitBreaker, RetryBudget, SchemaError
from distbreaker.cli import cli
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.dashboard.hub import fleet_snapshot

pytestmark = pytest.mark.keys_without_ttl("it writes hostile keys by hand")

NS = "distbreaker:v2"
OPTIONS = {"redis_timeout": 5.0}


def key(name: str, suffix: str) -> str:
    return f"{NS}:{{{name}}}:{suffix}"


#: name -> (the key made hostile, the start of its error after "key <key>").
HOSTILE = {
    "bh-inf": ("bh", " holds member 'x' with score inf, expected a deadline in server ms"),
    "probes-inf": ("cb:probes", " holds member 'x' with score inf, expected a deadline"),
    "events-type": ("cb:events", " holds a string, expected a stream"),
    "fw-type": ("cb:fw", " holds a string, expected a hash"),
    "notify-type": ("bh:notify", " holds a string, expected a list"),
    "budget-d": ("rb2", ": budget field D is not an integer count: '9007199254740993'"),
}


@pytest.fixture
def hostile(redis_url: str, redis_client: redis.Redis) -> dict[str, str]:
    """Each name used by every component, then one of its keys made hostile by hand."""
    for name in [*HOSTILE, "fine"]:
        CircuitBreaker(name, redis=redis_url, **OPTIONS).call(lambda: None)
        Bulkhead(name, redis=redis_url, max_concurrent_calls=2, **OPTIONS).call(lambda: None)
        RetryBudget(name, redis=redis_url, **OPTIONS).deposit()
    r = redis_client
    r.zadd(key("bh-inf", "bh"), {"x": float("inf")})
    r.zadd(key("probes-inf", "cb:probes"), {"x": float("inf")})
    for name, (suffix, _) in HOSTILE.items():
        if name.endswith("-type"):
            r.delete(key(name, suffix))
            r.set(key(name, suffix), "a string", px=600_000)
    r.setrange(key("budget-d", "rb2"), 32, struct.pack(">q", 2**53 + 1))  # D (layout 2)
    return {name: f"key {key(name, suffix)}{start}" for name, (suffix, start) in HOSTILE.items()}


def run(url: str, *args: str) -> Any:
    return CliRunner(env={"COLUMNS": "250"}).invoke(cli, ["--url", url, *args])


def test_ls_has_one_error_row_naming_each_key(redis_url: str, hostile: dict[str, str]) -> None:
    result = run(redis_url, "ls", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)["breakers"]}
    assert rows["fine"]["error"] is None
    for name, error in hostile.items():
        assert (rows[name]["error"] or "").startswith(error), rows[name]
    text = run(redis_url, "ls")
    assert text.exit_code == 0, text.output
    assert "Traceback" not in text.output


def test_show_names_the_key_and_reads_the_rest(redis_url: str,
                                               hostile: dict[str, str]) -> None:
    for name, error in hostile.items():
        result = run(redis_url, "show", name, "--json")
        assert result.exit_code == 0, result.output
        detail = json.loads(result.stdout)
        assert (detail["error"] or "").startswith(error), detail["error"]
        readable = [part for part in ("breaker", "bulkhead", "budget") if detail[part]]
        assert len(readable) >= 1  # the other components are still shown
        shown = run(redis_url, "show", name)
        assert shown.exit_code == 0 and "Traceback" not in shown.output, shown.output


def test_watch_dashboard_and_prometheus_show_them_too(redis_url: str,
                                                     hostile: dict[str, str]) -> None:
    watched = run(redis_url, "watch", "--interval", "0.05", "--iterations", "1")
    assert watched.exit_code == 0, watched.output
    for name, error in hostile.items():
        assert any(line.startswith(f"ERROR {name}: {error}")
                   for line in watched.stdout.splitlines()), (name, watched.stdout)

    client = redis.Redis.from_url(redis_url)
    try:
        rows = {r["name"]: r for r in fleet_snapshot(client, "distbreaker")["rows"]}
    finally:
        client.close()
    for name, error in hostile.items():
        assert (rows[name]["error"] or "").startswith(error)

    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    unreadable = {s.labels["name"] for metric in registry.collect() for s in metric.samples
                  if s.name == "distbreaker_unreadable" and s.value == 1}
    assert unreadable == set(hostile)


def test_the_scripts_name_the_foreign_quorum_marks_key(redis_url: str,
                                                        redis_client: redis.Redis) -> None:
    breaker = CircuitBreaker("quorum", redis=redis_url, min_failing_workers=2,
                             sliding_window_size=2, minimum_number_of_calls=2, **OPTIONS)
    breaker.call(lambda: None)
    redis_client.set(key("quorum", "cb:fw"), "a string", px=600_000)

    def boom() -> None:
        raise ConnectionError("down")
    with pytest.raises(SchemaError) as caught:
        breaker.call(boom)
    assert caught.value.key == key("quorum", "cb:fw")
    assert "holds a string, expected a hash" in str(caught.value)


@pytest.mark.parametrize("value", [2**53 + 1, -1, 2**63 - 1, -2**63])
def test_the_budget_script_refuses_a_count_it_cannot_keep_exact(
        redis_url: str, redis_client: redis.Redis, value: int) -> None:
    budget = RetryBudget("counts", redis=redis_url, **OPTIONS)
    budget.deposit()
    redis_client.setrange(key("counts", "rb2"), 32, struct.pack(">q", value))  # D (layout 2)
    stored = redis_client.get(key("counts", "rb2"))
    for op in (budget.deposit, budget.try_withdraw, budget.balance):
        with pytest.raises(SchemaError) as caught:
            op()
        assert caught.value.key == key("counts", "rb2")
    assert redis_client.get(key("counts", "rb2")) == stored  # nothing written
