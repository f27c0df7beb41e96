"""The web dashboard end to end: real dashboard and worker processes, a real redis-server,
the real CLI, and Debian's Chromium (headless, driven by Selenium + chromedriver).

A worker process trips a breaker: the open page shows OPEN without a reload (how soon
is printed, not asserted: a loaded CI machine is slow); the CLI closes it: the page
shows CLOSED. Operator actions from the page need the bearer token and are recorded
with actor and reason; a read-only dashboard refuses them; foreign keys are error
rows; a Redis outage is a banner, not a crash.

Set DISTBREAKER_SCREENSHOT_DIR to keep the screenshots (docs/images/ has one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from distbreaker.demo.embedded import RedisServer, free_port
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-5b1f"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Flags Chromium needs on this machine (no network beyond loopback, running as root).
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,650"]
WORKER = textwrap.dedent("""
    import sys, time
    from distbreaker import CircuitBreaker
    url, name = sys.argv[1], sys.argv[2]
    b = CircuitBreaker(name, redis=url, sliding_window_size=10, minimum_number_of_calls=4,
                       wait_duration_in_open_state=60, key_ttl=600)
    for _ in range(3):
        b.call(lambda: None)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "trip":
            while b.state.value != "OPEN":
                try:
                    b.call(lambda: 1 / 0)
                except ZeroDivisionError:
                    pass
            print("open", flush=True)
        elif line.strip() == "exit":
            break
