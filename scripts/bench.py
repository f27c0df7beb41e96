#!/usr/bin/env python3
"""Single-threaded throughput and Redis round trips per protected call.

Every scenario runs in one process against the same Redis (a fresh
``redis-server`` on a free port unless ``--url`` or ``$REDIS_URL`` is given),
interleaved in short slices (round robin), so that load from other programs
hits all scenarios alike and the ratios stay meaningful on a noisy machine:

* raw ``PING`` with redis-py (the floor: one round trip, no logic),
* distbreaker CLOSED success path (budget: 1 round trip per call),
* distbreaker OPEN rejection path while the wait is known (budget: 0), also with one
  event listener of every kind, and FORCED_OPEN's,
* distbreaker HALF_OPEN probe path (budget: 2),
* pybreaker with ``CircuitRedisStorage``, success path and OPEN rejection path,
* distbreaker ``record_mode="batched"`` CLOSED success path and interlock-cb
  with its ``RedisStorage`` (scripts/bench_batched.py),
* with ``--detection``: the fleet detection cost (16 processes calling a
  dependency that fails after 5 ms: dependency calls before every process
  rejects) for distbreaker exact and batched, pybreaker and interlock-cb.

Round trips are counted twice, independently: on the client (every request
a redis-py connection sends) and on the server (``INFO commandstats``
deltas of the commands the client sent; commands run inside Lua scripts are
reported separately as "server cmds", since Redis counts those too).

Usage: ``.venv/bin/python scripts/bench.py [--seconds 3] [--calls N] [--rounds 12]
[--detection] [--json]``
       ``.venv/bin/python scripts/bench.py --fleet [--processes 4] [--threads 4] [--json]``
       (scripts/bench_fleet.py: one Policy vs. raw EVALSHA from P processes x T threads)
       ``.venv/bin/python scripts/bench.py --redis-cost [--calls 200] [--fleet-ceiling] [--json]``
       (scripts/bench_redis_cost.py: server instructions per call under callgrind;
       --fleet-ceiling: calls/s one Redis core sustains, from --processes processes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

import distbreaker
from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import bench_redis
from distbreaker.errors import CallNotPermitted

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_batched  # this folder: batched mode, interlock-cb, detection cost
import bench_fleet  # this folder: --fleet (P processes x T threads)
import bench_redis_cost  # this folder: --redis-cost (callgrind) and --fleet-ceiling


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


def command_stats(admin: redis.Redis) -> tuple[Counter[str], Counter[str]]:
    """Calls and microseconds per command since the server started (INFO excluded)."""
    info = admin.info("commandstats")
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for key, value in info.items():
        command = key.removeprefix("cmdstat_")
        if command != "info":
            calls[command] = int(value["calls"])
            usec[command] = int(value["usec"])
    return calls, usec


@dataclasses.dataclass
class Scenario:
    """One measured path: a zero-argument call plus what it accumulated so far.

    `prepare` runs before every slice, outside the timed region and the
    counts (the HALF_OPEN scenario re-trips the breaker there).
    """

    key: str
    title: str
    call: Callable[[], Any]
    prepare: Callable[[], None] | None = None
    finish: Callable[[], None] | None = None  # after each slice: untimed, but counted
    calls: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # this thread's CPU time in the timed region
    best: float = 0.0
    round_trips: int = 0
    sent: Counter[str] = dataclasses.field(default_factory=Counter)
    server: Counter[str] = dataclasses.field(default_factory=Counter)
    usec: Counter[str] = dataclasses.field(default_factory=Counter)
    #: each slice's per-call latencies (ns), in slice (round) order
    latencies: list[list[int]] = dataclasses.field(default_factory=list)

    def warm_up(self) -> None:
        """Connections, script cache and local view ready before the first slice."""
        if self.prepare is not None:
            self.prepare()
        for _ in range(200):
            self.call()

    def run_slice(self, admin: redis.Redis, seconds: float, calls: int | None) -> None:
        """Run for `seconds` (or exactly `calls` times), timing and counting."""
        if self.prepare is not None:
            self.prepare()
        CountingConnection.round_trips = 0
        CountingConnection.commands = Counter()
        calls_before, usec_before = command_stats(admin)
        done, elapsed, cpu, call = 0, 0.0, 0.0, self.call
        clock, lat = time.perf_counter_ns, []
        add = lat.append
        while calls is None or done < calls:
            batch = 100 if calls is None else min(100, calls - done)
            started, cpu_started = time.perf_counter(), time.thread_time()
            for _ in range(batch):  # each call timed alone too (~0.1 us per call)
                t = clock()
                call()
                add(clock() - t)
            elapsed += time.perf_counter() - started
            cpu += time.thread_time() - cpu_started
            done += batch
            if calls is None and elapsed >= seconds:
                break
        if self.finish is not None:
            self.finish()
        calls_after, usec_after = command_stats(admin)
        self.server += calls_after - calls_before
        self.usec += usec_after - usec_before
        self.round_trips += CountingConnection.round_trips
        self.sent += CountingConnection.commands
        self.calls += done
        self.latencies.append(lat)
        self.seconds += elapsed
        self.cpu += cpu
        self.best = max(self.best, done / elapsed if elapsed else 0.0)

    def result(self) -> dict[str, Any]:
        calls = max(self.calls, 1)
        return {
            "key": self.key, "scenario": self.title, "calls": self.calls,
            "seconds": round(self.seconds, 3),
            "calls_per_second": round(self.calls_per_second, 1),
            "best_slice_calls_per_second": round(self.best, 1),
            "calls_per_cpu_second": round(self.calls_per_cpu_second, 1),
            "round_trips_per_call": round(self.round_trips / calls, 3),
            "top_level_commands_per_call": round(
                sum(self.server[name] for name in self.sent) / calls, 3),
            "server_commands_per_call": round(sum(self.server.values()) / calls, 3),
            # A script's time includes the commands it ran: count top-level ones only.
            "server_usec_per_call": round(
                sum(self.usec[name] for name in self.sent) / calls, 2),
            "server_commands": {name: round(count / calls, 3)
                                for name, count in sorted(self.server.items())},
            "p50_us": round(self.p50_us(), 2),
            "cpu_us_per_call": round(self.cpu_us_per_call, 2),
        }

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def p50_us(self) -> float:
        """The median latency of every call of every slice, in microseconds."""
        every = [ns for lat in self.latencies for ns in lat]
        return statistics.median(every) / 1000 if every else 0.0

    def slice_p50s_us(self) -> list[float]:
        """Each slice's median latency (us), in round order."""
        return [statistics.median(lat) / 1000 if lat else 0.0 for lat in self.latencies]

    @property
    def cpu_us_per_call(self) -> float:
        return self.cpu / self.calls * 1e6 if self.calls else 0.0

    @property
    def calls_per_cpu_second(self) -> float:
        """Calls per second of this thread's CPU: for the paths without a round trip
        (rejections, batched records) the client's own cost, less moved by other
        programs' load than wall-clock calls/s."""
        return self.calls / self.cpu if self.cpu else 0.0


