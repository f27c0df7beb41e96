"""The chaos harness for tests/chaos/: one fleet, one fault at a time.

`ChaosRun` starts from a private `redis-server`, spawns PROCESSES x THREADS workers
(tests/helpers/chaos_worker.py) driving one `Policy` (breaker + bulkhead + retry
with a budget) against a fake dependency, and injects the faults of its schedule
one after the other, waiting after each until the fleet works from Redis again and
then for a steady period. `analyse` turns the collected figures into the report
(chaos.json + CHAOS.md, `write_report`). The session fixture `chaos`
(tests/chaos/conftest.py) runs it once; the tests check the figures of each fault.

DISTBREAKER_SOAK=1 makes every phase SOAK_SCALE times longer.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from distbreaker import CircuitBreaker
from distbreaker._runtime.keys import BreakerKeys, BudgetKeys, BulkheadKeys
from distbreaker.demo.embedded import RedisServer
from tests.helpers import chaos_worker as cw
from tests.helpers.waiting import wait_until

SOAK = os.environ.get("DISTBREAKER_SOAK") == "1"
SOAK_SCALE = 6.0
SCALE = SOAK_SCALE if SOAK else 1.0
PROCESSES = int(os.environ.get("DISTBREAKER_CHAOS_PROCESSES", "8"))
THREADS = int(os.environ.get("DISTBREAKER_CHAOS_THREADS", "8"))
NAME = "chaos-{payments}"  # braces inside the name: the hash tag must still work
SPAWN = multiprocessing.get_context("spawn")
#: After the fleet works from Redis again, this long still counts as the fault's window.
GRACE = 0.3
#: Healthy time between two faults (the invariants are strict there).
STEADY = 1.5 * SCALE
#: How long the fleet may take to work from Redis again after a fault (the longest
#: Redis backoff is 5 s; the rest is for a loaded machine).
RECOVERY_TIMEOUT = 30.0
BUCKETS = int((120 * SCALE) / cw.BUCKET)


@dataclasses.dataclass
class Fault:
    """One injected fault: where it sits in time (wall clock) and what it did."""

    name: str
    description: str
    inject: float = 0.0
    fault_end: float = 0.0
    recovered: float = 0.0
    steady_end: float = 0.0
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


class ChaosRun:
    """The fleet, the private Redis, the fault schedule and the collected figures."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.url = server.url
        self.admin = redis.Redis.from_url(self.url, socket_timeout=5)
        slots = PROCESSES + 1  # the last slot is the victim's
        self.shared = cw.Shared(
            mode=SPAWN.RawValue("i", cw.FLAKY), stop=SPAWN.Event(), lock=SPAWN.Lock(),
            inflight=SPAWN.RawArray("i", slots), max_conc=SPAWN.RawArray("i", BUCKETS),
            requests=SPAWN.RawArray("i", BUCKETS), retries=SPAWN.RawArray("i", BUCKETS),
            redis_down=SPAWN.RawArray("i", slots), degraded=SPAWN.RawArray("i", BUCKETS),
            calls=SPAWN.RawArray("i", slots), last_call=SPAWN.RawArray("d", slots),
            victim_hung=SPAWN.Event(),
            t0_bucket=int(time.time() / cw.BUCKET))
        self.results = SPAWN.Queue()
        self.processes: list[Any] = []
        self.victim: Any = None
        self.faults: list[Fault] = []
        self.reports: list[dict[str, Any]] = []
        self.started = 0.0
        self.baseline = (0.0, 0.0)
        self.waiting_for = ""

    # -- the fleet ----------------------------------------------------------------------
    def spawn(self, index: int, victim: bool = False) -> Any:
        process = SPAWN.Process(target=cw.drive, daemon=True, args=(
            index, self.url, NAME, self.shared, THREADS, victim, self.results))
        process.start()
        return process

    def start_fleet(self) -> None:
        self.processes = [self.spawn(i) for i in range(PROCESSES)]
        wait_until(lambda: sum(self.shared.requests) >= 50 * PROCESSES, timeout=120,
                   interval=0.05, what="the fleet makes its first calls")
        time.sleep(0.5)  # every process past its first calls
        self.started = time.time()

    def stop_fleet(self) -> None:
        self.shared.stop.set()
        for _ in self.processes:
            self.reports.append(self.results.get(timeout=60))
        for process in self.processes:
            process.join(10)

    def kill_all(self) -> None:
        for process in [*self.processes, self.victim]:
            if process is not None and process.is_alive():
                process.kill()
                process.join(5)

    # -- recovery -------------------------------------------------------------------------
    def live_slots(self) -> list[int]:
        return [i for i, p in enumerate(self.processes) if p.is_alive()]

    def fleet_on_redis(self) -> bool:
        """Every live worker finished a call since the fault ended with its components on
        Redis, and the breaker reads fine from Redis."""
        since = self.faults[-1].fault_end if self.faults else 0.0
        stale = [i for i in self.live_slots() if self.shared.last_call[i] <= since]
        if stale:
            self.waiting_for = f"workers {stale} without a call since the fault ended"
            return False
        down = [i for i in self.live_slots() if self.shared.redis_down[i]]
        if down:
            self.waiting_for = f"workers {down} in Redis backoff"
            return False
        try:
            CircuitBreaker(NAME, redis=self.admin, **cw.BREAKER).metrics()
        except Exception as error:
            self.waiting_for = f"breaker metrics: {error!r}"
            return False
        return True

    def wait(self, ready: Callable[[], bool]) -> float:
        self.waiting_for = ""
        wait_until(ready, timeout=RECOVERY_TIMEOUT, interval=0.02,
                   what=f"the fleet recovers after {self.faults[-1].name}",
                   describe=lambda: f"waiting for {self.waiting_for}")
        return time.time()

    def run_fault(self, fault: Fault, inject: Callable[[Fault], None],
                  ready: Callable[[], bool] | None = None) -> None:
        self.faults.append(fault)
        fault.inject = time.time()
        inject(fault)
        fault.fault_end = time.time()
        fault.recovered = self.wait(ready or self.fleet_on_redis)
        fault.notes["last_waited_for"] = self.waiting_for
        time.sleep(STEADY)
        fault.steady_end = time.time()

    # -- the schedule ------------------------------------------------------------------------
    def keys(self) -> list[str]:
        breaker, bulkhead = BreakerKeys.build(NAME), BulkheadKeys.build(NAME)
        return [*breaker.script_keys, bulkhead.leases, bulkhead.meta, BudgetKeys.build(NAME).slices]

    def run_schedule(self) -> None:
        time.sleep(STEADY)
        self.baseline = (self.started, time.time())
        for fault, inject, ready in self.schedule():
            self.run_fault(fault, inject, ready)

    def schedule(self) -> list[tuple[Fault, Callable[[Fault], None], Any]]:
        return [
            (Fault("dependency_down", "the dependency fails every call for 1 s (the breaker "
                   "trips and cycles through half-open episodes); no Redis fault"),
             self.dependency_down, self.breaker_closed),
            (Fault("script_flush", "SCRIPT FLUSH every 0.2 s for 2 s"), self.script_flush, None),
            (Fault("redis_paused", "CLIENT PAUSE 1500 ALL (6x the 0.25 s client timeout)"),
             self.redis_paused, None),
            (Fault("redis_killed", "redis-server SIGKILLed, restarted empty on the same port "
                   "1 s later"), self.redis_killed, None),
            (Fault("keys_deleted", "every key of the name DELeted every 0.2 s for 1.5 s"),
             self.keys_deleted, None),
            (Fault("keys_wrong_type", "every key of the name overwritten with a wrong type "
                   "for 1.5 s, then deleted (the operator's fix)"), self.keys_wrong_type, None),
            (Fault("worker_killed", "a 9th worker SIGKILLed while its call holds a half-open "
                   "probe and a bulkhead permit (dependency down until then)"),
             self.worker_killed, self.breaker_closed),
            (Fault("acl_no_channel", "the workers' ACL user loses every channel permission "
                   "(Redis 7's default for new users) while the dependency fails for 1 s"),
             self.acl_no_channel, self.breaker_closed),
            (Fault("redis_full", "maxmemory reached under noeviction for 1.5 s: every write "
                   "that needs memory is refused (OOM)"), self.redis_full, None),
        ]

    def dependency_down(self, fault: Fault) -> None:
        self.shared.mode.value = cw.DOWN
        time.sleep(1.0 * SCALE)
        self.shared.mode.value = cw.FLAKY

    def breaker_closed(self) -> bool:
        try:
            metrics = CircuitBreaker(NAME, redis=self.admin, **cw.BREAKER).metrics()
        except Exception as error:
            self.waiting_for = f"breaker metrics: {error!r}"
            return False
        if metrics.state.value != "CLOSED":
            self.waiting_for = f"breaker {metrics.state.value}"
            return False
        return self.fleet_on_redis()

    def script_flush(self, fault: Fault) -> None:
        end = time.monotonic() + 2.0 * SCALE
        flushes = 0
        while time.monotonic() < end:
            self.admin.script_flush()
            flushes += 1
            time.sleep(0.2)
        fault.notes["flushes"] = flushes

    def redis_paused(self, fault: Fault) -> None:
        for _ in range(int(SCALE)):
            self.admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
            time.sleep(1.5)

    def redis_killed(self, fault: Fault) -> None:
        for _ in range(int(SCALE)):
            self.server.kill()
            time.sleep(1.0)
            self.server.start()
            if SOAK:
                time.sleep(2.0)

    def keys_deleted(self, fault: Fault) -> None:
        end = time.monotonic() + 1.5 * SCALE
        deletes = 0
        while time.monotonic() < end:
            deletes += self.admin.delete(*self.keys())
            time.sleep(0.2)
        fault.notes["keys_deleted"] = deletes

    def keys_wrong_type(self, fault: Fault) -> None:
        end = time.monotonic() + 1.5 * SCALE
        while time.monotonic() < end:
            pipe = self.admin.pipeline()
            for i, key in enumerate(self.keys()):
                pipe.delete(key)
                if i % 2:
                    pipe.rpush(key, "not", "ours")
                else:
                    pipe.set(key, "garbage")
            pipe.execute()
            time.sleep(0.2)
        self.admin.delete(*self.keys())

    def acl_no_channel(self, fault: Fault) -> None:
        history = BreakerKeys.build(NAME).history
        before = self.admin.xlen(history)
        self.admin.execute_command("ACL", "SETUSER", "default", "resetchannels")
        try:
            self.shared.mode.value = cw.DOWN
            time.sleep(1.0 * SCALE)
            self.shared.mode.value = cw.FLAKY
            entries = self.admin.xrange(history, count=1000)[before:]
            fault.notes["trips_saved"] = sum(1 for _, f in entries if f[b"to"] == b"OPEN")
        finally:
            self.admin.execute_command("ACL", "SETUSER", "default", "allchannels")

    def redis_full(self, fault: Fault) -> None:
        self.admin.config_set("maxmemory-policy", "noeviction")
        self.admin.config_set("maxmemory", "1")  # every write that needs memory is refused
        try:
            try:
                self.admin.set("chaos:probe", "x")
                fault.notes["oom_seen"] = False
            except redis.exceptions.OutOfMemoryError:
                fault.notes["oom_seen"] = True
            time.sleep(1.5 * SCALE)
        finally:
            self.admin.config_set("maxmemory", "0")

    def worker_killed(self, fault: Fault) -> None:
        self.victim = self.spawn(PROCESSES, victim=True)
        wait_until(lambda: self.shared.calls[PROCESSES] >= 20
                   and not self.shared.redis_down[PROCESSES], timeout=60, interval=0.02,
                   what="the victim calls on Redis")
        self.shared.mode.value = cw.DOWN
        hung = self.shared.victim_hung.wait(30 * SCALE)
        fault.notes["victim_held_probe"] = hung
        leases = self.admin.zcount(BulkheadKeys.build(NAME).leases, 1, "+inf")
        fault.notes["bulkhead_leases_at_kill"] = leases
        fault.notes["probe_leases_at_kill"] = self.admin.zcard(BreakerKeys.build(NAME).probes)
        self.victim.kill()
        self.victim.join(5)
        fault.notes["victim_exitcode"] = self.victim.exitcode
        with self.shared.lock:
            self.shared.inflight[PROCESSES] = 0  # a dead process runs no call
        self.shared.redis_down[PROCESSES] = 0
        self.shared.mode.value = cw.FLAKY


