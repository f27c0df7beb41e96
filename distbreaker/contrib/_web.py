"""What the web framework integrations share, without a framework.

A rejection (`CallNotPermitted`, `BulkheadFull`) that escapes a view becomes a
503 with ``Retry-After`` (whole seconds until a probe may be tried, at least 1)
and ``X-Distbreaker-Rejected: circuit-open|bulkhead-full``; the health
endpoints serve a registry's report as JSON: readiness is 503 only while this
process cannot serve a critical component (an OPEN breaker is shared by every
pod, so it fails readiness only where opted in), liveness is always 200 and reads nothing.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from ._http import REJECTIONS, rejection_headers

__all__ = ["REJECTIONS", "HealthPaths", "health_body", "live_body", "note_rejection",
           "rejection"]


class HealthPaths:
    """Where the health endpoints live: ``<prefix>`` and ``<prefix>/ready`` serve the
    readiness report, ``<prefix>/live`` liveness. `prefix` None: no endpoints."""

    def __init__(self, prefix: str | None = "/health") -> None:
        if prefix is not None and (not isinstance(prefix, str) or not prefix.startswith("/")):
            raise ValueError(f"health prefix must start with '/', got {prefix!r}")
        self.prefix = None if prefix is None else prefix.rstrip("/") or ""
        self.ready = {} if self.prefix is None else {self.prefix or "/", f"{self.prefix}/ready"}
        self.live = set() if self.prefix is None else {f"{self.prefix}/live"}

    def route(self, path: str) -> str | None:
        """"ready", "live" or None (not a health endpoint)."""
        if path in self.ready:
            return "ready"
        if path in self.live:
            return "live"
        return None


def rejection(error: BaseException) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the response to a rejection; notes it on the current
    OpenTelemetry span when opentelemetry is installed."""
    note_rejection(error)
    return 503, rejection_headers(error), f"{error}\n".encode()


def health_body(report: Any, details: bool = True) -> tuple[int, bytes]:
    """(status, JSON body) of a readiness request: 200 when ready, else 503."""
    payload = report.to_dict() if details else {"status": "UP" if report.ready else "DOWN"}
    return (200 if report.ready else 503), json.dumps(payload).encode()


def live_body() -> tuple[int, bytes]:
    """Liveness: the process answers; dependencies and Redis are not looked at."""
    return 200, b'{"status": "UP"}'


@functools.cache
def _span_hook() -> Callable[[BaseException], None] | None:
    try:
        from .otel import add_rejection_event
    except ImportError:
        return None
    return add_rejection_event


def note_rejection(error: BaseException) -> None:
    """Record a rejection on the current span (a no-op without opentelemetry)."""
    hook = _span_hook()
    if hook is not None:
        hook(error)
