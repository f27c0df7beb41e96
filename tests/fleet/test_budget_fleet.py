"""The retry budget shared by real (spawned) processes: the fleet's retries never exceed
the percentage of its requests plus the floor."""

from __future__ import annotations

import multiprocessing
import time

import redis

from distbreaker.budget.sync import RetryBudget
from tests.helpers.budget_window import window


def _fleet_worker(url: str, name: str, start: float, rounds: int) -> int:
    # (a generous redis_timeout: every call must reach Redis on a loaded machine too)
    budget = RetryBudget(name, redis=url, percent_can_retry=0.2, min_retries_per_sec=1, ttl=10,
                         redis_timeout=5.0)
    while time.time() < start:
        time.sleep(0.001)
    taken = 0
    for _ in range(rounds):
        budget.deposit()
        taken += budget.try_withdraw()
        taken += budget.try_withdraw()
    assert budget.last_source == "redis"
    return taken


def test_fleet_wide_retries_never_exceed_percent_of_requests_plus_floor(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    rounds, workers = 150, 4
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0
    with ctx.Pool(workers) as pool:
        taken = pool.starmap(_fleet_worker, [(redis_url, name, start, rounds)] * workers)
    deposits = rounds * workers
    allowance = int(1 * 10 + 0.2 * deposits)              # floor 10 + 20 % of 600 = 130
    assert sum(taken) <= allowance
    assert min(taken) > 0                                  # every worker got some
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0.2, min_retries_per_sec=1,
                         ttl=10, redis_timeout=5.0)
    left = 0
    while budget.try_withdraw():
        left += 1
    assert sum(taken) + left == allowance                  # nothing lost, nothing extra
    stored = window(redis_client, budget.keys.slices)
    assert stored["D"] == deposits and stored["W"] == allowance
