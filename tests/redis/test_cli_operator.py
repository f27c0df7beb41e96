"""The CLI as an operator uses it in an incident (issue 16), against a real redis-server:
Sentinel URLs, --version, did-you-mean, optional --reason, clear empty results, the real
previous state, stable JSON ids, human times with their zone, forcing open a name whose
keys expired, history-then-live events, config drift named by field and cleared by reset."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from distbreaker import __version__
from distbreaker._runtime.keys import BreakerKeys
from distbreaker.breaker.state import State
from distbreaker.cli.app import cli
from distbreaker.demo.embedded import EmbeddedSentinel
from distbreaker.errors import CallNotPermitted, ConfigDriftWarning
from tests.helpers.cli import fail, make, run

ROOT = Path(__file__).resolve().parents[2]
EPOCH_MS = re.compile(r"\b1[7-9]\d{11}\b")  # a raw epoch in ms (2023..2033)




#: `python -c` body: the CLI with Redis's clock (TIME, the only clock distbreaker's state
#: is read with) stopped at argv[1] ms, so time-dependent output is exact however long
#: the process took to start.
STOPPED_CLOCK_CLI = """
import sys
import redis
from distbreaker.cli import cli

now_ms = int(sys.argv.pop(1))
redis.Redis.time = lambda self: (now_ms // 1000, now_ms % 1000 * 1000)
cli(prog_name="distbreaker")
"""


def cli_process(url: str, *args: str, tz: str = "UTC",
                server_now_ms: int | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process (a real TZ); `server_now_ms` stops Redis's clock there."""
    env = {**os.environ, "TZ": tz}
    command = [sys.executable, "-m", "distbreaker"] if server_now_ms is None else \
        [sys.executable, "-c", STOPPED_CLOCK_CLI, str(server_now_ms)]
    return subprocess.run([*command, "--url", url, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


# -- connection and usage ------------------------------------------------------------------
@pytest.fixture(scope="module")
def sentinel() -> Iterator[EmbeddedSentinel]:
    with EmbeddedSentinel() as env:
        yield env


def test_sentinel_urls_work_as_the_library_takes_them(sentinel: EmbeddedSentinel,
                                                      name: str) -> None:
    worker = make(name, sentinel.url)
    fail(worker, 4)
    listed = run(sentinel.url, "ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert [(r["name"], r["state"]) for r in json.loads(listed.stdout)["breakers"]
            if r["name"] == name] == [(name, "OPEN")]
    closed = run(sentinel.url, "close", name, "--reason", "via sentinel")
    assert closed.exit_code == 0, closed.output
    assert worker.state is State.CLOSED
    unknown = run(f"redis+sentinel://127.0.0.1:{sentinel.sentinel_port}/nosuch", "ls")
    assert unknown.exit_code == 1
    assert "named a reachable primary for service 'nosuch'" in unknown.stderr
    assert unknown.stderr.count("\n") == 1
    bad = run("redis+sentinel://127.0.0.1:1", "ls")
    assert bad.exit_code == 2 and "must end in /<service name>" in bad.stderr


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"distbreaker {__version__} (key schema v2")


def test_did_you_mean_for_commands_and_names(redis_url: str) -> None:
    make("payments", redis_url).call(lambda: None)
    typo = run(redis_url, "metrics_only", "payments")
    assert typo.exit_code == 2 and "Did you mean 'metrics-only'?" in typo.stderr
    for args in (["show", "paymnets"], ["close", "paymnets"], ["events", "paymnets"],
                 ["reset", "paymnets"], ["open", "paymnets"]):
        result = run(redis_url, *args)
        assert result.exit_code == 1, (args, result.output)
        assert "did you mean 'payments'?" in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1


def test_empty_results_say_what_there_is(redis_url: str) -> None:
    make("a", redis_url).call(lambda: None)
    fail(make("b", redis_url), 4)
    result = run(redis_url, "ls", "--state", "half_open", "--state", "disabled")
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr.strip() == ("no breaker is HALF_OPEN or DISABLED under prefix "
                                     "'distbreaker' (2 names: 1 CLOSED, 1 OPEN)")
    nothing = run(redis_url, "--prefix", "elsewhere", "ls")
    assert ("no breakers, bulkheads, rate limiters or budgets under prefix 'elsewhere'"
            in nothing.stderr)
    quiet = run(redis_url, "events", "a")
    assert quiet.exit_code == 0 and "no history recorded for 'a'" in quiet.stderr


# -- actions ------------------------------------------------------------------------------
def test_reason_is_optional_and_a_default_is_recorded_with_user_at_host(
        redis_url: str, name: str) -> None:
    fail(make(name, redis_url), 4)
    result = run(redis_url, "reset", name, "--json")
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout)
    assert line["reason"] == "reset from the distbreaker CLI (no --reason given)"
    user, _, host = line["actor"].partition("@")
    assert user and host
    last = json.loads(run(redis_url, "events", name, "--json", "-n", "1").stdout)
    assert (last["reason"], last["actor"]) == (line["reason"], line["actor"])


def test_close_prints_the_real_previous_state(redis_url: str, name: str) -> None:
    fail(make(name, redis_url), 4)
    result = run(redis_url, "close", name, "--reason", "fixed", "--actor", "dana")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{name}: OPEN -> CLOSED  (closed by dana at ")
    again = run(redis_url, "close", name, "--json")
    doc = json.loads(again.stdout)
    assert (doc["previous"], doc["state"], doc["changed"]) == ("CLOSED", "CLOSED", False)
    assert "already CLOSED, nothing changed" in run(redis_url, "close", name).stdout


@pytest.mark.parametrize(("command", "action_id", "state"), [
    ("open", "forced_open", "FORCED_OPEN"), ("trip", "trip", "OPEN"),
    ("disable", "disabled", "DISABLED"), ("metrics-only", "metrics_only", "METRICS_ONLY"),
    ("close", "closed", "CLOSED"), ("reset", "reset", "CLOSED")])
def test_json_action_ids_are_stable_identifiers(redis_url: str, name: str, command: str,
                                                action_id: str, state: str) -> None:
    worker = make(name, redis_url)
    if command == "metrics-only":
        setup = worker.transition_to_disabled("setup", "test")
    else:
        setup = worker.transition_to_metrics_only("setup", "test")
    doc = json.loads(run(redis_url, command, name, "--json").stdout)
    assert (doc["action"], doc["state"]) == (action_id, state)
    assert re.fullmatch(r"[a-z_]+", doc["action"])
    assert doc["previous"] == setup.value and doc["changed"] is True
    assert isinstance(doc["at_ms"], int) and doc["created"] is False


def test_open_a_name_whose_keys_expired_forces_it_open_for_the_fleet(
        redis_url: str, redis_client: redis.Redis) -> None:
    worker = make("billing", redis_url)
    worker.call(lambda: None)
    redis_client.delete(*BreakerKeys.build("billing").__dict__.values())  # expired
    result = run(redis_url, "open", "billing", "--reason", "gateway maintenance", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["state"], doc["created"]) == ("FORCED_OPEN", True)
    with pytest.raises(CallNotPermitted), warnings.catch_warnings():
        # the new breaker was stored with the default config: this worker's differs
        warnings.simplefilter("ignore", ConfigDriftWarning)
        make("billing", redis_url).call(lambda: None)  # a fresh worker process's view
    history = json.loads(run(redis_url, "events", "billing", "--json").stdout)
    assert (history["to"], history["reason"]) == ("FORCED_OPEN", "gateway maintenance")
    text = run(redis_url, "open", "billing")
    assert "already FORCED_OPEN" in text.stdout


def test_open_a_new_name_close_to_an_existing_one_needs_create(redis_url: str) -> None:
    make("checkout", redis_url).call(lambda: None)
    refused = run(redis_url, "open", "checkuot")
    assert refused.exit_code == 1
    assert "did you mean 'checkout'?" in refused.stderr and "--create" in refused.stderr
    created = run(redis_url, "open", "checkuot", "--create", "--json")
    assert json.loads(created.stdout)["created"] is True


# -- human output -------------------------------------------------------------------------
def test_show_and_events_print_local_times_with_the_zone_and_no_raw_epoch(
        redis_url: str, name: str) -> None:
    breaker = make(name, redis_url, max_wait_in_half_open=0)
    fail(breaker, 4)
    raw = json.loads(run(redis_url, "show", name, "--json").stdout)
    assert isinstance(raw["breaker"]["since_ms"], int)  # raw ms stay in --json
    open_until_ms = raw["breaker"]["open_until_ms"]
    assert open_until_ms - raw["breaker"]["since_ms"] == 30_000  # the 30 s wait
    # Looked at 0.5 s after the trip (a stopped clock: a slow machine changes nothing)
    show = cli_process(redis_url, "show", name, tz="Asia/Kolkata",
                       server_now_ms=open_until_ms - 29_500)
    assert show.returncode == 0, show.stderr
    assert not EPOCH_MS.search(show.stdout), show.stdout
    assert re.search(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST, generation 1", show.stdout)
    assert "max half-open no limit" in show.stdout and "max half-open 0s" not in show.stdout
    assert "calls refused by Redis since the keys were created" in show.stdout
    assert "rejected fleet-wide" not in show.stdout
    assert "next call: rejected; probes start in 29s" in show.stdout
    events = cli_process(redis_url, "events", name, tz="UTC")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC  ", events.stdout)


def test_events_are_aligned_in_columns(redis_url: str) -> None:
    fail(make("a", redis_url), 4)
    make("a-much-longer-name", redis_url).transition_to_forced_open("maintenance", "ops")
    make("mid-name", redis_url).transition_to_metrics_only("observe", "ops")
    lines = run(redis_url, "events").stdout.splitlines()
    assert len(lines) == 3
    assert len({line.index("->") for line in lines}) == 1
    reasons = [line.index(word) for line, word in zip(
        lines, ("failure rate", "maintenance", "observe"), strict=True)]
    assert len(set(reasons)) == 1


def test_open_whose_wait_ended_is_shown_as_due_for_a_probe(redis_url: str, name: str) -> None:
    fail(make(name, redis_url, wait_duration_in_open_state=0.05), 4)
    time.sleep(0.1)
    row = next(line for line in run(redis_url, "ls").stdout.splitlines()
               if line.startswith(name))
    assert "OPEN (due)" in row and "next call" in row
    assert "the next call becomes a half-open probe" in run(redis_url, "show", name).stdout


def test_events_follow_prints_history_then_live(redis_url: str, name: str) -> None:
    breaker = make(name, redis_url)
    breaker.transition_to_forced_open("before", "ops")

    def act() -> None:
        time.sleep(0.5)
        breaker.transition_to_closed("after", "ops")

    thread = threading.Thread(target=act)
    thread.start()
    result = run(redis_url, "events", name, "--follow", "--json", "--max-events", "1",
                 "--timeout", "10")
    thread.join()
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["reason"], e["id"] is None) for e in events] == [("before", False),
                                                                ("after", True)]


# -- config drift -------------------------------------------------------------------------
def test_drift_is_warned_once_per_process_naming_each_field(redis_url: str,
                                                            name: str) -> None:
    # two breaker objects of one process on the older deployment, same drift
    others = [make(name, redis_url, failure_rate_threshold=30,
                   wait_duration_in_open_state=10.0) for _ in range(2)]
    others[0].call(lambda: None)
    make(name, redis_url).call(lambda: None)  # the newest deployment: in force
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for other in others:
            other.call(lambda: None)
            other.call(lambda: None)
    drift = [str(w.message) for w in caught if issubclass(w.category, ConfigDriftWarning)]
    assert len(drift) == 1, drift
    assert "failure_rate_threshold: here 30.0, stored 50.0" in drift[0]
    assert "wait_duration_in_open_state: here 10.0, stored 30.0" in drift[0]
    show = run(redis_url, "show", name).stdout
    assert "failure_rate_threshold 30.0 (stored 50.0)" in show


def test_cli_reset_clears_the_recorded_drift_or_adopts_it(redis_url: str,
                                                         name: str) -> None:
    drifting = make(name, redis_url, minimum_number_of_calls=2)
    drifting.call(lambda: None)
    make(name, redis_url).call(lambda: None)  # the newest deployment: in force
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        drifting.call(lambda: None)

    def drift() -> object:
        return json.loads(run(redis_url, "show", name, "--json").stdout)["breaker"][
            "config_drift"]

    assert drift() is not None
    result = run(redis_url, "reset", name)
    assert result.exit_code == 0 and "config drift record cleared" in result.stdout
    assert drift() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        drifting.call(lambda: None)
    assert drift() is not None
    adopted = json.loads(run(redis_url, "reset", name, "--adopt-drift", "--json").stdout)
    assert adopted["adopted"] == [{"field": "minimum_number_of_calls", "was": 4, "now": 2}]
    assert drift() is None
    drifting.call(lambda: None)
    assert drifting.config_drift is None  # its config is the stored one now
    none_left = run(redis_url, "reset", name, "--adopt-drift")
    assert none_left.exit_code == 1 and "nothing to adopt" in none_left.stderr
