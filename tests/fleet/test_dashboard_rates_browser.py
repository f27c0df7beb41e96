"""The dashboard's fleet-wide rates, sparklines that survive a restart, and the event
stream filtered by name and type, in headless Chromium against real processes (the
fixtures and helpers of tests/fleet/test_dashboard_browser.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.fleet import test_dashboard_browser as base
from tests.fleet.test_dashboard_browser import ROOT, DashboardProcess, cli, wait_for

browser = base.browser  # the headless Chromium fixture (module-scoped here too)

LOAD = textwrap.dedent("""
    import sys, time
    from distbreaker import CircuitBreaker
    url, name = sys.argv[1], sys.argv[2]
    b = CircuitBreaker(name, redis=url, sliding_window_size=100,   # 25 % < 50 %: no trip
                       minimum_number_of_calls=10, redis_timeout=5)
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        def work(i=i):
            time.sleep(0.02)               # every call takes 20 ms at least
            return 1 / (i % 4)             # one call in four fails
        try:
            b.call(work)
        except ZeroDivisionError:
            pass
""")

RATES = """
const row = [...document.querySelectorAll('#rows .row')].find(r => r.dataset.name === arguments[0]);
const cell = row && row.querySelector('.rates');
return cell ? cell.textContent : null;
"""


@pytest.fixture
def load(redis_url: str) -> Iterator[subprocess.Popen[str]]:
    procs = []

    def start(name: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", LOAD, redis_url, name], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        procs.append(proc)
        return proc

    yield start  # type: ignore[misc]
    for proc in procs:
        proc.kill()
        proc.wait(15)


def test_fleet_rates_from_two_workers_show_on_both_pages(redis_url: str, load: Any,
                                                         browser: Any) -> None:
    load("orders")
    load("orders")                                       # two workers, one breaker
    dashboard = DashboardProcess(redis_url)
    try:
        browser.get(dashboard.base + "/")
        wait_for(lambda: (browser.execute_script(RATES, "orders") or "-") != "-", timeout=60)
        text = browser.execute_script(RATES, "orders")
        calls, rest = text.split("/s (")
        ok, failed = float(rest.split(" ok, ")[0]), float(rest.split(" ok, ")[1].split(" ")[0])
        assert float(calls) > 0 and ok > 0 and failed > 0, text   # one call in four fails
        assert ok > failed, text
        latency = browser.execute_script(
            "const row = [...document.querySelectorAll('#rows .row')]"
            ".find(r => r.dataset.name === 'orders');"
            "return row.querySelector('.latency').textContent")
        p50, p99 = (int(part.split("ms")[0]) for part in latency[len("p50 "):].split(" · p99 "))
        assert 20 <= p50 <= p99, latency                   # the calls sleep 20 ms
        browser.get(dashboard.base + "/breakers/orders")
        wait_for(lambda: browser.execute_script(
            "const e = document.getElementById('fleet-rates');"
            "return e ? e.textContent : '-'") not in ("-", ""), timeout=60)
        recorded = browser.execute_script("return document.getElementById('state-facts')"
                                          ".textContent")
        assert "by every worker since the keys were created" in recorded
    finally:
        dashboard.stop()


def test_sparklines_survive_a_restart_of_the_dashboard(redis_url: str, redis_client: redis.Redis,
                                                        load: Any, browser: Any) -> None:
    load("checkout")
    first = DashboardProcess(redis_url)
    points_js = ("const p = page.spark.get(arguments[0]); return p ? p.map(x => x[0]) : [];")
    try:
        browser.get(first.base + "/")
        wait_for(lambda: len(browser.execute_script(points_js, "checkout")) >= 2, timeout=60)
    finally:
        first.stop()                                     # saves the sparklines on its way out
    saved = redis_client.hget("distbreaker:v2:dashboard:spark", "checkout")
    assert saved is not None and redis_client.pttl("distbreaker:v2:dashboard:spark") > 0
    restarted_at_ms = int(time.time() * 1000)
    second = DashboardProcess(redis_url)
    try:
        browser.get(second.base + "/")
        wait_for(lambda: len(browser.execute_script(points_js, "checkout")) >= 2, timeout=60)
        times = browser.execute_script(points_js, "checkout")
        assert min(times) < restarted_at_ms                # drawn from before the restart
        assert browser.execute_script(
            "const row = [...document.querySelectorAll('#rows .row')]"
            ".find(r => r.dataset.name === 'checkout');"
            "return row.querySelectorAll('svg.spark path').length") >= 1
    finally:
        second.stop()


STREAM = """
window.__seen = [];
const source = new EventSource('/api/events?' + arguments[0]);
for (const kind of ['status', 'snapshot', 'update', 'transition']) {
  source.addEventListener(kind, (e) => window.__seen.push([kind, JSON.parse(e.data)]));
}
window.__source = source;
"""


def test_the_event_stream_filters_by_name_and_type(redis_url: str, browser: Any) -> None:
    from distbreaker import CircuitBreaker

    for name in ("alpha", "beta"):
        CircuitBreaker(name, redis=redis_url).call(lambda: None)
    dashboard = DashboardProcess(redis_url)
    try:
        browser.get(dashboard.base + "/")
        browser.execute_script(STREAM, "name=alpha&type=transition&type=update")
        wait_for(lambda: browser.execute_script(  # the stream is open: subscribed
            "return window.__source.readyState === 1"), timeout=60)
        for name in ("beta", "alpha"):
            done = cli(redis_url, "trip", name, "--reason", f"drill {name}")
            assert done.returncode == 0, done.stderr
        wait_for(lambda: browser.execute_script(
            "return window.__seen.some(m => m[0] === 'transition')"), timeout=60)
        seen = browser.execute_script("return window.__seen")
        kinds = {kind for kind, _ in seen}
        assert kinds <= {"transition", "update"}, kinds    # no status, no snapshot
        transitions = [data for kind, data in seen if kind == "transition"]
        assert [(t["name"], t["to"], t["reason"]) for t in transitions] == [
            ("alpha", "OPEN", "drill alpha")]
        for kind, data in seen:
            if kind == "update":
                assert {row["name"] for row in data["rows"]} == {"alpha"}
        rejected = browser.execute_script(
            "return fetch('/api/events?type=nonsense').then(r => r.status)")
        assert rejected == 422
    finally:
        dashboard.stop()
