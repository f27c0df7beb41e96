"""A PHP breaker allowing fault injection never fails a call because of foreign data in
the injection keys (issue 27 review; docs/guides/fault_injection.md)."""

from __future__ import annotations

import redis

from distbreaker._runtime.faults import fault_keys
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.demo.embedded import RedisServer
from tests.interop.test_php import Php


def test_foreign_injection_keys_never_fail_a_php_call(
        php: str, redis_server: RedisServer, redis_url: str,
        redis_client: redis.Redis) -> None:
    redis_client.set(fault_keys(DEFAULT_PREFIX)[0], "not a hash", ex=600)
    result = Php(php, redis_server).run(action="faults", name="php-foreign", n=3)
    assert result["ok"] == 3 and result["injected"] == 0, result