# -- figures ------------------------------------------------------------------------------

def bucket(t: float, run: ChaosRun) -> int:
    return int(t / cw.BUCKET) - run.shared.t0_bucket


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "n": 0}
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5), 2), "p99": round(pick(0.99), 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


@dataclasses.dataclass
class Figures:
    """Per-bucket figures merged from every worker's report."""

    latency: dict[int, list[float]]
    outcomes: dict[int, Counter[str]]
    probes: Counter[str]
    unexpected: list[tuple[int, str]]

    @classmethod
    def merge(cls, reports: list[dict[str, Any]]) -> Figures:
        latency: dict[int, list[float]] = defaultdict(list)
        outcomes: dict[int, Counter[str]] = defaultdict(Counter)
        probes: Counter[str] = Counter()
        unexpected: list[tuple[int, str]] = []
        for report in reports:
            for b, samples in report["latency"].items():
                latency[int(b)].extend(samples)
            for b, outcome, n in report["outcomes"]:
                outcomes[int(b)][outcome] += n
            probes.update(report["probes"])
            unexpected.extend(report["unexpected"])
        return cls(latency, outcomes, probes, unexpected)

    def samples(self, first: int, last: int) -> list[float]:
        return [s for b in range(first, last) for s in self.latency.get(b, [])]

    def counts(self, first: int, last: int) -> Counter[str]:
        total: Counter[str] = Counter()
        for b in range(first, last):
            total.update(self.outcomes.get(b, Counter()))
        return total


def clean_buckets(run: ChaosRun, figures: Figures) -> list[bool]:
    """Buckets where every process used Redis: no call within 0.2 s ended in backoff or
    with a SchemaError (a loaded machine may also time out on Redis outside any fault)."""
    shared = run.shared
    bad = [bool(shared.degraded[b] or figures.outcomes.get(b, {}).get("SchemaError"))
           for b in range(BUCKETS)]
    return [not any(bad[max(0, b - 2):b + 3]) for b in range(BUCKETS)]


def first_clean_run(clean: list[bool], start: int, stop: int, length: int = 5) -> int:
    """The first bucket from `start` that begins `length` clean buckets in a row."""
    for b in range(start, stop):
        if all(clean[b:b + length]):
            return b
    return stop


def analyse(run: ChaosRun, figures: Figures) -> dict[str, Any]:
    """The report: per fault, latency, recovery, outcomes and invariant figures."""
    shared = run.shared
    clean = clean_buckets(run, figures)
    base_first, base_last = bucket(run.baseline[0], run), bucket(run.baseline[1], run)
    faults = []
    for fault in run.faults:
        first, end = bucket(fault.inject, run), bucket(fault.fault_end, run) + 1
        window_end = bucket(fault.recovered + GRACE, run) + 1
        steady_last = bucket(fault.steady_end, run)
        settled = first_clean_run(clean, end - 1, steady_last)
        recovered_at = max(fault.recovered, (settled + shared.t0_bucket) * cw.BUCKET)
        on_redis = [shared.max_conc[b] for b in range(first, steady_last) if clean[b]
                    and not (fault.name == "keys_deleted" and b < window_end)]
        faults.append({
            "fault": fault.name, "description": fault.description,
            "fault_seconds": round(fault.fault_end - fault.inject, 2),
            "time_to_recover_s": round(max(0.0, recovered_at - fault.fault_end), 2),
            "fleet_back_on_redis_s": round(max(0.0, fault.recovered - fault.fault_end), 2),
            "added_latency_ms": percentiles(figures.samples(first, window_end)),
            "added_latency_during_fault_ms": percentiles(figures.samples(first, end)),
            "outcomes": dict(figures.counts(first, window_end)),
            "steady_outcomes": dict(figures.counts(window_end, steady_last)),
            "degraded_calls": sum(shared.degraded[first:window_end]),
            "degraded_calls_steady_after": sum(shared.degraded[window_end:steady_last]),
            "max_concurrency": max(shared.max_conc[first:steady_last], default=0),
            "max_concurrency_on_redis": max(on_redis, default=0),
            "buckets": {"fault": [first, window_end], "steady": [window_end, steady_last]},
            "notes": fault.notes,
        })
    return {
        "processes": PROCESSES, "threads": THREADS, "soak": SOAK,
        "dependency_time_ms": cw.DEPENDENCY_TIME * 1000, "think_time_ms": cw.THINK_TIME * 1000,
        "flaky_failure_rate": cw.FLAKY_FAILURE_RATE, "breaker": cw.BREAKER,
        "bulkhead": cw.BULKHEAD, "budget": cw.BUDGET, "retry": cw.RETRY,
        "redis_timeout_s": 0.25, "load_average": [round(x, 1) for x in os.getloadavg()],
        "baseline": {"added_latency_ms": percentiles(figures.samples(base_first, base_last)),
                     "max_concurrency": max(shared.max_conc[base_first:base_last], default=0),
                     "outcomes": dict(figures.counts(base_first, base_last)),
                     "degraded_calls": sum(shared.degraded[base_first:base_last]),
                     "seconds": round(run.baseline[1] - run.baseline[0], 2)},
        "faults": faults,
        "half_open_episodes": {"redis": sum(1 for k in figures.probes if k.startswith("redis")),
                               "local": sum(1 for k in figures.probes if k.startswith("local")),
                               "max_probes_per_episode": max(figures.probes.values(),
                                                             default=0)},
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Chaos run", "",
        f"{report['processes']} processes x {report['threads']} threads (a "
        f"{report['think_time_ms']:g} ms pause between calls) drive one Policy: breaker, "
        f"bulkhead of {report['bulkhead']['max_concurrent_calls']} "
        f"(expected_workers {report['bulkhead']['expected_workers']}), retry "
        f"(max {report['retry']['max_attempts']} attempts) with a retry budget; the "
        f"dependency takes {report['dependency_time_ms']:g} ms and fails "
        f"{report['flaky_failure_rate']:.0%} of calls; redis_timeout "
        f"{report['redis_timeout_s']} s; load average at the end "
        f"{report['load_average']} on {os.cpu_count()} CPUs.", "",
        "- *added*: protected call time minus time inside the dependency and retry backoff "
        "sleeps, in ms, from the fault's start until the fleet was back on Redis;",
        "- *back on Redis*: seconds from the fault's end until every worker's breaker, "
        "bulkhead and budget used Redis again (polled); *settled*: until 0.5 s in a row "
        "without any call on the local fallback or a SchemaError;",
        "- *max conc.*: most calls inside the dependency at once (fleet-wide), over the fault "
        "and the steady period after it; *on Redis*: the same over the moments when no "
        "process was on its local fallback (and leases were not being deleted).", "",
        "| fault | fault s | back on Redis s | settled s | added p50 | added p99 | added max "
        "| max conc. | on Redis | fallback calls | SchemaError | calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = report["baseline"]
    lat = base["added_latency_ms"]
    lines.append(f"| (baseline, {base['seconds']} s) | - | - | - | {lat['p50']} | {lat['p99']} "
                 f"| {lat['max']} | {base['max_concurrency']} | - | {base['degraded_calls']} "
                 f"| 0 | {sum(base['outcomes'].values())} |")
    for f in report["faults"]:
        lat = f["added_latency_ms"]
        lines.append(
            f"| {f['fault']} | {f['fault_seconds']} | {f['fleet_back_on_redis_s']} | "
            f"{f['time_to_recover_s']} | {lat['p50']} | {lat['p99']} | {lat['max']} | "
            f"{f['max_concurrency']} | {f['max_concurrency_on_redis']} | "
            f"{f['degraded_calls']} | {f['outcomes'].get('SchemaError', 0)} | "
            f"{sum(f['outcomes'].values())} |")
    lines += ["", "Faults:", ""]
    lines += [f"- **{f['fault']}**: {f['description']}" for f in report["faults"]]
    episodes = report["half_open_episodes"]
    lines += ["", f"Half-open episodes seen by the dependency: {episodes['redis']} fleet-wide, "
              f"{episodes['local']} in local fallback breakers; most probes reaching the "
              f"dependency in one episode: {episodes['max_probes_per_episode']} (permitted: "
              f"{report['breaker']['permitted_calls_in_half_open']}).", ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "chaos.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (directory / "CHAOS.md").write_text(markdown(report))


@dataclasses.dataclass
class ChaosResult:
    run: ChaosRun
    figures: Figures
    report: dict[str, Any]
    report_dir: Path
    clean: list[bool]
