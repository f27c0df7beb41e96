"""PHP and Python workers share one fleet-wide rate limiter (lua/ratelimiter.lua).

Every PHP step runs in a real `php` process (clients/php/tests/worker.php) against the
same real redis-server as the Python side; php-cli and php-redis are required.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import redis

from distbreaker import RateLimiter
from distbreaker.demo.embedded import RedisServer
from tests.helpers.ratelimits import LOG, busiest_period, read_log, violations
from tests.interop.test_php import Php, finish

FORK = multiprocessing.get_context("fork")


def test_php_and_python_take_permits_from_one_bucket(php: str, redis_server: RedisServer,
                                                     redis_url: str, name: str) -> None:
    worker = Php(php, redis_server)
    config = {"limit_for_period": 10, "limit_refresh_period": 3600, "timeout_duration": 0}
    taken = worker.run(action="ratelimit", name=name, config=config, n=6)
    assert [t["outcome"] for t in taken] == ["ok"] * 6
    limiter = RateLimiter(name, redis_url, redis_timeout=5, **config)
    assert sum(limiter.try_acquire() for _ in range(10)) == 4
    refused = worker.run(action="ratelimit", name=name, config=config, n=1)[0]
    assert refused["outcome"] == "refused" and 300 < refused["retry_after"] <= 360
    heavy = worker.run(action="ratelimit", name=name, config=config, n=1, permits=11)[0]
    assert heavy["outcome"] == "refused" and "burst" in heavy["reason"]
    m = limiter.metrics()
    assert (m.calls, m.permits, m.rejected) == (10, 10, 8)


def test_an_operator_limit_set_from_php_governs_python_workers(
        php: str, redis_server: RedisServer, redis_url: str, name: str) -> None:
    worker = Php(php, redis_server)
    config = {"limit_for_period": 50, "limit_refresh_period": 60, "timeout_duration": 0}
    changed = worker.run(action="ratelimit_admin", name=name, config=config, op="change",
                         limit=3)
    assert changed["overridden"] and changed["limit_for_period"] == 3
    limiter = RateLimiter(name, redis_url, redis_timeout=5, **config)
    assert sum(limiter.try_acquire() for _ in range(10)) == 3
    assert worker.run(action="ratelimit_admin", name=name, config=config,
                      op="reset")["limit_for_period"] == 50
    assert not limiter.metrics().overridden


def _python_caller(url: str, name: str, log: str, config: dict[str, Any], n: int,
                   permits: int) -> None:
    limiter = RateLimiter(name, url, redis_timeout=5, **config)
    record = redis.Redis.from_url(url).register_script(LOG)
    for _ in range(n):
        reserved = limiter.reserve(permits)
        threading.Event().wait(reserved.wait)
        record(keys=[log], args=[f"{reserved.run_at_ms},{permits}"])


def test_php_and_python_waiting_callers_stay_within_the_limit(
        php: str, redis_server: RedisServer, redis_url: str, redis_client: redis.Redis,
        name: str) -> None:
    """Two PHP and two Python processes, all waiting for weighted permits at once: the
    log of every call conforms exactly to the guarantee, and nobody ran early."""
    worker = Php(php, redis_server)
    limit, period_ms = 20, 1000
    config = {"limit_for_period": limit, "limit_refresh_period": period_ms / 1000,
              "timeout_duration": 30}
    log, gate = f"{name}:log", f"{name}:gate"
    phps = [worker.start(action="ratelimit", name=name, config=config, n=15, permits=p,
                         log=log, gate=gate) for p in (1, 2)]
    pythons = [FORK.Process(target=_python_caller, daemon=True,
                            args=(redis_url, name, log, config, 15, p)) for p in (1, 3)]
    for process in pythons:
        process.start()
    redis_client.rpush(gate, 1, 1)                       # release both PHP workers
    results = [finish(p) for p in phps]
    for process in pythons:
        process.join(60)
        assert process.exitcode == 0
    assert all(r["outcome"] == "ok" for out in results for r in out)
    entries = read_log(redis_client, log)
    assert len(entries) == 60
    assert violations(entries, limit, period_ms, burst=limit) == []
    assert busiest_period(entries, period_ms) >= limit


def test_a_php_registry_builds_the_rate_limiter_python_builds(
        php: str, redis_server: RedisServer, redis_url: str, name: str) -> None:
    """The same `rate_limiters` section gives PHP and Python the same limiter (one
    bucket); a bad option is named."""
    worker = Php(php, redis_server)
    section = {"configs": {"default": {"limit_refresh_period": "1h", "timeout_duration": 0}},
               "instances": {name: {"limit_for_period": 5}}}
    built = worker.run(action="registry", registry={"rate_limiters": section},
                       kind="rate_limiter", name=name)
    assert built["class"] == "Distbreaker\\RateLimiter" and built["same"] is True
    assert built["options"] == {"limit_refresh_period": 3600.0, "timeout_duration": 0,
                                "limit_for_period": 5}
    from distbreaker import Registry

    limiter = Registry({"redis": redis_url, "rate_limiters": section}).rate_limiter(name)
    assert worker.run(action="ratelimit", name=name, config=built["options"], n=3)[0] == \
        {"outcome": "ok", "wait": 0}
    assert sum(limiter.try_acquire() for _ in range(5)) == 2     # 5 in all, one bucket
    bad = worker.run(action="registry", kind="rate_limiter", name=name,
                     registry={"rate_limiters": {"instances": {name: {"limit": 5}}}})
    assert bad["error"] == (f"distbreaker config rate_limiters.instances.{name}: unknown "
                            "rate limiter option(s): limit")
