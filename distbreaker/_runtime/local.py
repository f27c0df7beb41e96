"""The in-process fallback: the very same Lua scripts on an in-process fakeredis.

Used while Redis is unreachable (fail_open), so the local breaker has the fleet
semantics scoped to this process: no second state machine. One fakeredis per
process holds every component's fallback keys (building a component costs nothing);
a component's keys there are seeded from the last fleet state it saw (the breaker)
and deleted when Redis answers again. Loaded in the background, fresh in every
forked child.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .scripts import LuaScript, run_script

logger = logging.getLogger("distbreaker")


class _LocalRuntime:
    """Loads fakeredis (and its Lua runtime) once per process, in the background.

    Loading takes a few hundred milliseconds; a protected call must not wait
    for it, so until it is ready the fallback lets calls through unrecorded
    (fail-open without local accounting, logged once).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loader_pid = -1

    def _load(self) -> None:
        try:
            import fakeredis  # noqa: F401  (the import is the point)
        except Exception:  # pragma: no cover - a broken install: no local breaker
            logger.exception("distbreaker: cannot load the local fallback runtime")
            return
        self._ready.set()

    def ready(self) -> bool:
        """True when fakeredis is importable now; else start loading it (once per process)."""
        if self._ready.is_set() or ("fakeredis" in sys.modules and \
                hasattr(sys.modules["fakeredis"], "FakeStrictRedis")):
            self._ready.set()
            return True
        with self._lock:
            if self._loader_pid != os.getpid():
                self._loader_pid = os.getpid()
                logger.warning("distbreaker: loading the local fallback breaker; calls pass "
                               "unrecorded until it is ready")
                threading.Thread(target=self._load, name="distbreaker-fallback-loader",
                                 daemon=True).start()
        return False

    def wait(self, timeout: float) -> bool:
        """Block until the runtime is loaded (tests, or warming up before serving)."""
        self.ready()
        return self._ready.wait(timeout)


LOCAL_RUNTIME = _LocalRuntime()


class _LocalStore:
    """The process's one in-process fakeredis (made on first use, fresh after a fork).

    Every fallback of the process keeps its keys there (each component's own keys, as
    in Redis), so building a component costs nothing and the first outage pays for
    one fakeredis client, not one per breaker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pid = os.getpid()
        self._client: Any = None

    def client(self) -> Any:
        """The client (call with `guard()` held)."""
        if self._client is None:
            import fakeredis

            self._client = fakeredis.FakeStrictRedis(server=fakeredis.FakeServer())
        return self._client

    def delete(self, keys: Sequence[str]) -> None:
        """Delete `keys` if the client exists (call with `guard()` held)."""
        if self._client is not None:
            self._client.delete(*keys)

    def guard(self) -> threading.Lock:
        if self._pid != os.getpid():  # forked: fresh lock, and a fallback of our own
            self._pid = os.getpid()
            self.lock = threading.Lock()
            self._client = None
        return self.lock


_STORE = _LocalStore()


class LocalScriptRunner:
    """Runs distbreaker's scripts on the process's in-process fakeredis.

    `run` returns None while the fakeredis runtime is still loading (see
    `_LocalRuntime`); callers then decide without it (the breaker from the last
    state it knew, the budget on the safe side). Cheap to build: the fakeredis is
    the process's, shared by every runner (each runs only its own component's keys).
    """

    @staticmethod
    def ready() -> bool:
        """True when scripts can run now (else the runtime starts loading)."""
        return LOCAL_RUNTIME.ready()

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not LOCAL_RUNTIME.ready():
            return None
        with _STORE.guard():
            return run_script(_STORE.client(), script, keys, args)

    def reset(self, keys: Sequence[str]) -> None:
        """Forget the local state of `keys` (Redis is back: the fleet's state governs)."""
        if not keys or not LOCAL_RUNTIME.ready():
            return
        with _STORE.guard():
            _STORE.delete(keys)
