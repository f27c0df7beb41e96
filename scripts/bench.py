#!/usr/bin/env python3
"""Single-threaded throughput and Redis round trips per protected call.

Every scenario runs in one process against the same Redis (a fresh
``redis-server`` on a free port unless ``--url`` or ``$REDIS_URL`` is given),
so the numbers are comparable with each other even on a noisy machine:

* raw ``PING`` with redis-py (the floor: one round trip, no logic),
* distbreaker CLOSED success path (budget: 1 round trip per call),
* distbreaker OPEN rejection path while the wait is known (budget: 0),
* distbreaker HALF_OPEN probe path (budget: 2),
* pybreaker with ``CircuitRedisStorage``, success path and OPEN rejection path.

Round trips are counted twice, independently: on the client (every request
a redis-py connection sends) and on the server (``INFO commandstats``
deltas of the commands the client sent; commands run inside Lua scripts are
reported separately as "server cmds", since Redis counts those too).

Usage: ``.venv/bin/python scripts/bench.py [--seconds 2.5] [--calls N] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import redis

import distbreaker
from distbreaker import CallNotPermitted, CircuitBreaker, State
from distbreaker.embedded import RedisServer


class CountingConnection(redis.Connection):
    """A redis-py connection that counts requests (round trips) and command names."""

    round_trips = 0
    commands: Counter[str] = Counter()

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        CountingConnection.commands[name.lower().split()[0]] += 1
        super().send_command(*args, **kwargs)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.round_trips += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str, **options: Any) -> redis.Redis:
    """A client whose every request is counted (timeouts like distbreaker's own)."""
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection,
                                         socket_timeout=1.0, socket_connect_timeout=1.0,
                                         **options)
    return redis.Redis(connection_pool=pool)


def command_stats(admin: redis.Redis) -> Counter[str]:
    """Calls per command since the server started (INFO itself excluded)."""
    info = admin.info("commandstats")
    stats: Counter[str] = Counter()
    for key, value in info.items():
        command = key.removeprefix("cmdstat_")
        if command != "info":
            stats[command] = int(value["calls"])
    return stats


@dataclasses.dataclass
class Result:
    """One scenario's measurement."""

    key: str
    scenario: str
    calls: int
    seconds: float
    round_trips: float         # per call, counted on the client
    top_level_commands: float  # per call, commandstats of the commands the client sent
    server_commands: float     # per call, commandstats incl. commands run inside Lua
    commands: dict[str, float]  # per call, by command name (server side)

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


def measure(key: str, scenario: str, admin: redis.Redis, one_call: Callable[[], Any],
            seconds: float, calls: int | None, between: Callable[[int], None] | None = None,
            ) -> Result:
    """Run `one_call` for `seconds` (or exactly `calls` times) and count its round trips.

    `between(done)` runs every 1000 calls outside the timed region (and its
    Redis work outside the counts): the HALF_OPEN scenario re-trips there.
    """
    for _ in range(200):  # warm-up: connections, script cache, local view
        one_call()
    if between is not None:
        between(0)
    CountingConnection.round_trips = 0
    CountingConnection.commands = Counter()
    before = command_stats(admin)
    done, elapsed = 0, 0.0
    excluded: Counter[str] = Counter()
    while True:
        batch = 1000 if calls is None else min(1000, calls - done)
        if batch <= 0:
            break
        started = time.perf_counter()
        for _ in range(batch):
            one_call()
        elapsed += time.perf_counter() - started
        done += batch
        if calls is None and elapsed >= seconds:
            break
        if between is not None:
            mark = command_stats(admin)
            between(done)
            excluded += command_stats(admin) - mark
    after = command_stats(admin)
    server = after - before - excluded
    sent = CountingConnection.commands
    return Result(
        key=key, scenario=scenario, calls=done, seconds=elapsed,
        round_trips=CountingConnection.round_trips / done,
        top_level_commands=sum(server[name] for name in sent) / done,
        server_commands=sum(server.values()) / done,
        commands={name: count / done for name, count in sorted(server.items())},
    )


# -- scenarios ------------------------------------------------------------------

def ok() -> str:
    return "ok"


def bench_ping(url: str, admin: redis.Redis, seconds: float, calls: int | None) -> Result:
    client = counting_client(url)
    return measure("ping", "raw PING (redis-py)", admin, client.ping, seconds, calls)


def bench_closed(url: str, admin: redis.Redis, seconds: float, calls: int | None,
                 name: str) -> Result:
    breaker = CircuitBreaker(name, redis=counting_client(url))
    breaker.reset()
    result = measure("closed", "distbreaker CLOSED success", admin, lambda: breaker.call(ok),
                     seconds, calls)
    assert breaker.state is State.CLOSED
    return result


def bench_open(url: str, admin: redis.Redis, seconds: float, calls: int | None,
               name: str) -> Result:
    breaker = CircuitBreaker(name, redis=counting_client(url),
                             wait_duration_in_open_state=3600.0)
    breaker.trip("bench")

    def rejected() -> None:
        try:
            breaker.call(ok)
        except CallNotPermitted:
            return
        raise AssertionError("the OPEN breaker let a call through")

    return measure("open", "distbreaker OPEN rejection", admin, rejected, seconds, calls)


