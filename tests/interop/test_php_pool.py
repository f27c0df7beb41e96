"""PHP and Python workers share one fleet-wide pool (lua/pool.lua): the same keys,
config wire and script, so an outlier that PHP requests see is ejected for Python
workers too, and the reverse.

Every PHP step runs in a real `php` process (clients/php/tests/worker.php) against the
same real redis-server as the Python side; php-cli and php-redis are required.
"""

from __future__ import annotations

from typing import Any

from distbreaker import Pool
from distbreaker.demo.embedded import RedisServer, free_port
from distbreaker.pool.config import PoolConfig
from tests.interop.test_php import Php

#: Two members and a small trip: three 5xx in a row eject one (half the pool may go).
CONFIG: dict[str, Any] = {"consecutive_5xx": 3, "max_ejection_percent": 50,
                          "base_ejection_time": 60}


def python_pool(name: str, redis_url: str, **overrides: Any) -> Pool:
    return Pool(name, redis_url, redis_timeout=5, **{**CONFIG, **overrides})


def test_php_sends_the_config_wire_python_sends(php: str, redis_server: RedisServer,
                                                name: str) -> None:
    configs: list[dict[str, Any]] = [
        {},
        CONFIG,
        {"balance": "latency", "interval": 2.5, "split_external_local_origin_errors": True,
         "success_rate_stdev_factor": 1.25, "latency_factor": 2.5, "latency_threshold": 0.25,
         "latency_percentile": 90, "probe_calls": 7, "max_call_duration": 12.5,
         "key_ttl": 600, "max_ejection_time": 0},
    ]
    wires = Php(php, redis_server).run(action="pool_wire", name=name, configs=configs)
    assert wires == [PoolConfig(**c).wire for c in configs]


def test_an_outlier_php_sees_is_ejected_for_python_workers(
        php: str, redis_server: RedisServer, redis_url: str, name: str) -> None:
    pool = python_pool(name, redis_url, members=["good", "bad"])
    assert pool.pick().member in {"good", "bad"}  # puts the members in Redis
    steps = [{"avoid": ["good"], "status": 500}] * 3
    result = Php(php, redis_server).run(action="pool", name=name, config=CONFIG, steps=steps)
    assert result["picks"] == ["bad"] * 3
    assert result["events"] == ["", "", "ejected"]
    assert pool.status().member("bad").state == "ejected"
    assert {pool.pick(track=False).member for _ in range(20)} == {"good"}


def test_php_picks_avoid_a_member_python_ejected(
        php: str, redis_server: RedisServer, redis_url: str, name: str) -> None:
    pool = python_pool(name, redis_url, members=["a", "b", "c"])
    pool.release(pool.pick())  # puts the members in Redis
    pool.eject("b", 60, actor="test")
    steps = [{"status": 200}] * 15
    result = Php(php, redis_server).run(action="pool", name=name, config=CONFIG, steps=steps)
    assert set(result["picks"]) == {"a", "c"}
    assert set(result["sources"]) == {"redis"}
    # every lease was given back by its record: no pick left in flight
    assert all(m["in_flight"] == 0 for m in result["status"].values())
    assert result["status"]["b"]["record"][0] == 1  # state: ejected


def test_php_static_members_fill_an_empty_pool_and_a_throwing_call_is_a_failure(
        php: str, redis_server: RedisServer, redis_url: str, name: str) -> None:
    config = {**CONFIG, "members": {"x": 1, "y": 0}}
    steps = [{"status": 200}, {"throw": True}]
    result = Php(php, redis_server).run(action="pool", name=name, config=config, steps=steps)
    assert result["picks"] == ["x"]  # weight 0: never picked
    assert result["thrown"] == ["upstream failed"]
    pool = python_pool(name, redis_url)
    status = pool.status()
    assert sorted(m.member for m in status.members) == ["x", "y"]
    assert status.member("x").consecutive_5xx == 1


def test_php_picks_locally_while_redis_is_down(php: str, redis_server: RedisServer,
                                               name: str) -> None:
    config = {**CONFIG, "members": ["m1", "m2"]}
    result = Php(php, redis_server).run(action="pool_outage", name=name, config=config,
                                        dead_port=free_port(), n=6)
    assert {member for member, _ in result["picks"]} <= {"m1", "m2"}
    assert {source for _, source in result["picks"]} == {"local"}
    assert result["records"] == [None] * 6
