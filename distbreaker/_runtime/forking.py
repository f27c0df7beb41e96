"""Fork safety: what a child process must not inherit from its parent.

Objects holding locks, per-process counts, batches or background threads `register()`
themselves and implement ``_after_fork()``; `after_fork()` calls them all in the child,
automatically through ``os.register_at_fork`` (gunicorn, Celery prefork, multiprocessing).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Protocol, TypeVar

__all__ = ["ForkAware", "after_fork", "register"]


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


F = TypeVar("F", bound=ForkAware)

_registry: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_handled_pid = os.getpid()


def register(obj: F) -> F:
    """Have `obj._after_fork()` called in every forked child (held weakly); returns obj."""
    with _lock:
        _registry.add(obj)
    return obj


def after_fork() -> None:
    """Reset everything registered, once per process.

    In a forked child, a lock another parent thread held at the fork stays held
    forever, and the parent's counts, batched outcomes and deposits are the parent's
    to report; sockets need nothing (redis-py's pools notice the new pid). This runs
    by itself for ``os.fork()`` and multiprocessing's fork context; servers that fork
    from C without Python's fork hooks (uWSGI without ``py-call-osafterfork``) should
    call it from their post-fork hook. Idempotent; a no-op in the process that
    imported distbreaker first and in a child already reset.
    """
    global _handled_pid, _lock
    pid = os.getpid()
    if pid == _handled_pid:
        return
    _lock = threading.Lock()  # the parent's may have been held by another thread
    _handled_pid = pid
    with _lock:
        objects = list(_registry)
    for obj in objects:
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork)
