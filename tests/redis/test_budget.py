"""The fleet-wide retry budget on a real redis-server (lua/budget.lua). Tests taking
`flavour` run with the sync and the asyncio RetryBudget."""

from __future__ import annotations

import time
import warnings

import pytest
import redis

from distbreaker.budget.config import BudgetConfig
from distbreaker.budget.sync import RetryBudget
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.errors import ConfigDriftWarning, RetryBudgetExhausted, SchemaError
from tests.helpers.budget_window import window
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import wait_until


def drain(budget: RetryBudget) -> int:
    """Withdraw until refused; how many were allowed."""
    taken = 0
    while budget.try_withdraw():
        taken += 1
    return taken


def test_100_requests_at_20_percent_allow_exactly_20_retries(redis_url: str, name: str,
                                                             flavour: Flavour) -> None:
    budget = flavour.budget(name, redis=redis_url, percent_can_retry=0.2, min_retries_per_sec=0)
    assert budget.balance() == 0 and not budget.try_withdraw()
    for _ in range(100):
        budget.deposit()
    assert budget.balance() == 20
    assert drain(budget) == 20
    with pytest.raises(RetryBudgetExhausted) as caught:
        budget.withdraw()
    assert caught.value.deposits == 100 and caught.value.withdrawals == 20
    assert budget.last_source == "redis"
    budget.reset()                            # a fresh window: nothing deposited yet
    assert budget.balance() == 0 and budget.deposit(5) == 1


def test_percentages_use_exact_integer_arithmetic(redis_url: str, name: str,
                                                   flavour: Flavour) -> None:
    budget = flavour.budget(name, redis=redis_url, percent_can_retry=0.29,
                            min_retries_per_sec=0)
    assert budget.deposit(100) == 29          # 0.29 * 100 is 28.999... in floating point


def test_the_floor_alone_allows_min_retries_per_sec_times_ttl(redis_url: str, name: str,
                                                              flavour: Flavour) -> None:
    budget = flavour.budget(name, redis=redis_url, percent_can_retry=0.2, min_retries_per_sec=2,
                            ttl=5)
    assert BudgetConfig(min_retries_per_sec=2, ttl=5).floor == 10
    assert budget.balance() == 10
    assert drain(budget) == 10
    assert budget.deposit(4) == 0             # floor(10 + 0.8) - 10
    assert budget.deposit() == 1 and budget.try_withdraw()


def test_balance_does_not_create_the_key(redis_url: str, redis_client: redis.Redis,
                                         name: str, flavour: Flavour) -> None:
    budget = flavour.budget(name, redis=redis_url)
    assert budget.balance() == 100            # defaults: 10/s * 10 s
    assert not redis_client.exists(budget.keys.slices)


def test_slices_expire_after_ttl(redis_url: str, redis_client: redis.Redis, name: str) -> None:
    # 3 s (0.3 s slices): each step has over a second of slack for a loaded machine
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=1.0, min_retries_per_sec=0,
                         ttl=3.0, slices=10)
    budget.deposit(4)
    assert budget.try_withdraw()
    time.sleep(1.5)
    assert budget.deposit(3) == 6             # 4 + 3 - 1, both slices live
    assert 0 < redis_client.pttl(budget.keys.slices) <= 3300
    time.sleep(1.8)                           # the first slice (4 in, 1 out) has left
    assert budget.balance() == 3
    time.sleep(2.1)
    assert budget.balance() == 0              # everything has left
    assert budget.deposit() == 1              # and the old withdrawal is forgotten too
    fields = window(redis_client, budget.keys.slices)
    assert sorted(f for f in fields if f[:2] in ("d:", "w:")) == sorted(
        f for f in fields if f.startswith("d:"))
    assert len([f for f in fields if f.startswith("d:")]) == 1


def test_memory_is_bounded_by_the_slice_count(redis_url: str, redis_client: redis.Redis,
                                              name: str) -> None:
    budget = RetryBudget(name, redis=redis_url, ttl=0.2, slices=4)   # 50 ms slices
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        budget.deposit()
        budget.try_withdraw()
        time.sleep(0.005)
    stored = window(redis_client, budget.keys.slices)
    slice_fields = [f for f in stored if f[:2] in ("d:", "w:")]
    assert len(slice_fields) <= 2 * 4
    assert stored["D"] == sum(v for k, v in stored.items() if k.startswith("d:"))
    assert stored["W"] == sum(v for k, v in stored.items() if k.startswith("w:"))
    time.sleep(0.35)
    assert not redis_client.exists(budget.keys.slices)   # PEXPIRE (n + 1) * slice


