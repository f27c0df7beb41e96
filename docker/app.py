"""The gunicorn app of the docker-compose demo: each request charges through the Policy.

``gunicorn --workers 4 --bind 0.0.0.0:8000 --chdir docker app:app``. Answers
200 when the upstream did, 503 with Retry-After when the shared breaker (or
the bulkhead) rejected the call without touching the upstream, 502 when the
upstream failed; the JSON body names the gunicorn worker's pid.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from typing import Any

from fleet import charge, make_policy

from distbreaker import BulkheadFull, CallNotPermitted

_policy = None


def policy() -> Any:
    """This worker's Policy, built on first use (after gunicorn forked the worker)."""
    global _policy
    if _policy is None:
        _policy = make_policy(http_retries=2)
    return _policy


def handle() -> tuple[str, dict[str, Any], list[tuple[str, str]]]:
    body: dict[str, Any] = {"pid": os.getpid()}
    try:
        response = policy().call(charge)
    except CallNotPermitted as rejected:
        state = getattr(rejected.state, "value", rejected.state)
        body |= {"outcome": "rejected", "state": state, "retry_after": rejected.retry_after}
        return "503 Service Unavailable", body, [
            ("Retry-After", str(max(1, math.ceil(rejected.retry_after))))]
    except BulkheadFull:
        return "503 Service Unavailable", body | {"outcome": "bulkhead full"}, []
    except Exception as error:  # the upstream failed (after the budgeted retries)
        return "502 Bad Gateway", body | {"outcome": "error", "error": str(error)}, []
    return "200 OK", body | {"outcome": "ok", "upstream": response.status_code}, []


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """WSGI entry point."""
    status, body, headers = handle()
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data))), *headers])
    return [data]
