"""Shadow configs without Redis (distbreaker/breaker/shadow.py, BreakerConfig.shadow): the
candidate configs, the hello that declares them, the script arguments, and the would-be
accounting as the shadow hash stores it, decoded and told in words."""

from __future__ import annotations

import pytest

from distbreaker import BreakerConfig
from distbreaker.breaker import shadow
from distbreaker.breaker.core import BreakerCodec
from distbreaker.registry.config import RegistryConfigError, RegistrySpec

MINUTE = 60_000
T0 = 1_796_000_000_000  # server ms


def test_a_mapping_is_the_fields_that_differ_from_the_breakers_config() -> None:
    config = BreakerConfig(failure_rate_threshold=40, sliding_window_size=50,
                           shadow={"tight": {"failure_rate_threshold": 20,
                                             "wait_duration_in_open_state": "30s"},
                                   "whole": BreakerConfig(minimum_number_of_calls=7)})
    (name, tight), (other, whole) = config.shadow
    assert (name, other) == ("tight", "whole")
    assert tight.failure_rate_threshold == 20 and tight.sliding_window_size == 50
    assert tight.wait_duration_in_open_state == 30.0 and tight.shadow == ()
    assert whole.minimum_number_of_calls == 7 and whole.sliding_window_size == 100
    assert config.to_wire() == BreakerConfig(failure_rate_threshold=40,
                                             sliding_window_size=50).to_wire()
    assert shadow.candidate(config, {"minimum_number_of_calls": 5}).minimum_number_of_calls == 5


