"""The operator-reach bench (scripts/bench_reach.py) runs as a user would, in a
subprocess with tiny parameters, its workers real processes, against the session's
redis-server. Asserted: the JSON's structure and that the real CLI's close let every
thread through in every round; not how fast (a latency figure, for the README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]


def test_bench_reach_lets_every_thread_through_and_reports_percentiles(
        redis_url: str, redis_client: redis.Redis) -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/bench_reach.py", "--url", redis_url, "--processes", "2",
         "--threads", "2", "--rounds", "1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"processes": 2, "threads": 2, "rounds": 1, "redis": "given"}.items() \
        <= doc["run"].items()
    assert [row["flavour"] for row in doc["results"]] == ["sync", "asyncio"]
    for row in doc["results"]:
        assert row["threads"] == row["let_through"] == 4, row
        assert row["let_through_per_round"] == [4]
        assert 0 <= row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"], row
        assert row["cli_p50_ms"] > 0
    # its counters and breakers are gone
    assert not list(redis_client.scan_iter(match="*bench-reach*"))


def test_bench_reach_rejects_unknown_flavours() -> None:
    bad = subprocess.run([sys.executable, "scripts/bench_reach.py", "--only", "trio"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--only" in bad.stderr
