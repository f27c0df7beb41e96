"""Outcome recording and replay, the pure parts: sampling, the timeline's JSONL, the
order of a replay's calls, the judge of trips and the accounting (false trips, time
open, time to detect), sweeps."""

from __future__ import annotations

import json

import pytest

from distbreaker import BreakerConfig
from distbreaker.breaker.sampling import Sampler, parse_rate
from distbreaker.recording.replay_core import (
    ACQUIRE,
    RECORD,
    Tally,
    Truth,
    parse_sweep,
    plan,
    sweep_changes,
    weights,
)
from distbreaker.recording.timeline import Sample, TimelineError, read_jsonl, seed, write_jsonl

T0 = 1_700_000_000_000


def samples_per_second(rates: list[float], per_second: int = 10) -> list[Sample]:
    """`per_second` calls in each second, the first round(rate * n) of them failing."""
    out = []
    for second, rate in enumerate(rates):
        failing = round(rate * per_second)
        for i in range(per_second):
            failed = i < failing
            out.append(Sample(T0 + second * 1000 + i * (1000 // per_second),
                              ok=0 if failed else 1, failed=int(failed), duration_ms=10))
    return out


# -- recording is off by default; rates ----------------------------------------------

def test_recording_is_off_by_default() -> None:
    config = BreakerConfig()
    assert config.record_sample_rate == 0.0
    assert not Sampler(config.record_sample_rate, 10, 1000).active
    assert Sampler(0.0, 10, 1000).spec(lambda: 1 / 0) is None  # no worker id built


@pytest.mark.parametrize("text,rate", [("10%", 0.1), (0.25, 0.25), ("1", 1.0), ("0", 0.0),
                                       ("100%", 1.0)])
def test_sample_rates_are_fractions_or_percentages(text: object, rate: float) -> None:
    assert parse_rate(text) == pytest.approx(rate)
    assert BreakerConfig(record_sample_rate=text).record_sample_rate == pytest.approx(rate)


@pytest.mark.parametrize("bad", ["110%", -0.1, 1.5, "lots", True])
def test_bad_sample_rates_name_the_field(bad: object) -> None:
    with pytest.raises(ValueError, match="record_sample_rate"):
        BreakerConfig(record_sample_rate=bad)


def test_caps_are_validated() -> None:
    with pytest.raises(ValueError, match="record_max_samples"):
        BreakerConfig(record_max_samples=0)
    with pytest.raises(ValueError, match="record_ttl"):
        BreakerConfig(record_ttl=0.5)
    assert BreakerConfig(record_ttl="2h").record_ttl == 7200.0


def test_the_sampler_draws_at_its_rate_and_names_its_caps() -> None:
    draws = iter([0.05, 0.5, 0.09, 0.1])
    sampler = Sampler(0.1, 500, 60_000, draw=lambda: next(draws))
    specs = [sampler.spec(lambda: "host:1") for _ in range(4)]
    assert specs == ["500;60000;100000;host:1", None, "500;60000;100000;host:1", None]
    # every call at 100 %, without a draw
    assert Sampler(1.0, 5, 1000, draw=lambda: 1 / 0).spec(lambda: "w") == "5;1000;1000000;w"


def test_the_operators_switch_wins_until_it_ends_and_stop_is_rate_zero() -> None:
    sampler = Sampler(0.0, 500, 60_000, draw=lambda: 0.0)
    sampler.learn("250000;10060000;20;30000", now_ms=10_000_000)   # 25 %, 60 s left
    assert sampler.spec(lambda: "w") == "20;30000;250000;w"
    sampler.learn("0;10060000;20;30000", now_ms=10_000_000)        # `record stop`
    assert sampler.spec(lambda: "w") is None and not sampler.active
    sampler.learn("250000;10000000;;", now_ms=10_000_000)          # already ended
    assert sampler.spec(lambda: "w") is None
    base = Sampler(1.0, 7, 9000, draw=lambda: 0.0)
    base.learn("garbage", now_ms=0)
    assert base.spec(lambda: "w") == "7;9000;1000000;w"


# -- the timeline ----------------------------------------------------------------------

def test_the_jsonl_shape_round_trips_and_sorts_by_time() -> None:
    a = Sample(T0 + 5, ok=1, duration_ms=3, worker="w:1", rate=0.5, state="CLOSED", name="n")
    b = Sample(T0, failed=2, slow=1, duration_ms=80, worker="w:2", name="n")
    lines = list(write_jsonl([a, b]))
    assert json.loads(lines[0]) == {"name": "n", "t_ms": T0 + 5, "ok": 1, "failed": 0,
                                    "slow": 0, "duration_ms": 3, "worker": "w:1",
                                    "rate": 0.5, "state": "CLOSED"}
    assert read_jsonl(["", *lines]) == [b, a]
    # only t_ms and an outcome are required; other keys are ignored
    assert read_jsonl(['{"t_ms": 5, "failed": 1, "extra": true}']) == [Sample(5, failed=1)]


@pytest.mark.parametrize("line,problem", [
    ("not json", "not JSON"), ('{"ok": 1}', "t_ms"), ('{"t_ms": 1}', "ok or failed"),
    ('{"t_ms": 1, "ok": -1}', "ok must be"), ('{"t_ms": 1, "ok": 1, "rate": 0}', "rate"),
    ('{"t_ms": 1, "ok": 1, "slow": 2}', "slow"), ("[1]", "object")])
def test_bad_lines_are_named(line: str, problem: str) -> None:
    with pytest.raises(TimelineError, match=f"line 2: .*{problem}"):
        read_jsonl(['{"t_ms": 0, "ok": 1}', line])


def test_the_seed_scenario_fails_then_recovers() -> None:
    samples = seed(seconds=30, calls_per_second=10, fail_from=10, fail_until=20)
    truth = Truth(samples, weights(samples), 5000, 1)
    assert truth.incidents(50) == [(samples[0].t_ms + 10_000, samples[0].t_ms + 20_000)]
    assert seed(seconds=3) == seed(seconds=3)  # deterministic


# -- weights and the order of calls ------------------------------------------------------

def test_a_sampled_timeline_replays_as_many_calls_as_were_made() -> None:
    samples = [Sample(T0 + i, ok=1, rate=0.3) for i in range(10)]
    w = weights(samples)
    assert sum(w) == 33 and set(w) <= {3, 4}
    assert weights(samples, scale=False) == [1] * 10


def test_each_call_asks_at_its_start_and_records_at_its_end() -> None:
    samples = [Sample(T0 + 100, ok=1, duration_ms=100), Sample(T0 + 50, failed=1,
                                                               duration_ms=10)]
    steps = [(s.t_ms - T0, s.kind, s.index) for s in plan(samples)]
    assert steps == [(0, ACQUIRE, 0), (40, ACQUIRE, 1), (50, RECORD, 1), (100, RECORD, 0)]
    # a batch of 4 calls lasting 400 ms in total: each started 100 ms before the end
    assert plan([Sample(T0 + 500, ok=4, duration_ms=400)])[0].t_ms == T0 + 400


# -- the judge: truth, false trips, detection, time open ----------------------------------

def test_truth_is_the_recorded_failure_rate_per_bucket() -> None:
    samples = samples_per_second([0.0, 0.0, 0.5, 1.0, 0.0, 0.1])
    truth = Truth(samples, weights(samples), bucket_ms=2000, min_calls=1)
    assert truth.rates == [0.0, 75.0, 5.0]
    assert truth.rate_at(T0 + 2500) == 75.0
    assert truth.incidents(50) == [(T0 + 2000, T0 + 4000)]
    assert truth.incidents(80) == []


def test_a_quiet_bucket_keeps_its_predecessors_verdict() -> None:
    samples = [*samples_per_second([1.0]), Sample(T0 + 5500, ok=1)]
    truth = Truth(samples, weights(samples), 1000, min_calls=5)
    assert truth.rates == [100.0, 100.0, 100.0, 100.0, 100.0, 100.0]


def tally_of(transitions: list[tuple[int, str, str]]) -> Tally:
    tally = Tally("t", {}, T0)
    for at, frm, to in transitions:
        tally.transition(T0 + at, frm, to)
    return tally


def test_a_trip_under_the_target_is_false_one_during_an_incident_detects_it() -> None:
    # seconds 0-9 healthy (5 % failures), 10-19 failing (80 %), 20-29 healthy
    samples = samples_per_second([0.05] * 10 + [0.8] * 10 + [0.05] * 10, per_second=20)
    truth = Truth(samples, weights(samples), 1000, 1)
    tally = tally_of([(4_000, "CLOSED", "OPEN"), (5_000, "OPEN", "HALF_OPEN"),
                      (5_100, "HALF_OPEN", "CLOSED"),              # a false trip
                      (12_500, "CLOSED", "OPEN"), (17_000, "OPEN", "HALF_OPEN"),
                      (17_200, "HALF_OPEN", "OPEN"),               # a reopen, not a trip
                      (22_000, "OPEN", "HALF_OPEN"), (22_300, "HALF_OPEN", "CLOSED")])
    r = tally.result(T0 + 29_950, truth, target=50)
    assert (r.trips, r.reopens, r.false_trips) == (2, 1, 1)
    assert (r.incidents, r.missed_incidents, r.detect_s) == (1, 0, [2.5])
    assert r.time_open_s == pytest.approx(1.1 + 9.8)


def test_an_incident_without_a_trip_is_missed_and_open_time_runs_to_the_end() -> None:
    samples = samples_per_second([0.0] * 5 + [1.0] * 5 + [0.0] * 5 + [1.0] * 5)
    truth = Truth(samples, weights(samples), 1000, 1)
    tally = tally_of([(17_000, "CLOSED", "OPEN")])
    r = tally.result(T0 + 20_000, truth, target=50)
    assert (r.incidents, r.missed_incidents, r.false_trips) == (2, 1, 0)
    assert r.detect_s == [2.0] and r.mean_detect_s == 2.0
    assert r.time_open_s == pytest.approx(3.0)


def test_rejections_and_failures_let_through_are_weighted() -> None:
    tally = Tally("t", {}, T0)
    tally.permitted(Sample(T0, ok=1, failed=2), weight=3)
    tally.rejected(Sample(T0, failed=1), weight=10)
    r = tally.result(T0, Truth([], [], 1000), 50)
    assert (r.calls, r.failures_let_through, r.calls_rejected, r.failures_avoided) == \
        (19, 6, 10, 10)
    assert json.loads(json.dumps(r.to_json()))["calls"] == 19


# -- sweeps ---------------------------------------------------------------------------------

def test_sweeps_expand_ranges_and_lists() -> None:
    assert parse_sweep("failure_rate_threshold=30..70:10") == \
        ("failure_rate_threshold", [30, 40, 50, 60, 70])
    assert parse_sweep("failure-rate-threshold=0.5..1.5:0.5") == \
        ("failure_rate_threshold", [0.5, 1.0, 1.5])
    assert parse_sweep("wait_duration_in_open_state=10,30s") == \
        ("wait_duration_in_open_state", [10, "30s"])
    assert sweep_changes([("a", [1, 2]), ("b", [3, 4])]) == [
        {"a": 1, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": 3}, {"a": 2, "b": 4}]


@pytest.mark.parametrize("bad", ["x", "x=", "=1..2", "x=5..1:1", "x=1..5:0", "x=a..b",
                                 "x=0..5000:1"])
def test_bad_sweeps_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="--sweep"):
        parse_sweep(bad)


def test_a_trip_just_before_a_failing_bucket_detects_it() -> None:
    # the failure starts at 2.8 s: bucket 2 (2.0-3.9 s) stays under the target, bucket 3
    # does not; a fast breaker tripping at 2.9 s detected it (the resolution is a bucket)
    samples = [Sample(T0 + ms, ok=int(ms < 2800 or ms >= 6000),
                      failed=int(2800 <= ms < 6000)) for ms in range(0, 8000, 100)]
    truth = Truth(samples, weights(samples), 1000, 1)
    assert truth.rate_at(T0 + 2900) == 20.0 and truth.incidents(50)[0][0] == T0 + 3000
    r = tally_of([(2_900, "CLOSED", "OPEN")]).result(T0 + 8000, truth, target=50)
    assert (r.false_trips, r.missed_incidents, r.detect_s) == (0, 0, [0.0])


def test_an_incident_that_finds_the_breaker_open_is_not_missed() -> None:
    samples = samples_per_second([0.0] * 5 + [1.0] * 5)
    truth = Truth(samples, weights(samples), 1000, 1)
    r = tally_of([(1_000, "CLOSED", "OPEN"), (3_000, "OPEN", "HALF_OPEN"),
                  (3_100, "HALF_OPEN", "OPEN")]).result(T0 + 10_000, truth, target=50)
    assert (r.trips, r.false_trips, r.missed_incidents, r.detect_s) == (1, 1, 0, [0.0])


def test_the_registry_takes_recording_settings_from_files_and_the_environment() -> None:
    from distbreaker.registry.config import RegistrySpec

    data = {"breakers": {"instances": {"payments": {"record_sample_rate": "5%",
                                                    "record_ttl": "2h"}}}}
    config = RegistrySpec(data, environ={}).resolve("breaker", "payments").config
    assert (config.record_sample_rate, config.record_ttl) == (0.05, 7200.0)
    environ = {"DISTBREAKER_BREAKER_PAYMENTS_RECORD_SAMPLE_RATE": "0.25",
               "DISTBREAKER_BREAKER_PAYMENTS_RECORD_MAX_SAMPLES": "500"}
    config = RegistrySpec(data, environ=environ).resolve("breaker", "payments").config
    assert (config.record_sample_rate, config.record_max_samples) == (0.25, 500)
