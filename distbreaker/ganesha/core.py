"""Ganesha-compatible mode: share breaker state with an existing PHP Ganesha fleet.

Python workers read and write ackintosh/ganesha's own keys (Rate strategy,
Redis adapter) and make Ganesha's decisions, but each operation is one Lua
script (lua/ganesha.lua), so Python never loses its own events to member
collisions and "tripped" fires exactly once per trip among Python workers.
The PHP side keeps Ganesha's behaviour (its half-open lets every request
through; its check-then-set may fire "tripped" once per PHP process).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._runtime import forking
from .._runtime.events import logger
from .._runtime.health import RedisHealth
from .._runtime.options import to_ms
from .._runtime.scripts import load_script
from ..errors import CallNotPermitted
from .config import GaneshaConfig, GaneshaEvent

T = TypeVar("T")
SCRIPT_NAME = "ganesha"






@dataclasses.dataclass(frozen=True)
class GaneshaReply:
    available: bool
    status: str
    event: GaneshaEvent | None
    failures: int
    successes: int
    rejections: int
    member: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GaneshaCodec:
    """Pure part of the Ganesha mode: script arguments and reply decoding."""

    _counter = itertools.count()

    def __init__(self, service: str, config: GaneshaConfig) -> None:
        if not isinstance(service, str) or not service or any(
                not c.isprintable() or c.isspace() for c in service):
            raise ValueError(f"service must be a non-empty printable str without whitespace, "
                             f"got {service!r}")
        self.service = service
        self.config = config
        self.keys = config.keys(service)
        self._process_tag = f"{os.getpid():x}{secrets.token_hex(3)}"
        forking.register(self)

    def _after_fork(self) -> None:
        """A forked child gets its own tag: parent and child continue the same
        counter, so with a shared tag their members could collide."""
        self._process_tag = f"{os.getpid():x}{secrets.token_hex(3)}"

    def call(self, op: str) -> tuple[Sequence[str], Sequence[Any]]:
        c = self.config
        token = f"{self._process_tag}-{next(self._counter):x}"
        return self.keys, (op, repr(float(c.failure_rate_threshold)), c.minimum_requests,
                           c.time_window, c.interval_to_half_open, token, to_ms(c.key_ttl))

    @staticmethod
    def decode(raw: Sequence[Any]) -> GaneshaReply:
        event = _text(raw[2])
        return GaneshaReply(available=bool(int(raw[0])), status=_text(raw[1]),
                            event=GaneshaEvent(event) if event else None,
                            failures=int(raw[3]), successes=int(raw[4]),
                            rejections=int(raw[5]), member=_text(raw[6]))


GaneshaListener = Callable[[str, GaneshaEvent], None]


class GaneshaCore:
    """What the sync and asyncio Ganesha breakers share: everything but the Redis call."""

    def __init__(self, service: str, config: GaneshaConfig | None,
                 overrides: dict[str, Any]) -> None:
        base = config or GaneshaConfig()
        if not isinstance(base, GaneshaConfig):
            raise TypeError(f"config must be a GaneshaConfig, got {type(base).__name__}")
        self.config = dataclasses.replace(base, **overrides) if overrides else base
        self._codec = GaneshaCodec(service, self.config)
        self._script = load_script(SCRIPT_NAME)
        self._health = RedisHealth(5.0)
        self._listeners: list[GaneshaListener] = []

    @property
    def service(self) -> str:
        return self._codec.service

    def add_listener(self, listener: GaneshaListener) -> None:
        """Called as `listener(service, event)` when this process's call trips or calms it."""
        self._listeners.append(listener)

    def _prepare(self, op: str) -> tuple[Sequence[str], Sequence[Any]] | None:
        """The script call for `op`, or None while Redis is in backoff (fail open)."""
        return self._codec.call(op) if self._health.usable() else None

    def _unavailable(self, error: BaseException) -> None:
        self._health.failed(error)
        logger.warning("ganesha %s: redis unavailable (%s); failing open", self.service, error)

    def _handle(self, raw: Any) -> GaneshaReply:
        self._health.succeeded()
        reply = self._codec.decode(raw)
        if reply.event is not None:
            for listener in list(self._listeners):
                try:
                    listener(self.service, reply.event)
                except Exception:
                    logger.exception("ganesha listener %r failed", listener)
        return reply

    def _rejection(self) -> CallNotPermitted:
        return CallNotPermitted(self.service, "OPEN", 0.0, reason="ganesha: not available")


