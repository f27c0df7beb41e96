"""The compact record (docs/KEY_SCHEMA.md, "The compact record"): a usual CLOSED success
sends ARGV {fingerprint, ms} only, the script answers the server time, or 0 when it
needs the full form, which the client then sends. Through the public API on a real
redis-server: what goes on the wire, a config change reaching the script from a compact
caller, and the full form of an older client still accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker._runtime.scripts import load_script, run_script
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import config_fingerprint
from distbreaker.breaker.state import State
from tests.helpers.records import read_record

SMALL = {"sliding_window_size": 10, "minimum_number_of_calls": 5}


class Recording(redis.Connection):
    """A connection that keeps the ARGV of every script call it sends."""

    sent: list[tuple[str, ...]] = []

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        if str(args[0]).upper() in ("FCALL", "EVALSHA", "EVAL"):
            numkeys = int(args[2])
            Recording.sent.append(tuple(str(a) for a in args[3 + numkeys:]))
        super().send_command(*args, **kwargs)


@pytest.fixture
def recording(redis_url: str) -> Any:
    Recording.sent = []
    client = redis.Redis.from_url(redis_url, connection_class=Recording)
    yield client
    client.close()


def ok() -> str:
    return "ok"


def ops() -> list[str]:
    """Each script call's op, "compact" for the compact record's two-element ARGV."""
    return ["compact" if len(args) == 2 else args[0] for args in Recording.sent]


def test_a_usual_success_sends_only_fingerprint_and_duration(recording: redis.Redis,
                                                             name: str) -> None:
    breaker = CircuitBreaker(name, redis=recording, **SMALL)
    for _ in range(4):
        breaker.call(ok)
    sent = ops()
    # the first call acquires (no view yet: the full form, saying hello; sent again after
    # the library was loaded), then every record is compact
    assert set(sent[:-4]) == {"acquire"} and sent[-4:] == ["compact"] * 4
    assert all(args == (str(breaker._codec.fingerprint), "0") for args in Recording.sent[-4:])
    assert read_record(recording, BreakerKeys.build(name))["calls"] == 4
    assert breaker.state is State.CLOSED


def test_a_failure_a_slow_call_and_a_time_window_send_the_full_form(recording: redis.Redis,
                                                                     name: str) -> None:
    breaker = CircuitBreaker(name, redis=recording, slow_call_duration=0.05, **SMALL)
    breaker.call(ok)
    assert ops()[-1] == "compact"
    Recording.sent.clear()
    with pytest.raises(ValueError):
        breaker.call(lambda: (_ for _ in ()).throw(ValueError("x")))
    breaker.record(breaker.acquire(), None, 0.2)  # slow
    timed = CircuitBreaker(f"{name}-t", redis=recording, sliding_window_type="TIME", **SMALL)
    timed.call(ok)
    timed.call(ok)
    assert "compact" not in ops()
    assert ops()[:2] == ["record", "record"]
    assert read_record(recording, BreakerKeys.build(name))["calls"] == 3


def test_a_config_change_reaches_the_script_from_a_compact_caller(recording: redis.Redis,
                                                                  name: str) -> None:
    """The stored config changes under a worker that sends compact records: the script
    answers 0, the worker sends the full form with its config, learns the drift at once,
    and sends the full form while it drifts. Its call is recorded once."""
    worker = CircuitBreaker(name, redis=recording, **SMALL)
    worker.call(ok)
    worker.call(ok)
    assert ops()[-1] == "compact"
    operator = CircuitBreaker(name, redis=recording, **{**SMALL, "failure_rate_threshold": 30})
    operator.adopt_config()
    Recording.sent.clear()
    with pytest.warns(Warning):
        worker.call(ok)
    assert ops() == ["compact", "record"]
    assert Recording.sent[1][2] == worker._codec.wire
    assert worker.config_drift == operator._codec.wire
    assert read_record(recording, BreakerKeys.build(name))["calls"] == 3
    worker.call(ok)
    assert ops()[-1] == "record"  # drifting: the full form


def test_a_compact_record_the_script_cannot_finish_writes_nothing(redis_client: redis.Redis,
                                                                  name: str) -> None:
    keys = BreakerKeys.build(name)
    wire = BreakerConfig(**SMALL).to_wire()
    fp = config_fingerprint(wire)
    script = load_script("breaker")
    assert run_script(redis_client, script, [keys.state], [fp, 5]) == 0  # no record yet
    assert not redis_client.exists(keys.state)
    run_script(redis_client, script, keys.script_keys,
               ["record", fp, wire, name, keys.channel, "", 1, 0, 0, 5])
    before = redis_client.get(keys.state)
    assert run_script(redis_client, script, [keys.state], [fp + 1, 5]) == 0  # other config
    assert redis_client.get(keys.state) == before
    now_ms = run_script(redis_client, script, [keys.state], [fp, 5])
    assert isinstance(now_ms, int) and now_ms > 0
    assert read_record(redis_client, BreakerKeys.build(name))["calls"] == 2


def test_the_full_record_of_an_older_client_is_still_accepted(redis_client: redis.Redis,
                                                              name: str) -> None:
    """Key schema v2 unchanged: the full form (this release's PHP EVAL forms and earlier
    Python clients) records and answers {state, now_ms, since_ms} as before."""
    keys = BreakerKeys.build(name)
    wire = BreakerConfig(**SMALL).to_wire()
    args = ["record", config_fingerprint(wire), wire, name, keys.channel, "", 1, 0, 0, 5]
    for script in (load_script("breaker"),):
        raw = run_script(redis_client, script, keys.script_keys, args)
        assert len(raw) == 3 and raw[0] == b"CLOSED"
    # a newer client's compact call and an older client's full call share the record
    breaker = CircuitBreaker(name, redis=redis_client, **SMALL)
    breaker.call(ok)
    breaker.call(ok)
    raw = run_script(redis_client, load_script("breaker"), keys.script_keys, args)
    assert len(raw) == 3 and raw[0] == b"CLOSED"
    assert read_record(redis_client, BreakerKeys.build(name))["calls"] == 4
