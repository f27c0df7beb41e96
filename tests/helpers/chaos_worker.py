"""Bodies of the chaos fleet's worker processes (an importable module, for "spawn").

Every worker process builds one `Policy` (breaker + bulkhead + retry with a
retry budget) on the shared Redis URL and drives it from `threads` threads
until told to stop. The fake dependency records what it sees in shared memory
(`multiprocessing` raw arrays), not in Redis, so the figures survive the Redis
faults the suite injects:

* calls in flight, per process, and the highest fleet-wide sum per time bucket;
* logical requests and retries (attempts after the first) per time bucket;
* half-open probes reaching it, per half-open episode (the breaker reply's
  `since_ms` identifies the episode; episodes of a process's local fallback
  breaker are told apart by the process id);
* whether any of the process's components is in its Redis backoff.

Time buckets are `BUCKET` seconds of wall-clock time aligned to the epoch,
like the retry budget's 100 ms slices in Redis.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections import Counter, defaultdict
from multiprocessing.queues import Queue
from typing import Any

from distbreaker import CircuitBreaker, Policy
from distbreaker._runtime.connection import sync_client
from distbreaker.errors import BulkheadFull, CallNotPermitted, SchemaError

BUCKET = 0.1
DEPENDENCY_TIME = 0.002
FLAKY_FAILURE_RATE = 0.2
FLAKY, DOWN = 0, 1
#: Pause between two calls of a thread: 64 threads on 2 cores must leave Redis some CPU.
THINK_TIME = 0.005

#: What the fleet uses; the test module checks invariants against these numbers.
BREAKER = {"sliding_window_size": 20, "minimum_number_of_calls": 10,
           "failure_rate_threshold": 50, "wait_duration_in_open_state": 0.3,
           "permitted_calls_in_half_open": 3, "half_open_lease": 1.0, "key_ttl": 60.0}
BULKHEAD = {"max_concurrent_calls": 8, "expected_workers": 8, "lease": 1.0,
            "key_ttl": 60.0}
BUDGET = {"percent_can_retry": 0.1, "min_retries_per_sec": 5.0, "ttl": 1.0, "slices": 10}
RETRY = {"max_attempts": 3, "base": 0.005, "cap": 0.02}


class DependencyError(Exception):
    """The fake dependency failed (retryable, counted as a failure)."""


def bucket_of(t0_bucket: int, now: float | None = None) -> int:
    return int((time.time() if now is None else now) / BUCKET) - t0_bucket


@dataclasses.dataclass
class Shared:
    """Shared memory handed to every worker at creation (inherited by spawn)."""

    mode: Any          # RawValue('i'): FLAKY or DOWN
    stop: Any          # Event
    lock: Any          # Lock guarding the arrays below
    inflight: Any      # RawArray('i', slots): calls in the dependency, per process
    max_conc: Any      # RawArray('i', buckets): highest fleet-wide in-flight sum per bucket
    requests: Any      # RawArray('i', buckets): logical requests started per bucket
    retries: Any       # RawArray('i', buckets): attempts after the first reaching the dependency
    redis_down: Any    # RawArray('i', slots): 1 while a component of that process is in backoff
    degraded: Any      # RawArray('i', buckets): calls begun or ended with a component in backoff
    calls: Any         # RawArray('i', slots): protected calls finished, per process
    last_call: Any     # RawArray('d', slots): wall time the process's last call ended
    victim_hung: Any   # Event: the victim process holds a probe and a bulkhead permit
    t0_bucket: int


class ProbeAwareBreaker(CircuitBreaker):
    """A breaker that tells the dependency (via a thread-local) whether this call is a probe."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chaos = threading.local()

    def acquire(self) -> Any:
        self.chaos.probe = None
        self.chaos.source = "redis"
        return super().acquire()

    def _local_reply(self, call: Any) -> Any:
        self.chaos.source = f"local-{os.getpid()}"
        return super()._local_reply(call)

    def _admit(self, reply: Any, token: str, *rest: Any) -> Any:
        permit = super()._admit(reply, token, *rest)
        if permit.token:
            self.chaos.probe = f"{self.chaos.source}:{reply.since_ms}"
        return permit


