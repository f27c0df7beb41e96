"""The adaptive limit's windows, driven through bulkhead.lua with synthetic reports.

A report of weight n (ARGV[11]) counts as n successes of its mean latency; the first
report opens the first window; a window closes once it holds 24 successes and has
lasted `window` ms; its mean latency is
compared with the no-load reference, which a standing queue cannot become. Windows are
10 ms here and each report waits 60 ms more than its own latency (after a cut the next
window opens once the old calls could leave), so the tests follow server time, never a
tight bound.
"""

from __future__ import annotations

import time

import redis

from distbreaker import AdaptiveLimit
from distbreaker._runtime.keys import BulkheadKeys
from distbreaker._runtime.scripts import load_script, run_script

SCRIPT = load_script("bulkhead")
WINDOW = 24   # MIN_SAMPLES in lua/bulkhead.lua


def _wire(**fields: object) -> str:
    return AdaptiveLimit(**{"min_limit": 1, "max_limit": 100, "initial_limit": 40,
                            "window": 0.01, "probe_interval": 3600, **fields}).wire()


def _report(client: redis.Redis, keys: BulkheadKeys, wire: str, latency: int,
            weight: int = WINDOW, outcome: str = "ok", retry_after: int = 0) -> dict[str, str]:
    """One acquire and one release reporting `weight` successes of `latency` ms, after
    waiting out the window and the latency (the calls started after the window opened)."""
    time.sleep((latency + 60) / 1000)
    args = (keys.leases, keys.meta, keys.notify)
    run_script(client, SCRIPT, args, ("acquire", "t", 200, 30_000, 3_600_000, 0, wire))
    run_script(client, SCRIPT, args, ("release", "t", 200, 30_000, 3_600_000, 0, wire,
                                      outcome, latency, retry_after, weight))
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}


def test_a_report_of_weight_n_counts_as_n_successes(name: str,
                                                    redis_client: redis.Redis) -> None:
    weighted, single = BulkheadKeys.build(f"{name}-w"), BulkheadKeys.build(f"{name}-s")
    wire = _wire(window=60)   # a window that stays open
    _report(redis_client, weighted, wire, 20, weight=4)
    for _ in range(4):
        _report(redis_client, single, wire, 20, weight=1)
    for keys in (weighted, single):
        meta = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.meta).items()}
        assert (meta["a_wn"], float(meta["a_wsum"])) == ("4", 80.0)


def test_a_standing_queue_never_becomes_the_reference(name: str,
                                                       redis_client: redis.Redis) -> None:
    keys, wire = BulkheadKeys.build(name), _wire()
    _report(redis_client, keys, wire, 10)                  # opens the first window
    meta = _report(redis_client, keys, wire, 10)           # closes it: no load
    assert float(meta["a_rtt_l"]) == 10.0 and meta["a_why"] == "no-load latency measured"
    meta = _report(redis_client, keys, wire, 40)           # 4x: far above, a fast cut
    assert float(meta["a_limit"]) == 20.0                   # x max(0.5, 10 / 40)
    assert meta["a_why"] == "latency far above the no-load level"
    limits, probed = [], False
    for _ in range(8):   # a queue that stays (12 ms), and drains at half the limit (probe)
        probing = float(meta["a_saved"]) > 0
        probed = probed or probing
        meta = _report(redis_client, keys, wire, 10 if probing else 12)
        if not probing and float(meta["a_saved"]) == 0:
            limits.append(float(meta["a_limit"]))
        assert float(meta["a_rtt_l"]) == 10.0               # the reference is kept
    assert probed        # slow start ended: a probe came five windows later
    assert limits[-1] < limits[0] and meta["a_why"] == "latency above the no-load level"


def test_the_latency_target_is_never_traded_away(name: str,
                                                 redis_client: redis.Redis) -> None:
    keys, wire = BulkheadKeys.build(name), _wire(latency_target=0.015, tolerance=10)
    _report(redis_client, keys, wire, 10)
    _report(redis_client, keys, wire, 10)
    meta = _report(redis_client, keys, wire, 30)            # within the tolerance of 10x
    assert meta["a_why"] == "latency above the target"
    assert float(meta["a_limit"]) == 20.0                    # x max(0.5, 15 / 30)


def test_a_probe_remeasures_the_reference_at_three_quarters_of_the_limit(
        name: str, redis_client: redis.Redis) -> None:
    # (50 ms windows: a window of 24 calls closes after three of them, 150 ms)
    keys, wire = BulkheadKeys.build(name), _wire(probe_interval=0.6, window=0.05)
    _report(redis_client, keys, wire, 20)
    _report(redis_client, keys, wire, 20)                   # reference 20 ms
    _report(redis_client, keys, wire, 80)                   # a cut ends slow start
    limit = float(redis_client.hget(keys.meta, "a_limit"))
    time.sleep(0.6)
    meta = _report(redis_client, keys, wire, 20)            # the probe starts
    assert meta["a_why"] == "measuring no-load latency"
    assert float(meta["a_limit"]) == limit * 0.75 and float(meta["a_saved"]) == limit
    time.sleep(0.03)       # the probe's window opens once the old calls could leave
    meta = _report(redis_client, keys, wire, 8)             # the dependency got faster
    assert meta["a_why"] == "measuring no-load latency"     # a probe needs 2 x 24 calls
    meta = _report(redis_client, keys, wire, 8)
    assert meta["a_why"] == "no-load latency re-measured"
    # averaged with the last reference: one window's noise moves it half as far
    assert float(meta["a_rtt_l"]) == 14.0 and float(meta["a_limit"]) == limit


def test_the_window_after_a_cut_confirms_nothing(name: str,
                                                 redis_client: redis.Redis) -> None:
    """Its calls may have waited behind the old limit's queue: only a second window above
    the tolerance (or one twice as far) cuts again."""
    # (the probe that follows the end of slow start comes five 50 ms windows later)
    keys, wire = BulkheadKeys.build(name), _wire(window=0.05)
    _report(redis_client, keys, wire, 10)
    _report(redis_client, keys, wire, 10)                   # reference 10 ms
    meta = _report(redis_client, keys, wire, 40)            # 4x: one cut, to 20
    assert float(meta["a_limit"]) == 20.0
    meta = _report(redis_client, keys, wire, 20)            # 2x, right after the cut
    assert float(meta["a_limit"]) == 20.0
    meta = _report(redis_client, keys, wire, 20)            # 2x again: confirmed
    assert meta["a_why"] == "latency far above the no-load level"
    assert float(meta["a_limit"]) == 10.0


def test_after_a_429_the_limit_follows_the_429s_not_the_latency(
        name: str, redis_client: redis.Redis) -> None:
    keys, wire = BulkheadKeys.build(name), _wire()
    _report(redis_client, keys, wire, 10)
    _report(redis_client, keys, wire, 10)
    _report(redis_client, keys, wire, 40)                   # ends slow start
    time.sleep(0.05)      # one decrease per window or last mean latency (40 ms)
    meta = _report(redis_client, keys, wire, 0, weight=1, outcome="429")
    assert meta["a_why"] == "overload (429)" and int(meta["a_429"]) > 0
    limit = float(meta["a_limit"])
    for _ in range(3):   # latency above the reference, within the tolerance: no cut
        meta = _report(redis_client, keys, wire, 13)
        # (a probe may halve it for one window: the limit it restores counts)
        assert max(float(meta["a_limit"]), float(meta["a_saved"])) >= limit
