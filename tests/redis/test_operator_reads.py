"""Operator reads match the state (issue 29, item 5): an ended override reads as ended
everywhere without a call, its end is recorded stamped with its end time, every operator
action that changes anything says so and is recorded (one that changes nothing records
nothing), `events` shows every history kind with --kind filters, and `events --follow`
reconnects when Redis goes away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from distbreaker import readside as view
from distbreaker.contrib.prometheus import DistbreakerCollector
from distbreaker.demo.embedded import RedisServer
from tests.helpers.cli import fail, make, run
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _json(url: str, *args: str) -> Any:
    result = run(url, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _history(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    return view.read_history(client, "distbreaker", name, 1000)


@pytest.mark.parametrize("action, after", [("open", "HALF_OPEN"), ("disable", "CLOSED"),
                                           ("metrics-only", "CLOSED")])
def test_an_ended_override_reads_as_ended_without_a_call(
        redis_url: str, redis_client: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch,
        action: str, after: str) -> None:
    make(name, redis_url).call(lambda: None)
    done = _json(redis_url, action, name, "--for", "1h", "--reason", "window")
    ends = done["until_ms"]
    entries = len(_history(redis_client, name))
    # every reader's clock (Redis TIME as the readers see it) one second past the end;
    # the scripts keep the real clock, so no call can have recorded the end
    monkeypatch.setattr(redis.Redis, "time",
                        lambda self: (ends // 1000 + 1, ends % 1000 * 1000))
    row = _json(redis_url, "ls")["breakers"][0]
    assert (row["state"], row["breaker"]["override_until_ms"]) == (after, None)
    assert row["breaker"]["override_ended_ms"] == ends
    assert row["breaker"]["since_ms"] == ends
    listed = run(redis_url, "ls").stdout
    assert "held" not in listed and after in listed
    shown = run(redis_url, "show", name).stdout
    assert "the override ends in" not in shown and "override:  ended at" in shown
    assert view.read_rows(redis_client, "distbreaker",            # the dashboard's read
                          view.scan(redis_client, "distbreaker"))[0]["state"] == after
    exported = [s for metric in DistbreakerCollector(redis_url, discover=True).collect()
                for s in metric.samples if s.name == "distbreaker_breaker_state"
                and s.value == 1]
    assert [s.labels["state"] for s in exported] == [after]
    assert len(_history(redis_client, name)) == entries          # reads record nothing


def test_the_end_is_recorded_by_the_first_call_stamped_with_its_end_time(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = make(name, redis_url)
    breaker.transition_to_forced_open("short window", "ops", for_=0.3)
    ends = _history(redis_client, name)[-1]["until_ms"]
    wait_until(lambda: view.server_now_ms(redis_client) > ends + 300, timeout=30,
               what="the override's end passes")
    assert breaker.metrics().state == "HALF_OPEN"           # a read records the end
    ended = _history(redis_client, name)[-1]
    assert (ended["from"], ended["to"], ended["reason"]) == ("FORCED_OPEN", "HALF_OPEN",
                                                           "override ended")
    assert ended["at_ms"] == ends and ended["recorded_ms"] > ends
    row = _json(redis_url, "ls")["breakers"][0]
    assert (row["state"], row["breaker"]["override_ended_ms"]) == ("HALF_OPEN", None)
    assert row["breaker"]["since_ms"] == ended["recorded_ms"]   # probes count from then
    breaker.transition_to_disabled("short", "ops", for_=0.3)
    ends = _history(redis_client, name)[-1]["until_ms"]
    wait_until(lambda: view.server_now_ms(redis_client) > ends + 300, timeout=30,
               what="the override's end passes")
    assert breaker.metrics().state == "CLOSED"
    assert _json(redis_url, "ls")["breakers"][0]["breaker"]["since_ms"] == ends


def test_each_action_says_what_it_changed_and_records_only_changes(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = make(name, redis_url)
    breaker.call(lambda: None)

    def act(*args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        before = len(_history(redis_client, name))
        doc = _json(redis_url, *args, name, "--reason", " ".join(args))
        return doc, _history(redis_client, name)[before:]

    doc, new = act("open", "--for", "1h")
    assert (doc["change"], [e["kind"] for e in new]) == ("transition", [""])
    doc, new = act("open", "--for", "2h")
    assert (doc["change"], doc["changed"], [e["kind"] for e in new]) == (
        "extended", True, ["override"])
    text = run(redis_url, "open", name, "--for", "3h", "--reason", "longer").stdout
    assert "override extended to" in text and "nothing changed" not in text
    doc, new = act("open")                                   # no --for on a timed override
    assert (doc["change"], [(e["kind"], e["until_ms"]) for e in new]) == (
        "indefinite", [("override", None)])
    doc, new = act("open")                                   # the same again
    assert (doc["change"], doc["changed"], new) == (None, False, [])
    assert "nothing changed" in run(redis_url, "open", name).stdout
    doc, new = act("trip")                                   # an override holds it
    assert (doc["change"], new) == (None, [])
    act("close")
    fail(breaker, 4)
    assert breaker.state == "OPEN"
    doc, new = act("trip")                                   # OPEN: the wait restarts
    assert (doc["change"], [e["kind"] for e in new]) == ("restarted", ["restart"])
    act("close")
    make(name, redis_url).call(lambda: None)   # a fresh worker (`breaker` keeps its OPEN view)
    doc, new = act("reset")                                  # CLOSED with calls: audited
    assert (doc["change"], [e["kind"] for e in new]) == ("reset", ["reset"])
    assert new[0]["actor"] and new[0]["reason"] == "reset"
    doc, new = act("reset")                                  # nothing left to clear
    assert (doc["change"], new) == (None, [])
    doc, new = act("close", "--for", "1h")                   # hold it CLOSED for an hour
    assert (doc["change"], [e["kind"] for e in new]) == ("timed", ["override"])
    doc, new = act("close")                                  # and release it
    assert (doc["change"], [(e["kind"], e["until_ms"]) for e in new]) == (
        "released", [("override", None)])


def test_events_shows_every_kind_with_kind_filters(redis_url: str, name: str) -> None:
    breaker = make(name, redis_url)
    breaker.call(lambda: None)
    for args in (["open", "--for", "1h"], ["open", "--for", "2h"], ["open"], ["close"]):
        run(redis_url, *args, name)
    fail(breaker, 4)
    run(redis_url, "trip", name)
    run(redis_url, "close", name)
    make(name, redis_url).call(lambda: None)   # a fresh worker (`breaker` keeps its OPEN view)
    run(redis_url, "reset", name)
    lines = run(redis_url, "events", name, "--json").stdout.splitlines()
    kinds = [json.loads(line)["kind"] or "transition" for line in lines]
    assert kinds == ["transition", "override", "override", "transition", "transition",
                     "restart", "transition", "reset"]
    only = run(redis_url, "events", name, "--json", "--kind", "override", "--kind", "reset")
    assert [json.loads(x)["kind"] for x in only.stdout.splitlines()] == [
        "override", "override", "reset"]
    text = run(redis_url, "events", name, "--kind", "restart").stdout
    assert "[restart" in text and text.count("\n") == 1


def test_events_follow_shows_entries_that_are_not_published(redis_url: str,
                                                           name: str) -> None:
    breaker = make(name, redis_url)
    breaker.call(lambda: None)

    def act() -> None:  # the library's actions: a CliRunner captures stdout process-wide
        time.sleep(0.5)
        breaker.transition_to_forced_open("first", "ops", for_=3600)    # published
        breaker.transition_to_forced_open("longer", "ops", for_=7200)   # history only
        breaker.trip("ignored", "ops")                                   # changes nothing

    thread = threading.Thread(target=act)
    thread.start()
    result = run(redis_url, "events", name, "--follow", "--json", "-n", "0",
                 "--max-events", "2", "--timeout", "60")
    thread.join()
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["reason"], e["kind"]) for e in events] == [("first", ""),
                                                          ("longer", "override")]


def test_events_follow_reconnects_when_redis_goes_away(name: str) -> None:
    server = RedisServer().start()
    lines: list[str] = []
    errors: list[str] = []
    try:
        breaker = make(name, server.url)
        breaker.transition_to_forced_open("before", "ops")
        proc = subprocess.Popen(
            [sys.executable, "-m", "distbreaker", "--url", server.url, "events", name,
             "--follow", "--json", "--timeout", "120"], cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        threads = [threading.Thread(target=lambda s=s, o=o: o.extend(s), daemon=True)
                   for s, o in ((proc.stdout, lines), (proc.stderr, errors))]
        for thread in threads:
            thread.start()
        wait_until(lambda: any("before" in x for x in lines), timeout=60,
                   what="the history is printed (subscribed before it was read)")
        server.kill()
        wait_until(lambda: any("Redis unreachable" in x for x in errors), timeout=60,
                   what="the outage is reported")
        server.start()  # same port, empty
        again = make(name, server.url)
        wait_until(lambda: any("Redis answers again" in x for x in errors), timeout=60,
                   what="the reconnection")
        again.transition_to_forced_open("after", "ops")
        wait_until(lambda: any("after" in x for x in lines), timeout=60,
                   what="a transition after the outage is printed")
        assert proc.poll() is None                       # still following
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    reasons = [json.loads(x)["reason"] for x in lines]
    assert reasons == ["before", "after"]
