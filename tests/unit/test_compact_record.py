"""Which record calls go in the compact form ('r', fingerprint, ms), and its reply
decoded (docs/KEY_SCHEMA.md, "The compact record"): pure core, no Redis."""

from __future__ import annotations

import time

from distbreaker._runtime.classify import Outcome
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import BreakerCodec, Permit, decode_reply
from distbreaker.breaker.state import State


def closed_codec(**config: object) -> BreakerCodec:
    codec = BreakerCodec("dep", BreakerConfig(**config))  # type: ignore[arg-type]
    codec._fingerprint_arg()  # the first call's hello is behind it
    codec.apply(decode_reply(123), time.monotonic())
    return codec


def compact(codec: BreakerCodec, outcome: Outcome = Outcome.SUCCESS, duration: float = 0.003,
            token: str = "") -> object:
    call = codec.record_call(Permit(token), outcome, duration)
    assert call is not None
    return codec.compact_args(call)


def test_a_plain_success_in_a_closed_view_is_compact() -> None:
    codec = closed_codec()
    assert compact(codec) == ("r", codec.fingerprint, 3)


def test_everything_else_takes_the_full_form() -> None:
    codec = closed_codec(slow_call_duration=0.01)
    assert compact(codec, Outcome.FAILURE) is None
    assert compact(codec, duration=0.5) is None  # slow
    assert compact(codec, token="probe") is None
    assert compact(closed_codec(sliding_window_type="TIME")) is None
    assert compact(closed_codec(min_failing_workers=2)) is None
    unknown = BreakerCodec("dep", BreakerConfig())
    unknown._fingerprint_arg()
    assert compact(unknown) is None  # no view yet
    drifting = closed_codec()
    drifting.config_drift = "another wire"
    assert compact(drifting) is None
    hello = closed_codec()
    hello._next_hello = 0.0  # a hello is due: it needs the full form
    assert compact(hello) is None


def test_the_compact_reply_is_the_server_time_in_closed() -> None:
    reply = decode_reply(1_700_000_000_123)
    assert (reply.state, reply.now_ms, reply.permitted, reply.transitions) == (
        State.CLOSED, 1_700_000_000_123, True, ())
    codec = BreakerCodec("dep", BreakerConfig())
    codec.apply(decode_reply([b"CLOSED", 10, 7]), time.monotonic())
    codec.apply(decode_reply(20), time.monotonic())
    assert codec.view is State.CLOSED and codec._counted_since == 7  # since kept
