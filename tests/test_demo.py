"""The demo, run as a user would: trip and recovery shared by several processes.

Runs ``python -m distbreaker.demo`` in a subprocess (its four workers are
real processes) against the session's redis-server, and once more with no
``redis-server`` on PATH so the embedded fakeredis TCP server is used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from distbreaker.keys import BreakerKeys

ROOT = Path(__file__).resolve().parent.parent


def run_demo(env: dict[str, str], *args: str) -> tuple[str, dict[str, Any]]:
    """Run the demo at half speed; return its output and its SUMMARY line."""
    proc = subprocess.run([sys.executable, "-m", "distbreaker.demo", "--scale", "0.5", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert summaries, f"no SUMMARY line (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout, json.loads(summaries[-1].removeprefix("SUMMARY "))


def assert_trip_and_recovery(output: str, summary: dict[str, Any], workers: int) -> None:
    transitions = summary["transitions"]
    steps = [(t["from"], t["to"]) for t in transitions]
    # Phase 2 trips it once from CLOSED; phase 3 closes it through HALF_OPEN.
    assert steps[0] == ("CLOSED", "OPEN")
    assert steps.count(("CLOSED", "OPEN")) == 1
    assert steps[-2:] == [("OPEN", "HALF_OPEN"), ("HALF_OPEN", "CLOSED")]
    assert summary["final_state"] == "CLOSED"
    # Every fleet-wide event was made by exactly one worker's script call.
    makers = {t["by_worker"] for t in transitions}
    assert None not in makers and makers <= set(range(1, workers + 1))
    # Every worker process failed fast while the breaker was OPEN.
    assert summary["workers_failing_fast"] == list(range(1, workers + 1))
    failing = summary["phases"]["2"]
    assert len(failing) == workers
    assert all(tally.get("rejected", 0) > 0 for tally in failing.values())
    reached = sum(tally.get("reached_dependency", 0) for tally in failing.values())
    rejected = sum(tally.get("rejected", 0) for tally in failing.values())
    assert rejected > reached, "most failing-phase calls must be rejected without a call"
    # Half-open admits at most permitted_calls_in_half_open probes per episode.
    episodes = steps.count(("OPEN", "HALF_OPEN"))
    assert 1 <= summary["half_open_probes"] <= summary["permitted_calls_in_half_open"] * episodes
    # Phase 1 and the end of phase 3: calls succeed on every worker.
    healthy = summary["phases"]["1"].values()
    assert all(t.get("ok", 0) > 0 and not t.get("rejected") for t in healthy)
    assert all(t.get("ok", 0) > 0 for t in summary["phases"]["3"].values())
    assert summary["checks"] and all(summary["checks"].values())
    assert "made CLOSED -> OPEN" in output and "rejected: OPEN, failing fast" in output
    assert "observer received" in output


def test_demo_against_redis_server(redis_url: str, redis_client: redis.Redis,
                                   name: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    output, summary = run_demo(env, "--name", name)
    assert "REDIS_URL" in output.splitlines()[0]
    assert_trip_and_recovery(output, summary, workers=4)
    # The shared state and the capped history in Redis tell the same story.
    keys = BreakerKeys.build(name)
    assert redis_client.hget(keys.state, "state") == b"CLOSED"
    history = [(fields[b"from"].decode(), fields[b"to"].decode())
               for _, fields in redis_client.xrange(keys.history)]
    told = [(t["from"], t["to"]) for t in summary["transitions"]]
    assert history[-len(told):] == told


def test_demo_without_redis_server_uses_fakeredis_tcp() -> None:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["PATH"] = str(ROOT / "no-such-dir")  # no redis-server anywhere on PATH
    output, summary = run_demo(env, "--workers", "3")
    assert "fakeredis TCP server" in output.splitlines()[0]
    assert_trip_and_recovery(output, summary, workers=3)
