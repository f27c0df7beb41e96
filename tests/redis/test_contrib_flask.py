"""distbreaker.contrib.flask with Flask's own test client."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask

from distbreaker import Registry
from distbreaker.contrib.flask import Distbreaker

CONFIG = {
    "breakers": {"instances": {"payments": {"critical": True, "wait_duration_in_open_state": 7},
                               "recommendations": {},
                               "ledger": {"fail_readiness_when_open": True}}},
    "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 1}}},
}


def _app(registry: Registry | None = None, **options: object) -> tuple[Flask, Distbreaker]:
    app = Flask(__name__)
    resilience = Distbreaker(**options)

    @app.get("/pay")
    def pay() -> str:
        return resilience.registry.breaker("payments").call(lambda: "paid")

    @app.get("/reserve")
    def reserve() -> str:
        return resilience.registry.bulkhead("payments").call(lambda: "reserved")

    if registry is not None:
        app.config["DISTBREAKER_REGISTRY"] = registry
    resilience.init_app(app)
    return app, resilience


def test_rejections_are_503_with_retry_after(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    app, _ = _app(registry)
    client = app.test_client()
    assert client.get("/pay").text == "paid"
    registry.breaker("payments").trip()
    response = client.get("/pay")
    assert response.status_code == 503
    assert 2 <= int(response.headers["Retry-After"]) <= 7  # the rest of the 7 s wait
    assert response.headers["X-Distbreaker-Rejected"] == "circuit-open"
    held = registry.bulkhead("payments").acquire()
    assert client.get("/reserve").headers["X-Distbreaker-Rejected"] == "bulkhead-full"
    registry.bulkhead("payments").release(held)
    assert client.get("/reserve").text == "reserved"


def test_health_endpoints(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    app, _ = _app(registry)
    client = app.test_client()
    registry.breaker("ledger")
    registry.breaker("recommendations").trip()
    registry.breaker("payments").trip()       # critical, but a fleet state: the app serves
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json["components"]["breaker:payments"]["status"] == "DOWN"
    registry.breaker("payments").transition_to_forced_open("maintenance")
    assert client.get("/health").status_code == 200
    registry.breaker("ledger").trip()                                      # opted in
    assert client.get("/health").status_code == 503
    assert client.get("/health").json["failing"] == ["breaker:ledger"]
    assert client.get("/health/live").json == {"status": "UP"}


def test_readiness_fails_when_this_process_cannot_serve(dead_redis_url: str) -> None:
    for policy, status in (("fail_open", 200), ("fail_closed", 503)):
        config = {"breakers": {"instances": {"payments": {"critical": True,
                                                          "on_redis_error": policy}}}}
        registry = Registry.from_dict(config, redis=dead_redis_url, environ={})
        report = _app(registry)[0].test_client().get("/health/ready")
        assert report.status_code == status, policy
        assert report.json["components"]["breaker:payments"]["serving"] is (status == 200)


def test_config_file_prefix_and_details(redis_url: str, tmp_path: Path) -> None:
    file = tmp_path / "resilience.yaml"
    file.write_text(f"redis: {redis_url}\nbreakers: {{instances: {{payments: {{}}}}}}\n")
    app = Flask(__name__)
    app.config["DISTBREAKER_REGISTRY"] = str(file)
    Distbreaker(health_prefix="/_status", details=False).init_app(app)
    client = app.test_client()
    assert client.get("/_status").json == {"status": "UP"}
    assert client.get("/health").status_code == 404
    with pytest.raises(LookupError, match="DISTBREAKER_REGISTRY"):
        Distbreaker(Flask("bare"))
