"""A Flask extension: rejections become 503 with Retry-After, and health endpoints.

```python
from distbreaker.contrib.flask import Distbreaker

resilience = Distbreaker(app, registry)     # or Distbreaker().init_app(app), with
                                            # app.config["DISTBREAKER_REGISTRY"] = "resilience.yaml"
@app.get("/pay")
def pay():
    return resilience.registry.policy("payments").call(gateway.charge)
```

A `CallNotPermitted` or `BulkheadFull` escaping a view is answered with a 503,
``Retry-After`` and ``X-Distbreaker-Rejected``. ``/health`` and
``/health/ready`` serve the registry's report (503 only while this process
cannot serve a critical component; an OPEN breaker keeps it ready),
``/health/live`` answers 200 without reading anything
(`health_prefix` moves them, None turns them off).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, Response, current_app

from ..registry import Registry
from ._web import REJECTIONS, HealthPaths, health_body, live_body, rejection

__all__ = ["Distbreaker"]

CONFIG_KEY = "DISTBREAKER_REGISTRY"


class Distbreaker:
    """The extension; one instance may serve several apps (`init_app`)."""

    def __init__(self, app: Flask | None = None, registry: Registry | None = None, *,
                 health_prefix: str | None = "/health", details: bool = True) -> None:
        self._registry = registry
        self.paths = HealthPaths(health_prefix)
        self.details = details
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        registry = self._registry
        if registry is None:
            setting = app.config.get(CONFIG_KEY)
            if setting is None:
                raise LookupError(f"give Distbreaker a registry or set "
                                  f"app.config[{CONFIG_KEY!r}] to a config file path")
            registry = setting if isinstance(setting, Registry) else Registry.from_file(setting)
        app.extensions["distbreaker"] = registry
        for error in REJECTIONS:
            app.register_error_handler(error, _rejected)
        if self.paths.prefix is not None:
            app.register_blueprint(self._blueprint())

    @property
    def registry(self) -> Registry:
        """The current app's registry."""
        return current_app.extensions["distbreaker"]  # type: ignore[no-any-return]

    def _blueprint(self) -> Blueprint:
        blueprint = Blueprint("distbreaker", __name__, url_prefix=self.paths.prefix or None)
        details = self.details

        def ready() -> Response:
            return _json(*health_body(current_app.extensions["distbreaker"].health(), details))

        def live() -> Response:
            return _json(*live_body())

        blueprint.add_url_rule("", "health", ready, methods=["GET", "HEAD"],
                               strict_slashes=False)
        blueprint.add_url_rule("/ready", "ready", ready, methods=["GET", "HEAD"])
        blueprint.add_url_rule("/live", "live", live, methods=["GET", "HEAD"])
        return blueprint


def _rejected(error: Any) -> Response:
    status, headers, body = rejection(error)
    return Response(body, status=status, headers=headers)


def _json(status: int, body: bytes) -> Response:
    return Response(body, status=status, mimetype="application/json",
                    headers={"Cache-Control": "no-store"})
