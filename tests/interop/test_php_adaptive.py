"""PHP and Python workers share one adaptive bulkhead limit (docs/ADAPTIVE.md).

Every PHP step runs in a real `php` process (clients/php/tests/worker.php) against the
same real redis-server as the Python side; php-cli and php-redis are required.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from distbreaker import Bulkhead, Overloaded
from distbreaker._runtime.keys import BulkheadKeys
from distbreaker.breaker.config import BreakerConfig
from distbreaker.bulkhead.adaptive import AdaptiveLimit
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.bulkhead.core import BulkheadCodec
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import BulkheadFull
from tests.interop.test_php import Php

ADAPTIVE = {"min_limit": 1, "max_limit": 20, "initial_limit": 8, "backoff_ratio": 0.5,
            "window": 0.01}

ADAPTIVE_CASES: list[dict[str, Any]] = [
    {}, ADAPTIVE, {"min_limit": 3}, {"min_limit": 60},
    {"min_limit": 2, "max_limit": 9, "initial_limit": 9, "backoff_ratio": 0.999,
     "tolerance": 10, "smoothing": 0.001},
    {"backoff_ratio": 0.1234565, "tolerance": 1.0000005, "smoothing": 0.3333333333},
    {"latency_target": 0.2, "probe_interval": 2.5, "window": 0.05},
    {"latency_target": 0.0015, "probe_interval": 0.1, "window": 0.01},
]

RAMP_CASES: list[dict[str, Any]] = [
    {"ramp_duration": 30}, {"ramp_duration": 12.5, "ramp_start": 0.25}, {"ramp_start": 0.5},
    {"ramp_duration": 0.0015, "ramp_start": 1}, {"ramp_duration": 0, "ramp_start": 0.1},
    {"wait_randomization_factor": 0.5, "ramp_duration": 60, "ramp_start": 1e-05},
]


@pytest.fixture
def php_worker(php: str, redis_server: RedisServer, redis_url: str) -> Php:
    return Php(php, redis_server)


@pytest.fixture
def python_side(redis_url: str, name: str) -> Iterator[Bulkhead]:
    bulkhead = Bulkhead(name, redis=redis_url, adaptive=AdaptiveLimit(**ADAPTIVE))
    yield bulkhead
    bulkhead.close()


def meta(client: redis.Redis, name: str) -> dict[str, str]:
    return {k.decode(): v.decode()
            for k, v in client.hgetall(BulkheadKeys.build(name).meta).items()}


def test_php_builds_the_same_adaptive_argument_and_priority_shares_as_python(
        php_worker: Php) -> None:
    shares = [[{}, None], [{}, "critical"], [{}, "sheddable"], [{}, 7],
              [{"critical_reserve": 0.25, "sheddable_share": 0.5}, "normal"],
              [{"critical_reserve": 0.4, "sheddable_share": 0.9}, "SHEDDABLE"],
              [{"critical_reserve": 0, "sheddable_share": 1}, 2],
              [{"critical_reserve": 0.333333, "sheddable_share": 0.0000001}, "sheddable"]]
    out = php_worker.run(action="adaptive_wire", adaptive=ADAPTIVE_CASES, shares=shares)
    assert out["wires"] == [AdaptiveLimit(**case).wire() for case in ADAPTIVE_CASES]
    assert out["wires"][1] == "1,20,8,500000,1500000,500000,0,10000,10"
    assert out["wires"][6].endswith(",200,2500,50")
    python_shares = [BulkheadCodec("x", BulkheadConfig(**options)).share(priority)
                     for options, priority in shares]
    assert out["shares"] == python_shares
    assert python_shares[:4] == [1000000, 1000000, 700000, 700000]  # None: the whole limit


@pytest.mark.parametrize("bad", [{"min_limit": 0}, {"min_limit": 5, "max_limit": 4},
                                 {"initial_limit": 300}, {"backoff_ratio": 1},
                                 {"tolerance": 0.5}, {"smoothing": 0}, {"limit": 3},
                                 {"latency_target": 0}, {"window": 0}])
def test_php_refuses_what_python_refuses(php_worker: Php, bad: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)) as python_error:
        AdaptiveLimit.build(bad)  # a mapping, as PHP gets it
    [php_error] = php_worker.run(action="adaptive_wire", adaptive=[bad], shares=[])["wires"]
    field = str(python_error.value).split(" ")[0]  # the field Python names
    assert field in php_error["error"].split(" ")[0], php_error


def test_php_breaker_config_carries_the_ramp_fields_like_python(php_worker: Php) -> None:
    php_wires = php_worker.run(action="wire", configs=RAMP_CASES)
    assert php_wires == [BreakerConfig(**case).to_wire() for case in RAMP_CASES]
    assert php_wires[0].endswith(";C;O;1;0;0;30000")
    assert php_wires[4] == BreakerConfig().to_wire()  # the defaults are trimmed


def test_php_and_python_workers_move_one_adaptive_limit(
        php_worker: Php, redis_client: redis.Redis, name: str, python_side: Bulkhead) -> None:
    config = {"adaptive": ADAPTIVE, "lease": 10.0}
    # PHP: a failed call halves the shared limit (8 -> 4)
    out = php_worker.run(action="adaptive", name=name, config=config, steps=[{"op": "fail"}])
    assert out["steps"] == ["failed"] and out["metrics"]["limit"] == 4
    assert meta(redis_client, name)["a_why"] == "failure or timeout"
    assert python_side.metrics().limit == 4

    # Python: a 429 with Retry-After halves it again and pauses increases fleet-wide
    time.sleep(0.05)     # (one decrease per window: a burst of failures is one signal)
    permit = python_side.acquire()
    python_side.release(permit, Overloaded("slow down", retry_after=30))
    assert python_side.metrics().limit == 2
    # PHP's successes while paused do not grow it, and go into the fleet's window
    out = php_worker.run(action="adaptive", name=name, config=config,
                         steps=[{"op": "hold"}, {"op": "ok", "hold": 0.02}])
    assert out["steps"] == ["held", "ok"] and out["metrics"]["limit"] == 2
    fields = meta(redis_client, name)
    assert fields["a_why"] == "overload (429): increases paused"
    assert int(fields["a_wn"]) == 1 and float(fields["a_wsum"]) >= 15  # PHP's 20 ms call

    # Python holds the two permits: PHP is refused, and told the adaptive limit
    held = [python_side.acquire(), python_side.acquire()]
    out = php_worker.run(action="adaptive", name=name, config=config, steps=[{"op": "ok"}])
    assert out["steps"] == [{"full": 2, "in_use": 2}]
    for p in held:
        python_side.release(p, BulkheadFull(name, 2, 2))  # no outcome: the limit stays put

    # PHP's Overloaded is a 429 (not a plain failure): 2 -> 1; its 5 s Retry-After ends
    # before Python's 30 s pause, which stays
    paused = meta(redis_client, name)["a_pause"]
    time.sleep(0.05)
    out = php_worker.run(action="adaptive", name=name, config=config,
                         steps=[{"op": "429", "retry_after": 5}])
    assert out["steps"] == ["429"] and out["metrics"]["limit"] == 1
    fields = meta(redis_client, name)
    assert fields["a_why"] == "overload (429)" and fields["a_pause"] == paused
    assert python_side.metrics().limit == 1

    # slow start from PHP: the limit restarts at its minimum, for Python too
    python_side.restart_limit()
    assert meta(redis_client, name)["a_why"] == "restart after a recovery"
    redis_client.hset(BulkheadKeys.build(name).meta, "a_why", "")
    out = php_worker.run(action="adaptive", name=name, config=config, steps=[{"op": "restart"}])
    assert out["steps"] == ["restarted"] and out["metrics"]["limit"] == 1
    assert meta(redis_client, name)["a_why"] == "restart after a recovery"


def test_priorities_shed_php_calls_before_python_critical_ones(
        php_worker: Php, redis_url: str, name: str) -> None:
    """A fixed limit of 10: sheddable calls may use 7 permits, normal ones 9, critical all."""
    shared = {"max_concurrent_calls": 10, "lease": 10.0}
    python_side = Bulkhead(name, redis=redis_url, **shared)
    try:
        held = [python_side.acquire("sheddable") for _ in range(7)]
        out = php_worker.run(action="adaptive", name=name, config=shared,
                             steps=[{"op": "hold", "priority": "sheddable"},
                                    {"op": "hold"}, {"op": "hold", "priority": 1},
                                    {"op": "hold", "priority": "critical"}])
        # the sheddable one is refused at 7, two normal ones fit (to 9), critical takes the 10th
        assert out["steps"] == [{"full": 10, "in_use": 7}, "held", "held", "held"]
        assert out["metrics"]["in_use"] == 10
        for permit in held:
            python_side.release(permit)
    finally:
        python_side.close()
