#!/usr/bin/env python3
"""Memory per breaker in Redis (MEMORY USAGE of every key), for docs/OPERATIONS.md.

Usage: python scripts/measure_memory.py [REDIS_URL] [--window N] [--trips N] [--json]
(default: an embedded redis-server, a window of 100, 10 trips).

Every key of the breaker's key schema (`BreakerKeys`, the pub/sub channel aside) is
measured, so a key added to or renamed in the schema is measured too, not missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys
from distbreaker.demo.embedded import RedisServer


def key_sizes(client: redis.Redis, keys: BreakerKeys) -> dict[str, int]:
    """Bytes of each of the breaker's keys (0: the key does not exist)."""
    return {field.name: int(client.memory_usage(getattr(keys, field.name)) or 0)
            for field in dataclasses.fields(keys) if field.name != "channel"}


def measure(url: str, window: int, trips: int) -> list[dict[str, Any]]:
    """One row per breaker shape: what it is, its keys' bytes and their total."""
    client = redis.Redis.from_url(url)
    rows = []
    breakers: list[CircuitBreaker] = []
    try:
        def row(what: str, breaker: CircuitBreaker) -> None:
            sizes = key_sizes(client, breaker.keys)
            rows.append({"breaker": what, "keys": sizes, "bytes": sum(sizes.values())})

        count = CircuitBreaker("mem-count", redis=url, sliding_window_size=window,
                               subscribe=False)
        breakers.append(count)
        for _ in range(window):
            count.call(lambda: None)
        row(f"COUNT window of {window}, idle (full window)", count)

        timed = CircuitBreaker("mem-time", redis=url, sliding_window_type="TIME_BASED",
                               sliding_window_size=60, subscribe=False)
        breakers.append(timed)
        timed.call(lambda: None)
        row("TIME window of 60 s, one call", timed)

        tripped = CircuitBreaker("mem-tripped", redis=url, sliding_window_size=window,
                                 subscribe=False)
        breakers.append(tripped)
        for _ in range(window):
            tripped.call(lambda: None)
        for _ in range(trips):
            tripped.trip()
            tripped.reset()
        tripped.trip()
        row(f"COUNT {window}, tripped, {2 * trips + 1} history entries", tripped)
    finally:
        for breaker in breakers:
            breaker.close()
        client.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", help="Redis URL (default: an embedded redis-server)")
    parser.add_argument("--window", type=int, default=100, help="count window size")
    parser.add_argument("--trips", type=int, default=10, help="trip/reset cycles")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        server = RedisServer().start()
        url = server.url
    try:
        rows = measure(url, args.window, args.trips)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        detail = ", ".join(f"{k} {v}" for k, v in r["keys"].items())
        print(f"{r['breaker']:45s} {r['bytes']:6d} bytes  ({detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
