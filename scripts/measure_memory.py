"""Memory per breaker in Redis (MEMORY USAGE of every key), for docs/OPERATIONS.md.

Usage: python scripts/measure_memory.py [REDIS_URL]   (default: an embedded redis-server)
"""

from __future__ import annotations

import sys

import redis

from distbreaker import CircuitBreaker
from distbreaker.demo.embedded import RedisServer


def usage(client: redis.Redis, breaker: CircuitBreaker) -> int:
    keys = breaker.keys
    return sum(client.memory_usage(k) or 0
               for k in (keys.state, keys.window, keys.probes, keys.history))


def main() -> None:
    server = None
    if len(sys.argv) > 1:
        url = sys.argv[1]
    else:
        server = RedisServer().start()
        url = server.url
    client = redis.Redis.from_url(url)
    try:
        rows = []
        count = CircuitBreaker("mem-count", redis=url, sliding_window_size=100, subscribe=False)
        for _ in range(100):
            count.call(lambda: None)
        rows.append(("COUNT window of 100, idle (full window)", usage(client, count)))
        timed = CircuitBreaker("mem-time", redis=url, sliding_window_type="TIME_BASED",
                               sliding_window_size=60, subscribe=False)
        timed.call(lambda: None)
        rows.append(("TIME window of 60 s, one call", usage(client, timed)))
        tripped = CircuitBreaker("mem-tripped", redis=url, sliding_window_size=100,
                                 subscribe=False)
        for _ in range(100):
            tripped.call(lambda: None)
        for _ in range(10):
            tripped.trip()
            tripped.reset()
        tripped.trip()
        rows.append(("COUNT 100, tripped, 21 history entries", usage(client, tripped)))
        for what, size in rows:
            print(f"{what:45s} {size:6d} bytes")
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
