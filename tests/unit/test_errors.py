"""distbreaker's exceptions: what they carry, and that they survive pickling
(multiprocessing, Celery result backends)."""

from __future__ import annotations

import pickle

import pytest

from distbreaker.breaker.state import State
from distbreaker.errors import (
    BulkheadFull,
    CallNotPermitted,
    DistbreakerError,
    RequestNotPermitted,
    RetryBudgetExhausted,
    SchemaError,
)


@pytest.mark.parametrize("error", [
    CallNotPermitted("payments", State.OPEN, 12.5, reason="tripped"),
    BulkheadFull("payments", 3, 3, waited=0.5, local=True),
    BulkheadFull("payments", 3, -1, reason="permit lease expired before the call"),
    RetryBudgetExhausted("payments", balance=0, deposits=10, withdrawals=2),
    RequestNotPermitted("llm", 300, 1.25, local=True, reason="local fallback limit"),
    SchemaError("foreign data", key="distbreaker:v1:{payments}:cb"),
])
def test_round_trip_keeps_type_message_and_attributes(error: Exception) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_bulkhead_full_carries_name_limit_and_in_use() -> None:
    error = BulkheadFull("dep", 3, 3)
    assert isinstance(error, DistbreakerError)
    assert (error.name, error.limit, error.in_use) == ("dep", 3, 3)
