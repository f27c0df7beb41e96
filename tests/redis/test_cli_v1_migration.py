"""A rolling deploy from key schema v1 to v2 (issue 14, Migration): v1 workers' keys
stay readable. `ls` / `show` / `events` and the Prometheus collector's discovery list
v1 breakers beside v2 ones and say which schema each is; operator actions act on v2
only and say so for a name that has v1 keys only. The v1 keys are written as the v1
script wrote them (docs/KEY_SCHEMA.md of schema v1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from distbreaker._runtime.keys import BreakerKeys
from distbreaker.breaker.config import BreakerConfig
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.dashboard.app import Dashboard, create_app
from distbreaker.dashboard.hub import fleet_snapshot
from tests.helpers.cli import fail, make, run
from tests.helpers.schema_keys import v1_key, write_v1

pytestmark = pytest.mark.keys_without_ttl("it writes a v1 fleet's keys by hand")

V1_CONFIG = BreakerConfig(sliding_window_size=10, minimum_number_of_calls=4,
                          wait_duration_in_open_state=30.0)


@pytest.fixture
def deploy(redis_url: str, redis_client: redis.Redis) -> dict[str, Any]:
    """Mid-deploy: `pay` tripped by v2 workers and OPEN (its own trip) on v1 workers;
    `old` used by v1 workers only (4 outcomes, one failed, in its count window)."""
    fail(make("pay", redis_url), 4)
    pipe = redis_client.pipeline(transaction=False)
    write_v1(pipe, "pay", V1_CONFIG, state="OPEN", since=5000, open_until=9_999_999_999_999,
             gen=1, calls=4, failures=4)
    write_v1(pipe, "old", V1_CONFIG, calls=4, failures=1, total_ms=40, head=4, gen=0,
             window={"0": "0,0,10", "1": "1,0,10", "2": "0,0,10", "3": "0,0,10"})
    pipe.xadd(v1_key("old", ":events"), {"from": "CLOSED", "to": "OPEN", "reason": "v1 trip",
                                         "actor": "", "at_ms": "1000", "gen": "1"})
    pipe.execute()
    return {key: redis_client.dump(key) for key in redis_client.scan_iter("distbreaker:v1:*")}


def test_ls_lists_v1_and_v2_breakers_and_says_which_schema(
        redis_url: str, deploy: dict[str, Any]) -> None:
    doc = json.loads(run(redis_url, "ls", "--json").stdout)
    rows = [(r["name"], r["schema"], r["state"]) for r in doc["breakers"]]
    assert rows == [("old", "v1", "CLOSED"), ("pay", "v2", "OPEN"), ("pay", "v1", "OPEN")]
    old = doc["breakers"][0]
    assert old["error"] is None
    assert (old["breaker"]["calls"], old["breaker"]["failures"]) == (4, 1)
    assert old["breaker"]["failure_rate"] == 25.0
    assert old["breaker"]["config"]["wire"] == V1_CONFIG.to_wire()
    text = run(redis_url, "ls")
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [
        ["old", "[v1]"], ["pay", "OPEN"], ["pay", "[v1]"]]
    assert lines[1].split()[2] == "CLOSED" and lines[3].split()[2] == "OPEN"
    assert "[v1]: key schema v1" in text.stderr


def test_show_reads_a_v1_only_name_from_v1_and_names_the_other_schema(
        redis_url: str, deploy: dict[str, Any]) -> None:
    old = json.loads(run(redis_url, "show", "old", "--json").stdout)
    assert (old["schema"], old["other_schemas"], old["error"]) == ("v1", [], None)
    # ring order from head 4: slots 4-9 are empty, then the oldest, 0
    assert [(b["slot"], b["failed"]) for b in old["breaker"]["window"]["buckets"]] == [
        (0, False), (1, True), (2, False), (3, False)]
    assert old["ttls"] == {v1_key("old"): None, v1_key("old", ":win"): None,
                           v1_key("old", ":events"): None}  # v1 keys, shown with their TTLs
    pay = json.loads(run(redis_url, "show", "pay", "--json").stdout)
    assert (pay["schema"], pay["other_schemas"], pay["breaker"]["state"]) == ("v2", ["v1"], "OPEN")
    pay_v1 = json.loads(run(redis_url, "show", "pay", "--schema", "v1", "--json").stdout)
    assert (pay_v1["schema"], pay_v1["breaker"]["generation"]) == ("v1", 1)
    text = run(redis_url, "show", "old").stdout
    assert "key schema v1" in text and "outcomes:  .F.." in text
    assert "also has v1 keys" in run(redis_url, "show", "pay").stdout


def test_events_of_a_v1_only_name_read_its_v1_history(
        redis_url: str, deploy: dict[str, Any]) -> None:
    events = [json.loads(line) for line in
              run(redis_url, "events", "old", "--json").stdout.splitlines()]
    assert [(e["name"], e["to"], e["reason"]) for e in events] == [("old", "OPEN", "v1 trip")]


def test_operator_actions_act_on_v2_and_refuse_a_v1_only_name(
        redis_url: str, redis_client: redis.Redis, deploy: dict[str, Any]) -> None:
    for command in ("trip", "reset", "close", "open"):
        result = run(redis_url, command, "old", "--reason", "x")
        assert result.exit_code == 1, result.output
        assert "exists only in key schema v1" in result.stderr
        assert "Upgrade those workers, or act with a v1 distbreaker CLI" in result.stderr
    assert not redis_client.exists(BreakerKeys.build("old").state)
    # --create stores a new v2 breaker on purpose (only v2 workers obey it)
    created = run(redis_url, "open", "old", "--create", "--reason", "x")
    assert created.exit_code == 0, created.output
    assert "had no keys" in created.stderr and "also has key schema v1 keys" in created.stderr
    # a name with both: the action goes to v2 and says the v1 workers did not see it
    closed = run(redis_url, "close", "pay", "--reason", "fixed")
    assert closed.exit_code == 0, closed.output
    assert "OPEN -> CLOSED" in closed.stdout and "did not see this action" in closed.stderr
    doc = json.loads(run(redis_url, "ls", "--json").stdout)
    states = {(r["name"], r["schema"]): r["state"] for r in doc["breakers"]}
    assert states == {("old", "v2"): "FORCED_OPEN", ("old", "v1"): "CLOSED",
                      ("pay", "v2"): "CLOSED", ("pay", "v1"): "OPEN"}
    for key, dump in deploy.items():  # no v1 key was written
        assert redis_client.dump(key) == dump, key


def test_prometheus_discovery_exports_v1_breakers_apart(
        redis_url: str, deploy: dict[str, Any]) -> None:
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}
    assert samples[("distbreaker_breaker_state", (("name", "pay"), ("state", "OPEN")))] == 1
    assert ("distbreaker_breaker_state", (("name", "old"), ("state", "CLOSED"))) not in samples
    v1 = {labels: value for (metric, labels), value in samples.items()
          if metric == "distbreaker_breaker_v1_state" and value == 1}
    assert v1 == {(("name", "old"), ("state", "CLOSED")): 1,
                  (("name", "pay"), ("state", "OPEN")): 1}
    assert samples[("distbreaker_foreign_keys", ())] == 0


def test_foreign_v1_content_is_an_error_row_of_schema_v1(
        redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.hset(v1_key("weird"), mapping={"v": "1", "state": "SIDEWAYS"})
    redis_client.set(v1_key("typed"), "a string where v1 kept a hash")
    rows = {r["name"]: r for r in json.loads(run(redis_url, "ls", "--json").stdout)["breakers"]}
    assert rows["weird"]["schema"] == "v1"
    assert rows["weird"]["error"] == (f"key {v1_key('weird')}: breaker 'weird' has unknown "
                                      "state 'SIDEWAYS'")
    assert rows["typed"]["error"] == (f"key {v1_key('typed')} holds a string, "
                                      "expected a hash")


def test_dashboard_lists_v1_rows_and_refuses_actions_on_a_v1_only_name(
        redis_url: str, deploy: dict[str, Any]) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)  # a decoding client too
    try:
        rows = fleet_snapshot(client, "distbreaker")["rows"]
        assert [(r["name"], r["schema"]) for r in rows] == [
            ("old", "v1"), ("pay", "v2"), ("pay", "v1")]
        assert rows[1]["breaker"]["state"] == "OPEN"
    finally:
        client.close()
    dashboard = Dashboard(lambda: redis.Redis.from_url(redis_url), "distbreaker",
                          allow_actions=True, token="t")
    http = TestClient(create_app(dashboard))  # no lifespan: the hub thread stays off
    try:
        old = http.get("/api/breakers/old").json()
        assert old["schema"] == "v1" and [e["reason"] for e in old["history"]] == ["v1 trip"]
        assert http.get("/api/breakers/pay?schema=v1").json()["breaker"]["generation"] == 1
        refused = http.post("/api/breakers/old/actions/trip", json={"reason": "x"},
                            headers={"Authorization": "Bearer t"})
        assert refused.status_code == 409 and refused.json()["schema"] == "v1"
    finally:
        dashboard.close()


def test_watch_marks_v1_rows_and_explains_the_mark(
        redis_url: str, deploy: dict[str, Any]) -> None:
    result = run(redis_url, "watch", "--interval", "0.05", "--iterations", "1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines if " [v1] " in line] == [
        ["pay", "[v1]"], ["old", "[v1]"]]  # worst first: OPEN before CLOSED
    assert any(line.startswith("[v1]: key schema v1") for line in lines)


def test_an_invalid_v1_name_part_is_an_error_row_of_schema_v1(
        redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.hset(v1_key("bad name"), "state", "OPEN")
    redis_client.hset("distbreaker:v2:{also bad}:cb", "state", "OPEN")
    rows = {r["name"]: r for r in json.loads(run(redis_url, "ls", "--json").stdout)["breakers"]}
    assert rows["bad name"]["schema"] == "v1" and rows["also bad"]["schema"] == "v2"
    assert rows["bad name"]["error"].endswith(f"1 foreign key {v1_key('bad name')}")
