"""``scripts/bench.py --fleet``: P processes x T threads against one Policy vs. raw EVALSHA.

Every worker process (spawned) builds one `Policy` (breaker + bulkhead + retry
with a retry budget) on one Redis client, plus a plain client, and runs T
threads. The parent alternates two scenarios in short slices (so load from
other programs hits both alike): raw ``EVALSHA`` of ``return 1`` (the floor:
one round trip and the cheapest script) and a protected call through the
policy. Reported per scenario: calls/s, round trips per call (client side; a
pipeline is one), scripts and Redis commands per call (``INFO commandstats``
deltas; commands run inside scripts included), p50/p99 added latency (call
time minus time inside the dependency; for raw EVALSHA the whole call).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

import distbreaker


class CountingConnection(redis.Connection):
    """Counts the requests (round trips) each thread sends."""

    _sent = threading.local()

    @classmethod
    def round_trips(cls) -> int:
        """Requests the calling thread has sent so far."""
        return getattr(cls._sent, "count", 0)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection._sent.count = CountingConnection.round_trips() + 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection,
                                         socket_timeout=1.0, socket_connect_timeout=1.0)
    return redis.Redis(connection_pool=pool)


def command_calls(admin: redis.Redis) -> Counter[str]:
    """Calls per command since the server started (INFO excluded)."""
    return Counter({key.removeprefix("cmdstat_"): int(value["calls"])
                    for key, value in admin.info("commandstats").items()
                    if key != "cmdstat_info"})


def ok() -> str:
    return "ok"


IDLE, RAW, POLICY, STOP = 0, 1, 2, 3
FLEET_SCENARIOS = {RAW: ("raw", "raw EVALSHA 'return 1'"),
                   POLICY: ("policy", "Policy: breaker+bulkhead+budget")}
TRIVIAL_SCRIPT = "return 1"
SAMPLE_CAP = 50_000  # latency samples kept per scenario and process


@dataclasses.dataclass
class FleetTally:
    """What one worker process measured for one scenario."""

    calls: int = 0
    round_trips: int = 0
    added: list[float] = dataclasses.field(default_factory=list)


def fleet_policy(url: str, name: str, limit: int) -> distbreaker.Policy:
    """The protected path: Retry(CircuitBreaker(Bulkhead(call))) with a retry budget."""
    client = counting_client(url)
    return distbreaker.Policy(name, redis=client, bulkhead={"max_concurrent_calls": limit},
                              retry={"max_attempts": 3}, budget=True)


def fleet_thread(phase: Any, policy: distbreaker.Policy, raw: redis.Redis, sha: str,
                 dependency_s: float, tallies: dict[int, FleetTally], lock: Any) -> None:
    """One thread: call the scenario `phase` names until it says STOP."""
    inside = 0.0

    def dependency() -> str:
        nonlocal inside
        started = time.perf_counter()
        if dependency_s:
            time.sleep(dependency_s)
        inside = time.perf_counter() - started
        return "ok"

    while (current := phase.value) != STOP:
        if current == IDLE:
            time.sleep(0.002)
            continue
        before = CountingConnection.round_trips()
        started = time.perf_counter()
        if current == RAW:
            raw.evalsha(sha, 0)
            inside = 0.0
        else:
            policy.call(dependency)
        added = time.perf_counter() - started - inside
        with lock:
            tally = tallies[current]
            tally.calls += 1
            tally.round_trips += CountingConnection.round_trips() - before
            if len(tally.added) < SAMPLE_CAP:
                tally.added.append(added)


def fleet_process(url: str, name: str, threads: int, limit: int, dependency_s: float,
                  phase: Any, ready: Any, results: Any) -> None:
    """A worker process: `threads` threads, both scenarios, tallies sent back at the end."""
    policy = fleet_policy(url, name, limit)
    raw = counting_client(url)
    sha = raw.script_load(TRIVIAL_SCRIPT)
    policy.call(ok)  # connections and script cache warm
    tallies = {RAW: FleetTally(), POLICY: FleetTally()}
    lock = threading.Lock()
    pool = [threading.Thread(target=fleet_thread, args=(
        phase, policy, raw, sha, dependency_s, tallies, lock)) for _ in range(threads)]
    for thread in pool:
        thread.start()
    ready.release()
    for thread in pool:
        thread.join()
    results.put({key: dataclasses.asdict(tally) for key, tally in tallies.items()})


def fleet_slices(admin: redis.Redis, phase: Any, seconds: float, rounds: int
                 ) -> dict[int, dict[str, Any]]:
    """Alternate the scenarios in `rounds` slices each; server command counts per scenario."""
    measured = {key: {"seconds": 0.0, "server": Counter()} for key in FLEET_SCENARIOS}
    for _ in range(rounds):
        for key in FLEET_SCENARIOS:
            calls_before = command_calls(admin)
            started = time.perf_counter()
            phase.value = key
            time.sleep(seconds / rounds)
            phase.value = IDLE
            measured[key]["seconds"] += time.perf_counter() - started
            time.sleep(0.05)  # calls in flight finish inside this slice's counts
            calls_after = command_calls(admin)
            measured[key]["server"] += calls_after - calls_before
    return measured


def fleet_summary(key: int, tallies: list[FleetTally], seconds: float,
                  server: Counter[str]) -> dict[str, Any]:
    """One row of the fleet table (latencies in microseconds)."""
    calls = sum(t.calls for t in tallies) or 1
    added = sorted(x for t in tallies for x in t.added)

    def pick(q: float) -> float:
        return round(added[min(len(added) - 1, int(q * len(added)))] * 1e6, 1) if added else 0.0

    top_level = server.get("evalsha", 0) + server.get("eval", 0) + server.get("fcall", 0)
    return {
        "key": FLEET_SCENARIOS[key][0], "scenario": FLEET_SCENARIOS[key][1], "calls": calls,
        "seconds": round(seconds, 3), "calls_per_second": round(calls / seconds, 1),
        "round_trips_per_call": round(sum(t.round_trips for t in tallies) / calls, 3),
        "scripts_per_call": round(top_level / calls, 3),
        "server_commands_per_call": round(sum(server.values()) / calls, 3),
        "added_p50_us": pick(0.5), "added_p99_us": pick(0.99),
        "server_commands": {name: round(n / calls, 3) for name, n in sorted(server.items())},
    }


def run_fleet(url: str, processes: int, threads: int, seconds: float, rounds: int,
              dependency_s: float) -> list[dict[str, Any]]:
    """Spawn the fleet, alternate raw EVALSHA and the Policy, summarise both."""
    ctx = multiprocessing.get_context("spawn")
    phase, ready, results = ctx.RawValue("i", IDLE), ctx.Semaphore(0), ctx.Queue()
    admin = redis.Redis.from_url(url)
    name = f"bench-fleet-{os.getpid()}-{secrets.token_hex(3)}"
    workers = [ctx.Process(target=fleet_process, args=(
        url, name, threads, processes * threads, dependency_s, phase, ready, results))
        for _ in range(processes)]
    try:
        for worker in workers:
            worker.start()
        for _ in workers:
            ready.acquire(timeout=60)
        measured = fleet_slices(admin, phase, seconds, rounds)
        phase.value = STOP
        reports = [results.get(timeout=60) for _ in workers]
    finally:
        phase.value = STOP
        for worker in workers:
            worker.join(10)
        for key in admin.scan_iter(match=f"*{name}*", count=1000):
            admin.delete(key)
        admin.close()
    return [fleet_summary(key, [FleetTally(**r[key]) for r in reports],
                          measured[key]["seconds"], measured[key]["server"])
            for key in FLEET_SCENARIOS]


def print_fleet_table(rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    print(f"distbreaker {info['distbreaker']}, redis {info['redis_version']} ({info['redis']}), "
          f"python {info['python']}, {info['run']}")
    header = (f"{'scenario':32} {'calls/s':>9} {'round trips':>12} {'scripts':>8} "
              f"{'server cmds':>12} {'p50 added us':>13} {'p99 added us':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['scenario']:32} {r['calls_per_second']:9,.0f} "
              f"{r['round_trips_per_call']:12.2f} {r['scripts_per_call']:8.2f} "
              f"{r['server_commands_per_call']:12.2f} {r['added_p50_us']:13,.0f} "
              f"{r['added_p99_us']:13,.0f}")
    print("\nper call: round trips (client requests; a pipeline is one), scripts (EVALSHA/EVAL "
          "Redis ran),\nserver cmds (every command Redis ran, including inside scripts). "
          "added: call time minus time\ninside the dependency (raw: the whole EVALSHA).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench.py's options for this mode."""
    parser.add_argument("--fleet", action="store_true",
                        help="P processes x T threads: one Policy vs. raw EVALSHA")
    parser.add_argument("--processes", type=int, default=4,
                        help="--fleet, --fleet-ceiling: processes (4)")
    parser.add_argument("--threads", type=int, default=4, help="--fleet: threads each (4)")
    parser.add_argument("--dependency-ms", type=float, default=0.0,
                        help="--fleet: time the protected dependency takes (default 0)")


def main(options: argparse.Namespace,
         redis_url: Callable[[str | None], contextlib.AbstractContextManager[Any]]) -> int:
    """Run the fleet mode with bench.py's options; `redis_url` yields (url, origin)."""
    rounds = max(1, min(options.rounds, 6))
    with redis_url(options.url) as (url, origin):
        version = redis.Redis.from_url(url).info("server").get("redis_version", "?")
        rows = run_fleet(url, options.processes, options.threads, options.seconds, rounds,
                         options.dependency_ms / 1000)
    info = {"distbreaker": distbreaker.__version__, "redis_version": version, "redis": origin,
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "run": (f"fleet of {options.processes} processes x {options.threads} threads, "
                    f"{options.seconds:g} s per scenario in {rounds} rounds, dependency "
                    f"{options.dependency_ms:g} ms")}
    if options.json:
        print(json.dumps({**info, "results": rows}, indent=2))
    else:
        print_fleet_table(rows, info)
    return 0
