"""Resilience4j's breaker semantics, fleet-wide, against a real redis-server.

Each test names one rule of issue 2 and checks it through the public API (and,
where the rule is about Redis itself, through the keys and the server's
command statistics). Tests built with `make` run with the sync and the asyncio
breaker (the `flavour` fixture); what only asyncio has is in test_breaker_aio.py.
"""

from __future__ import annotations

import json
import secrets
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import library, load_script, run_script, text
from distbreaker._runtime.state_record import FIELDS
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import SCRIPT_NAME, config_fingerprint, decode_reply
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted, ConfigDriftWarning, SchemaError
from tests.helpers.flavours import Flavour
from tests.helpers.records import corrupt, count_window, read_record, record_bytes
from tests.helpers.redis_stats import commands, round_trips
from tests.helpers.waiting import wait_until


def fail(exc: BaseException) -> Callable[[], None]:
    def dependency() -> None:
        raise exc
    return dependency


def ok() -> str:
    return "ok"


def failures(breaker: CircuitBreaker, n: int, exc: type[Exception] = ConnectionError) -> None:
    for _ in range(n):
        with pytest.raises(exc):
            breaker.call(fail(exc("down")))


def wait_for_server_second(client: redis.Redis, margin: float = 0.02) -> int:
    """Sleep until just after the server's next second boundary; return that second."""
    sec, usec = client.time()
    time.sleep(1 - usec / 1e6 + margin)
    return int(sec) + 1


@pytest.fixture
def make(name: str, redis_url: str, flavour: Flavour) -> Callable[..., CircuitBreaker]:
    """Build breakers of the test's flavour (sync, asyncio) on the test's name (several
    objects = several fleet members)."""
    def build(**options: Any) -> CircuitBreaker:
        return flavour.breaker(options.pop("name", name), redis=redis_url, **options)
    return build


# -- rates, windows, minimum --------------------------------------------------------------


def test_slow_call_rate_opens_the_breaker_with_zero_failures(
        make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=4, minimum_number_of_calls=3, slow_call_duration=0.05,
                   slow_call_rate_threshold=60, failure_rate_threshold=50)
    calls = 0

    def slow_dependency() -> str:
        nonlocal calls
        calls += 1
        time.sleep(0.06)
        return "ok"

    assert breaker.call(ok) == "ok"                   # fast
    assert breaker.call(slow_dependency) == "ok"      # slow 1/2
    assert breaker.state is State.CLOSED
    assert breaker.call(slow_dependency) == "ok"      # slow 2/3 = 66.67% >= 60%
    assert breaker.state is State.OPEN
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed, metrics.slow) == (3, 0, 2)
    assert metrics.failure_rate == 0 and metrics.slow_call_rate == 66.67
    with pytest.raises(CallNotPermitted):
        breaker.call(slow_dependency)
    assert calls == 2


def test_time_window_forgets_buckets_older_than_the_window(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis, name: str) -> None:
    def server_second() -> int:
        return int(redis_client.time()[0])

    # Each step must land in its server second; a loaded machine may let one slip into
    # the next, and then the sequence runs again on a fresh breaker (the steps that ran
    # were still checked).
    for attempt in range(5):
        breaker = make(name=f"{name}-{attempt}",
                       sliding_window_type="TIME_BASED", sliding_window_size=2,
                       minimum_number_of_calls=3, failure_rate_threshold=50)
        second = wait_for_server_second(redis_client)  # second S
        failures(breaker, 2)
        if server_second() != second:
            continue
        time.sleep(1.0)                                # second S+1: inside the 2 s window
        before, metrics = server_second(), breaker.metrics()
        if not before == server_second() == second + 1:
            continue
        assert metrics.calls == 2 and metrics.failed == 2
        break
    else:
        pytest.fail("five runs each slipped past a server second: the machine is too slow")
    time.sleep(1.0)                                # second S+2 (or later): S has left
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed) == (0, 0)
    # 2 successes + 1 failure: 33% with the old failures forgotten (60% if they counted)
    breaker.call(ok)
    breaker.call(ok)
    failures(breaker, 1)
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed, metrics.failure_rate) == (3, 1, 33.33)
    assert breaker.state is State.CLOSED


