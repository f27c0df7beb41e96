"""The Celery worker of the docker-compose demo: a task charging through the same breaker.

``celery --workdir docker -A tasks worker --concurrency 2``. A rejected task
is re-queued for when a probe may be tried; a failed call is retried by
Celery with withdrawals from the fleet-wide retry budget the gunicorn app's
HTTP retries also draw from (`distbreaker.contrib.celery.protect`).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from fleet import BUDGET, NAME, REDIS_URL, charge, make_policy

from distbreaker import HttpStatusError, RetryBudget
from distbreaker.contrib.celery import protect

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/1")
app = Celery("tasks", broker=BROKER_URL, backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.worker_hijack_root_logger = False

_shared: dict[str, Any] = {}


def shared() -> tuple[Any, Any]:
    """This worker process's Policy (no HTTP retries: Celery retries) and budget."""
    if not _shared:
        _shared["policy"] = make_policy(http_retries=1)
        _shared["budget"] = RetryBudget(NAME, redis=REDIS_URL, config=BUDGET)
    return _shared["policy"], _shared["budget"]


class Lazy:
    """Defers building the Policy and budget to the worker process's first task."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __getattr__(self, attr: str) -> Any:
        return getattr(shared()[self.index], attr)


@app.task(bind=True, max_retries=None)
@protect(Lazy(0), budget=Lazy(1), retry_on=(HttpStatusError, OSError), backoff=0.5,
         backoff_max=5.0, min_countdown=0.5)
def charge_task(self: Any, order: int) -> dict[str, Any]:
    """Charge one order; returns the upstream's status and this worker's pid."""
    response = charge()
    return {"order": order, "status": response.status_code, "pid": os.getpid()}
