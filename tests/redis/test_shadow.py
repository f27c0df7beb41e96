"""Shadow configs (issue 27, docs/guides/shadow.md) against a real redis-server: a
candidate config fed every live outcome keeps its own window and state machine, trips
and counts what it would have rejected while the live breaker stays CLOSED and admits
every call; it ends by itself; the CLI sets, lists, shows and clears it; the registry
declares it; the hot path of a breaker without shadows is untouched."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker, Registry, operate
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX, BreakerKeys
from distbreaker._runtime.state_record import decode_record
from distbreaker.breaker.shadow import SHADOWED
from tests.helpers.cli import run
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import wait_until

LIVE = {"sliding_window_size": 10, "minimum_number_of_calls": 10,
        "failure_rate_threshold": 50, "wait_duration_in_open_state": 30.0,
        "redis_timeout": 5.0, "subscribe": False}
#: Trips on 2 failures in 10 calls (the live config needs 5).
TIGHT = {"minimum_number_of_calls": 5, "failure_rate_threshold": 20}


def boom() -> None:
    raise ConnectionError("down")


def drive(breaker: Any, ok: int, failed: int) -> None:
    """`ok` successful calls, then `failed` failing ones: each one is admitted."""
    for _ in range(ok):
        assert breaker.call(lambda: "fine") == "fine"
    for _ in range(failed):
        with pytest.raises(ConnectionError):
            breaker.call(boom)


def seq_of(client: redis.Redis, name: str) -> int:
    return int(decode_record(client.get(BreakerKeys.build(name).state) or b"")["seq"])


def shadows(client: redis.Redis, name: str) -> dict[str, dict[str, object]]:
    return {s["name"]: s for s in view.read_shadows(client, DEFAULT_PREFIX, name)}


def test_a_shadow_trips_and_counts_while_the_live_breaker_admits_every_call(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **LIVE)
    drive(breaker, 1, 0)  # the breaker exists
    result = operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "tight", TIGHT,
                                "try a tighter config", "dana")
    assert result["shadows"] == 1
    assert {c["field"] for c in result["changes"]} == {"minimum_number_of_calls",
                                                        "failure_rate_threshold"}
    assert seq_of(redis_client, name) >= SHADOWED
    drive(breaker, 8, 2)   # the shadow's window: 2 failed of 10, 20 %: it trips
    drive(breaker, 6, 2)   # all would have been rejected
    assert breaker.state.value == "CLOSED"  # the live breaker: 4 of 10 failed, 40 % < 50 %
    s = shadows(redis_client, name)["tight"]
    assert (s["state"], s["trips"], s["rejected"], s["avoided"]) == ("OPEN", 1, 8, 2)
    assert (s["seen"], s["seen_failures"]) == (18, 4)
    assert (s["source"], s["actor"], s["reason"]) == ("operator", "dana",
                                                      "try a tighter config")
    assert "8 calls would have been rejected, 2 failures avoided" in s["summary"]
    events = view.read_shadow_history(redis_client, DEFAULT_PREFIX, name, 10)
    assert [(e["kind"], e["from"], e["to"]) for e in events] == [
        ("set", "CLOSED", "CLOSED"), ("", "CLOSED", "OPEN")]
    assert events[1]["reason"] == "failure rate 20% >= 20%"
    # the live history never sees a shadow's transition
    assert view.read_history(redis_client, DEFAULT_PREFIX, name, 10) == []


def test_a_shadow_goes_half_open_and_closes_and_reports_the_episode(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "quick",
                       {**TIGHT, "wait_duration_in_open_state": 0.2,
                        "permitted_calls_in_half_open": 2}, "r", "a")
    drive(breaker, 3, 2)   # trips
    drive(breaker, 4, 0)   # rejected (inside the 0.2 s wait, or probes)
    time.sleep(0.3)
    drive(breaker, 2, 0)   # the wait ended: 2 probes succeed -> CLOSED
    s = shadows(redis_client, name)["quick"]
    assert s["state"] == "CLOSED" and s["trips"] == 1 and s["episode_ms"] > 0
    assert s["summary"].startswith("would have opened at ")
    moves = [(e["from"], e["to"]) for e in
             view.read_shadow_history(redis_client, DEFAULT_PREFIX, name, 10) if not e["kind"]]
    assert moves[0] == ("CLOSED", "OPEN") and moves[-2:] == [("OPEN", "HALF_OPEN"),
                                                            ("HALF_OPEN", "CLOSED")]


def test_a_time_window_shadow_and_batched_records_feed_it(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE, record_mode="batched")
    breaker.call(lambda: 1)
    breaker.flush()
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "time",
                       {"sliding_window_type": "TIME_BASED", "sliding_window_size": 60,
                        "minimum_number_of_calls": 5, "failure_rate_threshold": 20},
                       "r", "a")
    drive(breaker, 6, 0)
    drive(breaker, 0, 3)
    breaker.flush()
    s = shadows(redis_client, name)["time"]
    assert s["seen"] == 9 and s["state"] == "OPEN" and s["trips"] == 1
    breaker.close()


def test_a_shadow_ends_by_itself_and_the_hot_path_forgets_it(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "brief", TIGHT, "r", "a",
                       for_=0.3)
    assert shadows(redis_client, name)["brief"]["until_ms"]
    time.sleep(0.4)
    breaker.call(lambda: 1)  # the first record after its end removes it
    assert shadows(redis_client, name) == {}
    assert seq_of(redis_client, name) < SHADOWED
    kinds = [e["kind"] for e in view.read_shadow_history(redis_client, DEFAULT_PREFIX, name,
                                                         10)]
    assert kinds == ["set", "expired"]
    assert not [k for k in redis_client.keys("*:shadow*") if k.endswith(b":shadow")]


def test_at_most_three_shadows_and_bad_ones_are_refused(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    CircuitBreaker(name, redis=redis_url, **LIVE).call(lambda: 1)
    for i in range(3):
        operate.set_shadow(redis_client, DEFAULT_PREFIX, name, f"s{i}", TIGHT, "r", "a")
    with pytest.raises(ValueError, match="at most 3"):
        operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "s3", TIGHT, "r", "a")
    with pytest.raises(ValueError, match="shadow name"):
        operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "bad name", TIGHT, "r", "a")
    with pytest.raises(operate.UnknownBreaker):
        operate.set_shadow(redis_client, DEFAULT_PREFIX, name + "x", "s", TIGHT, "r", "a")
    # replacing one keeps the count
    assert operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "s1",
                              {"failure_rate_threshold": 10}, "r", "a")["shadows"] == 3
    cleared = operate.clear_shadow(redis_client, DEFAULT_PREFIX, name, None, "done", "a")
    assert sorted(cleared["cleared"]) == ["s0", "s1", "s2"] and cleared["shadows"] == 0
    assert seq_of(redis_client, name) < SHADOWED


def test_no_shadow_leaves_the_record_and_its_commands_as_they_were(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    redis_client.config_resetstat()
    for _ in range(20):
        breaker.call(lambda: 1)
    stats = redis_client.info("commandstats")
    assert "cmdstat_hmget" not in stats and "cmdstat_hgetall" not in stats
    assert seq_of(redis_client, name) < SHADOWED


def test_the_registry_declares_shadows_through_every_worker_hello(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(f"""
breakers:
  instances:
    {name}:
      sliding_window_size: 10
      minimum_number_of_calls: 10
      subscribe: false
      shadow:
        tight:
          minimumNumberOfCalls: 5
          failure_rate_threshold: 20
          wait_duration_in_open_state: 10s
