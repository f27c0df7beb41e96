"""The PHP client while an operator records a breaker's outcomes: its hellos get the
full reply with the switch (element 21), which it ignores; it keeps working and does
not sample (docs/KEY_SCHEMA.md, "Outcome recording")."""

from __future__ import annotations

import redis

from distbreaker.demo.embedded import RedisServer
from distbreaker.recording import control
from tests.interop.test_php import SMALL, Php


def test_php_workers_keep_working_while_recording_is_on(
        php: str, redis_server: RedisServer, redis_url: str, redis_client: redis.Redis,
        name: str) -> None:
    control.start(redis_client, name, 1.0, 600)
    result = Php(php, redis_server).run(action="records", name=name, config=SMALL, n=3)
    assert [(r["state"], r["permitted"], r["drift"]) for r in result["replies"]] == \
        [("CLOSED", True, False)] * 3
    assert result["metrics"]["calls"] == 3
    assert redis_client.exists(control.stream_key(name)) == 0
