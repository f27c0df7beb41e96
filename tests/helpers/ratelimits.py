"""What the rate limiter's fleet and interop tests share: the log every permitted call
writes, and the exact check of lua/ratelimiter.lua's guarantee on it.

Each permitted call appends ``run_at_ms,weight,ran_ms`` to a Redis list with one
atomic script (`LOG`): the reservation's server run time, its permits, and the server
time it actually ran. The guarantee: for any two logged calls i <= j (by run time) the
permits of calls i..j total at most ``burst + (run_j - run_i + 2 ms) * limit / period``
(2 ms: run times are the server clock's milliseconds, the script works in µs), and no
call ran before its run time.
"""

from __future__ import annotations

from typing import Any

#: KEYS[1] the log; ARGV[1] "run_at_ms,weight": appends "run_at_ms,weight,ran_ms".
LOG = """local t = redis.call('TIME')
local ran = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('RPUSH', KEYS[1], ARGV[1] .. ',' .. string.format('%d', ran))"""


def read_log(client: Any, log: str) -> list[tuple[int, int, int]]:
    """(run_at_ms, weight, ran_ms) of every logged call."""
    out = []
    for raw in client.lrange(log, 0, -1):
        at, weight, ran = (int(x) for x in (raw.decode() if isinstance(raw, bytes)
                                            else raw).split(","))
        out.append((at, weight, ran))
    return out


def violations(entries: list[tuple[int, int, int]], limit: int, period_ms: int,
               burst: int) -> list[str]:
    """Every (i, j) whose permits exceed the guarantee, and every call that ran early."""
    runs = sorted(entries)
    found = [f"ran at {ran} before its run time {at}" for at, _, ran in runs if ran < at]
    for i in range(len(runs)):
        total = 0
        for j in range(i, len(runs)):
            total += runs[j][1]
            allowed = burst + (runs[j][0] - runs[i][0] + 2) * limit / period_ms
            if total > allowed:
                found.append(f"calls {i}..{j}: {total} permits in "
                             f"{runs[j][0] - runs[i][0]} ms, allowed {allowed:.1f}")
                break
    return found


def busiest_period(entries: list[tuple[int, int, int]], period_ms: int) -> int:
    """The most permits whose run times fall within one period (evidence that the limit,
    not the callers, was the bottleneck)."""
    runs = sorted(entries)
    return max((sum(w for at, w, _ in runs[i:] if at < runs[i][0] + period_ms)
                for i in range(len(runs))), default=0)