# -- scenarios ------------------------------------------------------------------

def ok() -> str:
    return "ok"


def ping(url: str) -> Scenario:
    return Scenario("ping", "raw PING (redis-py)", counting_client(url).ping)


def raw_get(url: str) -> Scenario:
    client = counting_client(url)
    return Scenario("get", "raw GET (redis-py)", lambda: client.get("bench-missing-key"))


def raw_record(url: str, name: str) -> Scenario:
    """The exact CLOSED record's own script call (captured from the wire), sent by plain
    redis-py: what the call costs without distbreaker's Python around it."""
    wire = bench_redis_cost.record_wire(bench_redis_cost.exact_closed(
        bench_redis_cost.counting_client(url), name))
    client = counting_client(url)
    return Scenario("raw_record", "raw FCALL of the CLOSED record",
                    lambda: client.execute_command(*wire))


def closed(url: str, name: str) -> Scenario:
    breaker = CircuitBreaker(name, redis=counting_client(url))
    breaker.reset()
    return Scenario("closed", "distbreaker CLOSED success", lambda: breaker.call(ok))


def opened(url: str, name: str) -> Scenario:
    breaker = CircuitBreaker(name, redis=counting_client(url),
                             wait_duration_in_open_state=3600.0)
    breaker.trip("bench")

    def rejected() -> None:
        try:
            breaker.call(ok)
        except CallNotPermitted:
            return
        raise AssertionError("the OPEN breaker let a call through")

    return Scenario("open", "distbreaker OPEN rejection", rejected)


