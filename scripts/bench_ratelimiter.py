#!/usr/bin/env python3
"""The fleet-wide rate limiter against the `limits` library's Redis moving window.

One run, the same scenarios for both, side by side:

- **calls/s**: ``--calls`` sequential calls from one client (``--threads`` 1) or from
  ``--threads`` threads of one process, against a plain ``redis-server`` (a fresh one,
  or ``--url`` / ``$REDIS_URL``); wall-clock, so it depends on the machine and its load;
- **Redis instructions per permit**: the same calls against a ``redis-server`` under
  valgrind's callgrind, counted exactly as ``scripts/bench.py --redis-cost`` counts them
  (scripts/bench_redis_cost.py: collected in the read handler and the reply writer
  only), divided by the permits the calls took. ``--no-cost`` skips it (no valgrind).

Scenarios (a limit of ``--limit`` permits per minute for both, so no measured call
waits or is refused unless the scenario says so):

- ``granted``: one permit per call;
- ``weighted``: ``--weight`` permits per call (LLM tokens): distbreaker
  ``acquire(permits=n)``, limits ``hit(..., cost=n)``;
- ``refused``: a limiter that is full (a limit of 1 per hour, already taken):
  distbreaker ``try_acquire(timeout=0)``, limits ``hit()`` answering False.

What differs besides cost: distbreaker decides on Redis time and can make a caller
wait (reserving its place); ``limits`` decides on the client's clock and cannot wait
(a caller polls ``get_window_stats``); its moving window keeps one list element per
permit (``LPUSH`` n copies, ``LTRIM`` to the limit), distbreaker one timestamp.

    .venv/bin/python scripts/bench_ratelimiter.py [--calls 2000] [--threads 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from distbreaker import RateLimiter
from distbreaker.demo.embedded import bench_redis

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import bench_redis_cost  # this folder: callgrind server, counting client, measure()

SCENARIOS = ("granted", "weighted", "refused")
IMPLEMENTATIONS = ("distbreaker", "limits")


def make_calls(client: redis.Redis, url: str, tag: str, limit: int,
               weight: int) -> dict[tuple[str, str], tuple[Callable[[], Any], int]]:
    """(implementation, scenario) -> (one call, permits it takes)."""
    import limits
    import limits.storage
    import limits.strategies

    storage = limits.storage.RedisStorage(url, connection_pool=client.connection_pool)
    window = limits.strategies.MovingWindowRateLimiter(storage)
    per_minute = limits.RateLimitItemPerMinute(limit)
    full = limits.RateLimitItemPerHour(1)

    def ours(name: str, **config: Any) -> RateLimiter:
        return RateLimiter(f"{tag}-{name}", redis=client, timeout_duration=0, **config)

    granted = ours("granted", limit_for_period=limit, limit_refresh_period=60)
    weighted = ours("weighted", limit_for_period=limit, limit_refresh_period=60)
    refused = ours("refused", limit_for_period=1, limit_refresh_period=3600)
    refused.acquire()
    window.hit(full, tag, "refused")
    return {
        ("distbreaker", "granted"): (granted.acquire, 1),
        ("limits", "granted"): (lambda: window.hit(per_minute, tag, "granted"), 1),
        ("distbreaker", "weighted"): (lambda: weighted.acquire(weight), weight),
        ("limits", "weighted"): (lambda: window.hit(per_minute, tag, "weighted", cost=weight),
                                 weight),
        ("distbreaker", "refused"): (lambda: refused.try_acquire(timeout=0), 0),
        ("limits", "refused"): (lambda: window.hit(full, tag, "refused"), 0),
    }


def throughput(url: str, calls: int, threads: int, limit: int,
               weight: int) -> dict[tuple[str, str], float]:
    """Calls per second of each (implementation, scenario), interleaved twice (best kept)."""
    client = redis.Redis.from_url(url, socket_timeout=5, max_connections=threads + 8)
    tag = f"rl-tp-{secrets.token_hex(3)}"
    table = make_calls(client, url, tag, limit, weight)
    best: dict[tuple[str, str], float] = {}
    for _round in range(2):
        for key, (call, _permits) in table.items():
            for _ in range(20):  # warm up (connections, scripts loaded)
                call()
            per_thread = max(1, calls // threads)

            def run(call: Callable[[], Any] = call, n: int = per_thread) -> None:
                for _ in range(n):
                    call()

            workers = [threading.Thread(target=run) for _ in range(threads)]
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            rate = per_thread * threads / (time.perf_counter() - started)
            best[key] = max(best.get(key, 0.0), rate)
        # a new minute for the granted scenarios would need a new tag: the limit is large
    return best


def instructions(calls: int, limit: int, weight: int,
                 binary: str) -> dict[tuple[str, str], float]:
    """Server instructions per permit (per call for the refused scenario), callgrind."""
    bench_redis_cost.ensure_valgrind()
    with bench_redis_cost.CallgrindServer(binary) as server:
        client = bench_redis_cost.counting_client(server.url)
        table = make_calls(client, server.url, f"rl-cost-{secrets.token_hex(3)}", limit,
                           weight)
        scenarios = [bench_redis_cost.CostScenario(f"{impl}/{scen}", f"{impl} {scen}", call)
                     for (impl, scen), (call, _) in table.items()]
        results = bench_redis_cost.measure(scenarios, server, calls, 2, warm_up=20)
    out = {}
    for m, ((impl, scen), (_, permits)) in zip(results, table.items(), strict=True):
        per_call = m.per_call()
        if per_call is not None:
            out[(impl, scen)] = per_call / max(1, permits)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis for the calls/s part (default: $REDIS_URL, "
                        "else a fresh redis-server)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per scenario (calls/s)")
    parser.add_argument("--cost-calls", type=int, default=200,
                        help="calls per batch under callgrind (2 batches)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=1_000_000,
                        help="permits per minute (no measured call is refused)")
    parser.add_argument("--weight", type=int, default=100, help="permits per weighted call")
    parser.add_argument("--server-binary", default="redis-server")
    parser.add_argument("--no-cost", action="store_true", help="skip callgrind")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    try:
        import limits  # noqa: F401
    except ImportError:
        raise SystemExit("the bench needs `limits`: pip install 'distbreaker[bench]'") from None
    with bench_redis(options.url) as (url, where):
        rates = throughput(url, options.calls, options.threads, options.limit, options.weight)
    cost = {} if options.no_cost else instructions(options.cost_calls, options.limit,
                                                   options.weight, options.server_binary)
    rows = [{"scenario": scen, "implementation": impl,
             "calls_per_s": round(rates[(impl, scen)]),
             "instructions_per_permit": (None if (impl, scen) not in cost
                                         else round(cost[(impl, scen)]))}
            for scen in SCENARIOS for impl in IMPLEMENTATIONS]
    if options.json:
        print(json.dumps({"redis": where, "threads": options.threads, "weight": options.weight,
                          "rows": rows}, indent=2))
        return 0
    print(f"rate limiter bench: redis {where}, {options.threads} thread(s), weighted calls "
          f"take {options.weight} permits; instructions per call for 'refused'")
    header = f"{'scenario':10} {'implementation':14} {'calls/s':>9} {'instr/permit':>13}"
    print(header)
    print("-" * len(header))
    for r in rows:
        instr = r["instructions_per_permit"]
        print(f"{r['scenario']:10} {r['implementation']:14} {r['calls_per_s']:9,d} "
              f"{'-' if instr is None else f'{instr:,}':>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
