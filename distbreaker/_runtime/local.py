"""The in-process fallback: the very same Lua scripts on a private fakeredis.

Used while Redis is unreachable (fail_open), so the local breaker has the fleet
semantics scoped to this process: no second state machine. Loaded in the
background, wiped when Redis answers again, fresh in every forked child.
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


class LocalScriptRunner:
    """Runs distbreaker's scripts on a private in-process fakeredis (created lazily).

    `run` returns None while the fakeredis runtime is still loading (see
    `_LocalRuntime`); callers then fail open without local accounting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._client: Any = None

    def _guard(self) -> threading.Lock:
        if self._pid != os.getpid():  # forked: fresh lock, and a fallback of our own
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._client = None
        return self._lock

    def run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._client is None and not LOCAL_RUNTIME.ready():
            return None
        with self._guard():
            if self._client is None:
                import fakeredis

                self._client = fakeredis.FakeStrictRedis(server=fakeredis.FakeServer())
            return run_script(self._client, script, keys, args)

    def reset(self) -> None:
        """Forget local state (Redis is back: the fleet's state governs again)."""
        with self._guard():
            if self._client is not None:
                self._client.flushall()
