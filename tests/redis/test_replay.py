"""`distbreaker replay` on the real breaker script: the seed scenario (a dependency that
fails, then recovers), false trips, sweeps, the plot and JSON outputs, and the clock
override that exists only in the replay's own script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from distbreaker import BreakerConfig
from distbreaker._runtime.scripts import library, load_script
from distbreaker.recording.replay import Replayer, replay_source
from distbreaker.recording.timeline import Sample, seed, write_jsonl
from tests.helpers.cli import run

T0 = 1_700_000_000_000
TIGHT = {"sliding_window_size": 20, "minimum_number_of_calls": 10,
         "wait_duration_in_open_state": 10.0, "permitted_calls_in_half_open": 3}


@pytest.fixture(scope="module")
def seed_samples() -> list[Sample]:
    # 4 minutes at 10 calls/s: 2 % failures, 90 % from 60 s to 150 s, then 2 % again
    return seed(seconds=240, calls_per_second=10, fail_from=60, fail_until=150)


@pytest.fixture
def replayer(redis_client: redis.Redis) -> Replayer:
    return Replayer(redis_client)


def test_the_seed_scenario_is_detected_at_once_and_recovers(
        replayer: Replayer, seed_samples: list[Sample]) -> None:
    r = replayer.run(seed_samples, BreakerConfig(**TIGHT), target=20)
    assert r.calls == len(seed_samples)
    assert (r.incidents, r.missed_incidents, r.false_trips) == (1, 0, 0)
    assert r.trips >= 1 and r.detect_s and r.detect_s[0] < 5
    # open most of the 90 s outage, closed again after it: probes found it healed
    assert 60 <= r.time_open_s <= 110
    assert r.transitions[-1][2] == "CLOSED" and r.transitions[-1][0] > T0 + 150_000
    assert r.calls_rejected > 0 and r.failures_avoided > r.failures_let_through
    # the transitions happened on the recorded time, not the server's
    assert all(T0 < at < T0 + 240_000 for at, _, _ in r.transitions)


def test_a_time_window_replays_on_the_recorded_seconds(replayer: Replayer,
                                                       seed_samples: list[Sample]) -> None:
    config = BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=10,
                           minimum_number_of_calls=20, failure_rate_threshold=30,
                           wait_duration_in_open_state=20.0)
    r = replayer.run(seed_samples, config, target=20)
    assert (r.incidents, r.missed_incidents, r.false_trips) == (1, 0, 0)
    assert r.transitions[0][1:] == ("CLOSED", "OPEN")
    assert T0 + 60_000 <= r.transitions[0][0] < T0 + 70_000


def test_a_threshold_above_the_outage_misses_it(replayer: Replayer) -> None:
    # 60 % failures from 60 s to 150 s: a 50-call window never reaches 90 %
    samples = seed(seconds=240, calls_per_second=10, fail_from=60, fail_until=150,
                   failure_rate=0.6)
    r = replayer.run(samples, BreakerConfig(sliding_window_size=50, minimum_number_of_calls=50,
                                            failure_rate_threshold=90), target=20)
    assert (r.trips, r.missed_incidents, r.calls_rejected, r.time_open_s) == (0, 1, 0, 0)
    assert r.failures_let_through == r.failures


def test_a_blip_under_the_target_is_a_false_trip(replayer: Replayer) -> None:
    # 10 calls/s; one bad second (6 of 10 fail) in a 2 % background: 10 % over 5 s
    samples = [Sample(T0 + s * 1000 + i * 100, ok=int(not failed), failed=int(failed),
                      duration_ms=5)
               for s in range(60) for i in range(10)
               for failed in [(s == 30 and i < 6) or (s % 10 == 3 and i == 0)]]
    jumpy = BreakerConfig(sliding_window_size=10, minimum_number_of_calls=10,
                          failure_rate_threshold=50, wait_duration_in_open_state=5.0)
    r = replayer.run(samples, jumpy, target=20)
    assert (r.trips, r.false_trips, r.incidents) == (1, 1, 0)
    calm = replayer.run(samples, jumpy.replace(sliding_window_size=50,
                                               minimum_number_of_calls=50), target=20)
    assert (calm.trips, calm.false_trips) == (0, 0)


def test_sampled_timelines_replay_as_the_calls_they_stand_for(
        replayer: Replayer, seed_samples: list[Sample]) -> None:
    tenth = [Sample(s.t_ms, s.ok, s.failed, s.slow, s.duration_ms, rate=0.1)
             for s in seed_samples[::10]]
    # a sample a second: the judge needs wider buckets to tell noise from an outage
    r = replayer.run(tenth, BreakerConfig(**TIGHT), target=20, truth_window_ms=30_000)
    assert r.calls == len(seed_samples)
    assert (r.incidents, r.missed_incidents) == (1, 0)


def test_the_clock_override_is_only_in_the_replays_script() -> None:
    override = "local at = tonumber(ARGV[1])"
    assert override in replay_source()
    assert override not in library().code
    assert override not in load_script("breaker").source
    php = Path(__file__).resolve().parents[2] / "clients" / "php" / "lua" / "breaker.lua"
    assert override not in php.read_text()


def write_timeline(path: Path, samples: list[Sample]) -> str:
    path.write_text("".join(write_jsonl(samples)))
    return str(path)


def test_the_cli_compares_configs_and_sweeps(tmp_path: Path, redis_url: str,
                                             seed_samples: list[Sample]) -> None:
    timeline = write_timeline(tmp_path / "outcomes.jsonl", seed_samples)
    (tmp_path / "tight.yaml").write_text(
        "sliding_window_size: 20\nminimum_number_of_calls: 10\n"
        "wait_duration_in_open_state: 10s\npermitted_calls_in_half_open: 3\n")
    (tmp_path / "lax.yaml").write_text(
        "breakers:\n  instances:\n    seed: {failure_rate_threshold: 100, "
        "sliding_window_size: 100}\n")
    result = run(redis_url, "replay", timeline, "--config", str(tmp_path / "tight.yaml"),
                 "--config", str(tmp_path / "lax.yaml"), "--plot")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("config"))
    assert "false trips" in lines[header] and "detect" in lines[header]
    tight, lax = lines[header + 1].split(), lines[header + 2].split()
    assert tight[0] == "tight" and int(tight[1]) >= 1 and tight[-1] == "0/1"
    assert lax[0] == "lax" and lax[1] == "0" and lax[-1] == "1/1"
    assert any(line.startswith("tight") and "#" in line for line in lines[header + 3:])
    swept = run(redis_url, "replay", timeline, "--config", str(tmp_path / "tight.yaml"),
                "--sweep", "failure_rate_threshold=30..90:30",
                "--target-failure-rate", "20", "--json")
    assert swept.exit_code == 0, swept.output
    results = json.loads(swept.output)["results"]
    assert [r["changes"] for r in results] == [{"failure_rate_threshold": t}
                                               for t in (30, 60, 90)]
    assert all(r["missed_incidents"] == 0 for r in results)
    detect = [r["mean_detect_s"] for r in results]
    assert detect == sorted(detect)   # a higher threshold takes at least as long


def test_the_cli_writes_a_png_and_names_bad_input(tmp_path: Path, redis_url: str,
                                                  seed_samples: list[Sample]) -> None:
    timeline = write_timeline(tmp_path / "t.jsonl", seed_samples[:600])
    png = tmp_path / "replay.png"
    result = run(redis_url, "replay", timeline, "--plot", str(png))
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "bad.jsonl").write_text('{"t_ms": 1, "ok": 1}\n{"ok": 1}\n')
    bad = run(redis_url, "replay", str(tmp_path / "bad.jsonl"))
    assert bad.exit_code == 1 and "line 2: t_ms is missing" in bad.output
    sweep = run(redis_url, "replay", timeline, "--sweep", "no_such_field=1..2:1")
    assert sweep.exit_code == 2 and "no field 'no_such_field'" in sweep.output