""")


# -- processes --------------------------------------------------------------------------
class DashboardProcess:
    """`python -m distbreaker dashboard` in its own process, on a free port."""

    def __init__(self, url: str, *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distbreaker", "--url", url, "dashboard", "--port",
             str(self.port), "--refresh", "0.5", *extra], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def serving() -> bool:
            assert self.proc.poll() is None, self.proc.communicate()
            return httpx.get(self.base + "/api/config", timeout=5).status_code == 200

        wait_until(serving, timeout=60, interval=0.1, ignoring=(httpx.HTTPError,),
                   what="the dashboard serves")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=15)  # stops promptly even with streams open


@pytest.fixture
def dashboard(redis_url: str) -> Iterator[DashboardProcess]:
    process = DashboardProcess(redis_url, "--allow-actions", "--token", TOKEN)
    yield process
    process.stop()
    assert process.proc.returncode is not None


@pytest.fixture
def worker(redis_url: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, redis_url, "payments"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        proc.wait(15)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), \
        "Chromium is missing: apt-get install chromium chromium-driver (scripts/test does)"
    options = Options()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="distbreaker-chromium-")
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(10)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distbreaker", "--url", url, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


# -- reading the page -------------------------------------------------------------------
ROW_STATE = """
const row = [...document.querySelectorAll('#rows .row')].find(r => r.dataset.name === arguments[0]);
if (!row) return null;
const badge = row.querySelector('.state');
return badge ? badge.dataset.state : null;
"""


def wait_for(check: Callable[[], Any], timeout: float = 20.0) -> float:
    """Seconds until check() is truthy (printed figures; the bound is generous, not a
    promise: how fast the page updates is measured, not asserted)."""
    started = time.monotonic()
    wait_until(check, timeout=timeout, interval=0.02)
    return time.monotonic() - started


def row_state(browser: Any, name: str) -> str | None:
    return browser.execute_script(ROW_STATE, name)


def screenshot(browser: Any, tmp_path: Path, filename: str) -> Path:
    path = tmp_path / filename
    browser.save_screenshot(str(path))
    keep = os.environ.get("DISTBREAKER_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / filename)
    return path


# -- the tests ----------------------------------------------------------------------------
def test_a_trip_by_a_worker_shows_without_a_reload_and_a_cli_close_shows_closed(
        redis_url: str, redis_client: redis.Redis, dashboard: DashboardProcess,
        worker: subprocess.Popen[str], browser: Any, tmp_path: Path) -> None:
    from distbreaker import Bulkhead, CircuitBreaker, RetryBudget

    CircuitBreaker("search", redis=redis_url).transition_to_forced_open("reindex", "ops")
    bulkhead = Bulkhead("payments", redis=redis_url, max_concurrent_calls=4)
    held = bulkhead.acquire()
    RetryBudget("payments", redis=redis_url).deposit(20)
    redis_client.hset("distbreaker:v2:{legacy}:cb", "state", "written by someone else")

    browser.get(dashboard.base + "/")
    wait_for(lambda: [row_state(browser, n) for n in ("payments", "search", "legacy")]
             == ["CLOSED", "FORCED_OPEN", "ERROR"])  # foreign data: an error row
    legacy = browser.execute_script(
        "return [...document.querySelectorAll('#rows .row')]"
        ".find(r => r.dataset.name === 'legacy').textContent")
    assert "holds a hash, expected a string" in legacy
    browser.execute_script("window.__sameDocument = 'yes'")

    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write("trip\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "open"
    shown_after = wait_for(lambda: row_state(browser, "payments") == "OPEN")
    assert browser.execute_script("return window.__sameDocument") == "yes"  # no reload
    print(f"\nOPEN shown {shown_after * 1000:.0f} ms after the worker saw it")
    screenshot(browser, tmp_path, "dashboard.png")

    done = cli(redis_url, "close", "payments", "--reason", "upstream fixed", "--actor", "dana")
    assert done.returncode == 0, done.stderr
    assert "OPEN -> CLOSED" in done.stdout
    wait_for(lambda: row_state(browser, "payments") == "CLOSED")
    assert browser.execute_script("return window.__sameDocument") == "yes"
    recent = browser.execute_script("return document.getElementById('transitions').textContent")
    assert "upstream fixed" in recent and "dana" in recent
    bulkhead.release(held)
    bulkhead.close()


def test_actions_from_the_page_need_the_token_and_record_actor_and_reason(
        redis_url: str, dashboard: DashboardProcess, worker: subprocess.Popen[str],
        browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(dashboard.base + "/breakers/payments")
    wait_for(lambda: browser.execute_script(
        "return document.getElementById('actions').hidden === false"
        " && document.getElementById('config').textContent.includes('COUNT_BASED')"))

    def press(action: str, token: str) -> str:
        for field, value in (("token", token), ("actor", "erin"),
                             ("reason", "gateway maintenance")):
            box = browser.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        result = browser.find_element(By.ID, "action-result")
        before = result.text
        browser.find_element(By.CSS_SELECTOR, f"button[data-action='{action}']").click()
        wait_for(lambda: result.text and result.text != before)
        return result.text

    assert press("forced_open", "wrong").startswith("refused: a valid bearer token")
    assert cli(redis_url, "ls", "--json").stdout.count('"FORCED_OPEN"') == 0
    assert press("forced_open", TOKEN).startswith("CLOSED → FORCED_OPEN")
    wait_for(lambda: "erin via dashboard" in browser.find_element(By.ID, "history").text)
    screenshot(browser, tmp_path, "dashboard-breaker.png")
    last = json.loads(cli(redis_url, "events", "payments", "--json", "-n", "1").stdout)
    assert (last["to"], last["reason"], last["actor"]) == (
        "FORCED_OPEN", "gateway maintenance", "erin via dashboard")


def test_read_only_by_default_and_redis_outage_is_a_banner(browser: Any) -> None:
    server = RedisServer().start()
    process = DashboardProcess(server.url)
    try:
        from distbreaker import CircuitBreaker

        CircuitBreaker("payments", redis=server.url).call(lambda: None)
        refused = httpx.post(process.base + "/api/breakers/payments/actions/forced_open",
                             headers={"Authorization": f"Bearer {TOKEN}"}, json={})
        assert refused.status_code == 403 and "--allow-actions" in refused.json()["error"]
        assert httpx.get(process.base + "/api/config").json()["actions"] is False
        browser.get(process.base + "/")
        wait_for(lambda: row_state(browser, "payments") == "CLOSED")
        server.kill()
        wait_for(lambda: "Redis unreachable since" in browser.execute_script(
            "return document.getElementById('banner').textContent"))
        assert row_state(browser, "payments") == "CLOSED"  # the last read stays shown
        server.start()
        CircuitBreaker("after-restart", redis=server.url).call(lambda: None)
        wait_for(lambda: row_state(browser, "after-restart") == "CLOSED")
        assert not browser.execute_script(
            "return document.getElementById('banner').classList.contains('shown')")
        browser.get(process.base + "/breakers/payments")
        wait_for(lambda: browser.execute_script(  # the page read its config, then loaded
            "return document.getElementById('name').textContent === 'payments'"
            " || document.getElementById('error').textContent !== ''"))
        assert browser.execute_script("return document.getElementById('actions').hidden")
    finally:
        process.stop()
        server.stop()


def test_a_breakers_page_shows_its_shadow_configs(
        redis_url: str, redis_client: redis.Redis, dashboard: DashboardProcess,
        browser: Any) -> None:
    """What each candidate config would have done (docs/guides/shadow.md), on the page of
    the breaker it shadows; a breaker without shadows shows no such section."""
    from distbreaker import CircuitBreaker, operate

    breaker = CircuitBreaker("checkout", redis=redis_url, sliding_window_size=10,
                             minimum_number_of_calls=4, key_ttl=600, redis_timeout=5.0)
    breaker.call(lambda: None)
    operate.set_shadow(redis_client, "distbreaker", "checkout", "tight",
                       {"failure_rate_threshold": 20}, "what if", "ops")
    for fail in (True, False, False, False, False):
        try:
            breaker.call((lambda: 1 / 0) if fail else (lambda: None))
        except ZeroDivisionError:
            pass
    assert breaker.state.value == "CLOSED"  # 25 % < the live 50 %: the shadow's 20 % trips
    browser.get(dashboard.base + "/breakers/checkout")

    def shadow_row() -> str:
        return str(browser.execute_script(
            "const r = document.querySelector('#shadows tr[data-shadow=\"tight\"]');"
            "return r && !document.getElementById('shadows-section').hidden"
            " ? r.textContent : ''"))
    wait_for(lambda: "OPEN" in shadow_row() or "HALF_OPEN" in shadow_row())
    assert "would be open since" in shadow_row() and "would have been rejected" in shadow_row()
    CircuitBreaker("plain", redis=redis_url, key_ttl=600).call(lambda: None)
    browser.get(dashboard.base + "/breakers/plain")
    wait_for(lambda: browser.execute_script(
        "return document.getElementById('name').textContent") == "plain")
    assert browser.execute_script("return document.getElementById('shadows-section').hidden")
    breaker.close()
