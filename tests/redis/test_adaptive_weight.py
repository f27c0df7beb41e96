"""A sampled success report (bulkhead.lua ARGV[11], the weight) moves an adaptive limit's
latency averages as that many reports of the same latency do."""

from __future__ import annotations

import redis

from distbreaker import AdaptiveLimit
from distbreaker._runtime.keys import BulkheadKeys
from distbreaker._runtime.scripts import load_script, run_script

LIMIT = AdaptiveLimit(min_limit=1, max_limit=50, initial_limit=10).wire()
SCRIPT = load_script("bulkhead")


def _release(client: redis.Redis, keys: BulkheadKeys, token: str, latency: int,
             weight: int | None = None) -> None:
    run_script(client, SCRIPT, (keys.leases, keys.meta, keys.notify),
               ("acquire", token, 25, 30_000, 3_600_000, 0, LIMIT))
    tail = () if weight is None else (weight,)
    run_script(client, SCRIPT, (keys.leases, keys.meta, keys.notify),
               ("release", token, 25, 30_000, 3_600_000, 0, LIMIT, "ok", latency, 0, *tail))


def _averages(client: redis.Redis, keys: BulkheadKeys) -> tuple[float, float]:
    short, long = client.hmget(keys.meta, ["a_rtt_s", "a_rtt_l"])
    return float(short), float(long)


def test_one_report_of_weight_four_moves_the_averages_as_four_reports(
        name: str, redis_client: redis.Redis) -> None:
    weighted, single = BulkheadKeys.build(f"{name}-w"), BulkheadKeys.build(f"{name}-s")
    for keys in (weighted, single):
        _release(redis_client, keys, "seed", 10)          # seeds both averages at 10 ms
        assert _averages(redis_client, keys) == (10.0, 10.0)
    _release(redis_client, weighted, "w", 20, weight=4)
    for i in range(4):
        _release(redis_client, single, f"s{i}", 20)
    short, long = _averages(redis_client, weighted)
    assert (short, long) == _averages(redis_client, single)
    assert short == round(20 - 10 * 0.9 ** 4, 3)          # 1 - 0.9^4 of the way to 20
    assert long == round(20 - 10 * 0.99 ** 4, 3)
