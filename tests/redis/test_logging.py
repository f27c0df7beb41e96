"""Transitions are logged once fleet-wide, as structured records.

Two breaker objects (two "workers") share one breaker; each transition is
logged by the process whose script call made it, exactly once, with the
breaker's name, from/to states, reason and the rates it was decided on.
"""

from __future__ import annotations

import logging
import time

import pytest

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.readside import read_history

CFG = {"sliding_window_size": 4, "minimum_number_of_calls": 4,
       "failure_rate_threshold": 50, "wait_duration_in_open_state": 0.3,
       "permitted_calls_in_half_open": 2}


class Boom(Exception):
    pass


def _run(breaker: CircuitBreaker, fail: bool) -> None:
    def fn() -> None:
        if fail:
            raise Boom

    try:
        breaker.call(fn)
    except Boom:
        pass


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "distbreaker" and hasattr(r, "to_state")]


def test_each_transition_logged_once_with_structured_fields(
        redis_url: str, redis_client, name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="distbreaker")
    a = CircuitBreaker(name, redis=redis_url, **CFG)
    b = CircuitBreaker(name, redis=redis_url, **CFG)
    # 3 failures of 4 calls, alternating workers: the 4th call (b) trips it at 75 %.
    for worker, fail in ((a, True), (b, False), (a, True), (b, True)):
        _run(worker, fail)
    assert a.state is State.OPEN
    time.sleep(0.35)
    # Half-open: a probes and fails once, b probes and succeeds: 1/2 = 50 % -> OPEN again.
    _run(a, True)
    _run(b, False)
    assert b.state is State.OPEN
    time.sleep(0.35)
    _run(b, False)
    _run(a, False)   # 0/2 failed -> CLOSED
    assert a.state is State.CLOSED

    records = _records(caplog)
    seen = [(r.from_state, r.to_state) for r in records]
    assert seen == [("CLOSED", "OPEN"), ("OPEN", "HALF_OPEN"), ("HALF_OPEN", "OPEN"),
                    ("OPEN", "HALF_OPEN"), ("HALF_OPEN", "CLOSED")]
    history = read_history(redis_client, "distbreaker", name, 100)
    assert [(h["from"], h["to"]) for h in history] == seen  # once each, none missing
    for record, event in zip(records, history, strict=True):
        assert record.breaker == name
        assert record.levelno == logging.INFO
        assert record.reason == event["reason"] and record.reason
        assert record.failure_rate == event["failure_rate"]
        assert record.slow_rate == event["slow_rate"]
        assert record.at_ms == event["at_ms"]
        assert record.source == "redis"
        assert name in record.getMessage()
    trip, _, verdict, _, closing = records
    assert trip.failure_rate == 75.0 and trip.slow_rate == 0.0
    assert verdict.failure_rate == 50.0       # the probes' rate, not the old window's
    assert closing.failure_rate == 0.0
    assert "75" in trip.reason


def test_listener_events_carry_rates(redis_url: str, name: str) -> None:
    a = CircuitBreaker(name, redis=redis_url, **CFG)
    events = []
    a.add_listener(events.append)
    for _ in range(4):
        _run(a, True)
    assert [(e.to_state, e.failure_rate) for e in events] == [(State.OPEN, 100.0)]


def test_local_fallback_transitions_are_logged_as_local(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    """While Redis is unreachable the in-process breaker's transitions are logged
    too, marked source="local" (they are this process's, not the fleet's)."""
    caplog.set_level(logging.INFO, logger="distbreaker")
    breaker = CircuitBreaker(name, redis="redis://127.0.0.1:1/0", redis_timeout=0.05, **CFG)
    for _ in range(4):
        _run(breaker, True)
    records = _records(caplog)
    assert [(r.to_state, r.source, r.failure_rate) for r in records] == [("OPEN", "local", 100.0)]