def rejecting(url: str, name: str, forced: bool = False, listener: bool = False) -> Scenario:
    """An OPEN (or FORCED_OPEN) rejection from the local view (0 round trips), with no
    event listener or with one listening to every kind (events are built only then)."""
    breaker = CircuitBreaker(name, redis=counting_client(url),
                             wait_duration_in_open_state=3600.0, revalidate_interval=60.0)
    if forced:
        breaker.transition_to_forced_open("bench")
    else:
        breaker.trip("bench")
    if listener:
        breaker.add_listener(lambda event: None, kinds="*")

    def rejected() -> None:
        try:
            breaker.call(ok)
        except CallNotPermitted:
            return
        raise AssertionError("the rejecting breaker let a call through")

    state = "FORCED_OPEN" if forced else "OPEN"
    key = ("forced_open" if forced else "open") + ("_listener" if listener else "")
    return Scenario(key, f"distbreaker {state} rejection" + (", 1 listener" if listener else ""),
                    rejected)


HALF_OPEN_PROBES = 10_000  # the largest quota the config allows
MAX_SLICE_CALLS = 4_000    # so one slice never uses up the probes


def half_open(url: str, name: str) -> Scenario:
    """Probe path: a huge probe quota keeps the breaker HALF_OPEN; re-trip between slices."""
    options: dict[str, Any] = {"permitted_calls_in_half_open": HALF_OPEN_PROBES,
                               "wait_duration_in_open_state": 0.001}
    breaker = CircuitBreaker(name, redis=counting_client(url), **options)
    operator = CircuitBreaker(name, redis=redis.Redis.from_url(url), **options)
    issued = HALF_OPEN_PROBES

    def probe() -> None:
        nonlocal issued
        issued += 1
        breaker.call(ok)

    def retrip() -> None:
        nonlocal issued
        if issued + MAX_SLICE_CALLS >= HALF_OPEN_PROBES:
            operator.trip("bench")
            time.sleep(0.003)  # OPEN -> HALF_OPEN by server time alone
            issued = 0
        elif operator.state is not State.HALF_OPEN:
            raise AssertionError("the breaker left HALF_OPEN during the measurement")

    return Scenario("half_open", "distbreaker HALF_OPEN probe", probe, retrip)


def pybreaker_scenarios(url: str, tag: str) -> list[Scenario]:
    try:
        import pybreaker
    except ImportError:
        print("pybreaker is not installed: skipping its scenarios", file=sys.stderr)
        return []

    def make(namespace: str) -> Any:
        # CircuitRedisStorage decodes the bytes it reads: it needs decode_responses=False.
        storage = pybreaker.CircuitRedisStorage(pybreaker.STATE_CLOSED, counting_client(url),
                                                namespace=namespace)
        return pybreaker.CircuitBreaker(fail_max=5, reset_timeout=3600, state_storage=storage)

    closed_breaker, open_breaker = make(f"{tag}-pyb-closed"), make(f"{tag}-pyb-open")
    open_breaker.open()

    def rejected() -> None:
        try:
            open_breaker.call(ok)
        except pybreaker.CircuitBreakerError:
            return
        raise AssertionError("the open pybreaker let a call through")

    return [Scenario("pybreaker_closed", "pybreaker+Redis CLOSED success",
                     lambda: closed_breaker.call(ok)),
            Scenario("pybreaker_open", "pybreaker+Redis OPEN rejection", rejected)]


# -- running and reporting ---------------------------------------------------------

