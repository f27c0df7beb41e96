"""The CLI with many keyed breakers in one namespace (issue 26), against a real
redis-server: `ls` paging, `--top` ordering, globs with a state filter, and selectors on
operator commands (`--dry-run` changes nothing, a confirmation over the threshold, each
name recorded with actor and reason). 1,000 names made by pipelines of the breaker
script (scripts/bench_cli_scale.py, which times the same at 10,000)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from distbreaker.cli import cli

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
COUNT = 1000


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module("bench_cli_scale")


@pytest.fixture
def names(bench: ModuleType, redis_url: str) -> Iterator[list[str]]:
    client = redis.Redis.from_url(redis_url)
    made = bench.scale_names(COUNT)
    states = bench.seed_breakers(client, made, key_ttl=600)
    assert states["OPEN"] and states["CLOSED"]
    client.close()
    yield sorted(made)


def run(url: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args], input=stdin)


def listing(url: str, *args: str) -> dict[str, Any]:
    result = run(url, "ls", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_pages_are_slices_of_the_sorted_listing(redis_url: str, names: list[str]) -> None:
    whole = listing(redis_url)
    assert [r["name"] for r in whole["breakers"]] == names
    assert whole["total"] == COUNT and whole["page"] is None
    third = listing(redis_url, "--limit", "100", "--page", "3")
    assert [r["name"] for r in third["breakers"]] == names[200:300]
    assert [r["state"] for r in third["breakers"]] == [
        r["state"] for r in whole["breakers"][200:300]]
    assert third["page"] == {"limit": 100, "page": 3, "pages": 10, "next_page": 4}
    assert third["total"] == COUNT
    last = listing(redis_url, "--limit", "300", "--page", "4")
    assert [r["name"] for r in last["breakers"]] == names[900:]
    assert last["page"]["next_page"] is None
    text = run(redis_url, "ls", "--limit", "5", "--page", "2")
    assert text.exit_code == 0
    assert [line.split()[0] for line in text.stdout.splitlines()[1:]] == names[5:10]
    assert "page 2 of 200" in text.stderr and "--page 3" in text.stderr
    past = run(redis_url, "ls", "--limit", "500", "--page", "9")
    assert past.exit_code == 0 and not past.stdout and "past the last page" in past.stderr


def test_top_ranks_by_failure_rate_and_by_rejections(redis_url: str,
                                                    names: list[str]) -> None:
    rows = listing(redis_url)["breakers"]
    for by, field in (("failure-rate", "failure_rate"), ("rejections", "rejected")):
        expected = sorted(rows, key=lambda r: (-r["breaker"][field], r["name"]))[:20]
        top = listing(redis_url, "--top", "20", "--by", by)
        assert [r["name"] for r in top["breakers"]] == [r["name"] for r in expected]
        values = [r["breaker"][field] for r in top["breakers"]]
        assert values == sorted(values, reverse=True) and values[0] > 0
        assert top["top"] == {"n": 20, "by": by}
    assert listing(redis_url, "--top", "3")["breakers"][0]["breaker"]["failure_rate"] == max(
        r["breaker"]["failure_rate"] for r in rows)


def test_a_glob_with_a_state_filter_and_a_page(redis_url: str, names: list[str]) -> None:
    rows = listing(redis_url)["breakers"]
    wanted = [r["name"] for r in rows if r["name"].startswith("llm:model-3:")
              and r["state"] == "OPEN"]
    assert len(wanted) > 10
    page = listing(redis_url, "llm:model-3:*", "--state", "open", "--limit", "10")
    assert [r["name"] for r in page["breakers"]] == wanted[:10]
    assert page["total"] == len(wanted) and page["match"] == ["llm:model-3:*"]
    whole = listing(redis_url, "llm:model-3:*", "--state", "open")
    assert [r["name"] for r in whole["breakers"]] == wanted
    none = run(redis_url, "ls", "nothing:*")
    assert none.exit_code == 0 and "matching 'nothing:*'" in none.stderr


def states_and_history(url: str) -> tuple[dict[str, str], int]:
    client = redis.Redis.from_url(url)
    try:
        length = sum(client.xlen(k) for k in client.scan_iter(match="*:cb:events",
                                                              count=1000))
    finally:
        client.close()
    return {r["name"]: r["state"] for r in listing(url)["breakers"]}, length


def test_dry_run_shows_every_match_and_changes_nothing(redis_url: str,
                                                      names: list[str]) -> None:
    before = states_and_history(redis_url)
    llm = [n for n in names if n.startswith("llm:")]
    result = run(redis_url, "open", "llm:*", "--for", "10m", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plans = [json.loads(line) for line in result.stdout.splitlines()]
    assert [p["name"] for p in plans] == llm
    assert all(p["dry_run"] and p["target"] == "FORCED_OPEN" and p["would_change"]
               for p in plans)
    assert {p["state"] for p in plans} == {"OPEN", "CLOSED"}
    text = run(redis_url, "close", "llm:*", "--dry-run")
    assert text.exit_code == 0 and "nothing was changed" in text.stderr
    closed = [line for line in text.stdout.splitlines() if "(unchanged)" in line]
    assert closed and all("CLOSED" in line for line in closed)
    assert states_and_history(redis_url) == before


def test_a_selector_over_the_threshold_asks_first(redis_url: str, names: list[str]) -> None:
    before = states_and_history(redis_url)
    refused = run(redis_url, "open", "pay:*", stdin="n\n")
    assert refused.exit_code == 1 and "not confirmed: nothing changed" in refused.stderr
    assert "100 breakers matching 'pay:*'" in refused.stderr
    closed_stdin = run(redis_url, "open", "pay:*")  # no answer at all: nothing changes
    assert closed_stdin.exit_code == 1
    assert states_and_history(redis_url) == before
    agreed = run(redis_url, "open", "pay:*", "--for", "10m", "--reason", "maintenance",
                 "--actor", "dana@ops", "--json", stdin="y\n")
    assert agreed.exit_code == 0, agreed.output
    lines = [json.loads(line) for line in agreed.stdout.splitlines() if line.startswith("{")]
    pay = [n for n in names if n.startswith("pay:")]
    assert [r["name"] for r in lines] == pay
    assert all(r["state"] == "FORCED_OPEN" and r["changed"] and r["until_ms"]
               and r["actor"] == "dana@ops" and r["reason"] == "maintenance" for r in lines)
    after = {r["name"]: r for r in listing(redis_url, "pay:*")["breakers"]}
    assert {r["state"] for r in after.values()} == {"FORCED_OPEN"}
    events = run(redis_url, "events", pay[7], "-n", "1", "--json")
    last = json.loads(events.stdout.splitlines()[-1])
    assert (last["to"], last["actor"], last["reason"]) == ("FORCED_OPEN", "dana@ops",
                                                         "maintenance")
    untouched = {n: s for n, s in before[0].items() if not n.startswith("pay:")}
    assert {n: s for n, s in states_and_history(redis_url)[0].items()
            if not n.startswith("pay:")} == untouched


def test_a_small_selector_acts_without_asking_and_yes_skips_the_question(
        redis_url: str, names: list[str]) -> None:
    few = run(redis_url, "trip", "tenant:0000?", "--reason", "drill")  # 6 names
    assert few.exit_code == 0, few.output
    assert few.stdout.count("-> OPEN") + few.stdout.count("OPEN wait restarted") == 6
    many = run(redis_url, "reset", "tenant:*", "--yes", "--json", "--confirm-over", "5")
    assert many.exit_code == 0, many.output
    assert len(many.stdout.splitlines()) == 600
    assert {r["state"] for r in listing(redis_url, "tenant:*")["breakers"]} == {"CLOSED"}
    exact = run(redis_url, "open", "tenant:*", "--exact", "--create", "--reason", "literal")
    assert exact.exit_code == 0 and "tenant:*: " in exact.stdout  # one name, with a *
    assert run(redis_url, "open", "tenant:0000?", "--create").exit_code == 2
    assert run(redis_url, "open", "tenant:00001", "--dry-run").exit_code == 2
    missing = run(redis_url, "close", "nothing:*")
    assert missing.exit_code == 1 and "matches 'nothing:*'" in missing.stderr


def test_limit_changes_a_rate_limit_fleet_wide_recorded_and_shown(redis_url: str) -> None:
    from distbreaker import RateLimiter

    limiter = RateLimiter("llm:gpt", redis=redis_url, limit_for_period=50,
                          limit_refresh_period=60, timeout_duration=0, redis_timeout=5)
    other = RateLimiter("llm:gpt", redis=redis_url, limit_for_period=50,
                        limit_refresh_period=60, timeout_duration=0, redis_timeout=5)
    try:
        assert limiter.try_acquire()
        cut = run(redis_url, "limit", "llm:gpt", "--limit-for-period", "3", "--reason",
                  "quota cut", "--actor", "dana@ops", "--json")
        assert cut.exit_code == 0, cut.output
        result = json.loads(cut.stdout)
        assert (result["limit_for_period"], result["burst"], result["overridden"]) == (3, 3, True)
        assert result["previous"]["limit_for_period"] == 50 and result["at_ms"]
        # every worker obeys the operator's limit, whatever its own config says
        granted = [limiter.try_acquire(), other.try_acquire(), limiter.try_acquire(),
                   other.try_acquire()]
        assert granted.count(True) <= 3 and not granted[-1]
        row = listing(redis_url, "llm:*")["breakers"][0]["rate_limiter"]
        assert (row["limit_for_period"], row["overridden"]) == (3, True)
        assert (row["changed_by"], row["changed_reason"]) == ("dana@ops", "quota cut")
        assert "/3 per 1m00s!" in run(redis_url, "ls", "llm:gpt").stdout
        shown = run(redis_url, "show", "llm:gpt").stdout
        assert "limit by:  dana@ops at" in shown and "quota cut" in shown
        slower = run(redis_url, "limit", "llm:gpt", "--refresh", "2m")
        assert slower.exit_code == 0 and "3 per 1m00s -> 3 per 2m00s" in slower.stdout
        dropped = run(redis_url, "limit", "llm:gpt", "--reset", "--reason", "quota back")
        assert dropped.exit_code == 0 and "own config governs" in dropped.stdout
        assert limiter.metrics().limit_for_period == 50
        assert "reset by:" in run(redis_url, "show", "llm:gpt").stdout
        assert run(redis_url, "limit", "llm:gpt").exit_code == 2  # nothing to change
        unknown = run(redis_url, "limit", "llm:gp", "--limit-for-period", "1")
        assert unknown.exit_code == 1 and "did you mean 'llm:gpt'" in unknown.stderr
    finally:
        limiter.close()
        other.close()


def test_limit_takes_a_selector_over_keyed_rate_limiters(redis_url: str) -> None:
    from distbreaker import RateLimiter

    limiter = RateLimiter("llm", redis=redis_url, limit_for_period=50,
                          limit_refresh_period=60, timeout_duration=0, redis_timeout=5)
    try:
        for model in ("gpt", "claude", "mistral"):
            assert limiter.try_acquire(key=model)  # keyed instances: llm:gpt, ...
        plan = run(redis_url, "limit", "llm:*", "--limit-for-period", "5", "--dry-run",
                   "--json")
        assert plan.exit_code == 0, plan.output
        assert [json.loads(line)["name"] for line in plan.stdout.splitlines()] == [
            "llm:claude", "llm:gpt", "llm:mistral"]
        assert limiter.metrics(key="gpt").limit_for_period == 50  # a dry run changes nothing
        asked = run(redis_url, "limit", "llm:*", "--limit-for-period", "5",
                    "--confirm-over", "2", stdin="n\n")
        assert asked.exit_code == 1 and "not confirmed" in asked.stderr
        done = run(redis_url, "limit", "llm:*", "--limit-for-period", "5", "--yes",
                   "--actor", "dana@ops", "--json")
        assert done.exit_code == 0, done.output
        results = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(r["name"], r["limit_for_period"], r["actor"]) for r in results] == [
            (n, 5, "dana@ops") for n in ("llm:claude", "llm:gpt", "llm:mistral")]
        assert limiter.metrics(key="claude").limit_for_period == 5
    finally:
        limiter.close()


@pytest.mark.parametrize("argv", [["close", "llm:model-1:*"], ["trip", "llm:model-1:*"],
                                  ["open", "llm:model-1:*", "--for", "1h"]])
def test_a_dry_run_predicts_what_the_action_changes(redis_url: str, names: list[str],
                                                   argv: list[str]) -> None:
    run(redis_url, "open", "llm:model-1:000*", "--for", "10m", "--yes")  # a few held
    plan = run(redis_url, *argv, "--dry-run", "--json")
    predicted = {p["name"]: p["would_change"] for p in map(json.loads, plan.stdout.splitlines())}
    done = run(redis_url, *argv, "--yes", "--json")
    assert done.exit_code == 0, done.output
    changed = {r["name"]: r["changed"] for r in map(json.loads, done.stdout.splitlines())}
    assert predicted == changed
    assert set(changed.values()) == ({True} if "--for" in argv else {True, False})


def test_watch_shows_the_top_of_a_glob(redis_url: str, names: list[str]) -> None:
    result = run(redis_url, "watch", "llm:*", "--top", "5", "--iterations", "1")
    assert result.exit_code == 0, result.output
    assert "top 5 by failure rate of 300 names" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("llm:")]
    assert len(rows) == 5 and all(" OPEN" in line for line in rows)


def test_ls_json_goes_on_one_line_above_1000_rows(redis_url: str, names: list[str],
                                                  bench: ModuleType) -> None:
    indented = run(redis_url, "ls", "--json")
    assert indented.stdout.startswith("{\n")
    client = redis.Redis.from_url(redis_url)
    bench.seed_breakers(client, ["zz:99999"], key_ttl=600)
    client.close()
    one_line = run(redis_url, "ls", "--json")
    assert one_line.stdout.count("\n") == 1
    assert len(json.loads(one_line.stdout)["breakers"]) == COUNT + 1
