"""Django: rejections become 503 with Retry-After, and health views for a registry.

```python
# settings.py
MIDDLEWARE = [..., "distbreaker.contrib.django.DistbreakerMiddleware"]
DISTBREAKER_REGISTRY = "resilience.yaml"      # a config file, a dotted path to a
                                              # Registry, or a Registry object
# urls.py
urlpatterns = [..., path("health/", include("distbreaker.contrib.django"))]
```

The middleware answers a `CallNotPermitted` or `BulkheadFull` escaping a view
with a 503, ``Retry-After`` and ``X-Distbreaker-Rejected``. The views serve
``health/`` and ``health/ready`` (the registry's report; 503 only while this
process cannot serve a critical component, an OPEN breaker keeps it ready) and
``health/live`` (always 200, reads
nothing). `get_registry()` returns the registry the setting names (built once
per setting value).
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..registry import Registry
from ._web import REJECTIONS, health_body, live_body, rejection

__all__ = ["DistbreakerMiddleware", "get_registry", "health", "liveness", "readiness",
           "urlpatterns"]

SETTING = "DISTBREAKER_REGISTRY"
_FILE_SUFFIXES = (".yaml", ".yml", ".toml", ".json")


def get_registry() -> Registry:
    """The registry `settings.DISTBREAKER_REGISTRY` names."""
    value = getattr(settings, SETTING, None)
    if value is None:
        raise LookupError(f"settings.{SETTING} is not set: give a config file path, a "
                          "dotted path to a distbreaker.Registry, or the registry itself")
    if isinstance(value, Registry):
        return value
    if isinstance(value, (str, Path)):
        return _load(str(value))
    raise TypeError(f"settings.{SETTING} must be a path or a Registry, got {value!r}")


@functools.cache
def _load(value: str) -> Registry:
    if value.lower().endswith(_FILE_SUFFIXES):
        return Registry.from_file(value)
    module, _, attr = value.rpartition(".")
    registry = getattr(importlib.import_module(module), attr)
    if not isinstance(registry, Registry):
        raise TypeError(f"settings.{SETTING} = {value!r} is a {type(registry).__name__}, "
                        "not a distbreaker.Registry")
    return registry


class DistbreakerMiddleware:
    """Turns rejections escaping a view into 503 responses."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest,
                          exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, REJECTIONS):
            return None
        status, headers, body = rejection(exception)
        return HttpResponse(body, status=status, headers=headers)


def _json(status: int, body: bytes) -> HttpResponse:
    return HttpResponse(body, status=status, content_type="application/json")


@never_cache
@require_safe
def readiness(request: HttpRequest) -> HttpResponse:
    """The registry's report: 200 when ready, 503 while this process cannot serve a
    critical component (an OPEN breaker is a fleet state and keeps every pod ready)."""
    return _json(*health_body(get_registry().health()))


health = readiness


@never_cache
@require_safe
def liveness(request: HttpRequest) -> HttpResponse:
    """Always 200: liveness never depends on a dependency or on Redis."""
    return _json(*live_body())


urlpatterns = [
    path("", health, name="distbreaker-health"),
    path("ready", readiness, name="distbreaker-ready"),
    path("live", liveness, name="distbreaker-live"),
]
