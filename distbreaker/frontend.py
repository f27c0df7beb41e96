"""What the sync and asyncio breaker front ends share that is not I/O.

Configuration, codec, listeners, Redis health and the local fallback runner;
the front ends add only the calls to Redis (blocking or awaited).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .classify import Outcome
from .codec import SCRIPT_NAME, BreakerCodec, Permit, Reply, ScriptCall, Step, decode_reply
from .config import BreakerConfig, RedisErrorPolicy, build_config
from .events import Listener, Listeners
from .fallback import LocalScriptRunner, RedisHealth
from .scripts import PendingCall, load_script

logger = logging.getLogger("distbreaker")


def must_propagate(error: BaseException | None) -> bool:
    """True when the call ended with cancellation, KeyboardInterrupt or SystemExit:
    recording it (handing a half-open probe back) must never replace it with another
    error, or asyncio timeouts and task groups, and Ctrl-C, stop working."""
    return error is not None and not isinstance(error, Exception)


def log_hand_back_failure(name: str, error: BaseException | None, failure: Exception) -> None:
    logger.error("circuit breaker %s: recording a call ended by %s failed: %r", name,
                 type(error).__name__, failure)


class BreakerCore:
    """What the sync and asyncio breakers share that is not I/O."""

    def __init__(self, name: str, config: BreakerConfig | None, prefix: str,
                 overrides: dict[str, Any]) -> None:
        self.config = build_config(config, overrides)
        self._codec = BreakerCodec(name, self.config, prefix)
        self._script = load_script(SCRIPT_NAME)
        self._listeners = Listeners()
        self._health = RedisHealth(self.config.redis_retry_max_backoff)
        self._local = LocalScriptRunner()
        #: Where batched outcomes go (record_mode "batched"; set by the front end).
        self._batch: Any = None

    @property
    def name(self) -> str:
        return self._codec.name

    @property
    def keys(self) -> Any:
        """The Redis keys of this breaker (see docs/KEY_SCHEMA.md)."""
        return self._codec.keys

    @property
    def config_drift(self) -> str | None:
        """The fleet's stored config when it differs from this process's, else None."""
        return self._codec.config_drift

    @property
    def fail_closed(self) -> bool:
        return self.config.on_redis_error is RedisErrorPolicy.FAIL_CLOSED

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(Transition)` for every transition this process's calls make."""
        self._listeners.add(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    # -- the steps around each Redis call (the front ends only do the call) -----
    def _pending_acquire(self) -> tuple[ScriptCall, str] | None:
        """None: permitted locally (no round trip); raises a local rejection; else the call."""
        codec = self._codec
        now = time.monotonic()
        step = codec.step(now)
        if step is Step.PERMIT:
            return None
        if step is Step.REJECT:
            raise codec.local_rejection(now)
        return codec.acquire_call()

    def _admit(self, reply: Reply | None, token: str) -> Permit:
        """Turn the acquire reply into a permit, or raise CallNotPermitted.

        No reply while acquiring means the local fallback is still loading
        (fail_closed raises before): the call passes, nothing to protect yet.
        """
        if reply is None:
            return Permit()
        return self._codec.admission(reply, token)

    def _record_call(self, permit: Permit, error: BaseException | None, duration: float,
                     outcome: Outcome | None = None) -> ScriptCall | None:
        """The record script call for a finished call, or None when nothing is recorded.

        `outcome` overrides the breaker's own classification (a Policy uses it to
        make the breaker ignore BulkheadFull and HTTP client errors).
        """
        codec = self._codec
        if outcome is None:
            outcome = codec.outcome(error)
        if self._batch is not None and not permit.token and not (
                self._health.down and not self.fail_closed):
            # Batched mode, not a half-open probe: counted locally, flushed later.
            # (While Redis is down under fail_open, outcomes go to the local
            # fallback breaker at once, as in exact mode, so it still protects.)
            counts = codec.batched_counts(outcome, duration)
            if counts is not None:
                self._batch.add(self, counts)
            return None
        return codec.record_call(permit, outcome, duration)

    def _record_pending(self, permit: Permit, error: BaseException | None, duration: float,
                        outcome: Outcome | None = None) -> PendingCall | None:
        """The record call, to be pipelined with other components' calls by a Policy."""
        call = self._record_call(permit, error, duration, outcome)
        if call is None:
            return None

        def unavailable(failure: BaseException | None) -> None:
            if failure is not None:
                self._redis_failed(failure)
            self._fallback(call, acquiring=False)

        return PendingCall(self._script, call.keys, call.args, self._health.usable,
                           self._redis_reply, unavailable)

    def _redis_reply(self, raw: Any) -> Reply:
        """A protected call's script reply from Redis: Redis is healthy again."""
        self._redis_ok()
        return self._publish(decode_reply(raw), "redis")

    def _admin_reply(self, raw: Any) -> Reply:
        """An operator action's or read's reply (these never use the fallback)."""
        return self._publish(decode_reply(raw), "redis")

    def _local_reply(self, call: ScriptCall) -> Reply | None:
        """The local fallback breaker's reply; None while its runtime is still loading."""
        raw = self._local.run(self._script, call.keys, call.args)
        return None if raw is None else decode_reply(raw)

    def _publish(self, reply: Reply, source: str) -> Reply:
        for event in self._codec.apply(reply, time.monotonic(), source):
            self._listeners.emit(event)
        return reply

    def _redis_failed(self, error: BaseException) -> None:
        self._health.failed(error)
        self._codec.forget_view()

    def _redis_ok(self) -> None:
        if self._health.last_error is not None:
            self._local.reset()
        self._health.succeeded()

    def _fallback(self, call: ScriptCall, acquiring: bool) -> Reply | None:
        """Redis is unavailable: the local breaker answers, or (fail_closed) nobody."""
        if self.fail_closed:
            if acquiring:
                error = self._health.last_error or ConnectionError("redis unavailable")
                raise self._codec.redis_unavailable(error, self._health.retry_in())
            return None
        reply = self._local_reply(call)
        return None if reply is None else self._publish(reply, "local")
