#!/usr/bin/env python3
"""Memory per breaker, bulkhead, budget and Policy in Redis (MEMORY USAGE of every key),
for docs/OPERATIONS.md.

Usage: python scripts/measure_memory.py [REDIS_URL] [--window N] [--trips N]
[--transitions N] [--fleet N] [--json] (default: an embedded redis-server, a window of
100, 10 trips, 1,000 transitions; --fleet N adds `used_memory` per breaker over N new
breakers).

Every key of the breaker's key schema (`BreakerKeys`, the pub/sub channel aside) is
measured, so a key added to or renamed in the schema is measured too, not missed, and
the legacy rollout hash of clients before it moved into the meta hash (0 unless such a
client ran); the bulkhead, budget and Policy rows measure every key of their name's
hash tag. Each breaker row also gives the state record's content (its length), the
allocation holding it (MEMORY USAGE less the key's own overhead: its dict entry, its
name and the object header) and the ratio of the two: a record grown piece by piece is
over-allocated by Redis (up to twice its length); written whole when created it is
sized exactly, and what remains is jemalloc's size class (classes are 25 % apart, so a
record's ratio depends on its length: up to 1.25x).

The fleet row is `used_memory` per breaker, split into the dataset (names, values,
object headers) and Redis's overhead (each key's entries in the keyspace and expires
tables and their bucket arrays, which double at powers of two: with 2 keys per breaker
that part is 32-64 B per breaker depending on where N falls).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import redis

from distbreaker import Bulkhead, CircuitBreaker, Policy, RetryBudget
from distbreaker._runtime.keys import BreakerKeys
from distbreaker.demo.embedded import RedisServer


def key_sizes(client: redis.Redis, keys: BreakerKeys) -> dict[str, int]:
    """Bytes of each of the breaker's keys (0: the key does not exist), with the legacy
    config rollout hash (`<state key>:cfgs`, not in BreakerKeys: written only by clients
    before the rollout moved into the meta hash)."""
    sizes = {field.name: int(client.memory_usage(getattr(keys, field.name)) or 0)
             for field in dataclasses.fields(keys) if field.name != "channel"}
    sizes["legacy_rollout"] = int(client.memory_usage(keys.state + ":cfgs") or 0)
    return sizes


def size_class(size: int) -> int:
    """The bytes jemalloc allocates for `size` (its small size classes: 8, 16, then four
    classes per doubling, at least 16 apart)."""
    if size <= 16:
        return 8 if size <= 8 else 16
    step = max(16, 1 << ((size - 1).bit_length() - 3))
    return -(-size // step) * step


def value_allocation(key: str, usage: int) -> int:
    """The allocation holding a raw string's value: its MEMORY USAGE less the key's own
    overhead (the dict entry, 24 B; the object header, 16 B; the name as an sds: a 1-byte
    header below 32 bytes, else 3, and its terminator)."""
    length = len(key.encode())
    return usage - 24 - 16 - size_class(length + (2 if length < 32 else 4))


def component_row(client: redis.Redis, rows: list[dict[str, Any]], what: str,
                  name: str) -> None:
    """A row of every key of `name`'s hash tag (a bulkhead, a budget, a Policy's three)."""
    sizes = {key.decode(): int(client.memory_usage(key) or 0)
             for key in sorted(client.scan_iter(match=f"*{{{name}}}*"))}
    rows.append({"breaker": what, "keys": sizes, "bytes": sum(sizes.values())})


def _memory(client: redis.Redis) -> tuple[int, int]:
    """(used_memory, used_memory_overhead) once a growing keyspace table finished its
    incremental rehash (both tables are allocated until then): two equal reads."""
    last = (-1, -1)
    for _ in range(30):
        info = client.info("memory")
        now = (int(info["used_memory"]), int(info["used_memory_overhead"]))
        if now == last:
            break
        last = now
        time.sleep(0.1)
    return last


def fleet_row(client: redis.Redis, url: str, window: int, count: int) -> dict[str, Any]:
    """`used_memory` per breaker over `count` new breakers (one call each, then the
    worker's goodbye: idle): what Redis really spends, with the keyspace's own entries
    and each key's TTL entry; and how many keys each breaker owns."""
    before, overhead_before = _memory(client)
    for i in range(count):
        breaker = CircuitBreaker(f"mem-fleet-{i}", redis=url, sliding_window_size=window,
                                 subscribe=False)
        breaker.call(lambda: None)
        breaker.close()
    after, overhead_after = _memory(client)
    overhead = round((overhead_after - overhead_before) / count)
    used = round((after - before) / count)
    return {"breaker": f"{count:,} COUNT-{window} breakers, used_memory per breaker",
            "keys": {}, "bytes": used, "dataset": used - overhead, "overhead": overhead,
            "keys_per_breaker": round(sum(1 for _ in client.scan_iter(
                match="*{mem-fleet-*", count=1000)) / count, 2)}


def measure(url: str, window: int, trips: int, transitions: int = 1000,
            fleet: int = 0) -> list[dict[str, Any]]:
    """One row per shape: what it is, its keys' bytes and their total."""
    client = redis.Redis.from_url(url)
    rows = []
    breakers: list[CircuitBreaker] = []
    try:
        def row(what: str, breaker: CircuitBreaker) -> None:
            sizes = key_sizes(client, breaker.keys)
            content = int(client.strlen(breaker.keys.state))
            allocated = value_allocation(breaker.keys.state, sizes["state"])
            rows.append({"breaker": what, "keys": sizes, "bytes": sum(sizes.values()),
                         "record_content": content, "record_allocated": allocated,
                         "record_ratio": round(allocated / content, 3) if content else None})

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

        churned = CircuitBreaker("mem-churned", redis=url, sliding_window_size=window,
                                 subscribe=False)
        breakers.append(churned)
        churned.call(lambda: None)
        for i in range(transitions):
            churned.trip() if i % 2 == 0 else churned.reset()
        row(f"COUNT {window}, after {transitions:,} transitions", churned)

        bulkhead = Bulkhead("mem-bulkhead", redis=url, max_concurrent_calls=25)
        bulkhead.release(bulkhead.acquire())
        component_row(client, rows, "bulkhead of 25, after one call", "mem-bulkhead")
        bulkhead.close()

        budget = RetryBudget("mem-budget", redis=url)
        budget.deposit()
        component_row(client, rows, "retry budget, after one deposit", "mem-budget")
        budget.close()

        policy = Policy("mem-policy", redis=url, bulkhead={"max_concurrent_calls": 25},
                        retry={"max_attempts": 3}, budget=True)
        policy.call(lambda: None)
        component_row(client, rows, "Policy (breaker + bulkhead + budget), one call",
                      "mem-policy")
        if fleet:
            rows.append(fleet_row(client, url, window, fleet))
        for part in (policy.breaker, policy.bulkhead, policy.budget):
            if part is not None:
                part.close()
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
    parser.add_argument("--transitions", type=int, default=1000,
                        help="trips and resets of the churned breaker")
    parser.add_argument("--fleet", type=int, default=0,
                        help="also create this many breakers and report used_memory per one")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        server = RedisServer().start()
        url = server.url
    try:
        rows = measure(url, args.window, args.trips, args.transitions, args.fleet)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        detail = ", ".join(f"{k} {v}" for k, v in r["keys"].items())
        record = (f"; record {r['record_content']} B of content in {r['record_allocated']},"
                  f" x{r['record_ratio']}" if r.get("record_content") else "")
        keys = f"  ({detail}{record})" if detail else ""
        if "dataset" in r:
            keys = (f"  (dataset {r['dataset']}, overhead {r['overhead']}; "
                    f"{r['keys_per_breaker']:g} keys each)")
        print(f"{r['breaker']:50s} {r['bytes']:6d} bytes{keys}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
