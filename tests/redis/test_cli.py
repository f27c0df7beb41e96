"""The `distbreaker` CLI against a real redis-server: read views, operator actions,
confirmation, failures as one line with the documented exit codes, doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import Result

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys, BudgetKeys
from distbreaker._runtime.scripts import SCRIPT_NAMES
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import free_port
from distbreaker.errors import CallNotPermitted
from tests.helpers.cli import fail, make, run
from tests.helpers.schema_keys import write_v2

ROOT = Path(__file__).resolve().parents[2]




def one_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def fleet(redis_url: str) -> dict[str, CircuitBreaker]:
    """Breakers in CLOSED (with calls), OPEN, HALF_OPEN and FORCED_OPEN."""
    closed = make("api-closed", redis_url)
    closed.call(lambda: None)
    fail(closed, 1)
    tripped = make("api-open", redis_url)
    fail(tripped, 4)
    half = make("api-half", redis_url, wait_duration_in_open_state=0.05)
    fail(half, 4)
    time.sleep(0.06)
    half.acquire()  # one probe lease out, not reported
    forced = make("api-forced", redis_url)
    forced.transition_to_forced_open("maintenance", "ops@test")
    return {"closed": closed, "open": tripped, "half": half, "forced": forced}


# -- read views -------------------------------------------------------------------------
def test_ls_json_lists_every_breaker_with_state_and_rates(
        redis_url: str, fleet: dict[str, CircuitBreaker]) -> None:
    result = run(redis_url, "ls", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == 1 and doc["prefix"] == "distbreaker"
    rows = {r["name"]: r for r in doc["breakers"]}
    assert {n: r["state"] for n, r in rows.items()} == {
        "api-closed": "CLOSED", "api-open": "OPEN", "api-half": "HALF_OPEN",
        "api-forced": "FORCED_OPEN"}
    opened = rows["api-open"]["breaker"]
    assert opened["calls"] == 4 and opened["failures"] == 4 and opened["failure_rate"] == 100.0
    assert 20 < opened["retry_in_s"] <= 30  # what is left of the 30 s wait (slack: load)
    closed = rows["api-closed"]["breaker"]
    assert closed["calls"] == 2 and closed["failure_rate"] == -1  # below the minimum
    assert rows["api-forced"]["breaker"]["retry_in_s"] is None
    assert rows["api-half"]["breaker"]["half_open"]["issued"] == 1
    assert all(r["error"] is None and r["bulkhead"] is None for r in rows.values())

    only_open = json.loads(run(redis_url, "ls", "--json", "--state", "open",
                               "--state", "FORCED_OPEN").stdout)
    assert sorted(r["name"] for r in only_open["breakers"]) == ["api-forced", "api-open"]


def test_ls_text_shows_a_row_per_breaker(redis_url: str,
                                          fleet: dict[str, CircuitBreaker]) -> None:
    result = run(redis_url, "ls")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "IN"]
    row = next(line for line in lines if line.startswith("api-open "))
    assert "OPEN" in row and "100%" in row
    assert "held open" in next(line for line in lines if line.startswith("api-forced"))
    assert len(lines) == 5
    empty = run(redis_url, "--prefix", "other", "ls")
    assert empty.exit_code == 0 and "no breakers" in empty.stderr


def test_show_json_has_config_window_probes_and_ttls(redis_url: str, name: str) -> None:
    breaker = make(name, redis_url, wait_duration_in_open_state=0.05)
    breaker.call(lambda: None)
    fail(breaker, 3)
    doc = json.loads(run(redis_url, "show", name, "--json").stdout)
    b = doc["breaker"]
    assert b["state"] == "OPEN" and b["calls"] == 4 and b["failure_rate"] == 75.0
    assert b["config"]["wire"] == breaker.config.to_wire()
    assert b["config"]["sliding_window_size"] == 10
    assert b["config"]["wait_duration_in_open_state_s"] == 0.05
    assert [x["failed"] for x in b["window"]["buckets"]] == [False, True, True, True]
    time.sleep(0.06)
    permit = breaker.acquire()
    doc = json.loads(run(redis_url, "show", name, "--json").stdout)
    b = doc["breaker"]
    assert b["state"] == "HALF_OPEN"
    assert [p["token"] for p in b["probes"]] == [permit.token]
    assert 50 < b["probes"][0]["expires_in_s"] <= 60
    assert b["history_length"] == 2
    keys = BreakerKeys.build(name)
    assert 580 < doc["ttls"][keys.state] <= 600
    assert doc["bulkhead"] is None and doc["budget"] is None


def test_show_text_and_time_window_buckets(redis_url: str, name: str) -> None:
    breaker = make(name, redis_url, sliding_window_type="TIME_BASED", sliding_window_size=5)
    breaker.call(lambda: None)
    fail(breaker, 1)
    result = run(redis_url, "show", name)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "state:     CLOSED" in text
    assert "TIME_BASED window of 5" in text and "failure >= 50%" in text
    assert "-0s 2c/1f/0s" in text or "-1s" in text
    doc = json.loads(run(redis_url, "show", name, "--json").stdout)
    bucket = doc["breaker"]["window"]["buckets"][-1]
    assert bucket["calls"] >= 1 and sum(
        x["failures"] for x in doc["breaker"]["window"]["buckets"]) == 1


def test_show_bulkhead_holders_and_budget(redis_url: str, redis_client: redis.Redis,
                                          name: str) -> None:
    from distbreaker.budget.sync import RetryBudget
    from distbreaker.bulkhead.sync import Bulkhead

    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=3, lease=30.0)
    permit = bulkhead.acquire()
    budget = RetryBudget(name, redis=redis_url)
    budget.deposit(5)
    budget.try_withdraw()
    try:
        doc = json.loads(run(redis_url, "show", name, "--json").stdout)
        assert doc["breaker"] is None
        assert doc["bulkhead"]["in_use"] == 1 and doc["bulkhead"]["limit"] == 3
        assert 20 < doc["bulkhead"]["holders"][0]["expires_in_s"] <= 30
        assert doc["budget"]["deposits"] == 5 and doc["budget"]["withdrawals"] == 1
        assert doc["ttls"][BudgetKeys.build(name).slices] > 0
        row = json.loads(run(redis_url, "ls", "--json").stdout)["breakers"][0]
        assert row["bulkhead"] == {"in_use": 1, "limit": 3, "adaptive": None}
        assert row["state"] is None
        text = run(redis_url, "show", name).stdout
        assert "bulkhead:  1/3 in use" in text and "budget:    5 deposits, 1 retries" in text
    finally:
        bulkhead.release(permit)
        bulkhead.close()


def test_events_history_text_and_json(redis_url: str, name: str) -> None:
    breaker = make(name, redis_url)
    fail(breaker, 4)
    breaker.reset("deploy fixed it", "alice@laptop")
    result = run(redis_url, "events", name, "--json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["from"], e["to"]) for e in events] == [("CLOSED", "OPEN"), ("OPEN", "CLOSED")]
    assert events[0]["failure_rate"] == 100.0 and events[0]["reason"].startswith("failure rate")
    assert events[1]["reason"] == "deploy fixed it" and events[1]["actor"] == "alice@laptop"
    assert events[1]["generation"] == 2 and events[1]["id"]
    text = run(redis_url, "events", name).stdout.splitlines()
    assert len(text) == 2 and text[1].split()[4:] == [
        "OPEN", "->", "CLOSED", "deploy", "fixed", "it", "by", "alice@laptop"]
    other = make(name + "-b", redis_url)
    other.transition_to_disabled("noisy", "bob")
    everyone = [json.loads(x) for x in run(redis_url, "events", "--json").stdout.splitlines()]
    assert [e["name"] for e in everyone] == [name, name, name + "-b"]
    assert len(run(redis_url, "events", "-n", "1").stdout.splitlines()) == 1


def test_events_follow_prints_live_transitions_until_max_events(redis_url: str,
                                                                name: str) -> None:
    breaker = make(name, redis_url)
    breaker.call(lambda: None)

    def act() -> None:
        time.sleep(0.3)
        make(name + "-other", redis_url).trip("ignored: other name")
        breaker.trip("live test", "carol")

    thread = threading.Thread(target=act)
    thread.start()
    started = time.monotonic()
    result = run(redis_url, "events", name, "--follow", "--json", "--max-events", "1",
                 "--timeout", "120")
    thread.join()
    assert result.exit_code == 0, result.output
    event = json.loads(result.stdout)
    assert (event["name"], event["to"], event["reason"], event["actor"]) == (
        name, "OPEN", "live test", "carol")
    assert event["id"] is None
    assert time.monotonic() - started < 60  # ended by the event, not by the 120 s timeout
    quiet = run(redis_url, "events", "--follow", "-n", "0", "--timeout", "0.2")
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_watch_refreshes_a_table(redis_url: str, fleet: dict[str, CircuitBreaker],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []  # (the watch module's clock only: other threads keep theirs)
    monkeypatch.setattr("distbreaker.cli.watch.time", types.SimpleNamespace(
        sleep=slept.append, time=time.time, monotonic=time.monotonic))
    result = run(redis_url, "watch", "--interval", "0.05", "--iterations", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("distbreaker watch") == 3
    assert result.stdout.count("api-open") == 3
    assert slept == [0.05, 0.05]  # the given interval between frames, none after the last


# -- operator actions -----------------------------------------------------------------------
@pytest.mark.parametrize(("command", "expected"), [
    ("open", State.FORCED_OPEN), ("disable", State.DISABLED),
    ("metrics-only", State.METRICS_ONLY), ("trip", State.OPEN), ("reset", State.CLOSED),
    ("close", State.CLOSED)])
def test_operator_action_is_seen_by_workers_and_recorded(
        redis_url: str, redis_client: redis.Redis, name: str, command: str,
        expected: State) -> None:
    worker = make(name, redis_url, sliding_window_size=20)
    fail(worker, 2)
    if command in ("reset", "close"):
        worker.transition_to_forced_open("incident", "ops")
    wire = worker.config.to_wire()
    result = run(redis_url, command, name, "--reason", f"why {command}", "--actor", "dana")
    assert result.exit_code == 0, result.output
    assert f"-> {expected.value}" in result.stdout
    assert worker.state is expected  # the worker's next read sees it
    assert worker.config_drift is None
    assert redis_client.hget(BreakerKeys.build(name).meta, "cfg").decode() == wire
    last = json.loads(run(redis_url, "events", name, "--json", "-n", "1").stdout)
    assert (last["to"], last["reason"], last["actor"]) == (expected.value, f"why {command}",
                                                          "dana")
    if expected is State.FORCED_OPEN:
        with pytest.raises(CallNotPermitted):
            worker.call(lambda: None)
    if command == "reset":
        assert worker.metrics().calls == 0


def test_actor_defaults_to_user_at_host(redis_url: str, name: str) -> None:
    make(name, redis_url).call(lambda: None)
    result = run(redis_url, "open", name, "--reason", "x", "--json")
    assert result.exit_code == 0
    actor = json.loads(result.stdout)["actor"]
    assert "@" in actor and actor.split("@")[1]


def test_reset_all_needs_yes(redis_url: str, fleet: dict[str, CircuitBreaker]) -> None:
    refused = run(redis_url, "reset", "--all", "--reason", "incident over")
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert fleet["open"].state is State.OPEN
    assert run(redis_url, "reset", "--reason", "x").exit_code == 2  # neither NAME nor --all
    done = run(redis_url, "reset", "--all", "--yes", "--reason", "incident over")
    assert done.exit_code == 0, done.output
    assert all(b.state is State.CLOSED for b in fleet.values())
    last = json.loads(run(redis_url, "events", "api-forced", "--json", "-n", "1").stdout)
    assert last["reason"] == "incident over"


def test_release_stale_reaps_a_dead_holders_lease(redis_url: str, redis_client: redis.Redis,
                                                  name: str) -> None:
    from distbreaker._runtime.scripts import load_script, run_script
    from distbreaker.bulkhead.config import BulkheadConfig
    from distbreaker.bulkhead.core import BulkheadCodec, decode_reply

    def hold(token: str, lease: float) -> None:
        codec = BulkheadCodec(name, BulkheadConfig(max_concurrent_calls=2, lease=lease))
        call = codec.acquire_call(token, 0)
        assert decode_reply(run_script(redis_client, load_script("bulkhead"), call.keys,
                                       call.args)).ok

    hold("dead-worker", 0.05)   # SIGKILLed: never renews nor releases
    hold("live-worker", 30.0)
    time.sleep(0.08)
    before = json.loads(run(redis_url, "show", name, "--json").stdout)["bulkhead"]
    assert before["in_use"] == 1 and len(before["holders"]) == 2
    result = run(redis_url, "release-stale", name, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"name": name, "action": "release-stale",
                                         "released": 1, "in_use": 1, "limit": 2,
                                         "waiting": 0}
    assert redis_client.zrange(f"distbreaker:v2:{{{name}}}:bh", 0, -1) == [b"live-worker"]
    assert run(redis_url, "release-stale", "nobody").exit_code == 1


def test_url_defaults_to_distbreaker_redis_url_then_redis_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from distbreaker.cli.app import default_url

    monkeypatch.delenv("DISTBREAKER_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert default_url() == "redis://localhost:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://b:2/0")
    assert default_url() == "redis://b:2/0"
    monkeypatch.setenv("DISTBREAKER_REDIS_URL", "redis://a:1/0")
    assert default_url() == "redis://a:1/0"


# -- failures: one line, documented exit codes ------------------------------------------------
@pytest.mark.parametrize("args", [["show", "ghost"], ["close", "ghost", "--reason", "x"],
                                  ["events", "ghost"], ["reset", "ghost", "--reason", "x"]])
def test_unknown_name_exits_1_with_one_line(redis_url: str, args: list[str]) -> None:
    result = run(redis_url, *args)
    assert result.exit_code == 1
    assert "'ghost'" in one_line(result)


def test_unreachable_redis_exits_1_with_one_line() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = run(url, "ls")
    assert result.exit_code == 1
    line = one_line(result)
    assert line.startswith("Error: cannot reach Redis at " + url)


def test_wrong_password_exits_1_without_echoing_it(redis_url: str,
                                                   redis_client: redis.Redis) -> None:
    redis_client.execute_command("ACL", "SETUSER", "cli-user", "on", ">right", "~*", "&*",
                                 "+@all")
    try:
        url = redis_url.replace("redis://", "redis://cli-user:wrong@")
        result = run(url, "ls")
        assert result.exit_code == 1
        line = one_line(result)
        assert "authentication failed" in line and "wrong" not in line.replace(
            "username-password", "")
        ok = run(redis_url.replace("redis://", "redis://cli-user:right@"), "ls", "--json")
        assert ok.exit_code == 0
    finally:
        redis_client.execute_command("ACL", "DELUSER", "cli-user")


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_wrong_type_key(redis_url: str, redis_client: redis.Redis, name: str) -> None:
    redis_client.hset(BreakerKeys.build(name).state, "state", "v1's layout")
    result = run(redis_url, "show", name)  # shown with the error, the rest read (issue 13)
    assert result.exit_code == 0, result.output
    assert "error:     key " in result.stdout and "holds a hash, expected a string" in result.stdout
    row = json.loads(run(redis_url, "ls", "--json").stdout)["breakers"][0]
    assert row["name"] == name and "hash" in row["error"] and row["schema"] == "v2"
    assert run(redis_url, "open", name, "--reason", "x").exit_code == 1


@pytest.mark.parametrize("args", [["nope"], ["ls", "--state", "sideways"], ["show"],
                                  ["show", "two words"], ["open"],
                                  ["events", "--timeout", "1"], ["--prefix", "a{b}", "ls"]])
def test_bad_usage_exits_2(redis_url: str, args: list[str]) -> None:
    result = run(redis_url, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


# -- doctor ------------------------------------------------------------------------------------
def test_doctor_is_green_on_the_test_server(redis_url: str) -> None:
    result = run(redis_url, "doctor")
    assert result.exit_code == 0, result.output
    text = result.stdout
    for needle in ("server: Redis 7", "standalone", "latency: round trip", "breaker.lua: loaded",
                   "bulkhead.lua: loaded", "acl: ACL user 'default' may run all", "clock:",
                   "functions: library distbreaker_", f"{len(SCRIPT_NAMES)} functions (FCALL)"):
        assert needle in text
    doc = json.loads(run(redis_url, "doctor", "--json").stdout)
    assert doc["ok"] is True and {c["status"] for c in doc["checks"]} <= {"ok", "skip"}


def test_doctor_names_the_command_an_acl_user_lacks(redis_url: str,
                                                    redis_client: redis.Redis) -> None:
    redis_client.execute_command("ACL", "SETUSER", "no-publish", "on", ">pw", "~*", "&*",
                                 "+@all", "-publish")
    try:
        url = redis_url.replace("redis://", "redis://no-publish:pw@")
        result = run(url, "doctor")
        assert result.exit_code == 1
        assert "PUBLISH (needed by lua/breaker.lua" in result.stderr
        assert "FAIL  acl" in result.stdout
    finally:
        redis_client.execute_command("ACL", "DELUSER", "no-publish")


# -- real processes ----------------------------------------------------------------------------
def test_python_m_distbreaker_sees_a_breaker_tripped_by_another_process(
        redis_url: str, name: str) -> None:
    worker = textwrap.dedent(f"""
        from distbreaker import CircuitBreaker
        b = CircuitBreaker({name!r}, redis={redis_url!r}, sliding_window_size=10,
                           minimum_number_of_calls=4, wait_duration_in_open_state=30)
        for _ in range(4):
            try:
                b.call(lambda: 1 / 0)
            except ZeroDivisionError:
                pass
        assert b.state.value == "OPEN"
    """)
    env = {**os.environ, "DISTBREAKER_REDIS_URL": redis_url}
    subprocess.run([sys.executable, "-c", worker], check=True, cwd=ROOT, env=env, timeout=30)
    done = subprocess.run([sys.executable, "-m", "distbreaker", "ls", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["breakers"]
    assert [(r["name"], r["state"]) for r in rows] == [(name, "OPEN")]
    bad = subprocess.run([sys.executable, "-m", "distbreaker", "--url",
                          f"redis://127.0.0.1:{free_port()}/0", "show", name], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "cannot reach Redis" in bad.stderr


# -- scale ------------------------------------------------------------------------------------
@pytest.fixture
def many(redis_client: redis.Redis) -> Iterator[int]:
    count = 10_000
    pipe = redis_client.pipeline(transaction=False)
    config = make("x", "redis://unused").config
    for i in range(count):
        write_v2(pipe, f"bulk-{i:05d}", config, since=1)
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    yield count


@pytest.mark.keys_without_ttl("it writes 10,000 records by hand")
def test_ls_over_10000_breakers_scans_in_bounded_batches(
        redis_url: str, redis_client: redis.Redis, many: int) -> None:
    """No KEYS: many SCAN steps of a bounded COUNT, so no single command holds Redis for
    long. (How long a step takes is machine load, not asserted: the step count is.)"""
    redis_client.config_resetstat()
    started = time.perf_counter()
    result = run(redis_url, "ls", "--json")
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)["breakers"]) == many
    stats = redis_client.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert stats["cmdstat_scan"]["calls"] >= many // 500  # bounded COUNT, many steps
    print(f"\nls --json over {many} breakers: {elapsed:.2f}s, "
          f"{stats['cmdstat_scan']['calls']} SCAN calls of "
          f"{stats['cmdstat_scan']['usec_per_call']:.0f} us each")


# -- Redis Cluster --------------------------------------------------------------------------
@pytest.fixture
def cluster_url() -> Iterator[str]:
    """A one-node Redis Cluster owning every slot (enough to exercise the cluster client).

    EmbeddedCluster gives the node an explicit bus port: the default port+10000 is out
    of range (and redis-server exits) for ports above 55535.
    """
    from distbreaker.demo.embedded import EmbeddedCluster

    with EmbeddedCluster(primaries=1) as cluster:
        yield cluster.url


def test_cluster_is_detected_scanned_and_operated(cluster_url: str) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(cluster_url)
    for n in ("alpha", "beta"):
        fail(make(n, client), 4)
    doc = json.loads(run(cluster_url, "ls", "--json").stdout)
    assert [(r["name"], r["state"]) for r in doc["breakers"]] == [("alpha", "OPEN"),
                                                                  ("beta", "OPEN")]
    result = run(cluster_url, "reset", "alpha", "--reason", "cluster test")
    assert result.exit_code == 0, result.output
    assert make("alpha", client).state is State.CLOSED
    doctor = run(cluster_url, "doctor")
    assert doctor.exit_code == 0, doctor.output
    assert "cluster (1 primary)" in doctor.stdout
    client.close()


def _drive(url: str, name: str, target: str) -> None:
    """Runs in its own process: drives one breaker into `target` and exits."""
    breaker = make(name, url, wait_duration_in_open_state=0.05)
    if target == "CLOSED":
        breaker.call(lambda: None)
    elif target == "OPEN":
        breaker.trip("driven by a worker process", "worker")
    elif target == "HALF_OPEN":
        fail(breaker, 4)
        time.sleep(0.06)
        assert breaker.acquire().token  # a probe lease left behind by this process
    elif target == "FORCED_OPEN":
        breaker.transition_to_forced_open("maintenance", "worker")
    elif target == "DISABLED":
        breaker.transition_to_disabled("off", "worker")
    elif target == "METRICS_ONLY":
        breaker.transition_to_metrics_only("observe", "worker")


def test_ls_and_show_see_states_made_by_other_processes(redis_url: str) -> None:
    import multiprocessing

    targets = ["CLOSED", "OPEN", "HALF_OPEN", "FORCED_OPEN", "DISABLED", "METRICS_ONLY"]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_drive, args=(redis_url, f"proc-{t.lower()}", t))
             for t in targets]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    rows = {r["name"]: r for r in json.loads(run(redis_url, "ls", "--json").stdout)["breakers"]}
    seen = {name: row["state"] for name, row in rows.items()}
    # the OPEN one may have moved on to HALF_OPEN by time alone (0.05 s wait)
    assert seen.pop("proc-open") in ("OPEN", "HALF_OPEN")
    assert seen == {f"proc-{t.lower()}": t for t in targets if t != "OPEN"}
    shown = json.loads(run(redis_url, "show", "proc-half_open", "--json").stdout)
    assert len(shown["breaker"]["probes"]) == 1
    history = run(redis_url, "events", "proc-forced_open", "--json")
    assert history.exit_code == 0 and "maintenance" in history.stdout


def test_show_and_ls_report_the_retry_budget_balance(redis_url: str, name: str) -> None:
    from distbreaker import RetryBudget

    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0.2, min_retries_per_sec=1,
                         ttl=10)
    for _ in range(10):
        budget.deposit()
    assert budget.try_withdraw()
    expected = budget.balance()               # (1 * 10 + 0.2 * 10) - 1 = 11
    assert expected == 11
    shown = json.loads(run(redis_url, "show", name, "--json").stdout)
    assert shown["budget"]["balance"] == expected
    listed = json.loads(run(redis_url, "ls", "--json").stdout)
    row = next(r for r in listed["breakers"] if r["name"] == name)
    assert row["budget"]["balance"] == expected
    assert f"balance {expected}" in run(redis_url, "show", name).stdout


def test_show_reports_config_drift_until_reset(redis_url: str, name: str) -> None:
    import warnings

    # the older deployment (second) drifts once the newer one (first) is in force
    second = CircuitBreaker(name, redis=redis_url, failure_rate_threshold=30)
    second.call(lambda: None)
    first = CircuitBreaker(name, redis=redis_url, failure_rate_threshold=50)
    first.call(lambda: None)
    assert json.loads(run(redis_url, "show", name, "--json").stdout)["breaker"][
        "config_drift"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second.call(lambda: None)
    drift = json.loads(run(redis_url, "show", name, "--json").stdout)["breaker"][
        "config_drift"]
    assert drift["config"]["failure_rate_threshold"] == 30
    assert drift["config"]["wire"] == second.config.to_wire()
    assert drift["seen_at_ms"] > 0
    assert "drift:" in run(redis_url, "show", name).stdout
    second.reset()   # adopts the second config: no more drift
    assert json.loads(run(redis_url, "show", name, "--json").stdout)["breaker"][
        "config_drift"] is None
