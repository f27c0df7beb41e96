"""The pool bench (scripts/bench_pool.py): its JSON, and the cap it checks.

The bench runs as a user would, in a subprocess with tiny phases, its fleet real
worker processes, against the session's redis-server. What is asserted holds whatever
the machine's load: every variant reports every figure, a per-process ejector ejects
the member that answers 503s, no ejection never does, and the fleet never has more
than `max_ejection_percent` of the pool ejected (6 of 10 bad, a cap of 5).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_pool  # noqa: E402  (a script, not a package)

OUTLIER_FIELDS = ("time_to_eject_s", "time_to_first_eject_s", "processes_that_ejected",
                  "calls_to_bad_before_eject", "bad_share_after_eject", "calls_to_bad",
                  "goodput", "p50_ms", "p99_ms", "errors", "calls", "ejections")
CAP_FIELDS = ("cap", "bad_members", "max_ejected", "cap_violations", "distinct_ejected",
              "healthy_ever_ejected", "bad_share", "goodput", "errors", "calls")


def run_bench(redis_url: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "scripts/bench_pool.py", "--url", redis_url, "--json",
         "--processes", "2", "--threads", "2", "--warmup", "0.3", "--errors", "1.5",
         "--slow", "0.5", "--cap-seconds", "1.5", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return dict(json.loads(proc.stdout))


def test_bench_reports_every_variant_and_the_cap_holds(redis_url: str) -> None:
    doc = run_bench(redis_url)
    assert doc["run"]["members"] == 10 and doc["run"]["rules"]["max_ejection_percent"] == 50
    for variant in ("fleet", "per_process", "none"):
        assert "error" not in doc[variant], doc[variant]
        assert set(OUTLIER_FIELDS) <= set(doc[variant]), variant
        assert doc[variant]["calls"] > 0
    # No ejection: the bad member's 503s reach the callers, nobody ejects it.
    none = doc["none"]
    assert none["time_to_eject_s"] is None and none["ejections"] == {}
    assert none["errors"] > 0 and none["calls_to_bad"] > 0
    # Ejectors eject the member answering 503s (it fails fast, so it is picked often).
    for variant in ("fleet", "per_process"):
        assert doc[variant]["time_to_first_eject_s"] is not None, variant
        assert "m0" in doc[variant]["ejections"], variant
    assert doc["fleet"]["processes_that_ejected"] == 2
    # The cap: 6 of 10 bad, max_ejection_percent=50 -> never more than 5 ejected at once.
    for variant in ("fleet", "per_process"):
        cap = doc["cap"][variant]
        assert "error" not in cap, cap
        assert set(CAP_FIELDS) <= set(cap)
        assert cap["cap"] == 5 and cap["bad_members"] == 6
        assert cap["cap_violations"] == 0 and 1 <= cap["max_ejected"] <= 5, cap
        assert cap["healthy_ever_ejected"] == [], cap
    assert doc["cap"]["fleet"]["reads"] > 0
    assert doc["cap"]["per_process"]["max_ejected_by_any_process"] >= 1
    assert set(doc["targets"]["met"]) == {"ejected_within_quarter_of_per_process_calls",
                                          "bad_share_after_eject_le_1pct",
                                          "zero_cap_violations"}
    assert doc["targets"]["met"]["zero_cap_violations"] is True
    assert set(doc["ratios"]) == {"fleet_vs_per_process", "fleet_vs_none"}


def test_bench_rejects_unknown_scenarios() -> None:
    bad = subprocess.run([sys.executable, "scripts/bench_pool.py", "--only", "nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scenarios: nope" in bad.stderr


def spec(**over: Any) -> bench_pool.Spec:
    fields: dict[str, Any] = {
        "variant": "per_process", "name": "x", "members": 4, "bad": (0,), "start": 0.0,
        "bad_at": 0.0, "slow_at": 100.0, "end": 200.0, "latency": 0.01,
        "slow_factor": 10.0, "threads": 1,
        "rules": bench_pool.Rules(consecutive_5xx=3, max_ejection_percent=50,
                                  latency_minimum_hosts=3, latency_request_volume=3,
                                  latency_threshold=0.05)}
    return bench_pool.Spec(**{**fields, **over})


def test_per_process_ejector_follows_the_rules() -> None:
    """Consecutive 5xx eject for the base time x ejections; the cap (2 of 4) holds; a
    slow member is a latency outlier; fewer live than the panic threshold: route to all."""
    ejector = bench_pool.LocalEjector(spec())
    rng = random.Random(1)
    for _ in range(3):
        ejector.in_flight["m0"] += 1
        ejector.record("m0", 503, 0.001)
    assert "m0" in ejector.until and ejector.log[-1][1:] == ("m0", "eject", "consecutive_5xx")
    assert all(ejector.pick(rng) != "m0" for _ in range(50))
    for member in ("m1", "m2"):                  # the cap is 2: m2 stays in rotation
        for _ in range(3):
            ejector.in_flight[member] += 1
            ejector.record(member, 500, 0.001)
    assert set(ejector.until) == {"m0", "m1"}
    assert bench_pool.most_ejected(ejector.log) == 2
    other = [(0.5, "m2", "eject", "x"), (0.6, "m3", "eject", "x")]
    assert bench_pool.most_ejected_anywhere([ejector.log, other], 3) == (4, 1)
    # An ejection ends after base_ejection x its number; counters start again.
    ejector.until = {m: time.time() - 1 for m in ejector.until}
    assert ejector.routable(time.time()) == ["m0", "m1", "m2", "m3"]
    assert ejector.log[-1][2] == "return" and ejector.consecutive["m0"] == 0
    # Latency, when an interval ends: m3's mean at 10x the median member's, above the floor.
    ejector = bench_pool.LocalEjector(spec())
    for _ in range(3):
        for member, seconds in (("m0", 0.01), ("m1", 0.01), ("m2", 0.01), ("m3", 0.1)):
            ejector.in_flight[member] += 1
            ejector.record(member, 200, seconds)
    assert ejector.log == []
    ejector.interval_start -= ejector.rules.interval
    ejector.in_flight["m0"] += 1
    ejector.record("m0", 200, 0.01)
    assert ejector.log[-1][1:] == ("m3", "eject", "latency") and len(ejector.log) == 1
    # Below the floor (latency_threshold) a 10x member is no outlier.
    fast = bench_pool.LocalEjector(spec())
    for _ in range(3):
        for member, seconds in (("m0", 0.001), ("m1", 0.001), ("m2", 0.001), ("m3", 0.01)):
            fast.in_flight[member] += 1
            fast.record(member, 200, seconds)
    fast.interval_start -= fast.rules.interval
    fast.in_flight["m0"] += 1
    fast.record("m0", 200, 0.001)
    assert fast.log == []
    # Panic: with 2 of 4 live the threshold (50 %) still holds; below it, all are routable.
    panicky = bench_pool.LocalEjector(spec(rules=bench_pool.Rules(panic_threshold=75)))
    panicky.until = {"m0": time.time() + 60, "m1": time.time() + 60}
    assert panicky.routable(time.time()) == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize(("at", "expected"), [(-1.0, 200), (1.0, 503), (150.0, 200)])
def test_simulated_member_timeline(at: float, expected: int) -> None:
    s = spec(bad_at=0.0, slow_at=100.0)
    status, seconds = bench_pool.answer(s, 0, at, random.Random(2))
    assert status == expected
    if at >= 100.0:
        assert seconds > s.latency * 3      # only slow
    assert bench_pool.answer(s, 1, 1.0, random.Random(2))[0] == 200
