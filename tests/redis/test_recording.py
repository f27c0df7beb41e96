"""Outcome recording against the real redis-server: off by default, sampled outcomes in a
capped stream with a TTL (the same script call as the record), the operator's run-time
switch learned at a hello, batched flushes, the JSONL export."""

from __future__ import annotations

import asyncio
import json

import redis

from distbreaker import CircuitBreaker
from distbreaker.aio import CircuitBreaker as AsyncCircuitBreaker
from distbreaker.recording import control
from tests.helpers.cli import FAST, outcomes, run
from tests.helpers.redis_stats import round_trips


def test_recording_is_off_by_default(redis_url: str, redis_client: redis.Redis,
                                     name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, **FAST)
    outcomes(breaker, failed=3, ok=5)
    assert redis_client.exists(control.stream_key(name)) == 0
    assert control.status(redis_client, name).samples == 0


def test_sampled_outcomes_land_in_a_capped_stream_with_a_ttl(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, record_sample_rate="100%",
                             record_max_samples=20, record_ttl=600, **FAST)
    breaker.call(lambda: None)  # the first call (a hello) goes first
    redis_client.config_resetstat()
    for _ in range(300):
        breaker.call(lambda: None)
    assert round_trips(redis_client) == 300  # recording rides on the record: no trip more
    key = control.stream_key(name)
    # MAXLEN ~: Redis trims whole nodes (100 entries by default), never below the cap
    assert 20 <= redis_client.xlen(key) <= 20 + 100
    assert 0 < redis_client.pttl(key) <= 600_000
    last = list(control.export(redis_client, name))[-1]
    assert (last.ok, last.failed, last.rate, last.state, last.name) == (1, 0, 1.0, "CLOSED",
                                                                        name)
    assert last.worker and last.t_ms > 0


def test_failures_and_transitions_are_sampled_on_the_general_path(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, record_sample_rate=1.0, **FAST)
    outcomes(breaker, failed=6, ok=2)   # trips after 4 calls at 50 %; then rejections
    samples = list(control.export(redis_client, name))
    assert [(s.ok, s.failed) for s in samples] == [(1, 0), (1, 0), (0, 1), (0, 1)]
    assert samples[-1].state == "OPEN"  # the call that tripped it
    assert [s.t_ms for s in samples] == sorted(s.t_ms for s in samples)


