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
import functools
import inspect
import itertools
import os
import secrets
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, TypeVar

from . import forking
from .config import check_int, check_percent, to_ms, to_seconds
from .connection import sync_client
from .errors import CallNotPermitted
from .events import logger
from .fallback import UNAVAILABLE_ERRORS, RedisHealth
from .scripts import load_script, run_script

T = TypeVar("T")
SCRIPT_NAME = "ganesha"


class GaneshaEvent(str, Enum):
    """Ganesha's status events."""

    TRIPPED = "tripped"
    CALMED_DOWN = "calmed_down"


@dataclasses.dataclass(frozen=True)
class GaneshaConfig:
    """Ganesha's Rate strategy settings (seconds, as Ganesha takes them) and key layout.

    `key_ttl` 0 keeps Ganesha's own behaviour (keys never expire); a positive
    value makes every Python write refresh a TTL on the keys it touches.
    """

    failure_rate_threshold: float = 50.0
    interval_to_half_open: int = 5
    minimum_requests: int = 10
    time_window: int = 30
    prefix: str = "ganesha_"
    success_suffix: str = "_success"
    failure_suffix: str = "_failure"
    rejection_suffix: str = "_rejection"
    status_suffix: str = "_status"
    key_ttl: float = 0.0
    redis_timeout: float = 0.25

    def __post_init__(self) -> None:
        check_percent(self.failure_rate_threshold, "failure_rate_threshold")
        check_int(self.interval_to_half_open, "interval_to_half_open", 1, 86_400)
        check_int(self.minimum_requests, "minimum_requests", 1, 1_000_000_000)
        check_int(self.time_window, "time_window", 1, 86_400)
        for field in ("prefix", "success_suffix", "failure_suffix", "rejection_suffix",
                      "status_suffix"):
            value = getattr(self, field)
            if not isinstance(value, str) or any(not c.isprintable() or c.isspace()
                                                 for c in value):
                raise ValueError(f"{field} must be a printable str without whitespace, "
                                 f"got {value!r}")
        suffixes = {self.success_suffix, self.failure_suffix, self.rejection_suffix,
                    self.status_suffix}
        if len(suffixes) != 4:
            raise ValueError("the four suffixes must differ from each other")
        object.__setattr__(self, "key_ttl", to_seconds(self.key_ttl, "key_ttl"))
        object.__setattr__(self, "redis_timeout", to_seconds(self.redis_timeout,
                                                             "redis_timeout"))

    def keys(self, service: str) -> list[str]:
        """Ganesha's keys for a service: success, failure, rejection, status."""
        base = f"{self.prefix}{service}"
        return [base + self.success_suffix, base + self.failure_suffix,
                base + self.rejection_suffix, base + self.status_suffix]


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


class GaneshaBreaker(GaneshaCore):
    """A breaker that speaks Ganesha's Redis layout (see the module docstring).

    While Redis is unreachable `is_available()` answers True (fail-open, as a
    breaker must not become the outage) and outcomes are dropped; Redis is
    retried with backoff.
    """

    def __init__(self, service: str, redis: Any = None, config: GaneshaConfig | None = None,
                 **overrides: Any) -> None:
        super().__init__(service, config, overrides)
        self._client = sync_client(redis, self.config.redis_timeout)

    def _run(self, op: str) -> GaneshaReply | None:
        prepared = self._prepare(op)
        if prepared is None:
            return None
        try:
            raw = run_script(self._client, self._script, *prepared)
        except UNAVAILABLE_ERRORS as error:
            self._unavailable(error)
            return None
        return self._handle(raw)

    def is_available(self) -> bool:
        """Ganesha's isAvailable: records a rejection when it answers False."""
        reply = self._run("available")
        return True if reply is None else reply.available

    def success(self) -> None:
        self._run("success")

    def failure(self) -> None:
        self._run("failure")

    def counts(self) -> GaneshaReply | None:
        """Trimmed counts and availability, without recording anything."""
        return self._run("counts")

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` if available (else raise CallNotPermitted); record success or failure."""
        if not self.is_available():
            raise self._rejection()
        try:
            result = fn(*args, **kwargs)
        except Exception:
            self.failure()
            raise
        self.success()
        return result

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError("use distbreaker.aio.GaneshaBreaker for coroutine functions")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper
