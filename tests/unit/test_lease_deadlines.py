"""The lease deadline decisions of the cores, on a fake clock: a probe's lease runs
from when its acquire was sent for the governing `half_open_lease` (the stored
config's when it drifts); a bulkhead permit's from its acquire or last renewal."""

from __future__ import annotations

from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import BreakerCodec, Permit, Reply
from distbreaker.breaker.state import State
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec, BulkheadPermit
from distbreaker.errors import BulkheadFull, CallNotPermitted


def reply(state: State, drift: bool = False, stored: str = "") -> Reply:
    return Reply(state=state, wait_ms=0, permitted=True, transitions=(), calls=0, failures=0,
                 slow=0, total_ms=0, rejected=0, drift=drift, stored_config=stored, now_ms=1,
                 since_ms=0, probes_in_flight=1)


def test_a_probe_lease_runs_from_the_send_time_for_this_process_half_open_lease() -> None:
    codec = BreakerCodec("dep", BreakerConfig(half_open_lease=2.0))
    permit = codec.admission(reply(State.HALF_OPEN), "tok", sent_at=100.0)
    assert permit == Permit("tok", 102.0)
    assert codec.expired_lease(permit, 101.999) is None
    rejection = codec.expired_lease(permit, 102.0)
    assert isinstance(rejection, CallNotPermitted)
    assert (rejection.state, rejection.reason) == (State.HALF_OPEN,
                                                   "probe lease expired before the call")
    assert codec.not_permitted == 1


def test_a_drifting_reply_uses_the_stored_config_lease() -> None:
    codec = BreakerCodec("dep", BreakerConfig(half_open_lease=60.0))
    stored = BreakerConfig(half_open_lease=0.5).to_wire()
    permit = codec.admission(reply(State.HALF_OPEN, drift=True, stored=stored), "tok", 10.0)
    assert permit.lease_deadline == 10.5


def test_permits_outside_half_open_have_no_lease() -> None:
    codec = BreakerCodec("dep", BreakerConfig(half_open_lease=0.1))
    permit = codec.admission(reply(State.CLOSED), "tok", sent_at=1.0)
    assert permit == Permit()
    assert codec.expired_lease(permit, 1e9) is None


def test_a_bulkhead_lease_runs_from_the_acquire_or_the_last_renewal() -> None:
    codec = BulkheadCodec("db", BulkheadConfig(max_concurrent_calls=3, lease=1.0))
    permit = BulkheadPermit("tok", acquired_at=50.0)
    assert codec.expired_lease(permit, 50.9) is None
    permit.renewed_at = 50.5
    assert codec.expired_lease(permit, 51.4) is None
    refusal = codec.expired_lease(permit, 51.5)
    assert isinstance(refusal, BulkheadFull) and refusal.reason
    assert permit.expired
    assert codec.expired_lease(BulkheadPermit("", local=True, acquired_at=0.0), 1e9) is None
