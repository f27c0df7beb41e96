"""Operator overrides that end by server time (issue 16; Resilience4j's
transitionToOpenStateFor / Until) and same-state moves recorded as what they are
(issue 15.3), against a real redis-server, with the sync and the asyncio breaker."""

from __future__ import annotations

import datetime
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from distbreaker import CircuitBreaker
from distbreaker.breaker.core import config_fingerprint
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.cli.app import cli
from distbreaker.errors import CallNotPermitted, ConfigDriftWarning
from tests.helpers.flavours import Flavour
from tests.helpers.records import read_record

FAST = {"minimum_number_of_calls": 2, "sliding_window_size": 2,
        "wait_duration_in_open_state": 60, "permitted_calls_in_half_open": 1}


@pytest.fixture
def make(name: str, redis_url: str, flavour: Flavour) -> Callable[..., CircuitBreaker]:
    def build(**options: Any) -> CircuitBreaker:
        return flavour.breaker(name, redis=redis_url, **{**FAST, **options})
    return build


def boom() -> None:
    raise ConnectionError("down")


def history(client: redis.Redis, breaker: Any) -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in client.xrange(breaker.keys.history)]


def server_ms(client: redis.Redis) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_forced_open_for_rejects_with_the_remaining_time_then_probes(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make()
    seen: list[Transition] = []
    breaker.add_listener(seen.append)
    assert breaker.transition_to_forced_open("gateway maintenance", "dana",
                                             for_=2.0) is State.FORCED_OPEN
    with pytest.raises(CallNotPermitted) as rejected:
        breaker.call(lambda: "ok")
    assert rejected.value.state is State.FORCED_OPEN
    assert 1.0 < rejected.value.retry_after <= 2.0  # the override's remaining time
    time.sleep(2.01)
    # the override ended: OPEN-for-duration semantics, so probes check the service
    assert breaker.state is State.HALF_OPEN
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.state is State.CLOSED
    entries = history(redis_client, breaker)
    start, end = entries[0], entries[1]
    assert (start["to"], start["reason"], start["actor"]) == ("FORCED_OPEN",
                                                             "gateway maintenance", "dana")
    assert (end["from"], end["to"], end["reason"]) == ("FORCED_OPEN", "HALF_OPEN",
                                                       "override ended")
    assert start["until_ms"] == end["until_ms"]
    assert int(end["at_ms"]) >= int(end["until_ms"])
    assert [(t.from_state, t.to_state) for t in seen] == [
        (State.CLOSED, State.FORCED_OPEN), (State.FORCED_OPEN, State.HALF_OPEN),
        (State.HALF_OPEN, State.CLOSED)]


def test_disabled_and_metrics_only_until_return_to_closed(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make()
    until = (server_ms(redis_client) + 300) / 1000
    breaker.transition_to_disabled("load test", until=until)
    assert breaker.call(lambda: "ok") == "ok"
    time.sleep(0.35)
    assert breaker.state is State.CLOSED
    # (2 s: a loaded machine still makes its calls within it)
    end = datetime.datetime.fromtimestamp(until + 2.0, datetime.timezone.utc)
    breaker.transition_to_metrics_only("watch only", until=end)
    for _ in range(3):  # recorded, never trips
        with pytest.raises(ConnectionError):
            breaker.call(boom)
    assert breaker.state is State.METRICS_ONLY
    time.sleep(2.05)
    assert breaker.state is State.CLOSED
    assert history(redis_client, breaker)[-1]["reason"] == "override ended"


def test_closed_for_holds_the_breaker_closed_then_its_state_machine_resumes(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make()
    breaker.transition_to_closed("deploy in progress", for_=0.3)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            breaker.call(boom)
    assert breaker.state is State.CLOSED  # held: 100 % failures do not trip it
    time.sleep(0.35)
    with pytest.raises(ConnectionError):
        breaker.call(boom)
    assert breaker.state is State.OPEN  # the window was kept: the next failure trips it
    kinds = [(e.get("kind", ""), e["to"], e["reason"]) for e in history(redis_client, breaker)]
    assert ("override", "CLOSED", "deploy in progress") in kinds
    assert ("override_end", "CLOSED", "override ended") in kinds


def test_trip_for_is_transition_to_open_state_for(
        make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(wait_duration_in_open_state=60)
    breaker.trip("upstream says so", for_=datetime.timedelta(seconds=2))
    with pytest.raises(CallNotPermitted) as rejected:
        breaker.call(lambda: "ok")
    assert rejected.value.retry_after <= 2.0  # the given wait, not the configured 60 s
    time.sleep(2.01)
    assert breaker.state is State.HALF_OPEN


def test_an_override_on_a_name_without_keys_lets_the_first_worker_store_its_config(
        name: str, redis_url: str, flavour: Flavour, redis_client: redis.Redis) -> None:
    operator = flavour.breaker(name, redis=redis_url)  # the default config
    operator.transition_to_forced_open("planned maintenance", for_=0.3)
    stored = read_record(redis_client, operator.keys)
    assert (stored["fp"], stored["cfg"]) == (0, "")    # unset: no fingerprint, no cfg
    worker = flavour.breaker(name, redis=redis_url, **FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigDriftWarning)
        with pytest.raises(CallNotPermitted):
            worker.call(lambda: "ok")
        assert worker.config_drift is None
    stored = read_record(redis_client, worker.keys)
    wire = worker.config.to_wire()
    assert (stored["fp"], stored["cfg"]) == (config_fingerprint(wire), wire)


def test_a_new_action_without_an_end_lifts_the_override(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make()
    breaker.transition_to_forced_open("for a while", for_=0.2)
    breaker.transition_to_forced_open("until further notice")
    time.sleep(0.25)
    assert breaker.state is State.FORCED_OPEN
    with pytest.raises(CallNotPermitted) as rejected:
        breaker.call(lambda: "ok")
    assert rejected.value.retry_after == breaker.config.revalidate_interval
    assert history(redis_client, breaker)[-1]["kind"] == "override"


def test_bad_ends_are_refused(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    with pytest.raises(ValueError, match="not both"):
        breaker.transition_to_forced_open(for_=1, until=time.time() + 5)
    with pytest.raises(ValueError, match="aware"):
        breaker.transition_to_forced_open(until=datetime.datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="past"):
        breaker.transition_to_forced_open(until=time.time() - 60)
    assert breaker.state is State.CLOSED


# -- issue 15.3: a same-state move is not a transition ---------------------------------
def test_trip_on_an_open_breaker_restarts_the_wait_without_a_transition(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make(wait_duration_in_open_state=0.3)
    seen: list[Transition] = []
    breaker.add_listener(seen.append)
    channel = redis_client.pubsub()
    channel.subscribe(breaker.keys.channel)
    assert channel.get_message(timeout=1)["type"] == "subscribe"
    breaker.trip("first")
    time.sleep(0.2)
    breaker.trip("again")  # Resilience4j: no event for a same-state transition
    time.sleep(0.2)        # 0.4 s after the first trip, 0.2 s after the restart
    assert breaker.state is State.OPEN
    time.sleep(0.15)
    assert breaker.state is State.HALF_OPEN
    messages = []
    while (message := channel.get_message(timeout=0.1)) is not None:
        messages.append(json.loads(message["data"]))
    channel.close()
    assert [(t.from_state, t.to_state) for t in seen] == [
        (State.CLOSED, State.OPEN), (State.OPEN, State.HALF_OPEN)]
    assert [(m["from"], m["to"]) for m in messages] == [("CLOSED", "OPEN"),
                                                        ("OPEN", "HALF_OPEN")]
    entries = history(redis_client, breaker)
    assert [(e["from"], e["to"], e.get("kind", "")) for e in entries] == [
        ("CLOSED", "OPEN", ""), ("OPEN", "OPEN", "restart"), ("OPEN", "HALF_OPEN", "")]


# -- the CLI ---------------------------------------------------------------------------
def test_cli_open_for_shows_the_remaining_time(name: str, redis_url: str) -> None:
    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--url", redis_url, *args])

    done = run("open", name, "--for", "30m", "--reason", "gateway maintenance", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["state"] == "FORCED_OPEN" and result["created"] is True
    assert result["until_ms"] is not None
    shown = run("show", name)
    assert "the override ends in 29m" in shown.output or "the override ends in 30m" \
        in shown.output, shown.output
    listed = run("ls")
    assert "held 29m" in listed.output or "held 30m" in listed.output, listed.output
    as_json = json.loads(run("show", name, "--json").output)["breaker"]
    assert 1790 < as_json["override_left_s"] <= 1800
    assert as_json["config"]["unset"] is True
    bad = run("open", name, "--for", "soon")
    assert bad.exit_code == 2 and "must be a duration" in bad.output
    back = run("close", name, "--until", "2000-01-01T00:00+00:00")
    assert back.exit_code == 2 and "in the past" in back.output


def test_reset_lifts_a_held_closed(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make()
    breaker.transition_to_closed("hold", for_=60)
    breaker.reset()
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(boom)
    assert breaker.state is State.OPEN
