"""Fault injection under hostile inputs (issue 27 review): foreign data in its keys is
refused before anything is written, values no client would send are not kept forever,
and an injected latency is bounded (docs/guides/fault_injection.md, KEY_SCHEMA)."""

from __future__ import annotations

import json

import pytest
import redis

from distbreaker import inject as faults
from distbreaker._runtime.faults import fault_keys
from distbreaker._runtime.keys import DEFAULT_PREFIX, events_channel
from distbreaker._runtime.scripts import load_script, run_script
from distbreaker.errors import SchemaError
from tests.helpers.cli import run

KEYS = fault_keys(DEFAULT_PREFIX)


def raw_set(client: redis.Redis, spec: dict[str, object], duration_ms: int = 60_000) -> object:
    return run_script(client, load_script("inject"), KEYS,
                      ["set", events_channel(DEFAULT_PREFIX, 0), "x", json.dumps(spec),
                       str(duration_ms), "0", "me", "why"])


def test_a_foreign_log_key_refuses_set_and_off_before_anything_is_written(
        redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.set(KEYS[1], "not a stream", ex=600)
    with pytest.raises(SchemaError, match="holds a string, expected a stream"):
        faults.inject(redis_client, DEFAULT_PREFIX, "pay", "reject", for_=60,
                      require_allowed=False)
    assert faults.in_force(redis_client, DEFAULT_PREFIX)[1] == []  # nothing stored
    done = run(redis_url, "inject", "pay", "--reject", "--for", "1m", "--allow-absent")
    assert done.exit_code == 1 and "foreign data" in done.output, done.output
    redis_client.delete(KEYS[1])
    faults.inject(redis_client, DEFAULT_PREFIX, "pay", "reject", for_=60,
                  require_allowed=False)
    redis_client.set(KEYS[1], "not a stream", ex=600)
    with pytest.raises(SchemaError):
        faults.stop(redis_client, DEFAULT_PREFIX)
    assert len(faults.in_force(redis_client, DEFAULT_PREFIX)[1]) == 1  # still in force


def test_fields_ending_beyond_any_injection_are_foreign_and_removed(
        redis_url: str, redis_client: redis.Redis) -> None:
    forever = "99999999999999"
    redis_client.hset(KEYS[0], mapping={"f:reject:x": f"{forever} " + '{"rate":1}',
                                        "a:ghost": forever, "f:error:y": "garbage"})
    redis_client.expire(KEYS[0], 600)
    _, found, allowed = faults.in_force(redis_client, DEFAULT_PREFIX)
    assert found == [] and allowed == {}
    assert redis_client.hlen(KEYS[0]) == 0  # removed, so they cannot hold the key's TTL


def test_an_injected_latency_is_bounded_everywhere(
        redis_url: str, redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="latency"):
        faults.inject(redis_client, DEFAULT_PREFIX, "pay", "latency", latency=601, for_=60,
                      require_allowed=False)
    done = run(redis_url, "inject", "pay", "--latency", "99999h", "--for", "1m",
               "--allow-absent")
    assert done.exit_code == 2 and "latency" in done.output, done.output
    with pytest.raises(ValueError, match="latency_ms must be in"):
        raw_set(redis_client, {"kind": "latency", "rate": 1, "latency_ms": 600_001})
    with pytest.raises(ValueError, match="7 days"):
        raw_set(redis_client, {"kind": "reject", "rate": 1}, duration_ms=8 * 86_400_000)
    assert redis_client.exists(KEYS[0]) == 0


def test_a_question_mark_stands_for_one_character_of_a_unicode_name(
        redis_url: str, redis_client: redis.Redis) -> None:
    run_script(redis_client, load_script("inject"), KEYS, ["read", "30000", "llm:é", "ab"])
    assert faults.inject(redis_client, DEFAULT_PREFIX, "llm:?", "reject", for_=60)["names"] \
        == ["llm:é"]  # the script's match agrees with the workers' (one character)
    with pytest.raises(faults.NotAllowed):
        faults.inject(redis_client, DEFAULT_PREFIX, "llm:??", "reject", for_=60)


def test_an_injection_carries_a_bounded_reason(redis_url: str,
                                               redis_client: redis.Redis) -> None:
    done = run(redis_url, "inject", "pay", "--reject", "--for", "1m", "--allow-absent",
               "--reason", "x" * 501)
    assert done.exit_code == 2 and "--reason" in done.output, done.output
    with pytest.raises(ValueError, match="4096"):
        raw_set(redis_client, {"kind": "reject", "rate": 1, "reason": "x" * 5000})
    assert redis_client.exists(KEYS[0]) == 0
