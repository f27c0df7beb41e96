"""A release that fails for a Redis outage is sent again once Redis answers.

A worker process holds three permits (60 s leases) of a bulkhead on a private
redis-server, which is frozen (SIGSTOP) while the worker releases them: the first
release times out, the next ones find Redis in back-off. Once the server runs again the
permits must be free well before their leases would end (without the retry two of them
stayed held for the whole lease).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from distbreaker._runtime.keys import BulkheadKeys
from distbreaker.demo.embedded import RedisServer
from tests.helpers.processes import private_redis_server
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE = 60.0

WORKER = f"""
import sys
from distbreaker import Bulkhead
bulkhead = Bulkhead(sys.argv[2], redis=sys.argv[1], max_concurrent_calls=5, lease={LEASE!r},
                    redis_timeout=0.2, redis_retry_max_backoff=0.5)
permits = [bulkhead.acquire() for _ in range(3)]
print("held", flush=True)
sys.stdin.readline()
for permit in permits:
    bulkhead.release(permit)
print("released", flush=True)
sys.stdin.readline()      # stays alive (its retry runs) until told to exit
"""

AIO_WORKER = f"""
import asyncio, sys
from distbreaker.aio import Bulkhead
async def main():
    bulkhead = Bulkhead(sys.argv[2], redis=sys.argv[1], max_concurrent_calls=5, lease={LEASE!r},
                        redis_timeout=0.2, redis_retry_max_backoff=0.5)
    permits = [await bulkhead.acquire() for _ in range(3)]
    print("held", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    for permit in permits:
        await bulkhead.release(permit)
    print("released", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
asyncio.run(main())
"""


@pytest.fixture
def server() -> Iterator[RedisServer]:
    yield from private_redis_server()


@pytest.mark.parametrize("script", [WORKER, AIO_WORKER], ids=["sync", "asyncio"])
def test_permits_released_during_a_freeze_are_freed_once_redis_answers(
        server: RedisServer, name: str, script: str) -> None:
    assert server.process is not None
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    leases = BulkheadKeys.build(name).leases
    worker = subprocess.Popen([sys.executable, "-c", script, server.url, name], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "held"
        assert client.zcount(leases, 1, "+inf") == 3
        os.kill(server.process.pid, signal.SIGSTOP)              # Redis freezes
        try:
            worker.stdin.write("release\n")
            worker.stdin.flush()
            assert worker.stdout.readline().strip() == "released"  # none reached Redis
        finally:
            os.kill(server.process.pid, signal.SIGCONT)          # Redis answers again
        resumed = time.monotonic()
        wait_until(lambda: client.zcount(leases, 1, "+inf") == 0, timeout=20,
                   what="the permits released during the freeze are free")
        assert time.monotonic() - resumed < LEASE / 2   # not by the leases' expiry
        # a release sent again is a cancel: it counts no lease as lost
        assert int(client.hget(BulkheadKeys.build(name).meta, "lost") or 0) == 0
    finally:
        if worker.stdin is not None:
            worker.stdin.close()
        worker.wait(10)
        client.close()
