"""Ganesha mode's pure core: script arguments, reply decoding, listeners, Redis health.

Python workers share ackintosh/ganesha's (PHP) Rate-strategy keys, each operation one
Lua script (lua/ganesha.lua); the sync and asyncio breakers only send its calls.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from .._runtime import forking
from .._runtime.events import logger
from .._runtime.health import RedisHealth
from .._runtime.options import to_ms
from .._runtime.scripts import PendingCall, load_script, text
from ..errors import CallNotPermitted
from .config import GaneshaConfig, GaneshaEvent, build_ganesha_config

SCRIPT_NAME = "ganesha"


@dataclasses.dataclass(frozen=True)
class GaneshaReply:
    """A decoded ganesha script reply (see lua/ganesha.lua)."""

    available: bool
    status: str
    event: GaneshaEvent | None
    failures: int
    successes: int
    rejections: int
    member: str


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

    def script_call(self, op: str) -> tuple[Sequence[str], Sequence[Any]]:
        """KEYS and ARGV of one script call; each carries a member id unique in the fleet."""
        c = self.config
        member = f"{self._process_tag}-{next(self._counter):x}"
        return self.keys, (op, repr(float(c.failure_rate_threshold)), c.minimum_requests,
                           c.time_window, c.interval_to_half_open, member, to_ms(c.key_ttl))

    @staticmethod
    def decode(raw: Sequence[Any]) -> GaneshaReply:
        event = text(raw[2])
        return GaneshaReply(available=bool(int(raw[0])), status=text(raw[1]),
                            event=GaneshaEvent(event) if event else None,
                            failures=int(raw[3]), successes=int(raw[4]),
                            rejections=int(raw[5]), member=text(raw[6]))


GaneshaListener = Callable[[str, GaneshaEvent], None]


class GaneshaCore:
    """What the sync and asyncio Ganesha breakers share: everything but the Redis call.

    While Redis is unreachable nothing is recorded and `is_available()` answers True
    (fail open: the breaker must not become the outage); Redis is retried with backoff.
    """

    def __init__(self, service: str, config: GaneshaConfig | None,
                 overrides: dict[str, Any]) -> None:
        self.config = build_ganesha_config(config, overrides)
        self._codec = GaneshaCodec(service, self.config)
        self._script = load_script(SCRIPT_NAME)
        self._health = RedisHealth(self.config.redis_retry_max_backoff)
        self._listeners: list[GaneshaListener] = []

    @property
    def service(self) -> str:
        return self._codec.service

    def add_listener(self, listener: GaneshaListener) -> None:
        """Called as `listener(service, event)` when this process's call trips or calms it."""
        self._listeners.append(listener)

    def _pending(self, op: str) -> PendingCall:
        """The script call for `op`; its result is the reply, or None when Redis could
        not be asked (in backoff, or unavailable: logged)."""
        keys, args = self._codec.script_call(op)
        return PendingCall(self._script, keys, args, self._health.usable, self._on_reply,
                           self._on_unavailable)

    def _on_unavailable(self, error: BaseException | None) -> None:
        if error is not None:
            self._health.failed(error)
            logger.warning("ganesha %s: redis unavailable (%s); failing open", self.service,
                           error)

    def _on_reply(self, raw: Any) -> GaneshaReply:
        self._health.succeeded()
        reply = self._codec.decode(raw)
        if reply.event is not None:
            for listener in list(self._listeners):
                try:
                    listener(self.service, reply.event)
                except Exception:
                    logger.exception("ganesha listener %r failed", listener)
        return reply

    @staticmethod
    def _available(reply: GaneshaReply | None) -> bool:
        """Whether a call may run: as Redis says, or yes when it could not be asked."""
        return True if reply is None else reply.available

    def _rejection(self) -> CallNotPermitted:
        return CallNotPermitted(self.service, "OPEN", 0.0, reason="ganesha: not available")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.service!r})"
