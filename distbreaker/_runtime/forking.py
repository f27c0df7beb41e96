"""Fork safety: what a child process must not inherit from its parent.

gunicorn and Celery's prefork pool create breakers, bulkheads and budgets in the
parent (import time, ``preload_app``) and use them in forked children. What a
child must not reuse:

- **sockets**: redis-py's sync connection pools notice the new pid and open
  fresh connections in the child by themselves (nothing to do here);
- **locks held at fork time**: a ``threading.Lock`` held by another parent
  thread at the moment of the fork stays held forever in the child (only the
  forking thread survives), so the child's first call would deadlock;
- **per-process figures and batches**: rejection counts, pending batched
  retry-budget deposits (they belong to the parent, which sends them);
- **background threads**: they do not survive a fork (the bulkhead's lease
  renewer starts afresh on its own in the child).

Objects holding such state `register()` themselves and implement
``_after_fork()``; `after_fork()` calls them all in the child. It runs
automatically through ``os.register_at_fork`` for ``os.fork()`` and
multiprocessing's fork context (what gunicorn and Celery prefork use). Servers
that fork from C without running Python's fork hooks (uWSGI without
``py-call-osafterfork``) should call `after_fork()` explicitly in their
post-fork hook; calling it again in the same child is a no-op.
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
    """Reset everything registered, once per process: call it from gunicorn's
    ``post_fork`` or Celery's ``worker_process_init`` if your server forks
    without running Python's fork hooks. Idempotent; a no-op in the process
    that imported distbreaker first and in a child already reset."""
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
