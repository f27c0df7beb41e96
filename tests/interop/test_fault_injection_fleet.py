"""One `distbreaker inject` reaches every allowing worker of the fleet: sync and asyncio
Python processes and PHP requests, and never a worker that does not allow it; the master
switch ends it everywhere (docs/guides/fault_injection.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis

from distbreaker import inject as faults
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.demo.embedded import RedisServer
from tests.helpers.cli import run
from tests.helpers.fault_worker import report_key
from tests.helpers.waiting import wait_until
from tests.interop.test_php import Php

ROOT = Path(__file__).resolve().parents[2]


def counts(client: redis.Redis, name: str) -> dict[str, int]:
    raw = client.hgetall(report_key(name))
    return {k.decode(): int(v) for k, v in raw.items() if k != b"stop"}


def test_one_injection_reaches_sync_asyncio_and_php_workers_and_only_those_allowing(
        php: str, redis_server: RedisServer, redis_url: str,
        redis_client: redis.Redis) -> None:
    workers = {"llm:sync": ("sync", "allow"), "llm:aio": ("asyncio", "allow"),
               "llm:plain": ("sync", "deny")}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.fault_worker", redis_url,
                               name, flavour, allow], cwd=ROOT)
             for name, (flavour, allow) in workers.items()]
    try:
        wait_until(lambda: {"llm:sync", "llm:aio"} <= set(
            faults.in_force(redis_client, DEFAULT_PREFIX)[2]), timeout=60,
            what="both allowing workers registered")
        assert "llm:plain" not in faults.in_force(redis_client, DEFAULT_PREFIX)[2]
        done = run(redis_url, "inject", "llm:*", "--error", "503", "--for", "5m",
                   "--reason", "fleet drill")
        assert done.exit_code == 0, done.output
        started = time.monotonic()
        before = {name: counts(redis_client, name) for name in workers}
        wait_until(lambda: all(counts(redis_client, n).get("injected", 0) >= 5
                               for n in ("llm:sync", "llm:aio")), timeout=60,
                   what="both allowing Python workers got injected errors")
        print(f"injection reached both Python workers within {time.monotonic() - started:.3f}s")
        php_result = Php(php, redis_server).run(action="faults", name="llm:php", n=20)
        assert php_result["injected"] == 20 and php_result["status"] == 503, php_result
        plain = counts(redis_client, "llm:plain")
        assert plain.get("injected", 0) == 0 and plain["ok"] > before["llm:plain"].get("ok", 0)

        assert run(redis_url, "inject", "--off-all").exit_code == 0
        ended = {n: counts(redis_client, n) for n in ("llm:sync", "llm:aio")}
        wait_until(lambda: all(counts(redis_client, n).get("ok", 0) >= ended[n].get("ok", 0) + 5
                               for n in ended), timeout=60,
                   what="the Python workers' calls run again after --off-all")
        php_after = Php(php, redis_server).run(action="faults", name="llm:php", n=10)
        assert php_after["ok"] == 10, php_after
    finally:
        for name in workers:
            redis_client.hset(report_key(name), "stop", 1)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    assert [p.returncode for p in procs] == [0, 0, 0]
