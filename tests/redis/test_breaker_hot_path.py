"""A foreign key type on lua/breaker.lua's hot path (one outcome recorded in
CLOSED, count window) is a schema error naming that key, reported before
anything is written. v2 checks TYPEs only on error paths and before a write to
a key other than the state record: pinned here so that deferred check always
runs before the first write.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import load_script, run_script
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import Reply, config_fingerprint, decode_reply
from distbreaker.breaker.state import State
from distbreaker.errors import SchemaError
from tests.helpers.records import read_record

CONFIG = BreakerConfig(sliding_window_size=4, minimum_number_of_calls=4,
                       failure_rate_threshold=50)


def _record(client: redis.Redis, name: str, ok: int, fails: int) -> Reply:
    keys = BreakerKeys.build(name)
    wire = CONFIG.to_wire()
    args: tuple[Any, ...] = ("record", config_fingerprint(wire), wire, name, keys.channel, "",
                             ok, fails, 0, 5)
    return decode_reply(run_script(client, load_script("breaker"), keys.script_keys, args))


def _snapshot(client: redis.Redis, keys: BreakerKeys) -> list[Any]:
    """Everything the script could have written."""
    return [client.dump(key) for key in keys.script_keys] + [
        client.pttl(key) > 0 for key in keys.script_keys]


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_a_record_that_would_trip_checks_the_history_key_before_writing(
        name: str, redis_client: redis.Redis) -> None:
    keys = BreakerKeys.build(name)
    for _ in range(3):
        _record(redis_client, name, 0, 1)       # three failures: the fourth call decides
    redis_client.rpush(keys.history, "foreign")
    before = _snapshot(redis_client, keys)
    with pytest.raises(SchemaError) as caught:
        _record(redis_client, name, 1, 0)       # 3/4 failed: would open the breaker
    assert caught.value.key == keys.history
    assert "holds a list, expected a stream" in str(caught.value)
    assert _snapshot(redis_client, keys) == before


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_a_record_that_would_trip_checks_the_meta_key_before_writing(
        name: str, redis_client: redis.Redis) -> None:
    """Opening writes reason and actor to the meta hash: its type is checked before the
    record (the first write) changes."""
    keys = BreakerKeys.build(name)
    for _ in range(3):
        _record(redis_client, name, 0, 1)
    redis_client.delete(keys.meta)
    redis_client.set(keys.meta, "foreign")
    before = _snapshot(redis_client, keys)
    with pytest.raises(SchemaError) as caught:
        _record(redis_client, name, 1, 0)
    assert caught.value.key == keys.meta
    assert "holds a string, expected a hash" in str(caught.value)
    assert _snapshot(redis_client, keys) == before


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_a_foreign_state_key_is_reported_before_anything_is_written(
        name: str, redis_client: redis.Redis) -> None:
    keys = BreakerKeys.build(name)
    _record(redis_client, name, 1, 0)
    redis_client.delete(keys.state)
    redis_client.hset(keys.state, "state", "CLOSED")
    before = _snapshot(redis_client, keys)
    with pytest.raises(SchemaError) as caught:
        _record(redis_client, name, 1, 0)
    assert caught.value.key == keys.state
    assert "holds a hash, expected a string" in str(caught.value)
    assert _snapshot(redis_client, keys) == before


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_the_first_foreign_key_in_keys_order_wins_over_a_later_one(
        name: str, redis_client: redis.Redis) -> None:
    """Foreign meta and history keys: the meta key (earlier in KEYS) is named, as when
    every key was checked first."""
    keys = BreakerKeys.build(name)
    for _ in range(3):
        _record(redis_client, name, 0, 1)
    redis_client.delete(keys.meta)
    redis_client.rpush(keys.meta, "foreign")
    redis_client.rpush(keys.history, "foreign")
    with pytest.raises(SchemaError) as caught:
        _record(redis_client, name, 1, 0)       # would open: writes meta and history
    assert caught.value.key == keys.meta


def test_the_hot_path_still_counts_and_opens(name: str, redis_client: redis.Redis) -> None:
    keys = BreakerKeys.build(name)
    for _ in range(3):
        reply = _record(redis_client, name, 1, 0)
    stored = read_record(redis_client, keys)    # the short reply carries no counts
    assert (reply.state, stored["calls"], stored["failures"]) == (State.CLOSED, 3, 0)
    reply = _record(redis_client, name, 0, 1)
    stored = read_record(redis_client, keys)
    assert (reply.state, stored["calls"], stored["failures"]) == (State.CLOSED, 4, 1)
    reply = _record(redis_client, name, 0, 1)   # ring slot 0 (a success) is replaced: 2/4
    assert reply.state is State.OPEN
    assert [t[:2] for t in reply.transitions] == [(State.CLOSED, State.OPEN)]
    assert redis_client.xlen(BreakerKeys.build(name).history) == 1


def test_a_new_breakers_first_record_meeting_foreign_data_creates_no_record(
        name: str, redis_client: redis.Redis) -> None:
    """The first record stores the config in meta: a foreign meta key refuses it before
    the state record exists (a half-made record would be foreign data itself)."""
    keys = BreakerKeys.build(name)
    redis_client.set(keys.meta, "foreign")
    with pytest.raises(SchemaError) as caught:
        _record(redis_client, name, 1, 0)
    assert caught.value.key == keys.meta
    assert not redis_client.exists(keys.state)
    redis_client.delete(keys.meta)
    _record(redis_client, name, 1, 0)           # and once it is gone the record is whole
    assert len(redis_client.get(keys.state) or b"") == 320 + 4 * 4