def run(url: str, seconds: float, calls: int | None, rounds: int) -> list[Scenario]:
    """Interleave the scenarios in `rounds` short slices, so load drift hits all alike."""
    admin = redis.Redis.from_url(url)
    tag = f"bench-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        scenarios = [ping(url), raw_get(url), raw_record(url, f"{tag}-raw"),
                     closed(url, f"{tag}-closed"), opened(url, f"{tag}-open"),
                     rejecting(url, f"{tag}-open-listener", listener=True),
                     rejecting(url, f"{tag}-forced", forced=True),
                     half_open(url, f"{tag}-half"), *pybreaker_scenarios(url, tag),
                     *bench_batched.batched_scenarios(url, f"{tag}-batched", Scenario,
                                                      counting_client),
                     *bench_batched.interlock_scenarios(url, tag, Scenario, counting_client)]
        for scenario in scenarios:
            scenario.warm_up()
        if calls is not None:
            rounds = max(rounds, -(-calls // MAX_SLICE_CALLS))
        for index in range(rounds):
            for scenario in scenarios:
                share = None if calls is None else calls // rounds + (
                    1 if index < calls % rounds else 0)
                scenario.run_slice(admin, seconds / rounds, share)
    finally:
        for key in admin.scan_iter(match=f"*{tag}*", count=1000):
            admin.delete(key)
        admin.close()
    return scenarios


RATIOS = {
    "distbreaker CLOSED / pybreaker CLOSED": ("closed", "pybreaker_closed"),
    "distbreaker OPEN / pybreaker CLOSED": ("open", "pybreaker_closed"),
    "distbreaker OPEN / pybreaker OPEN": ("open", "pybreaker_open"),
    "distbreaker CLOSED / raw PING": ("closed", "ping"),
    "batched CLOSED / exact CLOSED": ("batched_closed", "closed"),
    "batched CLOSED / interlock-cb CLOSED": ("batched_closed", "interlock_closed"),
    "batched CLOSED / pybreaker CLOSED": ("batched_closed", "pybreaker_closed"),
    "distbreaker OPEN / interlock-cb CLOSED": ("open", "interlock_closed"),
    "distbreaker OPEN / OPEN with 1 listener": ("open", "open_listener"),
}


#: Ratios of in-process paths by CPU time (wall-clock calls/s of a path without a
#: round trip moves with every other program on the machine).
CPU_RATIOS = {
    "distbreaker CLOSED / raw GET, per CPU-s": ("closed", "get"),
    "distbreaker CLOSED / raw FCALL of its call, per CPU-s": ("closed", "raw_record"),
    "distbreaker OPEN / OPEN with 1 listener, per CPU-s": ("open", "open_listener"),
    "distbreaker OPEN / FORCED_OPEN, per CPU-s": ("open", "forced_open"),
}


#: p50 latency ratios against a bare GET on the same kind of connection (issue 25: the
#: client should add little to one round trip), each also per round (min..max: spread).
LATENCY_RATIOS = {
    "raw FCALL of the CLOSED record / GET, p50": ("raw_record", "get"),
    "distbreaker CLOSED / GET, p50": ("closed", "get"),
    "pybreaker+Redis CLOSED / GET, p50": ("pybreaker_closed", "get"),
    "distbreaker CLOSED / pybreaker+Redis CLOSED, p50": ("closed", "pybreaker_closed"),
}


def latency_ratios(scenarios: list[Scenario]) -> dict[str, dict[str, float]]:
    """p50 ratios over the whole run, and the lowest, median and highest of the rounds' ratios
    (the scenarios run interleaved, so a round's slices saw the same load)."""
    by = {s.key: s for s in scenarios}
    out: dict[str, dict[str, float]] = {}
    for label, (a, b) in LATENCY_RATIOS.items():
        if a not in by or b not in by or not by[b].p50_us():
            continue
        rounds = [x / y for x, y in zip(by[a].slice_p50s_us(), by[b].slice_p50s_us(),
                                        strict=False) if y]
        out[label] = {"ratio": round(by[a].p50_us() / by[b].p50_us(), 2),
                      "min": round(min(rounds), 2) if rounds else 0.0,
                      "median": round(statistics.median(rounds), 2) if rounds else 0.0,
                      "max": round(max(rounds), 2) if rounds else 0.0}
    return out


def client_cpu_above_get(scenarios: list[Scenario]) -> float | None:
    """The bench thread's CPU per exact CLOSED call above a bare GET's (us): the Python
    distbreaker and redis-py spend beyond one plain command."""
    by = {s.key: s for s in scenarios}
    if "closed" not in by or "get" not in by:
        return None
    return round(by["closed"].cpu_us_per_call - by["get"].cpu_us_per_call, 1)


def ratios(scenarios: list[Scenario]) -> dict[str, float]:
    """Throughput ratios between scenarios (higher: the first is faster)."""
    rate = {scenario.key: scenario.calls_per_second for scenario in scenarios}
    cpu = {scenario.key: scenario.calls_per_cpu_second for scenario in scenarios}
    return {**{label: round(rate[a] / rate[b], 2) for label, (a, b) in RATIOS.items()
               if rate.get(a) and rate.get(b)},
            **{label: round(cpu[a] / cpu[b], 2) for label, (a, b) in CPU_RATIOS.items()
               if cpu.get(a) and cpu.get(b)}}


def print_table(scenarios: list[Scenario], info: dict[str, Any]) -> None:
    print(f"distbreaker {info['distbreaker']}, redis {info['redis_version']} ({info['redis']}), "
          f"python {info['python']}, {info['run']}")
    header = (f"{'scenario':40} {'calls/s':>9} {'best':>9} {'per CPU-s':>10} {'p50 us':>8} "
              f"{'round trips':>12} {'top-level':>10} {'server cmds':>12} {'server us':>10}")
    print(header)
    print("-" * len(header))
    for s in scenarios:
        r = s.result()
        print(f"{s.title:40} {s.calls_per_second:9,.0f} {s.best:9,.0f} "
              f"{s.calls_per_cpu_second:10,.0f} {s.p50_us():8.1f} "
              f"{r['round_trips_per_call']:12.2f} {r['top_level_commands_per_call']:10.2f} "
              f"{r['server_commands_per_call']:12.2f} {r['server_usec_per_call']:10.1f}")
    print("\ncalls/s: over all slices; best: the fastest slice; per CPU-s: calls per second of "
          "the bench\nthread's CPU (for the paths without a round trip, the client's own cost, "
          "steadier under load).\nround trips: requests the client sent per call;\n"
          "top-level: the same counted by the server (INFO commandstats); "
          "server cmds: every command\nRedis ran per call, including those inside Lua scripts; "
          "server us: Redis CPU time per call.")
    print("\nratios (calls/s, or calls per CPU-s where said):")
    for label, value in ratios(scenarios).items():
        print(f"  {label:52} {value:8.2f}x")
    print("\np50 latency ratios (interleaved; min / median / max of the rounds' ratios):")
    for label, value in latency_ratios(scenarios).items():
        print(f"  {label:52} {value['ratio']:8.2f}x  ({value['min']:.2f} / {value['median']:.2f}"
              f" / {value['max']:.2f})")
    above = client_cpu_above_get(scenarios)
    if above is not None:
        print(f"\nclient CPU per exact CLOSED call above a bare GET: {above:.1f} us")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else spawn redis-server)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per scenario (default 3)")
    parser.add_argument("--calls", type=int, help="exactly this many calls per scenario")
    parser.add_argument("--rounds", type=int, default=12,
                        help="interleaved slices per scenario (default 12)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    bench_fleet.add_arguments(parser)
    bench_batched.add_arguments(parser)
    bench_redis_cost.add_arguments(parser)
    options = parser.parse_args(argv)
    if options.fleet:
        return bench_fleet.main(options, bench_redis)
    if options.redis_cost or options.fleet_ceiling:
        return bench_redis_cost.main(options, bench_redis)
    with bench_redis(options.url) as (url, origin):
        scenarios = run(url, options.seconds, options.calls, max(1, options.rounds))
        detection = bench_batched.detection(options, url)
        version = redis.Redis.from_url(url).info("server").get("redis_version", "?")
    info = {
        "distbreaker": distbreaker.__version__, "redis_version": version, "redis": origin,
        "python": sys.version.split()[0],
        "run": (f"{options.calls} calls per scenario" if options.calls
                else f"{options.seconds:g} s per scenario") + f" in {options.rounds} rounds",
    }
    if options.json:
        print(json.dumps({**info, "ratios": ratios(scenarios),
                          "latency_ratios": latency_ratios(scenarios),
                          "client_cpu_us_above_get": client_cpu_above_get(scenarios),
                          "results": [s.result() for s in scenarios],
                          **bench_batched.detection_json(detection)}, indent=2))
    else:
        print_table(scenarios, info)
        if detection is not None:
            bench_batched.print_detection(detection)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