def test_the_operators_switch_reaches_workers_at_their_hello_and_stops(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    until = control.start(redis_client, name, 1.0, 3600, max_samples=50, ttl_s=120,
                          actor="ops@test")
    status = control.status(redis_client, name)
    assert (status.switch_rate, status.switch_until_ms, status.switch_actor) == \
        (1.0, until, "ops@test")
    assert 0 < redis_client.pttl(control.switch_key(name)) <= 3_600_000
    worker = CircuitBreaker(name, redis=redis_url, **FAST)   # its first call says hello
    for _ in range(5):
        worker.call(lambda: None)
    assert redis_client.xlen(control.stream_key(name)) == 5
    assert 0 < redis_client.pttl(control.stream_key(name)) <= 120_000
    assert control.stop(redis_client, name) is True
    assert control.status(redis_client, name).switch_rate is None
    later = CircuitBreaker(name, redis=redis_url, **FAST)    # a hello after the stop
    for _ in range(5):
        later.call(lambda: None)
    assert redis_client.xlen(control.stream_key(name)) == 5
    assert control.stop(redis_client, name) is False


def test_a_running_worker_learns_the_switch_at_its_next_repeated_hello(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    """A worker already running (its first hello said, its repeated hellos on the hot
    path) learns `record start` at its next hello and `record stop` at the one after."""
    worker = CircuitBreaker(name, redis=redis_url, **FAST)
    worker.call(lambda: None)                        # the first hello: nothing to record
    control.start(redis_client, name, 1.0, 3600, max_samples=50, ttl_s=120)
    worker.call(lambda: None)                        # no hello due: not learned yet
    assert redis_client.xlen(control.stream_key(name)) == 0
    worker._codec._next_hello = 0.0                  # the next hello is due (every 20 s)
    for _ in range(3):
        worker.call(lambda: None)
    assert redis_client.xlen(control.stream_key(name)) >= 2
    worker.close()


def test_a_batched_flush_is_recorded_whole(redis_url: str, redis_client: redis.Redis,
                                           name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, record_mode="batched", max_batch=10,
                             flush_interval=30, record_sample_rate=1.0, **FAST)
    for _ in range(10):
        breaker.call(lambda: None)
    breaker.close()
    samples = list(control.export(redis_client, name))
    assert sum(s.ok for s in samples) == 10 and max(s.ok for s in samples) > 1


def test_the_asyncio_breaker_records_too(redis_url: str, redis_client: redis.Redis,
                                         name: str) -> None:
    async def main() -> None:
        breaker = AsyncCircuitBreaker(name, redis=redis_url, record_sample_rate=1.0, **FAST)

        async def ok() -> None:
            return None

        for _ in range(3):
            await breaker.call(ok)
        await breaker.aclose()

    asyncio.run(main())
    assert redis_client.xlen(control.stream_key(name)) == 3


def test_the_cli_starts_exports_and_stops(redis_url: str, redis_client: redis.Redis,
                                          name: str) -> None:
    result = run(redis_url, "record", "start", name, "--rate", "100%", "--for", "10m",
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rate"] == 1.0
    human = run(redis_url, "record", "start", name, "--rate", "100%", "--for", "10m")
    assert "recording 100.00% of outcomes" in human.output
    assert f"no breaker {name!r}" in human.output   # a typo shows (on stderr)
    empty = run(redis_url, "record", "export", name)
    assert empty.exit_code == 1 and "no recorded samples" in empty.output
    breaker = CircuitBreaker(name, redis=redis_url, **FAST)
    outcomes(breaker, failed=1, ok=2)
    status = run(redis_url, "record", "status", name)
    assert "switch on at 100.00%" in status.output and "3 samples" in status.output
    exported = run(redis_url, "record", "export", name)
    assert exported.exit_code == 0, exported.output
    lines = [json.loads(line) for line in exported.output.splitlines()]
    assert [(x["ok"], x["failed"]) for x in lines] == [(1, 0), (1, 0), (0, 1)]
    assert set(lines[0]) == {"name", "t_ms", "ok", "failed", "slow", "duration_ms",
                             "worker", "rate", "state"}
    stopped = run(redis_url, "record", "stop", name)
    assert "recording switch off" in stopped.output
    bad = run(redis_url, "record", "start", name, "--rate", "200%")
    assert bad.exit_code == 2 and "--rate" in bad.output


def test_a_policys_merged_call_records_the_sample(redis_url: str, redis_client: redis.Redis,
                                                  name: str) -> None:
    from distbreaker import Policy

    policy = Policy(name, redis=redis_url, breaker={**FAST, "record_sample_rate": 1.0},
                    bulkhead={"max_concurrent_calls": 5},
                    budget={"percent_can_retry": 0.2, "min_retries_per_sec": 1})
    for _ in range(4):
        policy.call(lambda: "ok")

    samples = list(control.export(redis_client, name))
    assert [(s.ok, s.failed, s.state) for s in samples] == [(1, 0, "CLOSED")] * 4


def record_args(name: str, *tail: object) -> tuple[list[str], list[object]]:
    from distbreaker import BreakerConfig
    from distbreaker._runtime.keys import BreakerKeys
    from distbreaker.breaker.core import config_fingerprint

    keys = BreakerKeys.build(name)
    wire = BreakerConfig(**FAST).to_wire()
    return keys.script_keys, ["record", config_fingerprint(wire), wire, name, keys.channel,
                              "", 1, 0, 0, 7, *tail]


def test_a_sample_keeps_the_hot_paths_short_reply_and_bad_ones_are_skipped(
        redis_client: redis.Redis, name: str) -> None:
    from distbreaker._runtime.scripts import load_script, run_script

    script = load_script("breaker")
    keys, args = record_args(name)
    run_script(redis_client, script, keys, args)          # creates the breaker
    keys, args = record_args(name, "", "100;60000;500000;w:1")
    assert len(run_script(redis_client, script, keys, args)) == 3
    [sample] = control.export(redis_client, name)
    assert (sample.ok, sample.duration_ms, sample.rate, sample.worker) == (1, 7, 0.5, "w:1")
    for bad in ("garbage", "0;60000;1;w", "100;5;1;w", "2000000;60000;1;w"):
        keys, args = record_args(name, "", bad)
        assert len(run_script(redis_client, script, keys, args)) == 3
    assert redis_client.xlen(control.stream_key(name)) == 1
    # a foreign key where the stream goes: the record still counts, the sample is lost
    redis_client.delete(control.stream_key(name))
    redis_client.set(control.stream_key(name), "not a stream", ex=60)
    keys, args = record_args(name, "", "100;60000;500000;w:1")
    assert run_script(redis_client, script, keys, args)[0] in (b"CLOSED", "CLOSED")
    assert redis_client.get(control.stream_key(name)) == b"not a stream"