class Worker:
    """One worker process: the policy, the instrumented dependency and the thread loop."""

    def __init__(self, index: int, url: str, name: str, shared: Shared, victim: bool) -> None:
        self.index = index
        self.shared = shared
        self.victim = victim
        client = sync_client(url, 0.25)  # one client: the policy pipelines its calls
        breaker = ProbeAwareBreaker(name, redis=client, **BREAKER)
        self.breaker = breaker
        self.policy = Policy(name, redis=client, breaker=breaker, bulkhead=dict(BULKHEAD),
                             retry=dict(RETRY), budget=dict(BUDGET), sleep=self._sleep)
        self.tls = threading.local()
        self.lock = threading.Lock()
        self.probes: Counter[str] = Counter()
        self.outcomes: Counter[tuple[int, str]] = Counter()
        self.latency: dict[int, list[float]] = defaultdict(list)
        self.unexpected: list[tuple[int, str]] = []

    def _sleep(self, seconds: float) -> None:
        """The policy's backoff sleep, timed so it is not counted as added latency."""
        started = time.perf_counter()
        time.sleep(seconds)
        self.tls.slept += time.perf_counter() - started

    def _bump(self, array: Any, bucket: int) -> None:
        with self.shared.lock:
            if 0 <= bucket < len(array):
                array[bucket] += 1

    def _enter(self) -> None:
        shared = self.shared
        bucket = bucket_of(shared.t0_bucket)
        with shared.lock:
            shared.inflight[self.index] += 1
            total = sum(shared.inflight)
            if 0 <= bucket < len(shared.max_conc) and total > shared.max_conc[bucket]:
                shared.max_conc[bucket] = total

    def _leave(self) -> None:
        with self.shared.lock:
            self.shared.inflight[self.index] -= 1

    def dependency(self) -> str:
        tls = self.tls
        tls.attempt += 1
        if tls.attempt > 1:
            self._bump(self.shared.retries, bucket_of(self.shared.t0_bucket))
        probe = self.breaker.chaos.probe
        started = time.perf_counter()
        self._enter()
        try:
            if probe is not None:
                with self.lock:
                    self.probes[probe] += 1
                if self.victim and probe.startswith("redis:"):
                    self.shared.victim_hung.set()
                    time.sleep(3600)  # hold the probe and the bulkhead permit until SIGKILL
            time.sleep(DEPENDENCY_TIME)
            if self.shared.mode.value == DOWN or random.random() < FLAKY_FAILURE_RATE:
                raise DependencyError("dependency failed")
            return "ok"
        finally:
            self._leave()
            tls.dep += time.perf_counter() - started

    def _components_down(self) -> bool:
        policy = self.policy
        return bool(policy.breaker._health.down or policy.bulkhead._codec.health.down
                    or policy.budget._health.down)

    def one_call(self) -> None:
        tls = self.tls
        tls.attempt, tls.dep, tls.slept = 0, 0.0, 0.0
        bucket = bucket_of(self.shared.t0_bucket)
        self._bump(self.shared.requests, bucket)
        # Down when the call starts or ends: a call that took a local permit (Redis down
        # at its start) still runs on it after the process's components (which share one
        # health) are back on Redis.
        down_at_start = self._components_down()
        started = time.perf_counter()
        try:
            self.policy.call(self.dependency)
            outcome = "ok"
        except DependencyError:
            outcome = "DependencyError"
        except (CallNotPermitted, BulkheadFull, SchemaError) as documented:
            outcome = type(documented).__name__
        except Exception as error:  # the suite asserts there are none
            outcome = "unexpected"
            with self.lock:
                if len(self.unexpected) < 50:
                    self.unexpected.append((bucket, f"{type(error).__name__}: {error}"[:300]))
        added = time.perf_counter() - started - tls.dep - tls.slept
        with self.lock:
            self.outcomes[(bucket, outcome)] += 1
            self.latency[bucket].append(round(added * 1000, 3))
        down_now = self._components_down()
        down = down_now or down_at_start
        self.shared.redis_down[self.index] = int(down_now)
        with self.shared.lock:
            self.shared.calls[self.index] += 1
            self.shared.last_call[self.index] = time.time()
        if down:
            self._bump(self.shared.degraded, bucket)

    def loop(self) -> None:
        while not self.shared.stop.is_set():
            self.one_call()
            time.sleep(THINK_TIME)

    def report(self) -> dict[str, Any]:
        return {"index": self.index, "probes": dict(self.probes),
                "outcomes": [(b, o, n) for (b, o), n in self.outcomes.items()],
                "latency": dict(self.latency), "unexpected": self.unexpected}


def drive(index: int, url: str, name: str, shared: Shared, threads: int, victim: bool,
          results: Queue) -> None:
    """Process body: `threads` threads call through the policy until `shared.stop` is set."""
    worker = Worker(index, url, name, shared, victim)
    pool = [threading.Thread(target=worker.loop, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    results.put(worker.report())
