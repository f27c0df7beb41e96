"""The fleet demo, run as a user would, and the flaky upstream it calls.

The demo runs in a subprocess (its workers and upstreams are real processes):
once as ``python -m distbreaker.demo`` against the session's redis-server with
``--json --plot``, once as ``python -m distbreaker demo`` (the CLI) with no
``redis-server`` on PATH, so the embedded fakeredis TCP server is used.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from distbreaker._runtime.keys import BreakerKeys
from distbreaker.demo.upstream import FlakyUpstream, Timeline
from tests.helpers.records import read_record

ROOT = Path(__file__).resolve().parents[2]


def run_demo(env: dict[str, str], *args: str) -> tuple[str, dict[str, Any]]:
    """Run a short demo with --json; return its stderr (the timeline) and its result."""
    proc = subprocess.run([sys.executable, *args, "--duration", "8", "--workers", "3", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stderr, json.loads(proc.stdout)


def assert_fleet_story(timeline: str, result: dict[str, Any], workers: int) -> None:
    steps = [(t["from"], t["to"]) for t in result["transitions"]]
    # Tripped once fleet-wide, in the failing phase, by one worker's script call.
    assert steps.count(("CLOSED", "OPEN")) == 1
    trip = next(t for t in result["transitions"] if t["to"] == "OPEN")
    bounds = {mode: (start, end) for mode, start, end in result["timeline"]}
    assert bounds["failing"][0] <= trip["t"] <= bounds["failing"][1]
    assert trip["by_worker"] in range(1, workers + 1)
    # Every WITH worker was rejected while the breaker was OPEN (it failed fast).
    assert result["workers_rejected_while_open"] == list(range(1, workers + 1))
    failing = result["phases"]["failing"]
    assert failing["with"]["rejected"] > failing["with"]["upstream_calls"]
    assert any(set(s["with"]["states"].values()) == {"OPEN"} for s in result["seconds"])
    # Far less load on the failing upstream than the naive retry layers produce.
    assert failing["with"]["upstream_calls"] * 3 <= failing["without"]["upstream_calls"]
    assert failing["without"]["calls_per_error"] == [27]     # 3 x 3 x 3 attempts
    assert failing["with"]["max_calls_per_request"] <= 3
    # ... and the rejected users did not wait: fail fast vs. 27 attempts.
    assert failing["with"]["latency_ms"]["p50"] * 10 < failing["without"]["latency_ms"]["p50"]
    # Recovery: probes closed it again, every worker sees CLOSED at the end.
    assert steps[-1] == ("HALF_OPEN", "CLOSED")
    assert result["final_state"] == "CLOSED"
    last = result["seconds"][-1]["with"]["states"]
    assert set(last.values()) == {"CLOSED"}
    assert result["phases"]["recovering"]["with"]["ok"] > 0
    assert result["ok"] and all(result["checks"].values())
    assert "*** CLOSED -> OPEN" in timeline and "HALF_OPEN -> CLOSED" in timeline


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_demo_json_and_plot_against_redis_server(redis_url: str, redis_client: redis.Redis,
                                                 name: str, tmp_path: Path) -> None:
    picture = tmp_path / "demo.png"
    env = {**os.environ, "REDIS_URL": redis_url}
    timeline, result = run_demo(env, "-m", "distbreaker.demo", "--name", name,
                                "--plot", str(picture))
    assert "REDIS_URL" in timeline.splitlines()[0]
    assert_fleet_story(timeline, result, workers=3)
    # Redis's own history of the breaker tells the same story as pub/sub did.
    keys = BreakerKeys.build(name)
    assert read_record(redis_client, keys)["state"] == "CLOSED"
    history = [(f[b"from"].decode(), f[b"to"].decode()) for _, f in redis_client.xrange(
        keys.history)]
    told = [(t["from"], t["to"]) for t in result["transitions"]]
    assert history[-len(told):] == told
    data = picture.read_bytes()
    width, height = png_size(data)
    assert width >= 800 and height >= 600 and len(data) > 20_000
    assert result["plot"] == str(picture)


def test_cli_demo_without_redis_server_uses_fakeredis_tcp() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",
                                                             "DISTBREAKER_REDIS_URL")}
    env["PATH"] = str(ROOT / "no-such-dir")  # no redis-server anywhere on PATH
    timeline, result = run_demo(env, "-m", "distbreaker", "demo")
    assert "fakeredis TCP server" in timeline.splitlines()[0]
    assert_fleet_story(timeline, result, workers=3)


# -- the flaky upstream ------------------------------------------------------------------

def test_timeline_parse_modes_and_loop() -> None:
    timeline = Timeline.parse("ok:1,failing:2,slow:1,recovering:1", scale=2.0)
    assert [(m, a, b) for m, a, b in timeline.bounds()] == [
        ("ok", 0, 2), ("failing", 2, 6), ("slow", 6, 8), ("recovering", 8, 10)]
    assert timeline.mode_at(1.9) == "ok" and timeline.mode_at(2.0) == "failing"
    assert timeline.mode_at(99) == "recovering"          # stays in the last phase
    looping = Timeline.parse("ok:1,failing:1", loop=True)
    assert looping.mode_at(2.5) == "ok" and looping.mode_at(3.5) == "failing"
    for bad in ("ok", "broken:1", "ok:-1", ""):
        with pytest.raises(ValueError):
            Timeline.parse(bad)


def fetch(url: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=b"" if method == "POST" else None,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_upstream_serves_the_timeline_and_counts_calls() -> None:
    timeline = Timeline.parse("ok:0.4,failing:0.4,slow:0.4,recovering:10")
    with FlakyUpstream(timeline, latency=0.0, slow_latency=0.25) as upstream:
        assert fetch(upstream.url + "/restart", "POST")[0] == 200
        seen = []
        while True:
            status, body = fetch(upstream.url + "/charge")
            seen.append((body["mode"], status))
            if body["mode"] == "recovering":
                break
        assert ("ok", 200) in seen and ("failing", 503) in seen
        assert ("slow", 200) in seen and seen[-1] == ("recovering", 200)
        assert fetch(upstream.url + "/healthz")[0] == 200     # not counted
        stats = fetch(upstream.url + "/stats")[1]
        assert stats["calls"] == len(seen)
        assert stats["by_mode"]["failing"] == {"503": sum(m == "failing" for m, _ in seen)}
        assert sum(sum(c.values()) for c in stats["per_second"].values()) == stats["calls"]
        assert fetch(upstream.url + "/restart", "POST")[0] == 200
        assert fetch(upstream.url + "/stats")[1]["calls"] == 0


def test_upstream_command_line_starts_and_rejects_a_bad_timeline() -> None:
    bad = subprocess.run([sys.executable, "-m", "distbreaker.demo.upstream", "--timeline", "nap:3"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown mode 'nap'" in bad.stderr
