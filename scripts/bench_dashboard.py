#!/usr/bin/env python3
"""Dashboard bench: the fleet page at N names (issue 26: 10,000), idle and with a few
names changing.

Seeds N breakers (one call each through `CircuitBreaker`, on a throwaway
redis-server), starts the real dashboard (``python -m distbreaker dashboard``), opens
the fleet page in headless Chromium (Selenium + chromedriver, the browser tests'
flags) and, once every row is shown, measures over ``--seconds``:

- ``page_busy_pct``: the page's main thread busy share (Chrome DevTools Protocol
  ``Performance.getMetrics`` ``TaskDuration``, its difference over the window: wall
  time of its tasks, so a loaded machine inflates it), ``page_cpu_pct`` (``ThreadTime``:
  its CPU time), and the rows and updates the page applied (``page.stats``);
- ``bytes_per_s``: bytes of the event stream per second, as a second subscriber on the
  same stream receives them (keep-alives included, the snapshot on connect excluded);
- ``server_cpu_pct``: the dashboard process's CPU (user + system, /proc) over the window;
- ``redis_cpu_pct`` and ``redis_calls_per_s``: what the dashboard costs Redis (``INFO``).

Phases: ``idle`` (nothing changes), then ``busy`` (``--busy`` names get a call every
second from this process). Also: the snapshot's size, and how long until the page
showed every row. Targets (issue 26, at 10,000 names, idle): page <= 10 % busy, <= 50
KB/s per browser, server CPU <= 2 %.

Usage: ``.venv/bin/python scripts/bench_dashboard.py [--names 10000] [--seconds 20]
[--busy 20] [--json]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

from distbreaker import CircuitBreaker  # noqa: E402
from distbreaker.demo.embedded import RedisServer, free_port  # noqa: E402
from tests.fleet.test_dashboard_browser import (  # noqa: E402  (the browser tests' tooling)
    CHROMEDRIVER,
    CHROMIUM,
    CHROMIUM_FLAGS,
)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def seed(url: str, names: int) -> None:
    client = redis.Redis.from_url(url)
    for i in range(names):
        CircuitBreaker(f"tenant:{i:05d}", redis=client, key_ttl=3600).call(lambda: None)
    # the seeding worker's goodbye (what close() sends): it reports into none of them any
    # more, so the reporting workers do not change while the bench measures "idle"
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(match="distbreaker:v2:{tenant:*}:cb:meta", count=1000):
        for field in client.hkeys(key):
            if (field.decode() if isinstance(field, bytes) else field).startswith("w:"):
                pipe.hdel(key, field)
    pipe.execute()
    client.close()


class Stream:
    """A second subscriber on the event stream, counting the bytes after the snapshot."""

    def __init__(self, base: str) -> None:
        self.bytes = 0
        self.snapshot_bytes = 0
        self.counting = False
        self.stop = False
        self.thread = threading.Thread(target=self._run, args=(base,), daemon=True)
        self.thread.start()

    def _run(self, base: str) -> None:
        head = b""
        with httpx.stream("GET", base + "/api/events", timeout=None) as response:
            for chunk in response.iter_raw():
                if self.stop:
                    return
                if self.counting:
                    self.bytes += len(chunk)
                elif not self.snapshot_bytes:
                    head += chunk
                    start = head.find(b"event: snapshot")
                    end = head.find(b"\n\n", start) if start >= 0 else -1
                    if end >= 0:
                        self.snapshot_bytes = end + 2 - start


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='bench-')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Performance.enable", {})
    return driver


def page_metrics(driver: Any) -> tuple[float, float]:
    """(TaskDuration, ThreadTime): the main thread's task wall time and CPU time so far."""
    metrics = {m["name"]: m["value"] for m in
               driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
    return metrics["TaskDuration"], metrics["ThreadTime"]


def measure(driver: Any, stream: Stream, pid: int, client: redis.Redis,
            seconds: float, busy: list[CircuitBreaker]) -> dict[str, float]:
    stream.bytes, stream.counting = 0, True
    info0 = client.info("cpu"), client.info("stats")["total_commands_processed"]
    stats0 = driver.execute_script("return page.stats")
    cpu0, (task0, thread0), t0 = cpu_seconds(pid), page_metrics(driver), time.monotonic()
    windows, (mark, at) = [], (task0, t0)  # the busy share per 5 s window
    while time.monotonic() - t0 < seconds:
        for breaker in busy:
            breaker.call(lambda: None)
        time.sleep(1.0 if busy else 0.25)
        if time.monotonic() - at >= 5:
            task, _ = page_metrics(driver)
            windows.append(100 * (task - mark) / (time.monotonic() - at))
            mark, at = task, time.monotonic()
    elapsed = time.monotonic() - t0
    cpu1, (task1, thread1) = cpu_seconds(pid), page_metrics(driver)
    stats1 = driver.execute_script("return page.stats")
    info1 = client.info("cpu"), client.info("stats")["total_commands_processed"]
    redis_cpu = sum(info1[0][k] - info0[0][k] for k in ("used_cpu_sys", "used_cpu_user"))
    # Redis commands this process sent (the busy calls) are not the dashboard's
    own_calls = len(busy) * round(elapsed)
    return {"seconds": round(elapsed, 1),
            "page_busy_pct": round(100 * (task1 - task0) / elapsed, 2),
            "page_busy_median_pct": round(statistics.median(windows), 2) if windows else None,
            "page_cpu_pct": round(100 * (thread1 - thread0) / elapsed, 2),
            "rows_received": stats1["rows"] - stats0["rows"],
            "updates_received": stats1["updates"] - stats0["updates"],
            "bytes_per_s": round(stream.bytes / elapsed, 1),
            "server_cpu_pct": round(100 * (cpu1 - cpu0) / elapsed, 2),
            "redis_cpu_pct": round(100 * redis_cpu / elapsed, 2),
            "redis_calls_per_s": round((info1[1] - info0[1] - own_calls) / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--busy", type=int, default=20, help="names called every second "
                        "in the busy phase (0: no busy phase)")
    parser.add_argument("--refresh", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), "Chromium is missing"

    server = RedisServer().start()
    proc = driver = stream = None
    result: dict[str, Any] = {"names": args.names, "refresh_s": args.refresh}
    try:
        started = time.monotonic()
        seed(server.url, args.names)
        seeded = time.monotonic()
        result["seed_s"] = round(seeded - started, 1)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "distbreaker", "--url", server.url,
                                 "dashboard", "--port", str(port), "--refresh",
                                 str(args.refresh)], cwd=ROOT, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/api/config", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "no dashboard"
            time.sleep(0.2)
        driver = browser()
        opened = time.monotonic()
        driver.get(base + "/")
        shown = "return document.querySelectorAll('#rows .row[data-key]').length"
        while driver.execute_script(shown) < args.names:
            assert time.monotonic() - opened < 300, "the page never showed every row"
            time.sleep(0.2)
        result["page_shown_s"] = round(time.monotonic() - opened, 1)
        stream = Stream(base)
        # settle: the first turn of header reads gives every row its rates once (from
        # "-" to 0/s); "idle" starts when the page got no update for 3 ticks
        quiet, last, settle_from = time.monotonic(), -1, time.monotonic()
        while time.monotonic() - quiet < 3 * args.refresh + 1:
            updates = driver.execute_script("return page.stats.updates")
            if updates != last:
                quiet, last = time.monotonic(), updates
            assert time.monotonic() - settle_from < 600, "the page never went quiet"
            time.sleep(0.5)
        result["settled_s"] = round(time.monotonic() - settle_from, 1)
        # a state's "for" is shown to the second in its first minute, then to the minute:
        # idle is a fleet whose states stand for longer (as a real one's do)
        time.sleep(max(0.0, 65 - (time.monotonic() - seeded)))
        result["snapshot_bytes"] = stream.snapshot_bytes
        client = redis.Redis.from_url(server.url)
        result["idle"] = measure(driver, stream, proc.pid, client, args.seconds, [])
        if args.busy:
            busy = [CircuitBreaker(f"tenant:{i:05d}", redis=client, key_ttl=3600)
                    for i in range(0, args.names, max(1, args.names // args.busy))][:args.busy]
            result["busy"] = measure(driver, stream, proc.pid, client, args.seconds, busy)
            result["busy"]["names_changing"] = len(busy)
    finally:
        if stream is not None:
            stream.stop = True
        if driver is not None:
            driver.quit()
        if proc is not None:
            proc.terminate()
            proc.wait(15)
        server.stop()
    result["targets"] = {"page_busy_pct": 10, "bytes_per_s": 50_000, "server_cpu_pct": 2}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.names} names (seeded in {result['seed_s']} s); page showed every row "
          f"after {result['page_shown_s']} s; snapshot {result['snapshot_bytes'] / 1e6:.2f} MB")
    print(f"{'phase':<6} {'page busy %':>11} {'(median 5 s)':>12} {'page CPU %':>10} "
          f"{'bytes/s':>9} {'rows/s':>7} {'server CPU %':>12} {'Redis CPU %':>11} "
          f"{'Redis calls/s':>13}")
    for phase in ("idle", "busy"):
        if phase in result:
            r = result[phase]
            print(f"{phase:<6} {r['page_busy_pct']:>11} {r['page_busy_median_pct']!s:>12} "
                  f"{r['page_cpu_pct']:>10} "
                  f"{r['bytes_per_s']:>9} {r['rows_received'] / r['seconds']:>7.1f} "
                  f"{r['server_cpu_pct']:>12} {r['redis_cpu_pct']:>11} "
                  f"{r['redis_calls_per_s']:>13}")
    print("page busy: main-thread task time (wall clock, inflated on a loaded machine; the "
          "median of 5 s windows drops a one-off long task); page CPU: its CPU time")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("targets (idle): page <= 10 % busy, <= 50,000 bytes/s, server CPU <= 2 %")


if __name__ == "__main__":
    main()
