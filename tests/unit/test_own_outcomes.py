"""A worker's own recent outcomes (quorum trip): only they may open its own view, so a
healthy worker is never rejected for other workers' failures."""

from __future__ import annotations

from distbreaker import BreakerConfig
from distbreaker.breaker.core import OwnOutcomes


def test_a_count_window_of_own_outcomes_needs_the_minimum_and_the_rate() -> None:
    own = OwnOutcomes(BreakerConfig(sliding_window_size=4, minimum_number_of_calls=3,
                                    failure_rate_threshold=50))
    own.add(1, 1, 0, 0.0)
    own.add(1, 1, 0, 0.0)
    assert not own.exceeded(0.0)          # 2 calls: below the minimum
    own.add(0, 1, 0, 0.0)
    assert own.exceeded(0.0)              # 2 of 3 failed
    own.add(0, 2, 0, 0.0)                 # a batch of two successes: the oldest left
    assert not own.exceeded(0.0)          # 1 of 4 failed: 25 %
    own.add(1, 1, 0, 0.0)
    own.add(1, 1, 0, 0.0)
    assert own.exceeded(0.0)              # 2 of the last 4: 50 %


def test_a_healthy_worker_never_exceeds() -> None:
    own = OwnOutcomes(BreakerConfig(sliding_window_size=10, minimum_number_of_calls=5))
    for _ in range(50):
        own.add(0, 1, 0, 0.0)
    assert not own.exceeded(0.0)


def test_a_time_window_of_own_outcomes_forgets_old_seconds() -> None:
    own = OwnOutcomes(BreakerConfig(sliding_window_type="TIME_BASED", sliding_window_size=2,
                                    minimum_number_of_calls=2, failure_rate_threshold=50))
    own.add(2, 2, 0, 100.2)
    assert own.exceeded(100.9)
    assert own.exceeded(101.5)            # second 100 is still within 2 s
    assert not own.exceeded(102.0)        # gone
    own.add(0, 1, 1, 102.1)
    own.add(0, 1, 0, 102.2)
    assert not own.exceeded(102.3)        # slow 1 of 2 = 50 % < 100 % (default)
