"""distbreaker.contrib.django with Django's own test client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=["testserver"], ROOT_URLCONF=__name__, SECRET_KEY="test",
        MIDDLEWARE=["distbreaker.contrib.django.DistbreakerMiddleware"],
        INSTALLED_APPS=[], DATABASES={}, LOGGING_CONFIG=None)
    django.setup()

from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import include, path

from distbreaker import Registry
from distbreaker.contrib.django import get_registry

CONFIG = {
    "breakers": {"instances": {"payments": {"critical": True, "wait_duration_in_open_state": 12},
                               "recommendations": {},
                               "ledger": {"fail_readiness_when_open": True}}},
    "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 1}}},
}
#: The registry the views below use (set by each test).
current: dict[str, Registry] = {}


def pay(request: HttpRequest) -> HttpResponse:
    return current["registry"].breaker("payments").call(lambda: HttpResponse("paid"))


def reserve(request: HttpRequest) -> HttpResponse:
    return current["registry"].bulkhead("payments").call(lambda: HttpResponse("reserved"))


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


urlpatterns = [path("pay", pay), path("reserve", reserve), path("boom", boom),
               path("health/", include("distbreaker.contrib.django"))]


@pytest.fixture
def registry(redis_url: str) -> Iterator[Registry]:
    current["registry"] = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    with override_settings(DISTBREAKER_REGISTRY=current["registry"]):
        yield current["registry"]


def test_rejections_are_503_with_retry_after(registry: Registry) -> None:
    client = Client(raise_request_exception=False)
    assert client.get("/pay").content == b"paid"
    registry.breaker("payments").trip()
    response = client.get("/pay")
    assert response.status_code == 503
    assert 7 <= int(response["Retry-After"]) <= 12  # the rest of the 12 s wait
    assert response["X-Distbreaker-Rejected"] == "circuit-open"
    held = registry.bulkhead("payments").acquire()
    full = client.get("/reserve")
    assert (full.status_code, full["X-Distbreaker-Rejected"]) == (503, "bulkhead-full")
    registry.bulkhead("payments").release(held)
    assert client.get("/reserve").content == b"reserved"
    assert client.get("/boom").status_code == 500


def test_health_views(registry: Registry) -> None:
    client = Client()
    registry.breaker("ledger")
    registry.breaker("recommendations").trip()
    registry.breaker("payments").trip()       # critical, but a fleet state: the app serves
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["components"]["breaker:payments"]["state"] == "OPEN"
    assert "no-cache" in ready["Cache-Control"]
    registry.breaker("payments").transition_to_forced_open("maintenance")
    assert client.get("/health/").status_code == 200
    registry.breaker("ledger").trip()                                      # opted in
    assert client.get("/health/").status_code == 503
    assert client.get("/health/ready").json()["failing"] == ["breaker:ledger"]
    assert client.get("/health/live").status_code == 200
    assert client.post("/health/ready").status_code == 405


def test_readiness_fails_when_this_process_cannot_serve(dead_redis_url: str) -> None:
    for policy, status in (("fail_open", 200), ("fail_closed", 503)):
        config = {"breakers": {"instances": {"payments": {"critical": True,
                                                          "on_redis_error": policy}}}}
        registry = Registry.from_dict(config, redis=dead_redis_url, environ={})
        with override_settings(DISTBREAKER_REGISTRY=registry):
            report = Client().get("/health/ready")
        assert report.status_code == status, policy
        assert report.json()["components"]["breaker:payments"]["serving"] is (status == 200)


def test_the_setting_may_name_a_file_or_a_dotted_path(redis_url: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "resilience.toml"
    file.write_text(f'redis = "{redis_url}"\n[breakers.instances.payments]\ncritical = true\n')
    with override_settings(DISTBREAKER_REGISTRY=str(file)):
        loaded = get_registry()
        assert loaded is get_registry()
        assert loaded.critical("breaker", "payments")
        assert Client().get("/health/ready").status_code == 200
    monkeypatch.setattr(f"{__name__}.named_registry", loaded, raising=False)
    with override_settings(DISTBREAKER_REGISTRY=f"{__name__}.named_registry"):
        assert get_registry() is loaded
    with override_settings(DISTBREAKER_REGISTRY=None), pytest.raises(LookupError):
        get_registry()
