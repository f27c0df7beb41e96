"""Fixtures for the tests against the real redis-server (tests/conftest.py starts it)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest
import redis

from tests.helpers.flavours import Flavour


@pytest.fixture(params=["sync", "asyncio"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """Run the test once with the sync components and once with the asyncio ones."""
    made = Flavour(request.param)
    yield made
    made.close()


@pytest.fixture
def dead_redis_url() -> str:
    """A Redis URL nothing listens on (a port just freed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


# -- no key without a TTL ------------------------------------------------------------------
#: Keys allowed to have no TTL, each with where it is documented: Ganesha mode writes
#: PHP Ganesha's own keys, which have none unless `key_ttl` is set (KEY_SCHEMA.md,
#: "Ganesha-compatible mode": "key TTL ms (0 = none, Ganesha's behaviour)").
#: scripts/bench_redis_cost.py compares pybreaker, whose CircuitRedisStorage keys (under
#: the bench's `cost-pyb` namespace) have no TTL by pybreaker's design, not ours.
DOCUMENTED_WITHOUT_TTL = (re.compile(r"^ganesha_"), re.compile(r"^cost-pyb:pybreaker:"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "keys_without_ttl(reason): the test writes keys without a TTL by hand "
        "on purpose (foreign data, a v1 fleet...): the TTL sweep skips it")


def keys_without_ttl(url: str) -> list[str]:
    """Every key of every database with no TTL (PTTL -1) that no document allows."""
    found = []
    admin = redis.Redis.from_url(url, socket_timeout=10)
    try:
        databases = [int(db[2:]) for db in admin.info("keyspace")]
    finally:
        admin.close()
    for db in databases:
        client = redis.Redis.from_url(url, db=db, socket_timeout=10)
        try:
            for raw in client.scan_iter(count=1000):
                name = raw.decode(errors="replace")
                if not any(p.search(name) for p in DOCUMENTED_WITHOUT_TTL) \
                        and client.pttl(raw) == -1:
                    found.append(f"db{db}:{name}" if db else name)
        finally:
            client.close()
    return sorted(found)


@pytest.fixture(autouse=True)
def every_key_has_a_ttl(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the session's redis-server: every key it left must
    expire (Principle 6: nothing leaks), unless the test wrote keys by hand on purpose
    (`@pytest.mark.keys_without_ttl(reason)`). The server is flushed before each test,
    so what is found was written by this test."""
    yield
    if "redis_url" not in request.fixturenames \
            or request.node.get_closest_marker("keys_without_ttl") is not None:
        return
    server = request.getfixturevalue("redis_server")
    if server.process is None or server.process.poll() is not None:
        return  # the test stopped it
    try:
        leaked = keys_without_ttl(server.url)
    except redis.ConnectionError:
        return  # stopped or restarted by the test
    if leaked:
        pytest.fail(f"keys without a TTL (PTTL -1) left by {request.node.nodeid}: "
                    f"{leaked[:10]}{' ...' if len(leaked) > 10 else ''}; a key distbreaker "
                    "writes must expire (docs/KEY_SCHEMA.md), or mark the test "
                    "keys_without_ttl(reason) if it wrote them by hand", pytrace=False)
