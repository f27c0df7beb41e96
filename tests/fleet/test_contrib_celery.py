"""distbreaker.contrib.celery with a real Celery worker process on the test's redis-server.

The worker (``celery -A tests.helpers.celery_app worker``) is started once for the
module and always terminated. Broker db 1, results db 2, distbreaker db 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.exceptions import Retry

from distbreaker import CircuitBreaker, RetryBudget
from distbreaker.breaker.state import State
from distbreaker.contrib.celery import backoff_countdown, protect, rejection_countdown
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import CallNotPermitted
from tests.helpers.records import read_record
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer) -> Iterator[dict[str, Any]]:
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    base = redis_server.url.rsplit("/", 1)[0]
    redis.Redis.from_url(f"{base}/1").flushdb()
    redis.Redis.from_url(f"{base}/2").flushdb()
    env = {**os.environ, "DISTBREAKER_CELERY_REDIS": base,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    os.environ["DISTBREAKER_CELERY_REDIS"] = base   # for the app imported by this process
    log = tempfile.NamedTemporaryFile(prefix="celery-worker-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.helpers.celery_app", "worker", "--pool=solo",
         "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-n", f"distbreaker-test-{os.getpid()}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ready() -> bool:
            assert proc.poll() is None, "the Celery worker exited"
            return b"ready." in Path(log.name).read_bytes()

        wait_until(ready, timeout=READY_TIMEOUT, interval=0.1, what="the Celery worker is ready",
                   describe=lambda: Path(log.name).read_text(errors="replace")[-3000:])
        from tests.helpers import celery_app
        yield {"app": celery_app, "base": base, "log": log.name, "proc": proc}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()
        os.unlink(log.name)


def deliveries(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.lrange(f"deliveries:{key}", 0, -1)]


def test_rejected_task_is_requeued_until_a_probe_may_be_tried(worker: dict[str, Any]) -> None:
    app = worker["app"]
    data = redis.Redis.from_url(app.DATA)
    breaker = CircuitBreaker("celery-defer", redis=app.DATA, **app.DEFER_BREAKER)
    breaker.reset()
    breaker.trip("upstream down")
    open_until_ms = int(read_record(data, breaker.keys)["open_until"])

    result = app.charge.delay("order-1")
    assert result.get(timeout=20) == "charged order-1"

    runs = deliveries(data, "order-1")
    assert [r["retries"] for r in runs] == [0, 1]   # rejected once, re-queued once, ran once
    first, second = runs
    assert first["at"] * 1000 < open_until_ms        # the first delivery met the OPEN breaker
    eta_ms = _epoch_ms(second["eta"])
    wait_ms = open_until_ms - first["at"] * 1000
    # countdown = retry_after (+ at most 10 % jitter): back exactly when a probe may be
    # tried (+1 s: a loaded worker may pause between reading the wait and setting the ETA)
    assert open_until_ms - 100 <= eta_ms <= open_until_ms + 0.1 * wait_ms + 1000
    assert second["at"] * 1000 >= open_until_ms - 100
    assert breaker.state is State.CLOSED             # the re-queued run was the probe


def test_retries_are_drawn_from_the_fleet_budget(worker: dict[str, Any]) -> None:
    app = worker["app"]
    data = redis.Redis.from_url(app.DATA)
    RetryBudget("celery-retry", redis=app.DATA, **app.RETRY_BUDGET).reset()
    CircuitBreaker("celery-retry", redis=app.DATA, **app.RETRY_BREAKER).reset()
    keys = [f"job-{i}" for i in range(4)]

    results = [app.flaky.delay(key) for key in keys]
    for r in results:
        r.get(timeout=30, propagate=False)

    assert all(r.state == "FAILURE" for r in results)
    assert all(isinstance(r.result, ConnectionError) for r in results)   # the original error
    runs = {key: deliveries(data, key) for key in keys}
    retries = sum(len(v) - 1 for v in runs.values())
    assert retries == app.BUDGET_ALLOWANCE          # fleet-wide, whatever the task count
    assert all(len(v) >= 1 for v in runs.values())
    budget = RetryBudget("celery-retry", redis=app.DATA, **app.RETRY_BUDGET)
    assert budget.balance() == 0


def _epoch_ms(eta: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(eta).timestamp() * 1000


# -- the pure parts, without a worker ------------------------------------------------------

def test_rejection_countdown() -> None:
    rejected = CallNotPermitted("x", State.OPEN, 12.0)
    assert rejection_countdown(rejected, rand=lambda: 0.0) == 12.0
    assert rejection_countdown(rejected, rand=lambda: 1.0) == pytest.approx(13.2)
    assert rejection_countdown(CallNotPermitted("x", State.OPEN, 0.01), rand=lambda: 0) == 1.0
    forced = CallNotPermitted("x", State.FORCED_OPEN, 0.0)
    assert rejection_countdown(forced, unknown_countdown=90, rand=lambda: 0) == 90
    outage = CallNotPermitted("x", "UNKNOWN", 0.0, reason="redis unavailable")
    assert rejection_countdown(outage, rand=lambda: 0) == 1.0


def test_backoff_countdown() -> None:
    assert backoff_countdown(0, base=1, rand=lambda: 0) == 0.5
    assert backoff_countdown(3, base=1, rand=lambda: 1) == 8
    assert backoff_countdown(30, base=1, cap=60, rand=lambda: 1) == 60


class FakeTask:
    """The bits of a bound Celery task that `protect` uses."""

    def __init__(self, retries: int = 0) -> None:
        self.request = type("Request", (), {"retries": retries})()
        self.retried: list[dict[str, Any]] = []

    def retry(self, **options: Any) -> Retry:
        self.retried.append(options)
        return Retry(exc=options.get("exc"), when=options.get("countdown"))


def test_budget_exhausted_fails_with_the_original_error(redis_url: str, name: str) -> None:
    budget = RetryBudget(name, redis=redis_url, percent_can_retry=0, min_retries_per_sec=0.1,
                         ttl=10)    # exactly one retry
    calls = []

    @protect(None, budget=budget, retry_on=(TimeoutError,))
    def body(task: Any) -> None:
        calls.append(task)
        raise TimeoutError("slow upstream")

    first = FakeTask()
    with pytest.raises(Retry):
        body(first)
    assert first.retried[0]["countdown"] <= 1.0
    second = FakeTask(retries=1)
    with pytest.raises(TimeoutError) as info:
        body(second)
    assert info.value.retry_budget_exhausted is True
    assert second.retried == []
    with pytest.raises(ValueError):
        protect(min_countdown=0)