""")
    registry = Registry.from_file(path, redis=redis_url)
    breaker = registry.breaker(name)
    assert [n for n, _ in breaker.config.shadow] == ["tight"]
    breaker.call(lambda: 1)  # the first call says hello, declaring it
    s = shadows(redis_client, name)["tight"]
    assert s["source"] == "declared" and s["until_ms"] > 0
    assert s["wire"] == breaker.config.shadow[0][1].to_wire()
    assert breaker.config.shadow[0][1].wait_duration_in_open_state == 10.0
    drive(breaker, 8, 3)
    assert shadows(redis_client, name)["tight"]["trips"] == 1
    registry.close()


def test_the_cli_sets_lists_shows_and_clears_a_shadow(
        tmp_path: Path, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    candidate = tmp_path / "tight.yaml"
    candidate.write_text("failure_rate_threshold: 20\nminimumNumberOfCalls: 5\n")
    done = run(redis_url, "shadow", name, "--config", str(candidate), "--for", "1h",
               "--reason", "tune", "--actor", "dana")
    assert done.exit_code == 0, done.output
    assert "shadow tight set (minimum_number_of_calls 10 -> 5, failure_rate_threshold " \
           "50.0 -> 20.0)" in done.output
    drive(breaker, 8, 3)
    listed = run(redis_url, "shadow", name)
    assert "tight: would be OPEN" in listed.output and "by dana: tune" in listed.output
    assert "1 calls would have been rejected, 1 failures avoided" in listed.output
    shown = run(redis_url, "show", name)
    assert "shadows:   1" in shown.output and "tight: would be OPEN" in shown.output
    as_json = json.loads(run(redis_url, "show", name, "--json").output)
    assert as_json["shadows"][0]["name"] == "tight"
    events = run(redis_url, "events", "--shadow", name)
    assert "shadow tight set (tune) by dana" in events.output
    assert "would have gone CLOSED -> OPEN (failure rate 20% >= 20%)" in events.output
    bad = run(redis_url, "shadow", name, "--config", str(candidate), "--as", "x y")
    assert bad.exit_code != 0
    off = run(redis_url, "shadow", name, "--off", "--json")
    assert json.loads(off.output)["cleared"] == ["tight"]
    lines = [json.loads(line) for line in
             run(redis_url, "events", "--shadow", name, "--json").output.splitlines()]
    assert lines[-1]["kind"] == "cleared" and lines[-1]["actor"]
    assert lines[-1]["rejected_total"] == 1
    assert "no shadow configs" in run(redis_url, "shadow", name).output


def test_every_shadow_key_has_a_ttl(redis_url: str, redis_client: redis.Redis,
                                    name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **LIVE,
                             shadow={"a": TIGHT, "t": {"sliding_window_type": "TIME_BASED",
                                                       "sliding_window_size": 5}})
    drive(breaker, 5, 2)
    keys = redis_client.keys("*shadow*")
    assert len(keys) >= 3
    assert all(redis_client.pttl(k) > 0 for k in keys)
    wait_until(lambda: all(redis_client.pttl(k) > 0 for k in keys), what="TTLs")


def test_prometheus_exports_each_shadows_would_be_figures(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    from prometheus_client import CollectorRegistry

    from distbreaker.contrib.prometheus import DistbreakerCollector
    from tests.redis.test_contrib_prometheus import scrape

    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "tight", TIGHT, "r", "a")
    drive(breaker, 8, 3)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, components=[breaker]))
    found = scrape(registry)
    labels = (("name", name), ("shadow", "tight"))
    assert found[("distbreaker_shadow_state", (*labels, ("state", "OPEN")))] == 1
    assert found[("distbreaker_shadow_trips_total", labels)] == 1
    assert found[("distbreaker_shadow_rejected_total", labels)] == 1
    assert found[("distbreaker_shadow_failures_avoided_total", labels)] == 1
    assert found[("distbreaker_shadow_calls_total", labels)] == 11


def test_a_policys_merged_call_feeds_the_shadows_too(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    from distbreaker import Bulkhead, Policy

    breaker = CircuitBreaker(name, redis=redis_url, **LIVE)
    breaker.call(lambda: 1)
    operate.set_shadow(redis_client, DEFAULT_PREFIX, name, "tight", TIGHT, "r", "a")
    policy = Policy(name, redis=redis_url, breaker=breaker,
                    bulkhead=Bulkhead(name, redis=redis_url, max_concurrent_calls=5))
    for _ in range(4):
        assert policy.call(lambda: "fine") == "fine"
    assert shadows(redis_client, name)["tight"]["seen"] == 4
