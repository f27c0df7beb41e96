"""distbreaker.contrib.asgi with Starlette's and FastAPI's own test clients."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import distbreaker.aio
from distbreaker import Registry
from distbreaker.contrib.asgi import DistbreakerMiddleware

CONFIG = {
    "breakers": {"instances": {"payments": {"critical": True, "wait_duration_in_open_state": 30},
                               "recommendations": {},
                               "ledger": {"fail_readiness_when_open": True}}},
    "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 1}}},
}


def _starlette(registry: Registry, **options: object) -> Starlette:
    def pay(request: Request) -> PlainTextResponse:
        return registry.breaker("payments").call(lambda: PlainTextResponse("paid"))

    def reserve(request: Request) -> PlainTextResponse:
        return registry.bulkhead("payments").call(lambda: PlainTextResponse("reserved"))

    def boom(request: Request) -> PlainTextResponse:
        raise RuntimeError("a bug, not a rejection")

    app = Starlette(routes=[Route("/pay", pay), Route("/reserve", reserve),
                            Route("/boom", boom)])
    app.add_middleware(DistbreakerMiddleware, registry=registry, **options)
    return app


def test_an_open_breaker_is_a_503_with_retry_after(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    client = TestClient(_starlette(registry), raise_server_exceptions=False)
    assert client.get("/pay").text == "paid"
    registry.breaker("payments").trip("gateway down")
    response = client.get("/pay")
    assert response.status_code == 503
    assert 20 <= int(response.headers["Retry-After"]) <= 30  # the rest of the 30 s wait
    assert response.headers["X-Distbreaker-Rejected"] == "circuit-open"
    assert "payments" in response.text
    assert client.get("/boom").status_code == 500   # other errors are not ours to answer


def test_a_full_bulkhead_is_a_503(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    client = TestClient(_starlette(registry))
    held = registry.bulkhead("payments").acquire()
    response = client.get("/reserve")
    assert response.status_code == 503
    assert response.headers["X-Distbreaker-Rejected"] == "bulkhead-full"
    assert response.headers["Retry-After"] == "1"
    registry.bulkhead("payments").release(held)
    assert client.get("/reserve").text == "reserved"


def test_an_open_breaker_never_fails_readiness_unless_opted_in(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    client = TestClient(_starlette(registry))
    registry.breaker("ledger")
    registry.breaker("recommendations").trip()
    registry.breaker("payments").trip()       # critical, but a fleet state: the app serves
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["components"]["breaker:payments"]["status"] == "DOWN"
    assert ready.json()["components"]["breaker:payments"]["serving"] is True
    assert ready.headers["Cache-Control"] == "no-store"
    assert client.get("/pay").headers["X-Distbreaker-Rejected"] == "circuit-open"
    registry.breaker("payments").transition_to_forced_open("maintenance")
    assert client.get("/health/ready").status_code == 200
    registry.breaker("ledger").transition_to_forced_open("maintenance")   # opted in
    assert client.get("/health/ready").status_code == 503
    assert client.get("/health").json()["failing"] == ["breaker:ledger"]
    live = client.get("/health/live")
    assert (live.status_code, live.json()) == (200, {"status": "UP"})


def test_readiness_fails_when_this_process_cannot_serve(dead_redis_url: str) -> None:
    for policy, status in (("fail_open", 200), ("fail_closed", 503)):
        config = {"breakers": {"instances": {"payments": {"critical": True,
                                                          "on_redis_error": policy}}}}
        registry = Registry.from_dict(config, redis=dead_redis_url, environ={})
        report = TestClient(_starlette(registry)).get("/health/ready")
        assert report.status_code == status, policy
        assert report.json()["components"]["breaker:payments"]["serving"] is (status == 200)


def test_health_prefix_and_details_options(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    client = TestClient(_starlette(registry, health_prefix="/_status", details=False))
    assert client.get("/_status").json() == {"status": "UP"}
    assert client.get("/_status/live").status_code == 200
    assert client.get("/health").status_code == 404
    with pytest.raises(ValueError, match="must start with '/'"):
        DistbreakerMiddleware(_starlette(registry), registry=registry, health_prefix="x")


def test_fastapi_with_the_asyncio_registry(redis_url: str) -> None:
    registry = distbreaker.aio.Registry.from_dict(CONFIG, redis=redis_url, environ={})
    app = FastAPI()
    app.add_middleware(DistbreakerMiddleware, registry=registry)

    @app.get("/pay")
    async def pay() -> dict[str, str]:
        async def charge() -> dict[str, str]:
            return {"status": "paid"}

        return await registry.breaker("payments").call(charge)

    @app.post("/trip")
    async def trip() -> dict[str, str]:
        await registry.breaker("payments").trip("by test")
        return {"status": "tripped"}

    with TestClient(app) as client:
        assert client.get("/pay").json() == {"status": "paid"}
        assert client.get("/health/ready").status_code == 200
        client.post("/trip")
        rejected = client.get("/pay")
        assert rejected.status_code == 503
        assert rejected.headers["X-Distbreaker-Rejected"] == "circuit-open"
        report = client.get("/health/ready")
        assert report.status_code == 200        # the pod keeps serving its own 503s
        assert report.json()["components"]["breaker:payments"]["state"] == "OPEN"


def test_a_registry_on_a_wrong_database_serves_every_endpoint(redis_url: str) -> None:
    """A registry file naming a database the server lacks (issue 23): every endpoint
    answered 500 (ResponseError: DB index is out of range); now the calls fail open."""
    wrong = redis_url.rsplit("/", 1)[0] + "/99"
    registry = Registry.from_dict(CONFIG, redis=wrong, environ={})
    client = TestClient(_starlette(registry), raise_server_exceptions=False)
    assert [client.get(path).text for path in ("/pay", "/reserve", "/pay")] == [
        "paid", "reserved", "paid"]
    registry.close()