def bench_half_open(url: str, admin: redis.Redis, seconds: float, calls: int | None,
                    name: str) -> Result:
    """Probe path: a huge probe quota keeps the breaker HALF_OPEN; re-trip between batches."""
    probes = 10_000
    breaker = CircuitBreaker(name, redis=counting_client(url),
                             permitted_calls_in_half_open=probes,
                             wait_duration_in_open_state=0.001)
    operator = CircuitBreaker(name, redis=redis.Redis.from_url(url),
                              permitted_calls_in_half_open=probes,
                              wait_duration_in_open_state=0.001)
    issued = 0

    def probe() -> None:
        nonlocal issued
        issued += 1
        breaker.call(ok)

    def retrip(done: int) -> None:
        nonlocal issued
        if issued + 1200 >= probes or done == 0:
            operator.trip("bench")
            time.sleep(0.003)  # OPEN -> HALF_OPEN by server time
            issued = 0

    operator.trip("bench")
    time.sleep(0.003)
    result = measure("half_open", "distbreaker HALF_OPEN probe", admin, probe, seconds, calls,
                     retrip)
    assert operator.state is State.HALF_OPEN, "left HALF_OPEN during the measurement"
    return result


def bench_pybreaker(url: str, admin: redis.Redis, seconds: float, calls: int | None,
                    name: str, open_state: bool) -> Result | None:
    try:
        import pybreaker
    except ImportError:
        print("pybreaker is not installed: skipping its scenarios", file=sys.stderr)
        return None
    # CircuitRedisStorage decodes the bytes it reads: it needs decode_responses=False.
    storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, counting_client(url),
                                            namespace=name)
    breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600, state_storage=storage)
    if not open_state:
        return measure("pybreaker_closed", "pybreaker+Redis CLOSED success", admin,
                       lambda: breaker.call(ok), seconds, calls)
    breaker.open()

    def rejected() -> None:
        try:
            breaker.call(ok)
        except pybreaker.CircuitBreakerError:
            return
        raise AssertionError("the open pybreaker let a call through")

    return measure("pybreaker_open", "pybreaker+Redis OPEN rejection", admin, rejected,
                   seconds, calls)


# -- running and reporting ---------------------------------------------------------

@contextlib.contextmanager
def redis_url(url: str | None) -> Iterator[tuple[str, str]]:
    """The Redis to measure against, and where it came from."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url, "given"
        return
    with RedisServer() as server:
        yield server.url, "spawned"


def run(url: str, seconds: float, calls: int | None) -> list[Result]:
    admin = redis.Redis.from_url(url)
    tag = f"bench-{os.getpid()}-{secrets.token_hex(3)}"
    results: list[Result | None] = []
    try:
        results.append(bench_ping(url, admin, seconds, calls))
        results.append(bench_closed(url, admin, seconds, calls, f"{tag}-closed"))
        results.append(bench_open(url, admin, seconds, calls, f"{tag}-open"))
        results.append(bench_half_open(url, admin, seconds, calls, f"{tag}-half"))
        results.append(bench_pybreaker(url, admin, seconds, calls, f"{tag}-pyb-c", False))
        results.append(bench_pybreaker(url, admin, seconds, calls, f"{tag}-pyb-o", True))
    finally:
        for key in admin.scan_iter(match=f"*{tag}*", count=1000):
            admin.delete(key)
        admin.close()
    return [result for result in results if result is not None]


RATIOS = {
    "distbreaker CLOSED / pybreaker CLOSED": ("closed", "pybreaker_closed"),
    "distbreaker OPEN / pybreaker CLOSED": ("open", "pybreaker_closed"),
    "distbreaker OPEN / pybreaker OPEN": ("open", "pybreaker_open"),
    "distbreaker CLOSED / raw PING": ("closed", "ping"),
}


def ratios(results: list[Result]) -> dict[str, float]:
    """Throughput ratios between scenarios (higher: the first is faster)."""
    rate = {result.key: result.calls_per_second for result in results}
    return {label: round(rate[a] / rate[b], 2) for label, (a, b) in RATIOS.items()
            if rate.get(a) and rate.get(b)}


def print_table(results: list[Result], info: dict[str, Any]) -> None:
    print(f"distbreaker {info['distbreaker']}, redis {info['redis_version']} ({info['redis']}), "
          f"python {info['python']}, {info['seconds_per_scenario']}")
    header = f"{'scenario':34} {'calls/s':>10} {'round trips':>12} {'top-level':>10} " \
             f"{'server cmds':>12}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.scenario:34} {r.calls_per_second:10,.0f} {r.round_trips:12.2f} "
              f"{r.top_level_commands:10.2f} {r.server_commands:12.2f}")
    print("\nround trips: requests sent by the client per call; top-level: the same counted by "
          "the server\n(INFO commandstats); server cmds: all commands Redis ran per call, "
          "including inside Lua.")
    print("\nratios (calls/s):")
    for label, value in ratios(results).items():
        print(f"  {label:40} {value:8.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else spawn redis-server)")
    parser.add_argument("--seconds", type=float, default=2.5,
                        help="timed seconds per scenario (default 2.5)")
    parser.add_argument("--calls", type=int, help="exactly this many calls per scenario")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    options = parser.parse_args(argv)
    with redis_url(options.url) as (url, origin):
        results = run(url, options.seconds, options.calls)
        version = redis.Redis.from_url(url).info("server").get("redis_version", "?")
    info = {
        "distbreaker": distbreaker.__version__, "redis_version": version, "redis": origin,
        "python": sys.version.split()[0],
        "seconds_per_scenario": (f"{options.calls} calls per scenario" if options.calls
                                 else f"{options.seconds:g} s per scenario"),
    }
    if options.json:
        print(json.dumps({**info, "ratios": ratios(results), "results": [
            {**dataclasses.asdict(r), "calls_per_second": round(r.calls_per_second, 1)}
            for r in results]}, indent=2))
    else:
        print_table(results, info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
