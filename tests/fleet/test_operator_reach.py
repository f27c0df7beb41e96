"""Operator actions reach every exact-mode worker at once (issue 13): 8 worker processes
x 4 threads (sync) or 4 tasks (asyncio) reject on an OPEN breaker with a 60 s wait; the
real CLI closes it; every thread's next call is permitted within one round trip plus
pub/sub delivery of the transition (p99 <= 50 ms on loopback), over ROUNDS trip/close
rounds."""

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
PROCESSES, THREADS, ROUNDS = 8, 4, 3


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_cli_close_reaches_every_worker_within_50_ms(redis_url: str, redis_client: redis.Redis,
                                                    name: str, flavour: str) -> None:
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
    delays_ms = [max(0.0, (t - closed_at[r]) * 1000) for r, t in permitted]
    print(f"{flavour}: close -> permitted p50 {percentile(delays_ms, 50):.1f} ms, "
          f"p99 {percentile(delays_ms, 99):.1f} ms, max {max(delays_ms):.1f} ms")
    assert percentile(delays_ms, 99) <= 50, sorted(delays_ms)