@pytest.mark.parametrize(("given", "problem"), [
    ({"a": {}, "b": {}, "c": {}, "d": {}}, "at most 3"),
    ({"bad name": {}}, "shadow names"),
    ({"a": {"no_such_field": 1}}, "unknown setting 'no_such_field'"),
    ({"a": {"failure_rate_threshold": 200}}, "shadow 'a': failure_rate_threshold"),
    ({"a": 5}, "must be a mapping"),
])
def test_bad_shadows_are_refused_naming_the_problem(given: dict[str, object],
                                                    problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        BreakerConfig(shadow=given)


def test_the_hello_declares_the_configs_shadows_and_only_the_hello() -> None:
    config = BreakerConfig(shadow={"t": {"failure_rate_threshold": 20}})
    codec = BreakerCodec("svc", config)
    hello = codec._call("record", "", 1, 0, 0, 5).args[1]
    assert hello.endswith("#t=" + config.shadow[0][1].to_wire())
    assert codec._call("record", "", 1, 0, 0, 5).args[1] == codec.fingerprint  # not again
    assert shadow.hello_suffix(()) == ""


def test_the_script_arguments() -> None:
    candidate = BreakerConfig(failure_rate_threshold=20)
    assert shadow.set_args("t", candidate, 3600, "dana", "why") == (
        "set", "t", candidate.to_wire(), "3600000", "dana", "why")
    assert shadow.set_args("t", candidate, None, "", "")[3] == ""
    assert shadow.clear_args(None, "a", "r") == ("clear", "*", "", "", "a", "r")
    with pytest.raises(ValueError):
        shadow.clear_args("no good", "a", "r")


def _i8(*values: int) -> bytes:
    return b"".join(v.to_bytes(8, "big", signed=True) for v in values)


def stored(slot: int, name: str, hot: dict[str, int], cold: dict[str, int], *,
           until: int = 0, source: str = "operator", actor: str = "dana",
           reason: str = "tune | try") -> dict[bytes, bytes]:
    wire = BreakerConfig(failure_rate_threshold=20).to_wire()
    spec = f"{until}|{name}|{wire}|{T0}|{source}|{actor}|{reason}"
    return {f"c{slot}".encode(): spec.encode(),
            f"h{slot}".encode(): _i8(*(hot.get(f, 0) for f in shadow.HOT_FIELDS)),
            f"s{slot}".encode(): _i8(*(cold.get(f, 0) for f in shadow.COLD_FIELDS))}


def test_an_open_episode_is_told_with_its_would_be_figures() -> None:
    raw = stored(2, "tight", {"code": 1, "calls": 10, "failures": 2, "seen": 1300,
                              "seen_failures": 40},
                 {"since": T0, "open_until": T0 + MINUTE, "trips": 1, "rejected": 1240,
                  "avoided": 37, "ep_at": T0, "ep_rejected": 1240, "ep_avoided": 37})
    (view,) = shadow.decode_shadows(raw, T0 + 40_000)
    assert (view.name, view.state, view.failure_rate) == ("tight", "OPEN", 20.0)
    assert (view.source, view.actor, view.reason) == ("operator", "dana", "tune | try")
    assert view.config is not None and view.config.failure_rate_threshold == 20
    assert view.time_open_ms == 40_000
    assert view.summary(lambda ms: "12:03:05") == (
        "would be open since 12:03:05 (40 s so far); 1,240 calls would have been rejected, "
        "37 failures avoided")
    # its wait over, the next record finds it HALF_OPEN
    (later,) = shadow.decode_shadows(raw, T0 + MINUTE)
    assert later.state == "HALF_OPEN" and later.stored_state == "OPEN"
    assert later.as_dict()["summary"].startswith("would be open since ")


def test_an_ended_episode_and_a_shadow_that_never_opened() -> None:
    raw = {**stored(1, "calm", {"seen": 500, "seen_failures": 3}, {}),
           **stored(3, "tight", {"code": 0, "seen": 5000},
                    {"trips": 2, "rejected": 2000, "avoided": 60, "open_ms": 70_000,
                     "ep_at": T0, "ep_rejected": 1240, "ep_avoided": 37, "ep_ms": 40_000})}
    calm, tight = shadow.decode_shadows(raw, T0 + 100_000)
    assert calm.summary() == "would not have opened (500 calls seen, 3 failed)"
    assert tight.summary(lambda ms: "12:03:05") == (
        "would have opened at 12:03:05 for 40 s; 1,240 calls would have been rejected, 37 "
        "failures avoided (in all: 2 trips, 2,000 rejected, 60 avoided)")
    assert tight.time_open_ms == 70_000 and tight.failure_rate == -1.0


def test_history_entries_in_words() -> None:
    moved = shadow.decode_shadow_event(b"1-0", {
        b"shadow": b"t", b"from": b"HALF_OPEN", b"to": b"CLOSED", b"reason": b"probes",
        b"at_ms": str(T0).encode(), b"failure_rate": b"0", b"slow_rate": b"0",
        b"episode_at_ms": str(T0 - 40_000).encode(), b"episode_ms": b"40000",
        b"rejected": b"1240", b"avoided": b"37"}, "svc")
    assert shadow.describe_event(moved, lambda ms: "12:03:05") == (
        "shadow t: would have gone HALF_OPEN -> CLOSED (probes); open 40 s from 12:03:05, "
        "1,240 calls would have been rejected, 37 failures avoided")
    ended = shadow.decode_shadow_event(b"2-0", {
        b"shadow": b"t", b"kind": b"expired", b"reason": b"its time ended", b"seen": b"9",
        b"trips": b"1", b"rejected_total": b"4", b"avoided_total": b"2"}, "svc")
    assert shadow.describe_event(ended) == (
        "shadow t expired (its time ended): 9 calls seen, 1 trips, 4 would have been "
        "rejected, 2 failures avoided")


def test_the_registry_takes_shadow_settings_by_any_of_their_names() -> None:
    spec = RegistrySpec({"breakers": {"instances": {"pay": {
        "failure_rate_threshold": 40,
        "shadow": {"t": {"failureRateThreshold": "25", "waitDurationInOpenState": "5s"}}}}}})
    (name, candidate), = spec.resolve("breaker", "pay").config.shadow
    assert name == "t" and candidate.failure_rate_threshold == 25.0
    assert candidate.wait_duration_in_open_state == 5.0
    with pytest.raises(RegistryConfigError, match="unknown breaker setting"):
        RegistrySpec({"breakers": {"instances": {"pay": {"shadow": {"t": {"nope": 1}}}}}})
    env = RegistrySpec({"breakers": {"instances": {"pay": {}}}}, environ={
        "DISTBREAKER_BREAKER_PAY_SHADOW": '{"t": {"failure_rate_threshold": 30}}'})
    assert env.resolve("breaker", "pay").config.shadow[0][1].failure_rate_threshold == 30
