"""Operator actions reach every exact-mode worker at once (issue 13): 8 worker processes
x 4 threads (sync) or 4 tasks (asyncio) reject on an OPEN breaker with a 60 s wait; the
real CLI closes it; every thread's next call is permitted within one round trip plus
pub/sub delivery of the transition (p99 <= 50 ms on loopback), over ROUNDS trip/close
rounds.

Every run must let every thread through far sooner than revalidation would (1 s: so
the pub/sub message did it; without it the 60 s wait would hold). The 50 ms target is
a latency measured on a 2-core machine shared by 9 Python processes: a run whose p99
misses it (scheduling noise) is measured again, up to ATTEMPTS runs, and the target
must hold in one of them. The figures of every run are printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from distbreaker import CircuitBreaker, State

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "reach_worker.py"
PROCESSES, THREADS, ROUNDS, ATTEMPTS = 8, 4, 3, 3
TARGET_P99_MS = 50.0
REVALIDATE_MS = 1000.0  # the default revalidate_interval


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_cli_close_reaches_every_worker_within_50_ms(redis_url: str, redis_client: redis.Redis,
                                                    name: str, flavour: str) -> None:
    p99s = []
    for attempt in range(ATTEMPTS):
        delays_ms = measure(redis_url, redis_client, f"{name}-{attempt}", flavour)
        p99 = percentile(delays_ms, 99)
        print(f"{flavour} run {attempt + 1}: close -> permitted p50 "
              f"{percentile(delays_ms, 50):.1f} ms, p99 {p99:.1f} ms, max {max(delays_ms):.1f} ms")
        assert max(delays_ms) < REVALIDATE_MS, sorted(delays_ms)  # pushed, not re-checked
        p99s.append(p99)
        if p99 <= TARGET_P99_MS:
            break
    assert min(p99s) <= TARGET_P99_MS, p99s


def measure(redis_url: str, redis_client: redis.Redis, name: str, flavour: str) -> list[float]:
    """ROUNDS trip/close rounds with a fresh fleet: every thread's delay, in ms, from the
    CLI's transition (server time) to its first permitted call."""
    admin = CircuitBreaker(name, redis=redis_url, wait_duration_in_open_state=60,
                           sliding_window_size=10, minimum_number_of_calls=10, subscribe=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [subprocess.Popen([sys.executable, str(WORKER), redis_url, name, str(THREADS),
                                 "1" if flavour == "asyncio" else "0", str(ROUNDS)],
                                stdout=subprocess.PIPE, text=True, env=env)
               for _ in range(PROCESSES)]
    closed_at: list[float] = []
    try:
        for round_ in range(ROUNDS):
            assert admin.trip("test") is State.OPEN
            deadline = time.monotonic() + 60
            key = f"test:{name}:rejecting:{round_}"
            while int(redis_client.get(key) or 0) < PROCESSES * THREADS:
                assert time.monotonic() < deadline, "workers never all saw OPEN"
                time.sleep(0.05)
            time.sleep(0.3)  # every worker is now on its local OPEN view (no round trips)
            closed = subprocess.run([sys.executable, "-m", "distbreaker", "--url", redis_url,
                                     "close", name, "--reason", "recovered"],
                                    capture_output=True, text=True, env=env, timeout=30)
            assert closed.returncode == 0, closed.stderr
            (_, fields), = redis_client.xrevrange(admin.keys.history, count=1)
            assert fields[b"to"] == b"CLOSED"
            closed_at.append(int(fields[b"at_ms"]) / 1000.0)
            time.sleep(0.5)  # every thread got through before the next trip
        outputs = [worker.communicate(timeout=60)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    # (round, time of the first permitted call) of every thread of every process
    permitted = [(r, t) for out in outputs for r, t in json.loads(out)]
    # every thread was let through again, in every round
    assert len(permitted) == PROCESSES * THREADS * ROUNDS
    return [max(0.0, (t - closed_at[r]) * 1000) for r, t in permitted]
