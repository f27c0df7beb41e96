"""Routing by pool: contrib.httpx's PoolTransport / AsyncPoolTransport and contrib.requests'
PoolAdapter against local HTTP servers (the members) and a real redis-server. Every
behaviour is checked through the three clients, the hits counted on the servers."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests

import distbreaker
import distbreaker.aio
from distbreaker.contrib.httpx import AsyncPoolTransport, PoolTransport
from distbreaker.contrib.requests import PoolAdapter, route
from tests.helpers.flaky_http import FlakyServer, slow, status

POOL = {"consecutive_5xx": 3, "consecutive_gateway_failure": 3,
        "enforcing_consecutive_gateway_failure": 100, "max_ejection_percent": 50,
        "base_ejection_time": 60}


class Client:
    """One client flavour routing the logical host ``payments`` by one pool."""

    pool: Any

    def __init__(self, redis_url: str, members: list[str], **options: Any) -> None:
        self.name = f"pay-{secrets.token_hex(3)}"
        self.sync_pool = distbreaker.Pool(self.name, redis=redis_url, members=members, **POOL)

    def get(self, url: str, headers: dict[str, str] | None = None) -> Any:
        raise NotImplementedError

    def member_of(self, response: Any) -> str:
        raise NotImplementedError

    def close(self) -> None:
        self.sync_pool.reset()
        self.sync_pool.close()


class SyncHttpx(Client):
    errors = (httpx.TransportError,)

    def __init__(self, redis_url: str, members: list[str], **options: Any) -> None:
        super().__init__(redis_url, members)
        self.pool = self.sync_pool
        self.client = httpx.Client(transport=PoolTransport({"payments": self.pool}, **options))

    def get(self, url: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(url, headers=headers, timeout=5)

    def member_of(self, response: Any) -> str:
        return str(response.extensions["distbreaker_member"])

    def close(self) -> None:
        self.client.close()
        super().close()


class AsyncHttpx(Client):
    errors = (httpx.TransportError,)

    def __init__(self, redis_url: str, members: list[str], **options: Any) -> None:
        super().__init__(redis_url, members)
        self.loop = asyncio.new_event_loop()
        self.pool = distbreaker.aio.Pool(self.name, redis=redis_url, members=members, **POOL)
        self.client = httpx.AsyncClient(
            transport=AsyncPoolTransport({"payments": self.pool}, **options))

    def get(self, url: str, headers: dict[str, str] | None = None) -> Any:
        return self.loop.run_until_complete(self.client.get(url, headers=headers, timeout=5))

    def member_of(self, response: Any) -> str:
        return str(response.extensions["distbreaker_member"])

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()
        super().close()


class Requests(Client):
    errors = (requests.ConnectionError,)

    def __init__(self, redis_url: str, members: list[str], **options: Any) -> None:
        super().__init__(redis_url, members)
        self.pool = self.sync_pool
        self.session = requests.Session()
        route(self.session, {"payments": self.pool}, **options)

    def get(self, url: str, headers: dict[str, str] | None = None) -> Any:
        return self.session.get(url, headers=headers, timeout=5)

    def member_of(self, response: Any) -> str:
        return str(response.distbreaker_member)

    def close(self) -> None:
        self.session.close()
        super().close()


FLAVOURS = {"httpx": SyncHttpx, "httpx-async": AsyncHttpx, "requests": Requests}


@pytest.fixture
def servers() -> Iterator[list[FlakyServer]]:
    made = [FlakyServer().start() for _ in range(3)]
    yield made
    for server in made:
        server.stop()


def member(server: FlakyServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture(params=list(FLAVOURS))
def make(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Any]:
    made: list[Client] = []

    def build(members: list[str], **options: Any) -> Client:
        client = FLAVOURS[request.param](redis_url, members, **options)
        made.append(client)
        return client

    yield build
    for client in made:
        client.close()


def test_requests_go_to_picked_members_with_their_host(make: Any,
                                                       servers: list[FlakyServer]) -> None:
    client = make([member(s) for s in servers])
    served = set()
    for _ in range(12):
        response = client.get("http://payments/charge?id=7")
        assert response.status_code == 200
        served.add(client.member_of(response))
    assert served <= {member(s) for s in servers} and len(served) >= 2
    assert sum(s.count("/charge") for s in servers) == 12
    status_ = client.sync_pool.status()
    assert all(m.in_flight == 0 and m.state == "healthy" for m in status_.members)
    assert sum(m.calls for m in status_.members) == 12


def test_a_member_answering_503s_is_ejected_for_the_fleet(make: Any,
                                                          servers: list[FlakyServer]) -> None:
    servers[0].set(None, status(503))
    client = make([member(s) for s in servers])
    for _ in range(30):
        client.get("http://payments/charge")
        if client.sync_pool.status().member(member(servers[0])).ejected:
            break
    sick = client.sync_pool.status().member(member(servers[0]))
    assert sick.ejected and sick.why in ("consecutive_5xx", "consecutive_gateway_failure")
    hits = servers[0].count()
    assert hits == 3                     # the fleet's count: 3 in a row, then never again
    for _ in range(10):
        assert client.get("http://payments/charge").status_code == 200
    assert servers[0].count() == hits


def test_a_429_with_retry_after_ejects_that_member_for_that_long(
        make: Any, servers: list[FlakyServer]) -> None:
    """The LLM recipe: a deployment's 429 with Retry-After: 30 takes it out of the pool,
    fleet-wide, for 30 s; the other deployments keep serving."""
    servers[1].set(None, status(429, retry_after=30))
    client = make([member(s) for s in servers])
    for _ in range(40):
        response = client.get("http://payments/v1/chat")
        if client.member_of(response) == member(servers[1]):
            assert response.status_code == 429       # the caller sees the answer
            break
    limited = client.sync_pool.status()
    record = limited.member(member(servers[1]))
    assert record.ejected and record.why == "retry_after"
    assert record.ejected_until is not None
    assert 25 <= record.ejected_until - limited.read_at <= 30.5
    assert servers[1].count() == 1
    for _ in range(10):
        assert client.get("http://payments/v1/chat").status_code == 200
    assert servers[1].count() == 1


def test_client_errors_are_answers_and_other_hosts_pass_through(
        make: Any, servers: list[FlakyServer]) -> None:
    servers[0].set("/missing", status(404))
    client = make([member(servers[0])])
    for _ in range(5):
        assert client.get("http://payments/missing").status_code == 404
    record = client.sync_pool.status().member(member(servers[0]))
    assert record.state == "healthy" and record.failures == 0 and record.calls == 5
    # A host that is not a pool's is sent as it is.
    assert client.get(f"{servers[2].url}/direct").status_code == 200
    assert servers[2].count("/direct") == 1


def test_a_refused_connection_is_a_local_origin_failure(make: Any,
                                                        servers: list[FlakyServer]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    client = make([dead])
    with pytest.raises(client.errors):
        client.get("http://payments/charge")
    record = client.sync_pool.status().member(dead)
    assert record.failures == 1 and record.in_flight == 0
    assert record.consecutive_gateway_failure + record.consecutive_local_origin_failure >= 1


def test_path_prefix_scheme_and_stickiness(make: Any, servers: list[FlakyServer]) -> None:
    members = [f"http://127.0.0.1:{s.port}/base" for s in servers]
    client = make(members, key=lambda request: request.headers.get("X-User"))
    chosen = set()
    for _ in range(6):
        response = client.get("http://payments/charge", headers={"X-User": "alice"})
        assert response.status_code == 200
        chosen.add(client.member_of(response))
    assert len(chosen) == 1
    assert sum(s.count("/base/charge") for s in servers) == 6


def test_keep_host_sends_the_logical_host(redis_url: str, servers: list[FlakyServer]) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Host"])
        seen.append(str(request.url))
        return httpx.Response(200)

    name = f"pay-{secrets.token_hex(3)}"
    pool = distbreaker.Pool(name, redis=redis_url, members=["10.1.2.3:8080"])
    try:
        for keep, host in ((False, "10.1.2.3:8080"), (True, "payments")):
            transport = PoolTransport(pool, httpx.MockTransport(handler), keep_host=keep)
            with httpx.Client(transport=transport) as client:
                assert client.get("http://payments/a?b=1").status_code == 200
            assert seen[-2:] == [host, "http://10.1.2.3:8080/a?b=1"]
    finally:
        pool.reset()
        pool.close()


def test_a_cancelled_async_request_gives_its_pick_back(redis_url: str,
                                                       servers: list[FlakyServer]) -> None:
    servers[0].set(None, slow(2.0))
    name = f"pay-{secrets.token_hex(3)}"
    sync_pool = distbreaker.Pool(name, redis=redis_url, members=[member(servers[0])])

    async def scenario() -> None:
        pool = distbreaker.aio.Pool(name, redis=redis_url, members=[member(servers[0])])
        async with httpx.AsyncClient(transport=AsyncPoolTransport(pool)) as client:
            task = asyncio.ensure_future(client.get("http://anything/slow", timeout=10))
            deadline = time.monotonic() + 20
            while servers[0].count() == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert sync_pool.status().member(member(servers[0])).in_flight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await pool.aclose()

    try:
        asyncio.run(scenario())
        record = sync_pool.status().member(member(servers[0]))
        assert record.in_flight == 0 and record.calls == 0
    finally:
        sync_pool.reset()
        sync_pool.close()


def test_bad_options_are_refused() -> None:
    with pytest.raises(TypeError, match="pick"):
        PoolTransport(object())
    with pytest.raises(ValueError, match="at least one host"):
        PoolAdapter({})
    with pytest.raises(TypeError, match="keep_host"):
        PoolAdapter({"a": _FakePool()}, keep_host="yes")
    with pytest.raises(TypeError, match="key"):
        AsyncPoolTransport(_FakePool(), key="X-User")


class _FakePool:
    def pick(self, key: Any = None) -> Any:
        raise AssertionError("not called")


def test_recipe_by_hand_an_sdk_429_with_retry_after_ejects_the_deployment(
        redis_url: str, servers: list[FlakyServer]) -> None:
    """The recipe's second form: one client per deployment, ``with pool.use()``; the
    error a 429 raises (status and headers on its response) ejects that deployment for
    its Retry-After."""
    servers[0].set(None, status(429, retry_after=20))
    clients = {"eastus": servers[0], "westeu": servers[1]}
    name = f"llm-{secrets.token_hex(3)}"
    pool = distbreaker.Pool(name, redis=redis_url, members=list(clients),
                            max_ejection_percent=50)
    try:
        with httpx.Client(timeout=5) as http:
            for _ in range(40):
                try:
                    with pool.use() as pick:
                        http.get(f"{clients[pick.member].url}/chat").raise_for_status()
                except httpx.HTTPStatusError as error:
                    assert error.response.status_code == 429
                    break
        limited = pool.status()
        record = limited.member("eastus")
        assert record.ejected and record.why == "retry_after"
        assert record.ejected_until is not None
        assert 15 <= record.ejected_until - limited.read_at <= 20.5
        assert limited.member("westeu").state == "healthy"
        assert pool.pick().member == "westeu"
    finally:
        pool.reset()
        pool.close()


def test_failover_sends_a_429_to_another_deployment(make: Any,
                                                    servers: list[FlakyServer]) -> None:
    """LiteLLM's router fallback, on the fleet's record: the deployment answering 429
    with Retry-After is ejected and the same request goes to another one."""
    servers[0].set(None, status(429, retry_after=30))
    client = make([member(servers[0]), member(servers[1])], failover=1)
    for _ in range(30):
        response = client.get("http://payments/v1/chat")
        assert response.status_code == 200
        assert client.member_of(response) == member(servers[1])
        if servers[0].count():
            break
    assert servers[0].count() == 1
    assert client.sync_pool.status().member(member(servers[0])).why == "retry_after"
    assert client.get("http://payments/v1/chat").status_code == 200
    assert servers[0].count() == 1


def test_failover_tries_each_member_once_then_answers_the_last(
        make: Any, servers: list[FlakyServer]) -> None:
    for server in servers[:2]:
        server.set(None, status(500))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    client = make([member(servers[0]), member(servers[1]), dead], failover=5)
    response = client.get("http://payments/charge")
    assert response.status_code == 500              # every member tried: the last answer
    assert servers[0].count() == 1 and servers[1].count() == 1
    status_ = client.sync_pool.status()
    assert sum(m.failures for m in status_.members) == 3
    assert all(m.in_flight == 0 for m in status_.members)


def test_no_failover_for_methods_not_listed(redis_url: str,
                                            servers: list[FlakyServer]) -> None:
    servers[0].set(None, status(503))
    name = f"pay-{secrets.token_hex(3)}"
    pool = distbreaker.Pool(name, redis=redis_url, members=[member(s) for s in servers[:2]])
    try:
        with httpx.Client(transport=PoolTransport(pool, failover=1)) as client:
            for _ in range(30):
                if client.post("http://payments/charge", content=b"{}").status_code == 503:
                    break
        assert servers[0].count() == 1          # a POST is not sent twice
        with pytest.raises(ValueError, match="failover"):
            PoolTransport(pool, failover=-1)
    finally:
        pool.reset()
        pool.close()
