"""Outcome recording and replay with real processes: an operator turns recording on
(`distbreaker record start`), two worker processes meet a dependency that fails 70 % of
its calls for a while, then recovers, and their lax config never trips; the operator
exports the samples (`record export`) and replays them against that config and a tight
one (`distbreaker replay`, on its own redis-server): the tight one would have tripped
during the incident, and closed again after it."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from distbreaker.recording import control
from tests.helpers import recording_worker
from tests.helpers.processes import collect, join_all
from tests.helpers.waiting import wait_until

SPAWN = multiprocessing.get_context("spawn")


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distbreaker", "--url", url, *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_recorded_incident_is_exported_and_replayed(name: str, redis_url: str,
                                                      reap: list[Any],
                                                      tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    started = cli(redis_url, "record", "start", name, "--rate", "100%", "--for", "10m")
    assert started.returncode == 0, started.stderr
    failing, stop, results = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    workers = [SPAWN.Process(target=recording_worker.run,
                             args=(redis_url, name, failing, stop, results))
               for _ in range(2)]
    reap.extend(workers)
    for w in workers:
        w.start()
    stream = control.stream_key(name)
    wait_until(lambda: client.xlen(stream) >= 300, what="healthy calls recorded")
    failing.set()
    before = client.xlen(stream)
    wait_until(lambda: client.xlen(stream) >= before + 600, what="failing calls recorded")
    failing.clear()
    before = client.xlen(stream)
    wait_until(lambda: client.xlen(stream) >= before + 600, what="recovered calls recorded")
    stop.set()
    join_all(workers)
    assert sum(collect(results, 2)) > 0
    assert client.exists(f"{stream[:-4]}:events") == 0   # the live breaker never tripped

    exported = cli(redis_url, "record", "export", name)
    assert exported.returncode == 0, exported.stderr
    samples = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len({s["worker"] for s in samples}) == 2      # both processes sampled
    assert any(s["failed"] for s in samples) and samples[-1]["failed"] == 0
    assert [s["t_ms"] for s in samples] == sorted(s["t_ms"] for s in samples)
    timeline = tmp_path / "outcomes.jsonl"
    timeline.write_text(exported.stdout)
    (tmp_path / "live.yaml").write_text(json.dumps(recording_worker.LIVE))
    (tmp_path / "tight.yaml").write_text(json.dumps(recording_worker.TIGHT))
    replayed = cli(redis_url, "replay", str(timeline), "--config", str(tmp_path / "live.yaml"),
                   "--config", str(tmp_path / "tight.yaml"), "--target-failure-rate", "40",
                   "--truth-window", "1", "--json")
    assert replayed.returncode == 0, replayed.stderr
    live, tight = json.loads(replayed.stdout)["results"]
    assert (live["label"], live["trips"], live["calls_rejected"]) == ("live", 0, 0)
    assert live["incidents"] >= 1 and live["missed_incidents"] == live["incidents"]
    assert tight["label"] == "tight" and tight["trips"] >= 1
    assert tight["missed_incidents"] < tight["incidents"] and tight["calls_rejected"] > 0
    assert tight["failures_let_through"] < live["failures_let_through"]
    assert tight["transitions"][-1][2] == "CLOSED"        # closed again after recovery
    assert client.pttl(stream) > 0