def test_batched_deposits_cost_no_round_trip_until_the_batch_is_full(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0.2, min_retries_per_sec=0,
                         deposit_batch=10)
    redis_client.config_resetstat()
    for _ in range(9):
        assert budget.deposit() is None
    assert not redis_client.exists(budget.keys.slices)
    assert budget.deposit() == 2                          # the 10th sends all ten
    for _ in range(5):
        budget.deposit()
    assert budget.try_withdraw()                          # carries the 5 pending deposits
    assert window(redis_client, budget.keys.slices)["D"] == 15
    budget.deposit(3)
    budget.flush()
    budget.flush()                                        # nothing pending: no call
    assert budget.balance() == 2                          # floor(0.2 * 18) - 1
    # one script call each (FCALL, or EVALSHA where Functions are unusable; a call that
    # failed, e.g. "Function not found" before the library was loaded, is not one):
    # the 10th deposit, withdraw, flush, balance
    stats = redis_client.info("commandstats")
    assert sum(stats[c]["calls"] - stats[c].get("failed_calls", 0)
               for c in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval") if c in stats) == 4


def test_script_rejects_bad_arguments(redis_client: redis.Redis) -> None:
    from distbreaker._runtime.scripts import load_script, run_script

    script = load_script("budget")
    good = ["200000", "0", "1000", "10"]
    for args in (["deposit", *good, "0"], ["deposit", *good, "1.5"],
                 ["withdraw", *good, "1", "-1"], ["balance", *good, "1", "x"],
                 ["steal", *good, "1"], ["balance", "200000", "0", "1000", "101", "1"]):
        with pytest.raises(ValueError, match="bad budget arguments"):
            run_script(redis_client, script, ["k"], args)
    # ARGV[6] is ignored by withdraw and balance (clients send 1): no deposit is made
    assert run_script(redis_client, script, ["k"], ["withdraw", *good, "5"])[2] == 0
    assert run_script(redis_client, script, ["k"], ["balance", *good, "1", "5"])[2] == 5


@pytest.mark.keys_without_ttl("it writes foreign keys by hand")
def test_foreign_data_is_a_schema_error(redis_url: str, redis_client: redis.Redis,
                                        name: str) -> None:
    budget = RetryBudget(name, redis=redis_url)
    redis_client.hset(budget.keys.slices, "x", "1")
    with pytest.raises(SchemaError, match="expected a string"):
        budget.deposit()
    redis_client.delete(budget.keys.slices)
    redis_client.set(budget.keys.slices, "not a budget window")
    with pytest.raises(SchemaError, match="corrupt budget fields"):
        budget.try_withdraw()
    assert redis_client.get(budget.keys.slices) == b"not a budget window"  # nothing written


def test_geometry_drift_warns_and_the_stored_window_wins(redis_url: str, name: str) -> None:
    first = RetryBudget(name, redis=redis_url, ttl=10, min_retries_per_sec=0)
    first.deposit(10)
    other = RetryBudget(name, redis=redis_url, ttl=20, min_retries_per_sec=0)
    with pytest.warns(ConfigDriftWarning, match="stored window"):
        assert other.deposit(10) == 4
    other.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert other.deposit(5) == 1


def test_redis_down_uses_a_local_budget_with_the_same_formula(name: str,
                                                              flavour: Flavour) -> None:
    budget = flavour.budget(name, redis=f"redis://127.0.0.1:{free_port()}/0",
                            percent_can_retry=0.5, min_retries_per_sec=1, ttl=3)
    assert budget.balance() == 3 and budget.last_source == "local"
    assert drain(budget) == 3
    assert budget.deposit(4) == 2 and drain(budget) == 2
    assert budget.last_source == "local"


def test_budget_goes_back_to_redis_when_it_returns(name: str, flavour: Flavour) -> None:
    with RedisServer() as server:
        budget = flavour.budget(name, redis=server.url, percent_can_retry=0,
                                min_retries_per_sec=1, ttl=5)
        assert drain(budget) == 5 and budget.last_source == "redis"
        server.kill()
        assert budget.try_withdraw() and budget.last_source == "local"   # fresh local floor
        server.start()

        def back_on_redis() -> bool:
            budget.balance()
            return budget.last_source == "redis"

        wait_until(back_on_redis, interval=0.05, what="the budget reads Redis again")
        assert budget.balance() == 5                  # a restarted Redis lost the window
