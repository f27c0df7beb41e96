"""The pure steps the sync and asyncio shells share, without Redis: replies are built by
hand in the scripts' reply layout (docs/KEY_SCHEMA.md, lua/bulkhead.lua)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest

from distbreaker._runtime.scripts import text
from distbreaker.breaker.batching.accumulator import Accumulator, Added, Tally
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import BreakerCore, Permit, Step
from distbreaker.budget.config import BudgetConfig
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec, BulkheadPermit
from distbreaker.errors import BulkheadFull, CallNotPermitted
from distbreaker.ganesha.config import GaneshaConfig
from distbreaker.ganesha.core import GaneshaCore

NOW_MS = 1_700_000_000_000


def breaker_reply(state: str, permitted: bool, wait_ms: int = 0) -> list[Any]:
    """A breaker script reply: state, wait, permitted, transitions, window figures,
    drift, stored config, server time, since, probes in flight."""
    return [state.encode(), wait_ms, int(permitted), [], 0, 0, 0, 0, 0, 0, b"", NOW_MS,
            NOW_MS, 0]


def bulkhead_reply(ok: bool, in_use: int = 1, next_deadline_ms: int = 0) -> list[int]:
    """A bulkhead script reply: ok, in_use, limit, waiting, rejected, next deadline,
    server time, lost, acquired."""
    return [int(ok), in_use, 2, 0, 0, next_deadline_ms, NOW_MS, 0, 1]


def core(**overrides: Any) -> BreakerCore:
    return BreakerCore("dep", None, "distbreaker", overrides)


# -- the breaker's acquire step ---------------------------------------------------------
def test_an_unknown_view_asks_redis_and_the_reply_becomes_the_permit() -> None:
    breaker = core()
    step = breaker._acquire_step()
    assert step.step is Step.ACQUIRE and step.call is not None and step.token
    assert step.call.args[0] == "acquire" and step.token in step.call.args
    assert step.call.on_reply(breaker_reply("CLOSED", True)) == Permit()
    assert breaker._acquire_step().step is Step.PERMIT          # CLOSED: 0 round trips
    assert breaker._acquire_step().call is None


def test_a_half_open_grant_holds_the_probe_token() -> None:
    breaker = core()
    step = breaker._acquire_step()
    assert step.call is not None
    before = time.monotonic()
    permit = step.call.on_reply(breaker_reply("HALF_OPEN", True))
    assert permit.token == step.token
    # its lease: from when the acquire was sent, for this process's half_open_lease
    assert permit.lease_deadline <= before + breaker.config.half_open_lease


def test_a_known_open_wait_rejects_locally() -> None:
    breaker = core()
    step = breaker._acquire_step()
    assert step.call is not None
    with pytest.raises(CallNotPermitted):
        step.call.on_reply(breaker_reply("OPEN", False, wait_ms=60_000))
    with pytest.raises(CallNotPermitted) as rejected:
        breaker._acquire_step()                                 # no call built at all
    assert rejected.value.state == "OPEN"
    assert breaker.local_counts().rejections == {"OPEN": 2}


def test_fail_closed_turns_an_unavailable_acquire_into_a_rejection() -> None:
    breaker = core(on_redis_error="fail_closed")
    step = breaker._acquire_step()
    assert step.call is not None
    with pytest.raises(CallNotPermitted) as rejected:
        step.call.on_unavailable(ConnectionError("down"))
    assert rejected.value.state == "UNKNOWN"
    assert isinstance(rejected.value.__cause__, ConnectionError)


def test_invalidate_drops_the_view_unless_a_reply_already_reported_it() -> None:
    breaker = core()
    step = breaker._acquire_step()
    assert step.call is not None
    step.call.on_reply(breaker_reply("CLOSED", True))
    assert not breaker.invalidate(NOW_MS - 1)                   # older than the reply
    assert breaker._acquire_step().step is Step.PERMIT
    assert breaker.invalidate(NOW_MS + 5)
    assert breaker._acquire_step().step is Step.ACQUIRE


def test_a_record_failure_never_replaces_a_cancellation(caplog: pytest.LogCaptureFixture,
                                                         ) -> None:
    breaker = core()
    with caplog.at_level(logging.ERROR, "distbreaker"), breaker._recording(KeyboardInterrupt()):
        raise ValueError("record failed")
    assert "recording a call ended by KeyboardInterrupt failed" in caplog.text
    with pytest.raises(ValueError), breaker._recording(None):
        raise ValueError("record failed")
    with pytest.raises(KeyboardInterrupt), breaker._recording(KeyboardInterrupt()):
        raise KeyboardInterrupt


def test_batched_counts_spill_by_the_redis_error_policy() -> None:
    assert not core(on_redis_error="fail_closed").spill_batch((3, 1, 0, 40))
    pending = core().batch_pending((3, 1, 0, 40))
    assert pending.args[0] == "record" and tuple(pending.args[-4:]) == (3, 1, 0, 40)


# -- the batched accumulator --------------------------------------------------------------
def test_accumulator_signals_first_outcome_and_full_batch() -> None:
    breaker = core(record_mode="batched", max_batch=3)
    acc = Accumulator()
    assert acc.add(breaker, (1, 0, 0, 5)) is Added.FIRST
    assert acc.add(breaker, (0, 1, 1, 70)) is Added.NOTHING
    assert acc.add(breaker, (1, 0, 0, 5)) is Added.FULL
    assert acc.pending(breaker) == 3 and acc.due_in() == 0.0
    assert acc.drain() == {breaker: (2, 1, 1, 80)}
    assert not acc and acc.restore(breaker, (2, 1, 1, 80)) == 3
    assert acc.take(breaker) == (2, 1, 1, 80) and acc.take(breaker) is None


def test_tally_adds_counts_as_one_operation() -> None:
    tally = Tally()
    tally.add((1, 2, 1, 30))
    tally.add((4, 0, 0, 10))
    assert tally.counts() == (5, 2, 1, 40) and tally.outcomes == 7


# -- the bulkhead's acquisition ----------------------------------------------------------
def bulkhead(**overrides: Any) -> BulkheadCodec:
    return BulkheadCodec("dep", BulkheadConfig(max_concurrent_calls=2, **overrides))


def test_acquisition_waits_after_a_refusal_then_takes_the_grant() -> None:
    codec = bulkhead(max_wait_duration=1.0)
    attempt = codec.begin_acquire()
    assert attempt.via_redis and attempt.orphans == []
    call = attempt.request()
    assert call.args[0] == "acquire" and call.args[1] == attempt.token and call.args[5] > 0
    assert attempt.answer(bulkhead_reply(False, in_use=2, next_deadline_ms=200)) is None
    assert attempt.block_for(cap=10.0) <= 0.21                  # the next lease deadline
    assert attempt.block_for(cap=0.05) == 0.05                  # the socket's bound
    permit = attempt.answer(bulkhead_reply(True))
    assert permit is not None and permit.token == attempt.token and not permit.local


def test_acquisition_without_wait_raises_bulkhead_full() -> None:
    codec = bulkhead()
    attempt = codec.begin_acquire()
    attempt.request()
    with pytest.raises(BulkheadFull):
        attempt.answer(bulkhead_reply(False, in_use=2))
    assert codec.local_counts().rejected == 1
    assert attempt.must_cancel(KeyboardInterrupt()) and not attempt.must_cancel(
        BulkheadFull("dep", 2, 2, 0.0))


def test_a_lost_acquire_reply_is_cancelled_by_the_next_acquire() -> None:
    codec = bulkhead()
    lost = codec.begin_acquire()
    lost.unavailable(ConnectionError("reply lost"))
    assert not codec.begin_acquire().via_redis                  # Redis in backoff: local
    codec.health.succeeded()
    assert codec.begin_acquire().orphans == [lost.token]


def test_release_gives_back_once_and_never_a_lost_lease() -> None:
    codec = bulkhead()
    local = BulkheadPermit("", local=True)
    assert codec.take_release(local) and not codec.take_release(local)
    lost = BulkheadPermit("t", lost=True)
    assert codec.release_pending(lost) is None and lost.released
    held = BulkheadPermit("t2")
    pending = codec.release_pending(held)
    assert pending is not None and pending.args[:2] == ("release", "t2")
    assert codec.release_pending(held) is None                  # idempotent
    assert codec.renew_pending(held) is None                    # released: no renewal


# -- the same Redis options everywhere ----------------------------------------------------
CONFIGS = [BreakerConfig, BulkheadConfig, BudgetConfig, GaneshaConfig]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_validates_the_redis_options_alike(config: Any) -> None:
    built = config(redis_timeout=timedelta(milliseconds=500), redis_retry_max_backoff=2)
    assert (built.redis_timeout, built.redis_retry_max_backoff) == (0.5, 2.0)
    with pytest.raises(ValueError, match="redis_timeout must be > 0 seconds"):
        config(redis_timeout=0)
    with pytest.raises(ValueError, match="redis_retry_max_backoff"):
        config(redis_retry_max_backoff=-1)
    with pytest.raises(ValueError, match="redis_retry_max_backoff"):
        config(redis_retry_max_backoff="5 s later")


def test_ganesha_backs_off_as_configured() -> None:
    for backoff, retried_at_once in ((0.0, True), (5.0, False)):
        ganesha = GaneshaCore("svc", None, {"redis_retry_max_backoff": backoff})
        assert ganesha._pending("available").on_unavailable(ConnectionError("down")) is None
        assert (ganesha._health.retry_in() == 0.0) is retried_at_once
    with pytest.raises(TypeError, match="unknown ganesha option"):
        GaneshaCore("svc", None, {"backoff": 1})


def test_text_decodes_any_reply_element() -> None:
    assert text(b"OPEN") == "OPEN" and text("OPEN") == "OPEN" and text(3) == "3"
    assert text(b"\xff") == "\ufffd"                            # foreign bytes, shown
