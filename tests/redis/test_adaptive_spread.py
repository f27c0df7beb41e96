"""The adaptive limit measures each window's spread and reads no queue into its noise.

Each report carries a count and a mean; the script keeps the sum of count x mean^2
and the number of reports, so a window knows the standard error of its own mean
(PHP's single calls and Python's batches alike). A window whose mean is above the
no-load reference by less than that is no queue: heavy-tailed latency does not trim
the limit, while the same mean from calls that agree does. Windows are 0.5 s here and
the reports wait out their own latency, so the tests follow server time.
"""

from __future__ import annotations

import time

import redis

from distbreaker import AdaptiveLimit
from distbreaker._runtime.keys import BulkheadKeys
from distbreaker._runtime.scripts import load_script, run_script

SCRIPT = load_script("bulkhead")
WIRE = AdaptiveLimit(min_limit=1, max_limit=100, initial_limit=40, window=0.5,
                     probe_interval=3600).wire()


def _report(client: redis.Redis, keys: BulkheadKeys, latency: int, weight: int,
            outcome: str = "ok", wait: float = 0.0) -> dict[str, str]:
    """After `wait` s and the latency, one acquire and one release reporting `weight`
    successes of mean `latency` ms (or a failure)."""
    time.sleep(wait + latency / 1000)
    args = (keys.leases, keys.meta, keys.notify)
    run_script(client, SCRIPT, args, ("acquire", "t", 200, 30_000, 3_600_000, 0, WIRE))
    run_script(client, SCRIPT, args, ("release", "t", 200, 30_000, 3_600_000, 0, WIRE,
                                      outcome, latency, 0, weight))
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}


def _window_at(client: redis.Redis, keys: BulkheadKeys, means: list[int]) -> dict[str, str]:
    """Reference 100 ms, slow start ended by a failure (limit 36), then one window of
    24 successes reported 4 at a time with the given means."""
    _report(client, keys, 100, 24)                            # opens the first window
    meta = _report(client, keys, 100, 24, wait=0.55)           # closes it
    assert float(meta["a_rtt_l"]) == 100.0
    meta = _report(client, keys, 0, 1, outcome="drop")         # x 0.9, slow start over
    assert float(meta["a_limit"]) == 36.0
    for mean in means[:-1]:
        meta = _report(client, keys, mean, 4, wait=0.01)
    assert int(meta["a_wk"]) == len(means) - 1                # the window is still open
    return _report(client, keys, means[-1], 4, wait=0.2)       # lasted 0.5 s: it closes


def test_a_window_within_its_own_noise_is_no_queue(name: str,
                                                   redis_client: redis.Redis) -> None:
    # mean 115 ms, 15 % above the reference; reports of 60 and 170 ms: a standard
    # error of ~25 ms (sd ~120 ms over 24 calls), so the 15 ms are noise
    meta = _window_at(redis_client, BulkheadKeys.build(name), [60, 170] * 3)
    assert float(meta["a_rtt_s"]) == 115.0
    assert float(meta["a_limit"]) == 36.0 and meta["a_why"] == "failure or timeout"
    assert (meta["a_wn"], meta["a_wsq"], meta["a_wk"]) == ("0", "0", "0")  # a new window


def test_the_same_mean_from_calls_that_agree_is_a_queue(name: str,
                                                       redis_client: redis.Redis) -> None:
    meta = _window_at(redis_client, BulkheadKeys.build(name), [115] * 6)
    assert float(meta["a_rtt_s"]) == 115.0
    # the queue 36 x (1 - 100 / 115) = 4.7 is above the hold (1.08): half the excess off
    assert meta["a_why"] == "latency above the no-load level"
    assert 34.0 < float(meta["a_limit"]) < 35.0


def test_single_reports_measure_the_spread_too(name: str,
                                               redis_client: redis.Redis) -> None:
    """PHP reports every success alone (weight 1): the same sums."""
    keys = BulkheadKeys.build(name)
    _report(redis_client, keys, 10, 1)                         # opens the first window
    for latency in (20, 40):
        meta = _report(redis_client, keys, latency, 1)
    assert (meta["a_wn"], meta["a_wsum"], meta["a_wsq"], meta["a_wk"]) == \
        ("3", "70", "2100", "3")
