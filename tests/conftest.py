"""Shared fixtures: a real redis-server per test session (flushed between tests)
and a fakeredis client for fast unit tests."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterator

import fakeredis
import pytest
import redis

pytest.register_assert_rewrite("tests.helpers")

from distbreaker.demo.embedded import RedisServer  # noqa: E402 - after the rewrite hook

_names = itertools.count()


@pytest.fixture(autouse=True)
def _no_fault_feed_outlives_its_test() -> Iterator[None]:
    """A breaker allowing fault injection starts a thread that reads Redis every few
    seconds; one a test left open would run into the next tests (their command counts)."""
    yield
    from distbreaker._runtime.fault_feed import FEEDS

    FEEDS.stop_all()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()  # a previous test killed it
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.script_flush()
    yield redis_server.url
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def fake_client() -> fakeredis.FakeStrictRedis:
    return fakeredis.FakeStrictRedis()


@pytest.fixture
def name() -> str:
    """A fresh breaker name per test."""
    return f"dep-{next(_names)}"


@pytest.fixture(scope="session")
def php() -> str:
    """The php binary with the redis extension; fail (not skip) when it is missing."""
    binary = shutil.which("php")
    if binary is None:
        pytest.fail("php is not installed: run scripts/test (it installs php-cli and php-redis) "
                    "or `apt-get install -y php-cli php-redis`")
    modules = subprocess.run([binary, "-m"], capture_output=True, text=True, check=True).stdout
    if "redis" not in modules.lower().split():
        pytest.fail("the phpredis extension is missing: `apt-get install -y php-redis`")
    return binary
