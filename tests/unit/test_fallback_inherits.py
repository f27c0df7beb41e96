"""The local fallback starts from the last fleet state the process saw (issue 23): the
seed each known state becomes, and a known OPEN kept through an outage (the local
fallback is the in-process fakeredis: no Redis server here)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from distbreaker._runtime.local import LOCAL_RUNTIME
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import BreakerCodec, BreakerCore, Step, decode_reply
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted

NOW_MS = 1_700_000_000_000


def reply(state: str, permitted: bool, wait_ms: int = 0) -> list[Any]:
    return [state.encode(), wait_ms, int(permitted), [], 0, 0, 0, 0, 0, 0, b"", NOW_MS,
            NOW_MS, 0]


def seen(codec: BreakerCodec, state: str, wait_ms: int = 0) -> BreakerCodec:
    codec.apply(decode_reply(reply(state, state != "OPEN", wait_ms)), time.monotonic())
    codec.forget_view()  # Redis became unreachable
    return codec


@pytest.mark.parametrize(("state", "wait_ms", "target", "hold_ms"), [
    ("OPEN", 30_000, "TRIP", (29_000, 30_000)),   # the wait that was left
    ("OPEN", 0, "TRIP", (1, 1)),                  # its wait over: probes next
    ("HALF_OPEN", 0, "TRIP", (1, 1)),
    ("FORCED_OPEN", 0, "FORCED_OPEN", None),
    ("DISABLED", 0, "DISABLED", None),
    ("METRICS_ONLY", 0, "METRICS_ONLY", None),
])
def test_each_known_state_seeds_the_local_breaker(state: str, wait_ms: int, target: str,
                                                  hold_ms: tuple[int, int] | None) -> None:
    codec = seen(BreakerCodec("dep", BreakerConfig()), state, wait_ms)
    seed = codec.seed_call(time.monotonic())
    assert seed is not None and seed.args[0] == "set" and seed.args[5] == target
    if hold_ms is None:
        assert len(seed.args) == 8  # no hold: kept until an operator changes it
    else:
        assert hold_ms[0] <= int(seed.args[8]) <= hold_ms[1]


@pytest.mark.parametrize("state", ["CLOSED", None])
def test_closed_or_unknown_starts_a_fresh_local_breaker(state: str | None) -> None:
    codec = BreakerCodec("dep", BreakerConfig())
    if state is not None:
        seen(codec, state)
    assert codec.seed_call(time.monotonic()) is None


def test_a_known_open_is_kept_by_the_local_fallback_after_the_view_expires() -> None:
    assert LOCAL_RUNTIME.wait(60)
    breaker = BreakerCore(f"inherit-{time.monotonic_ns()}", None, "distbreaker",
                          {"revalidate_interval": 0.01, "wait_duration_in_open_state": 60})
    step = breaker._acquire_step()
    assert step.call is not None
    with pytest.raises(CallNotPermitted):
        step.call.on_reply(reply("OPEN", False, wait_ms=60_000))
    time.sleep(0.02)  # the view is re-checked: Redis is asked, and is gone
    step = breaker._acquire_step()
    assert step.step is Step.ACQUIRE and step.call is not None
    for _ in range(3):
        with pytest.raises(CallNotPermitted) as rejected:
            step.call.on_unavailable(ConnectionError("down"))
        assert rejected.value.state is State.OPEN
        assert rejected.value.retry_after > 50  # the wait it knew, not a fresh one
