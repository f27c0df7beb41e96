"""Keys another client wrote under the prefix (an invalid name part, a key of a foreign
type, foreign content) never stop a read-side command: against a real redis-server
with 5 tripped breakers, every command shows them as error rows and goes on, `reset
--all` resets the 5 and reports the rest, and the exporters count them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys, BulkheadKeys
from distbreaker._runtime.state_record import MAGIC, encode_fields
from distbreaker.breaker.core import config_fingerprint
from distbreaker.cli.app import cli
from distbreaker.cli.watch import HEADERS
from distbreaker.contrib.otel import DistbreakerInstrumentor
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.dashboard.app import Dashboard, create_app
from distbreaker.dashboard.hub import fleet_snapshot
from distbreaker.errors import CallNotPermitted

pytestmark = pytest.mark.keys_without_ttl("its fleet fixture writes foreign keys by hand")

FAST = {"sliding_window_size": 10, "minimum_number_of_calls": 4,
        "failure_rate_threshold": 50, "wait_duration_in_open_state": 30.0,
        "permitted_calls_in_half_open": 2, "key_ttl": 600.0}
GOOD = [f"dep-{i}" for i in range(5)]
NS = "distbreaker:v2"
LONG = "n" * 201
#: Name parts that are not valid names, each with the start of its row's error.
INVALID = {"bad name": "not a distbreaker name (name must not contain whitespace",
           "ctl\x01x": "not a distbreaker name (name must not contain whitespace or control",
           "}brace": "not a distbreaker name (name must not start with '}'",
           LONG: "not a distbreaker name (name must be 1-200 characters",
           "\ufffd": "not a distbreaker name (its key is not UTF-8"}
#: Valid names whose keys hold a foreign type or content, with their row's error.
FOREIGN = {"x": f"key {NS}:{{x}}:cb: breaker 'x': its state record is not a distbreaker v2 "
                 "state record",
           "xh": f"key {NS}:{{xh}}:cb holds a hash, expected a string",
           "garb": f"key {NS}:{{garb}}:cb: breaker 'garb': its state record has an unknown "
                   "state code 9",
           "badcfg": f"key {NS}:{{badcfg}}:cb: breaker 'badcfg': ",
           "badmeta": f"key {NS}:{{badmeta}}:cb:meta holds a string, expected a hash",
           "bh": f"key {NS}:{{bh}}:bh holds a list, expected a zset"}
ERRORS = {**INVALID, **FOREIGN}


def _boom() -> None:
    raise ConnectionError("down")


@pytest.fixture
def fleet(redis_url: str, redis_client: redis.Redis) -> dict[str, Any]:
    """5 tripped breakers plus foreign keys of each kind; returns the foreign keys'
    dumps, so a test can check nothing foreign was changed."""
    for name in GOOD:
        breaker = CircuitBreaker(name, redis=redis_url, **FAST)
        for _ in range(5):
            try:
                breaker.call(_boom)
            except (ConnectionError, CallNotPermitted):
                pass
        assert breaker.state.value == "OPEN"
        breaker.close()
    r = redis_client
    r.hset(f"{NS}:{{bad name}}:cb", mapping={"state": "OPEN", "v": "1"})  # redis-cli
    r.hset(f"{NS}:{{bad name}}:cb:meta", "cfg", "x")
    r.hset(f"{NS}:{{ctl\x01x}}:cb", "state", "CLOSED")
    r.set(f"{NS}:{{}}brace}}:cb", "1")
    r.zadd(f"{NS}:{{{LONG}}}:bh", {"holder": 1})
    r.hset(f"{NS}:{{".encode() + b"\xff}:cb", "state", "OPEN")  # not UTF-8
    r.set(BreakerKeys.build("x").state, "a string")  # a string that is not a state record
    r.hset(BreakerKeys.build("xh").state, mapping={"state": "OPEN", "v": "1"})  # v1's layout
    r.set(BreakerKeys.build("garb").state, encode_fields(b"", magic=MAGIC, state=9))
    r.set(BreakerKeys.build("badcfg").state,
          encode_fields(b"", magic=MAGIC, fp=config_fingerprint("nonsense")))
    r.hset(BreakerKeys.build("badcfg").meta, "cfg", "nonsense")
    CircuitBreaker("badmeta", redis=redis_url, **FAST).call(lambda: None)
    r.delete(BreakerKeys.build("badmeta").meta)
    r.set(BreakerKeys.build("badmeta").meta, "meta of the wrong type")
    r.rpush(BulkheadKeys.build("bh").leases, "a", "b")
    r.set(f"{NS}:{{other}}:unknown-suffix", "ignored")
    return {key: r.dump(key) for key in r.scan_iter(match=f"{NS}:{{*")
            if not key.decode(errors="replace").startswith(f"{NS}:{{dep-")}


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--url", url, *args])


def assert_error_rows(rows: list[dict[str, Any]]) -> None:
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {*GOOD, *ERRORS}
    for name in GOOD:
        assert by_name[name]["error"] is None
        assert by_name[name]["state"] == "OPEN"
    for name, start in ERRORS.items():
        row = by_name[name]
        assert row["error"].startswith(start), row
        assert (row["state"], row["breaker"], row["bulkhead"], row["budget"]) == (
            None, None, None, None)
    assert by_name["bad name"]["error"].endswith(
        f"2 foreign keys {NS}:{{bad name}}:cb, {NS}:{{bad name}}:cb:meta")


def test_ls_json_lists_the_5_breakers_and_one_error_row_per_foreign_name(
        redis_url: str, fleet: dict[str, Any]) -> None:
    result = run(redis_url, "ls", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["name"] for r in doc["breakers"]] == sorted(r["name"] for r in doc["breakers"])
    assert_error_rows(doc["breakers"])


def test_ls_text_shows_error_rows_with_control_characters_escaped(
        redis_url: str, fleet: dict[str, Any]) -> None:
    result = run(redis_url, "ls")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "\x01" not in result.stdout
    for name in GOOD:
        assert any(line.split()[:2] == [name, "OPEN"] for line in lines), result.stdout
    for shown in ("bad name  ", "ctl\\x01x", "}brace", "\ufffd ", "x ", "xh ", "garb", "badcfg",
                  "badmeta", "bh "):
        line = next(line for line in lines if line.startswith(shown))
        assert " ERROR " in line
    assert FOREIGN["x"] in result.stdout and FOREIGN["badmeta"] in result.stdout
    # a --state filter keeps only the breakers in that state
    only_open = run(redis_url, "ls", "--state", "open", "--json")
    assert [r["name"] for r in json.loads(only_open.stdout)["breakers"]] == GOOD


def test_watch_shows_error_rows_after_the_open_breakers(
        redis_url: str, fleet: dict[str, Any]) -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["--url", redis_url, "watch", "--interval", "0.05", "--iterations", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    rows = [line for line in lines if " OPEN  " in line or " ERROR " in line]
    assert [row.split()[0] for row in rows[:5]] == GOOD  # worst first: OPEN before ERROR
    assert all(" ERROR " in row for row in rows[5:])
    assert len(rows) == len(GOOD) + len(ERRORS)
    shown = next(line for line in lines if line.startswith("NAME")).split()
    assert shown == [h for h in HEADERS if h != "RATE"]  # no rate limiter: no RATE column
    for row in rows[:5]:  # every column is still there beside the error rows
        assert len(row.split()) == len(shown) and row.split()[1] == "OPEN", row
    assert f"ERROR x: {FOREIGN['x']}" in lines
    assert f"{len(GOOD) + len(ERRORS)} names" in result.stdout


def test_show_reads_the_rest_and_names_the_foreign_key(
        redis_url: str, redis_client: redis.Redis, fleet: dict[str, Any]) -> None:
    CircuitBreaker("bh", redis=redis_url, **FAST).call(lambda: None)  # a readable breaker too
    result = run(redis_url, "show", "bh", "--json")
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert detail["error"] == FOREIGN["bh"]
    assert detail["exists"] is True
    assert detail["breaker"]["state"] == "CLOSED"
    assert detail["bulkhead"] is None
    text = run(redis_url, "show", "x")
    assert text.exit_code == 0, text.output
    assert f"error:     {FOREIGN['x']}" in text.stdout
    content = json.loads(run(redis_url, "show", "garb", "--json").stdout)
    assert content["error"] == FOREIGN["garb"] and content["breaker"] is None
    good = json.loads(run(redis_url, "show", "dep-0", "--json").stdout)
    assert good["error"] is None and good["breaker"]["state"] == "OPEN"
    # an invalid name cannot be asked for by name: a usage error, as before
    assert run(redis_url, "show", "bad name").exit_code == 2


def test_events_prints_error_lines_then_the_5_trips(
        redis_url: str, redis_client: redis.Redis, fleet: dict[str, Any]) -> None:
    redis_client.set(BreakerKeys.build("dep-9").history, "not a stream")
    result = run(redis_url, "events", "--json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    errors = [e for e in events if e["error"]]
    trips = [e for e in events if not e["error"]]
    assert sorted(e["name"] for e in trips) == GOOD
    assert all((e["from"], e["to"]) == ("CLOSED", "OPEN") for e in trips)
    assert events[:len(errors)] == errors  # the error lines come first
    wanted = {n for n, start in ERRORS.items() if n != "bh"} | {"dep-9"}  # bh: no breaker
    assert {e["name"] for e in errors} == wanted
    by_name = {e["name"]: e for e in errors}
    assert by_name["dep-9"]["error"] == (f"key {NS}:{{dep-9}}:cb:events holds a string, "
                                         "expected a stream")
    assert by_name["x"]["error"] == FOREIGN["x"]
    assert (by_name["x"]["id"], by_name["x"]["generation"], by_name["x"]["to"]) == (None, None, "")
    text = run(redis_url, "events")
    assert text.exit_code == 0, text.output
    assert sum(" ERROR " in line for line in text.stdout.splitlines()) == len(wanted)
    assert sum("CLOSED" in line and "OPEN" in line for line in text.stdout.splitlines()) == 5
    assert "\x01" not in text.stdout
    one = [json.loads(line) for line in run(redis_url, "events", "x", "--json").stdout.splitlines()]
    assert one == [by_name["x"]]  # NAME alone: its error line, and no history
    one = run(redis_url, "events", "dep-9")
    assert one.exit_code == 0 and "ERROR  key " in one.stdout
    followed = run(redis_url, "events", "--follow", "--json", "--timeout", "0.2")
    assert followed.exit_code == 0, followed.output
    assert len(followed.stdout.splitlines()) == len(events)


def test_reset_all_resets_the_5_and_reports_the_rest(
        redis_url: str, redis_client: redis.Redis, fleet: dict[str, Any]) -> None:
    result = run(redis_url, "reset", "--all", "--yes")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    for name in GOOD:
        assert CircuitBreaker(name, redis=redis_url, **FAST).state.value == "CLOSED"
        assert f"{name}: OPEN -> CLOSED" in result.stdout
    refused = [line for line in result.stderr.splitlines() if ": not reset: " in line]
    # every name with breaker keys that could not be reset (bh and LONG have none)
    assert len(refused) == len(ERRORS) - 2
    assert f"x: not reset: {FOREIGN['x']}" in result.stderr
    assert f"reset 5 breaker(s); {len(ERRORS) - 2} name(s)" in result.stderr
    for key, dump in fleet.items():  # nothing foreign was touched
        assert redis_client.dump(key) == dump, key


def test_reset_all_json_has_one_line_per_breaker_and_per_refusal(
        redis_url: str, fleet: dict[str, Any]) -> None:
    result = run(redis_url, "reset", "--all", "--yes", "--json")
    assert result.exit_code == 1, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    done = [x for x in lines if "error" not in x]
    assert sorted(x["name"] for x in done) == GOOD
    assert all(x["state"] == "CLOSED" and x["previous"] == "OPEN" for x in done)
    refused = {x["name"]: x for x in lines if "error" in x}
    assert set(refused) == {"bad name", "ctl\x01x", "}brace", "\ufffd", "x", "xh", "garb",
                            "badcfg", "badmeta"}
    assert refused["garb"] == {"name": "garb", "action": "reset", "error": FOREIGN["garb"]}


def test_reset_all_exits_0_without_foreign_keys(redis_url: str,
                                                redis_client: redis.Redis) -> None:
    CircuitBreaker("only", redis=redis_url, **FAST).call(lambda: None)
    redis_client.set(f"{NS}:{{other}}:unknown-suffix", "not ours, not listed")
    result = run(redis_url, "reset", "--all", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "reset 1 breaker(s)"


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


#: Keys of invalid name parts (bad name has 2) plus one per foreign valid name.
FOREIGN_KEY_COUNT = 6 + len(FOREIGN)


def test_prometheus_discover_exports_the_5_and_counts_the_foreign_keys(
        redis_url: str, fleet: dict[str, Any]) -> None:
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    samples = _scrape(registry)
    assert samples[("distbreaker_up", ())] == 1
    assert samples[("distbreaker_foreign_keys", ())] == FOREIGN_KEY_COUNT
    for name in GOOD:
        assert samples[("distbreaker_breaker_state", (("name", name), ("state", "OPEN")))] == 1
        assert samples[("distbreaker_breaker_transitions_total", (
            ("from_state", "CLOSED"), ("name", name), ("to_state", "OPEN")))] == 1
    for name in FOREIGN:
        assert samples[("distbreaker_unreadable", (("name", name),))] == 1
    labelled = {dict(labels).get("name") for _, labels in samples}
    assert not labelled & set(INVALID)  # invalid name parts are counted, never labels


def test_prometheus_without_foreign_keys_exports_zero(redis_url: str) -> None:
    CircuitBreaker("only", redis=redis_url, **FAST).call(lambda: None)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis_url, discover=True))
    samples = _scrape(registry)
    assert samples[("distbreaker_foreign_keys", ())] == 0
    assert samples[("distbreaker_breaker_state", (("name", "only"), ("state", "CLOSED")))] == 1


def test_otel_discover_counts_the_foreign_keys_too(redis_url: str,
                                                   fleet: dict[str, Any]) -> None:
    reader = InMemoryMetricReader()
    DistbreakerInstrumentor(redis_url, discover=True,
                            meter_provider=MeterProvider(metric_readers=[reader]))
    points: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = [(dict(p.attributes), p.value)
                                       for p in metric.data.data_points]
    assert points["distbreaker_up"] == [({}, 1)]
    assert points["distbreaker_foreign_keys"] == [({}, FOREIGN_KEY_COUNT)]
    opened = {a["name"] for a, v in points["distbreaker_breaker_state"]
              if a["state"] == "OPEN" and v == 1}
    assert opened == set(GOOD)


def test_dashboard_fleet_and_detail_show_the_errors(redis_url: str,
                                                    fleet: dict[str, Any]) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert_error_rows(fleet_snapshot(client, "distbreaker")["rows"])
    finally:
        client.close()
    dashboard = Dashboard(lambda: redis.Redis.from_url(redis_url), "distbreaker")
    http = TestClient(create_app(dashboard))  # no lifespan: the hub thread stays off
    try:
        response = http.get("/api/breakers/x")
        assert response.status_code == 200
        assert response.json()["error"] == FOREIGN["x"]
        assert response.json()["history"] == []
        good = http.get("/api/breakers/dep-0").json()
        assert good["error"] is None and good["breaker"]["state"] == "OPEN"
        assert [e["to"] for e in good["history"]] == ["OPEN"]
    finally:
        dashboard.close()


def test_a_v2_record_with_an_impossible_window_is_named_by_show(
        redis_url: str, redis_client: redis.Redis) -> None:
    """The header reads (ls shows the state) but its window size is no config's, so
    `show` does not walk a billion slots: it names the record as foreign."""
    CircuitBreaker("huge", redis=redis_url, **FAST).call(lambda: None)
    key = BreakerKeys.build("huge").state
    redis_client.set(key, encode_fields(redis_client.get(key), window_size=10**9))
    row = json.loads(run(redis_url, "ls", "--json").stdout)["breakers"][0]
    assert (row["name"], row["state"], row["error"]) == ("huge", "CLOSED", None)
    detail = json.loads(run(redis_url, "show", "huge", "--json").stdout)
    assert detail["breaker"] is None
    assert detail["error"] == (f"key {key}: breaker 'huge': the state record has window type 0 "
                               "and size 1000000000, which no config allows")