def test_minimum_number_of_calls_is_respected(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=10, minimum_number_of_calls=5)
    failures(breaker, 4)
    metrics = breaker.metrics()
    assert breaker.state is State.CLOSED and metrics.failed == 4
    assert metrics.failure_rate == -1 and metrics.slow_call_rate == -1
    failures(breaker, 1)
    assert breaker.state is State.OPEN


def test_minimum_is_capped_at_the_count_window_size(make: Callable[..., CircuitBreaker]) -> None:
    """Resilience4j: with a count window of 3, three calls are enough whatever the minimum."""
    breaker = make(sliding_window_size=3, minimum_number_of_calls=100)
    failures(breaker, 3)
    assert breaker.state is State.OPEN


# -- classification ----------------------------------------------------------------------------


class Boom(Exception):
    pass


def test_ignored_exceptions_count_nowhere(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=4, minimum_number_of_calls=1,
                   record_exceptions=(Boom, KeyError),
                   ignore_exceptions=(KeyError,),   # both recorded and ignored: ignore wins
                   ignore_predicate=lambda e: "harmless" in str(e))
    failures(breaker, 3, KeyError)
    with pytest.raises(Boom):
        breaker.call(fail(Boom("harmless")))
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed) == (0, 0) and breaker.state is State.CLOSED
    failures(breaker, 1, Boom)
    assert breaker.state is State.OPEN


def test_not_recorded_exceptions_count_as_successes(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=4, minimum_number_of_calls=2,
                   record_exceptions=(ConnectionError,),
                   record_predicate=lambda e: isinstance(e, ValueError) and "5xx" in str(e))
    failures(breaker, 2, LookupError)               # neither recorded: successes
    with pytest.raises(ValueError):
        breaker.call(fail(ValueError("4xx")))
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed, metrics.failure_rate) == (3, 0, 0)
    with pytest.raises(ValueError):
        breaker.call(fail(ValueError("5xx")))       # the predicate records it
    failures(breaker, 1, ConnectionError)
    assert breaker.metrics().failed == 2
    assert breaker.state is State.OPEN              # 2 of the last 4 = 50%


def test_ignored_probe_hands_its_half_open_slot_back(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=2, minimum_number_of_calls=1,
                   wait_duration_in_open_state=0.03, permitted_calls_in_half_open=1,
                   ignore_exceptions=(KeyError,))
    breaker.trip()
    time.sleep(0.04)
    failures(breaker, 1, KeyError)                  # the only probe, ignored
    assert breaker.state is State.HALF_OPEN
    assert breaker.call(ok) == "ok"                 # so another probe may run
    assert breaker.state is State.CLOSED


