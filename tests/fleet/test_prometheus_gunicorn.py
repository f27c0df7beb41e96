"""Prometheus under gunicorn: 4 real workers, prometheus_client's multiprocess mode, as
docs/guides/prometheus.md sets it up. Every scrape, whichever worker answers it, reports
the calls the whole fleet made (issue 28 saw 9, 8, 8, 8, 12, 9 for 40), and the
fleet-wide window figures read from Redis agree with them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from distbreaker.demo.embedded import free_port
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
OK, FAILED = 30, 10


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.fixture
def gunicorn(redis_url: str, name: str, tmp_path: Path) -> Iterator[str]:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    port = free_port()
    env = {**os.environ, "DB_REDIS_URL": redis_url, "DB_NAME": name,
           "PROMETHEUS_MULTIPROC_DIR": str(multiproc), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--preload", "-w", str(WORKERS), "-b",
         f"127.0.0.1:{port}", "--graceful-timeout", "5", "tests.helpers.prometheus_app:app"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        return httpx.get(base + "/metrics", timeout=10).status_code == 200

    try:
        wait_until(serving, timeout=60, interval=0.2, ignoring=(httpx.HTTPError,),
                   what="gunicorn serves")
        yield base
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_every_scrape_of_any_worker_reports_the_fleets_calls(gunicorn: str, name: str) -> None:
    pids = set()
    for i in range(OK + FAILED):
        # a new connection per call, so gunicorn's workers share the calls
        answer = httpx.get(gunicorn + ("/call?fail=1" if i < FAILED else "/call"), timeout=30)
        assert answer.status_code == 200
        pids.add(answer.text)
    assert len(pids) > 1, "one worker served every call: the test would prove nothing"

    labels = (("name", name), ("outcome", "success"))
    failure = (("name", name), ("outcome", "failure"))
    seen = []
    for _ in range(6):
        found = samples(httpx.get(gunicorn + "/metrics", timeout=30).text)
        seen.append((found.get(("distbreaker_calls_total", labels)),
                     found.get(("distbreaker_calls_total", failure)),
                     found.get(("distbreaker_breaker_fleet_calls_total", labels)),
                     found.get(("distbreaker_breaker_fleet_calls_total", failure)),
                     found.get(("distbreaker_breaker_window_calls", (("name", name),))),
                     found.get(("distbreaker_breaker_window_failures", (("name", name),)))))
    assert seen == [(OK, FAILED, OK, FAILED, OK + FAILED, FAILED)] * 6, seen


def test_one_exporter_reports_the_fleets_calls(gunicorn: str, name: str,
                                               redis_url: str) -> None:
    """An exporter process that protects nothing (discover=True) reads the fleet's
    per-call counters from Redis: what every worker recorded."""
    from prometheus_client import CollectorRegistry, generate_latest

    from distbreaker.contrib.prometheus import DistbreakerCollector

    for i in range(OK + FAILED):
        httpx.get(gunicorn + ("/call?fail=1" if i < FAILED else "/call"), timeout=30)
    registry = CollectorRegistry()
    registry.register(DistbreakerCollector(redis=redis_url, discover=True, timeout=5,
                                           multiprocess=False))
    for _ in range(3):
        found = samples(generate_latest(registry).decode())
        assert found[("distbreaker_breaker_fleet_calls_total",
                      (("name", name), ("outcome", "success")))] == OK
        assert found[("distbreaker_breaker_fleet_calls_total",
                      (("name", name), ("outcome", "failure")))] == FAILED
