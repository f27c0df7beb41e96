"""The overload bench (scripts/bench_overload.py) and its capacity-limited upstream.

The upstream runs in-process for its own tests; the bench runs as a user would, in a
subprocess with tiny phases, its fleet real worker processes, against the session's
redis-server. What is asserted holds whatever the machine's load: no-bulkhead runs
overload a tiny capacity, a queueing upstream never answers 429, the best fixed limit
is the sweep's best, every scenario reports its figures, a failing upstream opens the
breaker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from distbreaker.demo.capacity import CapacityUpstream, Settings
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


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


def test_queueing_upstream_queues_beyond_capacity_in_order_and_503s_when_full() -> None:
    """C=1, a queue of 1: the second call waits for the first (an overload call, served),
    the third finds the queue full: 503 at once. No 429 ever."""
    settings = Settings(capacity=1, base_latency=1.0, queue=1, sigma=0)
    with CapacityUpstream(settings) as upstream:
        assert fetch(upstream.url + "/restart", {})[0] == 200
        answers: list[tuple[int, float]] = []

        def call() -> None:
            started = time.monotonic()
            status, _, _ = fetch(upstream.url + "/call")
            answers.append((status, time.monotonic() - started))

        first = threading.Thread(target=call)
        first.start()
        wait_until(lambda: fetch(upstream.url + "/stats")[1]["in_flight"] >= 1,
                   what="the first call is served")
        second = threading.Thread(target=call)
        second.start()
        wait_until(lambda: fetch(upstream.url + "/stats")[1]["in_flight"] >= 2,
                   what="the second call waits in the queue")
        status, body, _ = fetch(upstream.url + "/call")          # the queue is full
        assert (status, body["fate"]) == (503, "overload")
        first.join()
        second.join()
        assert sorted(s for s, _ in answers) == [200, 200]
        assert max(t for _, t in answers) >= 1.5                 # it waited for the first
        stats = fetch(upstream.url + "/stats")[1]
        assert stats["calls"] == 3 and stats["ok"] == 1 and stats["overload_calls"] == 2
        assert stats["statuses"] == {"200": 2, "503": 1} and stats["max_admitted"] == 1
    for bad in ({"queue": -1}, {"queue": 1.5}, {"sigma": -0.1}):
        with pytest.raises(ValueError):
            Settings(**bad)


def run_bench(redis_url: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "scripts/bench_overload.py", "--url", redis_url, "--capacity", "2",
         "--processes", "2", "--threads", "3", "--seconds", "1", "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return dict(json.loads(proc.stdout))


def test_bench_steady_scenarios_on_the_queueing_upstream(redis_url: str) -> None:
    doc = run_bench(redis_url, "--upstream", "queueing", "--limits", "1,4",
                    "--only", "none,fixed,adaptive,aimd,gradient", "--base-latency", "0.02")
    assert doc["run"]["capacity"] == 2 and doc["run"]["queue"] == 64
    results = doc["queueing"]
    assert "refusing" not in doc
    for key in ("none", "best_fixed", "fixed_2x", "adaptive", "aimd", "gradient"):
        for field in ("goodput", "p50_ms", "p99_ms", "overload_calls", "rejected",
                      "status_503", "timeouts"):
            assert isinstance(results[key][field], (int, float)), (key, field)
        assert results[key]["status_429"] == 0          # a queueing upstream never 429s
        assert "series" not in results[key]             # only with --series
    # Open-loop arrivals at 2x a capacity of 2 with no limit: calls queue.
    assert results["none"]["overload_calls"] > 0 and results["none"]["rejected"] == 0
    # A fleet-wide limit of 1 never lets a call queue; 2C does.
    sweep = {int(limit): goodput for limit, goodput in results["best_fixed"]["sweep"].items()}
    assert sorted(sweep) == [1, 4] and results["best_fixed"]["goodput"] == max(sweep.values())
    assert results["fixed_2x"]["limit"] == 4
    # The per-process limiters ran and moved their limits.
    for key in ("aimd", "gradient", "adaptive"):
        assert results[key]["attempts"] > 0 and results[key]["limit"] is not None
    met = results["targets"]["met"]
    assert all(isinstance(met[k], bool) for k in (
        "adaptive_goodput_ge_90pct", "adaptive_overload_le_10pct",
        "adaptive_ahead_of_per_process"))


def test_bench_step_growth_and_recovery_on_the_refusing_upstream(redis_url: str) -> None:
    doc = run_bench(redis_url, "--upstream", "refusing", "--series",
                    "--only", "step_adaptive,growth_adaptive,recovery_plain")
    results = doc["refusing"]
    step = results["step_adaptive"]
    assert [c["capacity"] for c in step["convergence"]] == [1, 2]   # C -> C/3 -> C
    assert step["series"]["limit"] and len(step["series"]["limit"]) == len(
        step["series"]["limit_t"])
    assert results["growth_adaptive"]["goodput"] > 0
    plain = results["recovery_plain"]
    assert plain["status_503"] > 0 and plain["rejected_breaker"] > 0
    assert plain["after_recovery"]["capacity"] == 1


def test_bench_rejects_unknown_scenarios(redis_url: str) -> None:
    bad = subprocess.run([sys.executable, "scripts/bench_overload.py", "--only", "nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scenarios: nope" in bad.stderr


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
