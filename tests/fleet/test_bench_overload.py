"""The overload bench (scripts/bench_overload.py) and its capacity-limited upstream.

The upstream runs in-process for its own tests; the bench runs as a user would, in a
subprocess with tiny phases, its fleet real worker processes, against the session's
redis-server. What is asserted holds whatever the machine's load: no-bulkhead runs
overload a tiny capacity, a fixed limit at or under the capacity never does, the best
fixed limit is the sweep's best, a failing upstream opens the breaker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import distbreaker
from distbreaker.demo.capacity import CapacityUpstream, Settings
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
STEADY = ("none", "fixed_2x", "fixed_half", "best_fixed", "adaptive")
RECOVERY = ("recovery_plain", "recovery_slow_start", "recovery_adaptive")


def fetch(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any],
                                                                 dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers.items())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers.items())


def test_settings_validate_and_latency_rises_with_concurrency() -> None:
    settings = Settings(capacity=4, base_latency=0.01, exponent=2)
    assert settings.latency(0) == pytest.approx(0.01)
    assert settings.latency(4) == pytest.approx(0.04)
    assert settings.latency(2) < settings.latency(3)
    for bad in ({"capacity": 0}, {"capacity": 2.5}, {"over_status": 500},
                {"base_latency": -1}, {"bucket": 0}):
        with pytest.raises(ValueError):
            Settings(**bad)
    with pytest.raises(ValueError, match="unknown settings: nope"):
        settings.replace({"nope": 1})


def test_upstream_refuses_beyond_capacity_with_retry_after_and_counts() -> None:
    # (3 s calls: a loaded machine still sends the third while the two are in flight)
    with CapacityUpstream(Settings(capacity=2, base_latency=1.5, retry_after=2)) as upstream:
        assert fetch(upstream.url + "/restart", {})[0] == 200
        answers: list[tuple[int, dict[str, str]]] = []

        def call() -> None:
            status, _, headers = fetch(upstream.url + "/call")
            answers.append((status, headers))

        threads = [threading.Thread(target=call) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: fetch(upstream.url + "/stats")[1]["in_flight"] >= 2,
                   what="the two admitted calls run together")
        status, body, headers = fetch(upstream.url + "/call")     # the third: beyond C
        assert status == 429 and body["fate"] == "overload"
        assert headers["Retry-After"] == "2"
        for thread in threads:
            thread.join()
        assert sorted(s for s, _ in answers) == [200, 200]
        stats = fetch(upstream.url + "/stats")[1]
        assert stats["calls"] == 3 and stats["ok"] == 2 and stats["overload_calls"] == 1
        assert stats["statuses"] == {"200": 2, "429": 1}
        assert stats["max_admitted"] == 2 and stats["max_in_flight"] == 3
        assert sum(point["calls"] for point in stats["series"]) == 3


def test_admin_changes_capacity_fails_for_a_while_and_rejects_bad_input() -> None:
    with CapacityUpstream(Settings(capacity=8, base_latency=0.0)) as upstream:
        status, settings, _ = fetch(upstream.url + "/admin",
                                    {"capacity": 4, "fail_for": 0.3, "over_status": 503})
        assert status == 200 and settings["capacity"] == 4 and settings["over_status"] == 503
        assert fetch(upstream.url + "/healthz")[1]["failing_for"] > 0
        status, body, _ = fetch(upstream.url + "/call")
        assert (status, body["fate"]) == (503, "failed")
        time.sleep(0.35)
        assert fetch(upstream.url + "/call")[0] == 200
        stats = fetch(upstream.url + "/stats")[1]
        assert stats["failed"] == 1 and stats["overload_calls"] == 0
        for bad in ({"capacity": 0}, {"fail_for": -1}, {"speed": 3}, [1]):
            status, body, _ = fetch(upstream.url + "/admin", bad)  # type: ignore[arg-type]
            assert status == 400 and body["error"]
        assert fetch(upstream.url + "/healthz")[1]["capacity"] == 4   # unchanged


def test_capacity_upstream_command_line_rejects_bad_settings() -> None:
    bad = subprocess.run([sys.executable, "-m", "distbreaker.demo.capacity", "--capacity", "0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "capacity must be an integer >= 1" in bad.stderr


def run_bench(redis_url: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "scripts/bench_overload.py", "--url", redis_url, "--capacity", "2",
         "--processes", "2", "--threads", "3", "--seconds", "1", "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return dict(json.loads(proc.stdout))


def test_bench_reports_every_scenario_and_the_basic_truths(redis_url: str,
                                                           tmp_path: Path) -> None:
    plot = tmp_path / "overload.png"
    doc = run_bench(redis_url, "--plot", str(plot))
    assert plot.stat().st_size > 10_000
    assert doc["run"]["capacity"] == 2 and doc["run"]["processes"] == 2
    ran = [key for key in (*STEADY, *RECOVERY) if "skipped" not in doc[key]]
    for key in ran:
        for field in ("goodput", "p50_ms", "p99_ms", "overload_calls", "rejected",
                      "status_429"):
            assert isinstance(doc[key][field], (int, float)), (key, field)
        assert "series" not in doc[key]            # only with --series
    for key in ("none", "fixed_2x", "fixed_half", "best_fixed", "recovery_plain"):
        assert key in ran
    # No bulkhead against a capacity of 2 from 6 callers: overloaded, answered 429.
    assert doc["none"]["overload_calls"] > 0 and doc["none"]["status_429"] > 0
    assert doc["none"]["rejected"] == 0
    # A fleet-wide limit under the capacity never lets the upstream exceed it.
    assert doc["fixed_half"]["limit"] == 1 and doc["fixed_half"]["overload_calls"] == 0
    assert doc["fixed_half"]["status_429"] == 0 and doc["fixed_half"]["max_in_flight"] <= 1
    assert doc["fixed_half"]["rejected"] > 0                   # 6 callers, 1 permit
    assert doc["fixed_2x"]["limit"] == 4 and doc["fixed_2x"]["overload_calls"] > 0
    # The best fixed limit is the sweep's best, and the sweep spans C/2 .. 2C.
    sweep = {int(limit): goodput for limit, goodput in doc["best_fixed"]["sweep"].items()}
    assert min(sweep) == 1 and max(sweep) == 4
    assert doc["best_fixed"]["goodput"] == max(sweep.values())
    assert sweep[doc["best_fixed"]["limit"]] == doc["best_fixed"]["goodput"]
    # Recovery: the outage's 503s opened the breaker (it rejected), then the upstream
    # came back at half capacity.
    plain = doc["recovery_plain"]
    assert plain["status_503"] > 0 and plain["rejected_breaker"] > 0
    assert plain["after_recovery"]["capacity"] == 1
    assert plain["goodput"] > 0 and plain["after_recovery"]["goodput"] > 0
    # The adaptive limit and slow start run (issue 18), each reporting its targets.
    if hasattr(distbreaker, "AdaptiveLimit"):
        for key in ("adaptive", "recovery_slow_start", "recovery_adaptive"):
            assert key in ran and doc[key]["goodput"] > 0, (key, doc[key])
        assert doc["recovery_adaptive"]["after_recovery"]["capacity"] == 1
        met = doc["targets"]["met"]
        assert all(isinstance(met[k], bool) for k in (
            "adaptive_goodput_ge_90pct", "adaptive_overload_le_10pct",
            "slow_start_at_or_under_capacity", "adaptive_restart_at_or_under_capacity"))
    # What is not built yet says so instead of a number.
    if not hasattr(distbreaker, "AdaptiveLimit"):
        assert doc["adaptive"] == {"skipped": "AdaptiveLimit not available"}
        assert doc["targets"]["adaptive_goodput_vs_best_fixed"] is None
    from distbreaker.breaker.config import BreakerConfig

    if "ramp_duration" not in BreakerConfig.__dataclass_fields__:
        assert doc["recovery_slow_start"]["skipped"].startswith("slow start not available")


def test_bench_only_runs_the_scenarios_asked_and_rejects_unknown_ones(redis_url: str) -> None:
    doc = run_bench(redis_url, "--only", "fixed_half", "--series")
    assert [key for key in doc if key not in ("run", "targets")] == ["fixed_half"]
    series = doc["fixed_half"]["series"]
    assert len(series["t"]) == len(series["goodput"]) and max(series["in_flight"]) <= 1
    bad = subprocess.run([sys.executable, "scripts/bench_overload.py", "--only", "nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scenarios: nope" in bad.stderr


def test_a_scenario_the_library_cannot_build_reports_its_error_and_the_rest_runs(
        redis_url: str, tmp_path: Path) -> None:
    """An `AdaptiveLimit` the Bulkhead does not take (a stand-in, installed in every
    process by sitecustomize while the library has none) fails that scenario only."""
    (tmp_path / "sitecustomize.py").write_text(
        "import distbreaker\n"
        "class AdaptiveLimit:\n"
        "    def __init__(self, min_limit=1, max_limit=10):\n"
        "        self.min_limit, self.max_limit = min_limit, max_limit\n"
        "if not hasattr(distbreaker, 'AdaptiveLimit'):\n"
        "    distbreaker.AdaptiveLimit = AdaptiveLimit\n"
        "    distbreaker.STAND_IN = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "scripts/bench_overload.py", "--url", redis_url, "--capacity", "2",
         "--processes", "2", "--threads", "2", "--seconds", "0.5", "--json",
         "--only", "fixed_half,adaptive"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    if hasattr(distbreaker, "AdaptiveLimit"):    # the real one: no stand-in, it runs
        assert doc["adaptive"]["goodput"] > 0
    else:
        assert "unknown bulkhead option(s): adaptive" in doc["adaptive"]["error"]
    assert doc["fixed_half"]["goodput"] > 0 and doc["fixed_half"]["overload_calls"] == 0


def test_a_restart_keeps_the_calls_in_progress_in_flight() -> None:
    """Counts restart between scenarios while calls may still run: those stay in flight
    (else they would leave into a negative count and let more than C in)."""
    with CapacityUpstream(Settings(capacity=1, base_latency=1.5)) as upstream:
        first = threading.Thread(target=fetch, args=(upstream.url + "/call",))
        first.start()
        wait_until(lambda: fetch(upstream.url + "/stats")[1]["in_flight"] >= 1,
                   what="the first call is in flight")
        assert fetch(upstream.url + "/restart", {})[0] == 200
        stats = fetch(upstream.url + "/stats")[1]
        assert stats["calls"] == 0 and stats["in_flight"] == 1
        assert fetch(upstream.url + "/call")[0] == 429      # still full
        first.join()
        assert fetch(upstream.url + "/stats")[1]["in_flight"] == 0
        assert fetch(upstream.url + "/call")[0] == 200