def test_a_failing_probe_hand_back_never_replaces_a_keyboard_interrupt(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    """Ctrl-C mid-probe hands the probe back; if that record fails (here: foreign data
    written meanwhile) the KeyboardInterrupt still propagates, not the SchemaError."""
    breaker = make(wait_duration_in_open_state=0.03, permitted_calls_in_half_open=1)
    breaker.trip()
    time.sleep(0.04)

    def interrupted() -> None:
        corrupt(redis_client, breaker.keys, state=99)   # an unknown state code
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        breaker.call(interrupted)
    with pytest.raises(SchemaError):  # an ordinary failure still reports it
        breaker.call(fail(ConnectionError("down")))


# -- special states, trip, reset --------------------------------------------------------------


def test_forced_open_rejects_every_call_until_reset(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(wait_duration_in_open_state=0.01)
    other = make(wait_duration_in_open_state=0.01)  # another fleet member
    other.call(ok)
    assert breaker.transition_to_forced_open() is State.FORCED_OPEN
    time.sleep(0.03)                                # longer than the open wait: still held
    with pytest.raises(CallNotPermitted) as caught:
        breaker.call(ok)
    # FORCED_OPEN has no wait of its own: retry_after is the re-check interval (never 0,
    # so `queue_for_later(delay=rejected.retry_after)` cannot spin), with the reason.
    assert caught.value.state is State.FORCED_OPEN
    assert caught.value.retry_after == breaker.config.revalidate_interval == 1.0
    assert caught.value.reason == "forced open"
    # `other` last saw CLOSED, where a call costs no round trip before it runs: at
    # most one call slips through before the reply of its record refreshes the view.
    reached = 0
    for _ in range(5):
        try:
            other.call(ok)
            reached += 1
        except CallNotPermitted as rejected:
            assert rejected.state is State.FORCED_OPEN
    assert reached <= 1
    assert other.state is State.FORCED_OPEN
    assert breaker.trip() is State.FORCED_OPEN      # trip does not weaken it
    assert other.reset() is State.CLOSED
    assert breaker.call(ok) == "ok"


def test_disabled_always_permits_and_records_nothing(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=2, minimum_number_of_calls=1)
    breaker.transition_to_disabled()
    failures(breaker, 5)
    assert breaker.call(ok) == "ok"
    metrics = breaker.metrics()
    assert metrics.state is State.DISABLED and (metrics.calls, metrics.failed) == (0, 0)
    assert breaker.trip() is State.DISABLED
    assert breaker.transition_to_closed() is State.CLOSED
    failures(breaker, 1)
    assert breaker.state is State.OPEN


def test_metrics_only_records_but_never_transitions(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=4, minimum_number_of_calls=2)
    breaker.transition_to_metrics_only()
    failures(breaker, 6)
    metrics = breaker.metrics()
    assert metrics.state is State.METRICS_ONLY
    assert (metrics.calls, metrics.failed, metrics.failure_rate) == (4, 4, 100)
    assert breaker.transition_to_closed() is State.CLOSED
    assert breaker.metrics().calls == 0             # a new state starts a new window


def test_trip_opens_now_and_probes_after_the_wait(make: Callable[..., CircuitBreaker]) -> None:
    # (a 1 s wait: a loaded machine still calls within it)
    breaker = make(wait_duration_in_open_state=1.0, permitted_calls_in_half_open=1)
    assert breaker.trip("maintenance") is State.OPEN
    with pytest.raises(CallNotPermitted) as caught:
        breaker.call(ok)
    assert caught.value.state is State.OPEN and 0 < caught.value.retry_after <= 1.0
    time.sleep(1.01)
    assert breaker.call(ok) == "ok"
    assert breaker.state is State.CLOSED


def test_reset_clears_the_window(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(sliding_window_size=10, minimum_number_of_calls=5)
    failures(breaker, 4)
    assert breaker.reset() is State.CLOSED
    assert breaker.metrics().calls == 0
    failures(breaker, 4)                            # 8 in total, but only 4 since the reset
    assert breaker.state is State.CLOSED


# -- half-open: timeout and leases -------------------------------------------------------------


def test_max_wait_in_half_open_moves_back_to_open(make: Callable[..., CircuitBreaker]) -> None:
    breaker = make(wait_duration_in_open_state=0.03, max_wait_in_half_open=0.3,
                   permitted_calls_in_half_open=2)
    seen: list[Transition] = []
    breaker.add_listener(seen.append)
    breaker.trip()
    time.sleep(0.04)
    breaker.acquire()                               # a probe that never reports
    assert breaker.state is State.HALF_OPEN
    time.sleep(0.31)
    assert breaker.state is State.OPEN
    assert [(t.from_state, t.to_state) for t in seen] == [
        (State.CLOSED, State.OPEN), (State.OPEN, State.HALF_OPEN),
        (State.HALF_OPEN, State.OPEN)]
    assert seen[-1].reason == "max wait in half-open elapsed"


def test_an_expired_probe_lease_frees_the_slot(make: Callable[..., CircuitBreaker]) -> None:
    # (a 2 s lease: a loaded machine still calls within it)
    breaker = make(wait_duration_in_open_state=0.03, permitted_calls_in_half_open=1,
                   half_open_lease=2.0)
    breaker.trip()
    time.sleep(0.04)
    lost = breaker.acquire()                        # the worker holding it "dies"
    assert lost.token
    with pytest.raises(CallNotPermitted) as caught:
        breaker.call(ok)
    assert caught.value.state is State.HALF_OPEN and 0 < caught.value.retry_after <= 2.0
    assert breaker.metrics().probes_in_flight == 1
    time.sleep(2.01)
    assert breaker.metrics().probes_in_flight == 0
    permit = breaker.acquire()                      # the slot went to another probe
    breaker.record(lost, ConnectionError("late"), 0.2)   # a late report is not counted
    assert breaker.state is State.HALF_OPEN
    breaker.record(permit, None, 0.001)
    assert breaker.state is State.CLOSED


# -- events ------------------------------------------------------------------------------------


def test_each_transition_is_in_the_history_and_on_the_channel_once(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make(wait_duration_in_open_state=0.03, permitted_calls_in_half_open=1)
    watcher = make(wait_duration_in_open_state=0.03, permitted_calls_in_half_open=1)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(breaker.keys.channel)
    pubsub.get_message(timeout=1.0)                 # consume the subscribe confirmation
    breaker.trip("drill", actor="ops")
    time.sleep(0.04)
    assert watcher.state is State.HALF_OPEN         # the reader made OPEN -> HALF_OPEN
    assert watcher.state is State.HALF_OPEN         # ... once
    breaker.call(ok)
    breaker.metrics()

    entries = redis_client.xrange(breaker.keys.history)
    steps = [(e[b"from"], e[b"to"]) for _, e in entries]
    assert steps == [(b"CLOSED", b"OPEN"), (b"OPEN", b"HALF_OPEN"), (b"HALF_OPEN", b"CLOSED")]
    assert entries[0][1][b"reason"] == b"drill" and entries[0][1][b"actor"] == b"ops"

    messages = []

    def three_messages() -> bool:
        message = pubsub.get_message(timeout=0.1)
        if message and message["type"] == "message":
            messages.append(json.loads(message["data"]))
        return len(messages) >= 3

    wait_until(three_messages, interval=0, what="3 transitions are published")
    time.sleep(0.05)
    assert pubsub.get_message(timeout=0.05) is None  # nothing more
    pubsub.close()
    assert [(m["name"], m["from"], m["to"]) for m in messages] == [
        (breaker.name, "CLOSED", "OPEN"), (breaker.name, "OPEN", "HALF_OPEN"),
        (breaker.name, "HALF_OPEN", "CLOSED")]
    assert messages[0]["reason"] == "drill" and messages[0]["actor"] == "ops"
    assert [m["gen"] for m in messages] == [1, 2, 3]


# -- keys: TTL and foreign data -------------------------------------------------------------------


def test_every_key_has_a_ttl_after_a_call(make: Callable[..., CircuitBreaker],
                                          redis_client: redis.Redis) -> None:
    breaker = make(key_ttl=120, wait_duration_in_open_state=0.02,
                   permitted_calls_in_half_open=2)
    keys = breaker.keys.script_keys
    breaker.call(ok)
    breaker.trip()
    time.sleep(0.03)
    breaker.acquire()                               # a live probe lease: the zset exists
    present = [k for k in keys if redis_client.exists(k)]
    assert present == keys                          # all four exist now
    for key in keys:
        assert 0 < redis_client.pttl(key) <= 120_000, key


def test_the_history_stream_a_first_transition_creates_expires(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    """A breaker that trips once and goes idle leaves no history stream without a TTL
    (the stream is created by the transition's XADD, after the other keys' TTLs were
    set): by an operator's trip, and by a record's trip. An OPEN keeps its keys for
    key_ttl past its wait (60 s here): up to 180 s."""
    tripped = make(key_ttl=120, wait_duration_in_open_state=60)
    tripped.trip()
    assert 0 < redis_client.pttl(tripped.keys.history) <= 180_000
    failing = make(name=tripped.name + "-r", key_ttl=120, wait_duration_in_open_state=60,
                   sliding_window_size=2, minimum_number_of_calls=2)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            failing.call(lambda: 1 / 0)
    assert failing.get_state() is State.OPEN
    assert 0 < redis_client.pttl(failing.keys.history) <= 180_000


def _corrupt_cases(keys: BreakerKeys) -> list[tuple[str, Callable[[redis.Redis], Any], str]]:
    return [
        ("unknown state code", lambda r: corrupt(r, keys, state=99),
         "has an unknown state code"),
        ("string that is not a record", lambda r: r.set(keys.state, "x"),
         "is not a distbreaker v2 state record"),
        ("hash at the state key", lambda r: (r.delete(keys.state), r.hset(keys.state, "a", "b")),
         "holds a hash, expected a string"),
        ("hash at the probes key", lambda r: r.hset(keys.probes, "a", "b"),
         "holds a hash, expected a zset"),
        ("list at the history key", lambda r: r.rpush(keys.history, "a"),
         "holds a list, expected a stream"),
        ("string at the meta key", lambda r: (r.delete(keys.meta), r.set(keys.meta, "x")),
         "holds a string, expected a hash"),
        ("record with a zero window size", lambda r: corrupt(r, keys, window_size=0),
         "bad config"),
    ]


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
@pytest.mark.parametrize("case", range(7))
def test_foreign_data_is_a_schema_error_naming_the_key(
        case: int, make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    breaker = make(sliding_window_size=3, minimum_number_of_calls=3)
    breaker.call(ok)                                # a record and its meta exist
    label, corrupt_it, detail = _corrupt_cases(breaker.keys)[case]
    corrupt_it(redis_client)
    with pytest.raises(SchemaError) as caught:
        breaker.metrics()
    keys = breaker.keys
    assert caught.value.key in (keys.state, keys.meta, keys.probes, keys.history), label
    assert caught.value.key in str(caught.value) and detail in str(caught.value), label
    with pytest.raises(SchemaError):
        breaker.reset()


def test_a_truncated_record_is_foreign_data(make: Callable[..., CircuitBreaker],
                                            redis_client: redis.Redis) -> None:
    """A record cut inside its header (magic gone) is refused, not read as zeros."""
    breaker = make(sliding_window_size=3, minimum_number_of_calls=3)
    breaker.call(ok)
    data = record_bytes(redis_client, breaker.keys)
    assert data is not None
    redis_client.set(breaker.keys.state, data[:8 * FIELDS.index("magic")], keepttl=True)
    with pytest.raises(SchemaError) as caught:
        breaker.call(ok)
    assert caught.value.key == breaker.keys.state
    assert "is not a distbreaker v2 state record" in str(caught.value)


def test_count_window_slots_decode_as_documented(
        make: Callable[..., CircuitBreaker], redis_client: redis.Redis) -> None:
    """Each count slot holds bit 31 present, 30 failed, 29 slow, 0-28 duration ms."""
    breaker = make(sliding_window_size=4, minimum_number_of_calls=4,
                   slow_call_duration=0.1)
    for kind, seconds in [("ok", 0.004), ("fail", 0.007), ("slow", 0.12)]:
        permit = breaker.acquire()
        breaker.record(permit, ConnectionError("down") if kind == "fail" else None, seconds)
    slots = count_window(redis_client, breaker.keys)
    assert slots == [(False, False, 4), (True, False, 7), (False, True, 120), None]
    record = read_record(redis_client, breaker.keys)
    assert (record["calls"], record["failures"], record["slow"], record["total_ms"],
            record["head"]) == (3, 1, 1, 131, 3)


# -- config drift -------------------------------------------------------------------------------


def test_config_drift_is_detected_warned_once_and_the_stored_config_governs(
        make: Callable[..., CircuitBreaker]) -> None:
    """A newer config is adopted at its first call (a rollout, docs/OPERATIONS.md); the
    worker left on the older one is the drifting one: warned once, governed by the
    config in force."""
    first = make(sliding_window_size=4, minimum_number_of_calls=4)
    second = make(sliding_window_size=4, minimum_number_of_calls=2)
    first.call(ok)
    first.call(ok)
    assert first.config_drift is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failures(second, 1)                         # second's config is now in force
        assert second.config_drift is None
        first.call(ok)                              # the window was kept: 4 calls
        assert first.metrics().calls == 4
    drift = [w for w in caught if issubclass(w.category, ConfigDriftWarning)]
    assert len(drift) == 1 and second.config.to_wire() in str(drift[0].message)
    assert "will not become it" in str(drift[0].message)
    assert first.config_drift == second.config.to_wire()
    failures(first, 1)                              # 2 of 4 failed (the oldest left)
    assert first.state is State.OPEN

    assert first.reset() is State.CLOSED            # reset adopts the caller's config
    assert first.config_drift is None
    with pytest.warns(ConfigDriftWarning):
        second.metrics()
    assert second.config_drift == first.config.to_wire()


def test_metrics_under_drift_use_the_governing_minimum(
        make: Callable[..., CircuitBreaker]) -> None:
    """The config in force decides (minimum 4), so the rates a drifting worker reports
    are -1 below that minimum, as the fleet's decision sees them, not below its own (2)."""
    old = make(sliding_window_size=4, minimum_number_of_calls=2)
    new = make(sliding_window_size=4, minimum_number_of_calls=4)
    old.call(ok)
    new.call(ok)                                    # the newest deployment is in force
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        failures(old, 1)
        metrics = old.metrics()
    assert (metrics.calls, metrics.failed, metrics.failure_rate) == (3, 1, -1)
    assert old.state is State.CLOSED
    assert new.metrics().failure_rate == -1


# -- scripts, names --------------------------------------------------------------------------------


def test_function_flush_is_recovered(make: Callable[..., CircuitBreaker],
                                     redis_client: redis.Redis) -> None:
    lib = library()
    breaker = make(sliding_window_size=4, minimum_number_of_calls=2)
    failures(breaker, 1)
    listed = redis_client.function_list(lib.name)
    assert len(listed) == 1 and lib.name in [text(v) for v in listed[0]]
    redis_client.function_flush()
    assert redis_client.function_list(lib.name) == []
    failures(breaker, 1)                            # FCALL -> not found -> LOAD -> FCALL
    assert len(redis_client.function_list(lib.name)) == 1
    assert breaker.state is State.OPEN
    redis_client.function_flush()
    metrics = breaker.metrics()                     # both recorded in Redis, not locally
    assert (metrics.calls, metrics.failed) == (2, 2)


def test_eval_form_after_script_flush_is_recovered(redis_url: str) -> None:
    """A client that cannot use Functions (here: an ACL without FCALL) runs the EVAL
    form, and reloads it after SCRIPT FLUSH."""
    admin = redis.Redis.from_url(redis_url)
    user = f"evalonly{secrets.token_hex(3)}"
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                      commands=["+@all", "-fcall", "-function"])
    client = redis.Redis.from_url(redis_url, username=user, password="pw")
    sha = load_script(SCRIPT_NAME).sha
    breaker = CircuitBreaker(f"evalonly-{secrets.token_hex(3)}", redis=client,
                             sliding_window_size=4, minimum_number_of_calls=2)
    failures(breaker, 1)
    assert admin.script_exists(sha) == [True]
    admin.script_flush()
    failures(breaker, 1)                            # EVALSHA -> NOSCRIPT -> EVAL
    assert admin.script_exists(sha) == [True]
    assert breaker.state is State.OPEN
    admin.acl_deluser(user)


@pytest.mark.parametrize("bad", ["", "x" * 201, "a b", "tab\there", "nl\nhere", "nul\x00",
                                 "bell\x07", "nbsp\u00a0x"])
def test_invalid_names_are_rejected_and_write_nothing(bad: str, redis_url: str,
                                                      redis_client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="name"):
        CircuitBreaker(bad, redis=redis_url)
    assert redis_client.dbsize() == 0


def test_a_200_character_name_is_accepted(redis_url: str, redis_client: redis.Redis) -> None:
    breaker = CircuitBreaker("n" * 200, redis=redis_url)
    assert breaker.call(ok) == "ok"
    assert redis_client.exists(breaker.keys.state)


# -- round trips ---------------------------------------------------------------------------------


def test_round_trips_per_protected_call(make: Callable[..., CircuitBreaker],
                                        redis_client: redis.Redis) -> None:
    breaker = make(sliding_window_size=10, minimum_number_of_calls=10,
                   wait_duration_in_open_state=0.5, permitted_calls_in_half_open=3)
    breaker.call(ok)                                # loads the script, learns CLOSED

    redis_client.config_resetstat()
    for _ in range(20):
        breaker.call(ok)
    assert round_trips(redis_client) == 20                   # CLOSED: exactly 1 per call
    assert commands(redis_client)["fcall"] == 20              # the Function form

    breaker.trip()
    redis_client.config_resetstat()
    for _ in range(20):
        with pytest.raises(CallNotPermitted):
            breaker.call(ok)
    assert commands(redis_client) == {}                      # known OPEN wait: nothing at all

    time.sleep(0.5)
    redis_client.config_resetstat()
    for _ in range(2):
        breaker.call(ok)                                      # two probes of three
    assert round_trips(redis_client) == 4                    # HALF_OPEN: 2 per call
    assert breaker.state is State.HALF_OPEN


# -- the script's argument contract -------------------------------------------------------------


def _script(client: redis.Redis, name: str, config: BreakerConfig, op: str, *extra: Any) -> Any:
    keys = BreakerKeys.build(name)
    wire = config.to_wire()
    args = (op, config_fingerprint(wire), wire, name, keys.channel, *extra)
    return decode_reply(run_script(client, load_script("breaker"), keys.script_keys, args))


@pytest.mark.parametrize("counts", [(-1, 0, 0, 0), (1, 0, 0, -5), (1.5, 0, 0, 0),
                                    ("x", 0, 0, 0), (1, 1, 3, 0)])
def test_record_rejects_impossible_counts(counts: tuple[Any, ...], name: str,
                                          redis_client: redis.Redis) -> None:
    config = BreakerConfig(sliding_window_size=4, minimum_number_of_calls=1)
    _script(redis_client, name, config, "record", "", 1, 0, 0, 3)
    with pytest.raises(ValueError, match="record"):
        _script(redis_client, name, config, "record", "", *counts)
    reply = _script(redis_client, name, config, "state")
    assert (reply.calls, reply.failures, reply.slow, reply.total_ms) == (1, 0, 0, 3)


def test_a_retried_acquire_with_the_same_token_takes_one_slot(
        name: str, redis_client: redis.Redis) -> None:
    config = BreakerConfig(wait_duration_in_open_state=0.01, permitted_calls_in_half_open=2)
    _script(redis_client, name, config, "set", "TRIP", "t", "")
    time.sleep(0.02)
    with pytest.raises(ValueError, match="token"):
        _script(redis_client, name, config, "acquire", "")
    for _ in range(3):
        assert _script(redis_client, name, config, "acquire", "tok-a").permitted
    reply = _script(redis_client, name, config, "acquire", "tok-b")
    assert reply.permitted          # a short reply: the leases are read from Redis
    keys = BreakerKeys.build(name)
    assert redis_client.zrange(keys.probes, 0, -1) == [b"tok-a", b"tok-b"]
    assert _script(redis_client, name, config, "state").probes_in_flight == 2
    assert not _script(redis_client, name, config, "acquire", "tok-c").permitted
    assert _script(redis_client, name, config, "acquire", "tok-a").permitted  # still held


def test_keys_created_between_ttl_refreshes_get_a_ttl_at_once(name: str, redis_url: str,
                                                              redis_client: redis.Redis) -> None:
    """TTLs are refreshed every ttl/2 only, so a key a call creates must get one itself."""
    breaker = CircuitBreaker(name, redis=redis_url, key_ttl=3600,
                             sliding_window_size=4, minimum_number_of_calls=4,
                             wait_duration_in_open_state=0.2, permitted_calls_in_half_open=1)
    for _ in range(4):                            # record, meta, then history appear
        with pytest.raises(ZeroDivisionError):
            breaker.call(lambda: 1 / 0)
    time.sleep(0.25)
    permit = breaker.acquire()                    # HALF_OPEN: the probes zset appears
    assert permit.token
    assert 0 < redis_client.pttl(breaker.keys.probes) <= 3_600_000
    breaker.record(permit, None, 0.001)           # CLOSED: the window is cleared
    assert count_window(redis_client, breaker.keys) == [None] * 4
    assert breaker.call(lambda: "ok") == "ok"     # and filled again by a record
    assert count_window(redis_client, breaker.keys)[0] is not None
    for key in breaker.keys.script_keys:
        if redis_client.exists(key):
            ttl = redis_client.pttl(key)
            assert 0 < ttl <= 3_600_000, (key, ttl)
    assert redis_client.exists(breaker.keys.state, breaker.keys.meta,
                               breaker.keys.history) == 3


def test_a_bad_record_leaves_no_half_done_transition(name: str, redis_url: str,
                                                     redis_client: redis.Redis) -> None:
    """Bad arguments are refused before time-driven transitions run, so nothing is published."""
    breaker = CircuitBreaker(name, redis=redis_url, wait_duration_in_open_state=0.05)
    breaker.trip("test")
    time.sleep(0.08)                                   # OPEN -> HALF_OPEN is now due
    before = redis_client.xlen(breaker.keys.history)
    call = breaker._codec._call("record", "", 1, 0, 5, 0)   # more slow calls than calls
    with pytest.raises(ValueError, match="slow"):
        run_script(redis_client, load_script("breaker"), call.keys, call.args)
    assert redis_client.xlen(breaker.keys.history) == before
    assert breaker.state is State.HALF_OPEN            # the transition happens once, here
    assert redis_client.xlen(breaker.keys.history) == before + 1
