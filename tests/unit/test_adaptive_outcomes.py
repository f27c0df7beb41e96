"""What a finished call reports to an adaptive bulkhead limit (bulkhead/adaptive.py)."""

from __future__ import annotations

import asyncio

import pytest

from distbreaker import AdaptiveLimit, BulkheadFull, CallNotPermitted, HttpStatusError, Overloaded
from distbreaker.bulkhead.adaptive import SuccessBatch, outcome_of, priority_level, priority_share


class _Response:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code, self.headers = status, headers


class _ClientError(Exception):
    """Shaped like an httpx/requests HTTP error: the response carries status and headers."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.response = _Response(status, headers)


@pytest.mark.parametrize("error,expected", [
    (None, ("ok", 0)),
    (RuntimeError("boom"), ("drop", 0)),
    (TimeoutError(), ("drop", 0)),
    (Overloaded(retry_after=2.5), ("429", 2500)),
    (HttpStatusError(429, {"Retry-After": "3"}), ("429", 3000)),
    (_ClientError(429, {"Retry-After": "7"}), ("429", 7000)),
    (_ClientError(429, {}), ("429", 0)),
    (_ClientError(503, {"Retry-After": "7"}), ("drop", 0)),
    (BulkheadFull("x", 1, 1, 0.0), ("", 0)),
    (CallNotPermitted("x", "OPEN", 1.0), ("", 0)),
    (asyncio.CancelledError(), ("", 0)),
    (KeyboardInterrupt(), ("", 0)),
])
def test_outcomes(error: BaseException | None, expected: tuple[str, int]) -> None:
    assert outcome_of(error) == expected


def test_priorities_and_shares() -> None:
    assert [priority_level(p) for p in ("critical", "normal", "sheddable", 0, 5)] == [0, 1, 2,
                                                                                    0, 5]
    assert priority_share(0, 0.1, 0.7) == 1_000_000
    assert priority_share(1, 0.1, 0.7) == 900_000
    assert priority_share(2, 0.1, 0.7) == 700_000
    assert priority_share(2, 0.5, 0.7) == 500_000  # never above normal's share
    for bad in ("urgent", -1, 1.5, True):
        with pytest.raises(ValueError, match="priority"):
            priority_level(bad)  # type: ignore[arg-type]


def test_adaptive_limit_validates_and_builds_its_wire() -> None:
    assert AdaptiveLimit(min_limit=2, max_limit=40).wire() == \
        "2,40,8,900000,1500000,500000,0,10000,200"
    assert AdaptiveLimit(latency_target=0.2, probe_interval=5, window=0.1).wire().endswith(
        ",200,5000,100")
    with pytest.raises(ValueError, match="latency_target"):
        AdaptiveLimit(latency_target=0)
    assert AdaptiveLimit.build({"min_limit": 3}) == AdaptiveLimit(min_limit=3)
    with pytest.raises(ValueError, match="max_limit"):
        AdaptiveLimit(min_limit=5, max_limit=4)
    with pytest.raises(ValueError, match="backoff_ratio"):
        AdaptiveLimit(backoff_ratio=1.5)
    with pytest.raises(TypeError, match="unknown adaptive option"):
        AdaptiveLimit.build({"min": 1})


def test_successes_are_reported_in_batches_of_their_count_and_mean_latency() -> None:
    limit = AdaptiveLimit(sample_rate=0.25)
    assert limit.batch == 4 and AdaptiveLimit(sample_rate=1.0).batch == 1
    batch = SuccessBatch(limit.batch)
    assert [batch.add(ms) for ms in (10, 20, 30)] == [None, None, None]
    assert batch.add(40) == (4, 25)                   # every success counted, none lost
    batch.put_back(4, 25)                             # a report Redis did not get
    assert batch.add(50) == (5, 30)                   # goes with the next one
    with pytest.raises(ValueError, match="sample_rate"):
        AdaptiveLimit(sample_rate=0)
