"""Which records go in the compact form (fingerprint, ms), and its answer applied
(docs/KEY_SCHEMA.md, "The compact record"): pure core, no Redis."""

from __future__ import annotations

import time

from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import BreakerCodec, decode_reply
from distbreaker.breaker.state import State


def closed_codec(**config: object) -> BreakerCodec:
    codec = BreakerCodec("dep", BreakerConfig(**config))  # type: ignore[arg-type]
    codec._fingerprint_arg()  # the first call's hello is behind it
    codec.apply(decode_reply([b"CLOSED", 10, 7]), time.monotonic())
    return codec


def test_a_plain_success_in_a_closed_view_is_compact() -> None:
    codec = closed_codec()
    assert codec.compact_record(0.003) == (codec.fingerprint, 3)
    assert codec.compact_record(-0.001) == (codec.fingerprint, 0)


def test_everything_else_takes_the_full_form() -> None:
    assert closed_codec(slow_call_duration=0.01).compact_record(0.5) is None  # slow
    assert closed_codec(sliding_window_type="TIME").compact_record(0.001) is None
    assert closed_codec(min_failing_workers=2).compact_record(0.001) is None
    assert closed_codec(record_sample_rate=1.0).compact_record(0.001) is None
    unknown = BreakerCodec("dep", BreakerConfig())
    unknown._fingerprint_arg()
    assert unknown.compact_record(0.001) is None  # no view yet
    drifting = closed_codec()
    drifting.config_drift = "another wire"
    assert drifting.compact_record(0.001) is None
    hello = closed_codec()
    hello._next_hello = 0.0  # a hello is due: it needs the full form
    assert hello.compact_record(0.001) is None
    opened = closed_codec()
    opened.apply(decode_reply([b"OPEN", 5000, 0, [], 0, 0, 0, 0, 0, 0, "", 20, 20, 0]),
                 time.monotonic())
    assert opened.compact_record(0.001) is None


def test_the_answer_counts_the_success_and_keeps_the_closed_view() -> None:
    codec = closed_codec()
    codec.compact_answered(20, time.monotonic())
    assert codec.view is State.CLOSED and codec._counted_since == 7  # since kept
    assert codec.outcomes["success"] == 1
    codec.compact_answered(5, time.monotonic())  # older than the view: counted only
    assert codec._view_now_ms == 20 and codec.outcomes["success"] == 2
