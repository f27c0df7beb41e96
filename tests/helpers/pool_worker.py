"""A worker process of the pool fleet tests: picks members of a simulated pool and records
how each call went (module level: spawn needs an importable target)."""

from __future__ import annotations

import time
from typing import Any

from distbreaker import Pool

MEMBERS = [f"m{i}" for i in range(10)]
#: The cap scenario: 6 of 10 members bad, at most 50 % ejected; ejections short, so the
#: bad members go round ejection, probes and ejection again many times while the workers
#: race for the last slot; the interval rules (success rate, failure percentage) too.
CAP = {"members": MEMBERS, "max_ejection_percent": 50, "consecutive_5xx": 2,
       "base_ejection_time": 0.15, "max_ejection_time": 0.3, "interval": 0.25,
       "success_rate_request_volume": 5, "failure_percentage_request_volume": 5,
       "enforcing_failure_percentage": 100, "healthy_panic_threshold": 40,
       "probe_calls": 1, "redis_timeout": 5.0}


def run_for(url: str, name: str, bad: list[str], start_at: float, seconds: float,
            results: Any) -> None:
    """Pick and record for `seconds` from wall-clock `start_at`: a call to a `bad` member
    answers 500, the others 200. Reports (calls, calls to bad members, picks made locally)."""
    pool = Pool(name, url, **CAP)
    while time.time() < start_at:
        time.sleep(0.005)
    calls = to_bad = local = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pick = pool.pick()
        calls += 1
        to_bad += pick.member in bad
        local += pick.source != "redis"
        pool.record(pick, status=500 if pick.member in bad else 200, duration=0.001)
    pool.close()
    results.put((calls, to_bad, local))
