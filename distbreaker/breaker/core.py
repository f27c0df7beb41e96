"""The breaker's pure protocol core, shared by the sync and asyncio front ends.

It builds script arguments, decodes replies, keeps this process's local view
of the fleet state (refreshed by every reply) and decides what a call needs:
a local permit (CLOSED: 0 round trips before the call), a local rejection
(a known OPEN wait: 0 round trips), or an `acquire` script call. It performs
no I/O; the front ends do, and hand every reply back here.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from enum import Enum
from typing import Any

from .._runtime import forking
from .._runtime.events import Listeners
from .._runtime.health import RedisHealth
from .._runtime.keys import DEFAULT_PREFIX, BreakerKeys
from .._runtime.local import LocalScriptRunner
from .._runtime.options import to_ms
from .._runtime.scripts import Owed, PendingCall, load_script
from ..errors import CallNotPermitted, ConfigDriftWarning
from .classify import Outcome, classify_exception
from .config import BreakerConfig, RedisErrorPolicy, build_config, config_differences
from .events import Listener, Transition, log_transition
from .state import State

logger = logging.getLogger("distbreaker")
SCRIPT_NAME = "breaker"


class Step(str, Enum):
    """What a protected call must do before running."""

    PERMIT = "permit"    # run now, no round trip
    REJECT = "reject"    # fail fast, no round trip
    ACQUIRE = "acquire"  # ask Redis (or the local fallback) with the acquire script


#: Outcome counts as the record script takes them: (successes, failures, slow, total_ms).
Counts = tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class ScriptCall:
    """KEYS and ARGV of one breaker script call."""

    keys: Sequence[str]
    args: Sequence[Any]


@dataclasses.dataclass(frozen=True)
class Reply:
    """A decoded breaker script reply (see docs/KEY_SCHEMA.md)."""

    state: State
    wait_ms: int
    permitted: bool
    transitions: tuple[tuple[State, State, str], ...]
    calls: int
    failures: int
    slow: int
    total_ms: int
    rejected: int
    drift: bool
    stored_config: str
    now_ms: int
    since_ms: int
    probes_in_flight: int
    #: (failure_rate, slow_rate) of each transition, in the order of `transitions`.
    transition_rates: tuple[tuple[float, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class Permit:
    """Permission to run one call; `token` is the half-open probe lease, if any."""

    token: str = ""


@dataclasses.dataclass(frozen=True)
class BreakerMetrics:
    """Fleet-wide window figures plus this process's own rejection count.

    Rates are percentages, -1 until the minimum number of calls is reached.
    In HALF_OPEN the figures are those of the probes reported so far.
    """

    state: State
    failure_rate: float
    slow_call_rate: float
    calls: int
    failed: int
    slow: int
    not_permitted: int
    rejected_fleet_wide: int
    probes_in_flight: int


#: The former name, kept as an alias.
Metrics = BreakerMetrics


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_reply(raw: Sequence[Any]) -> Reply:
    """Decode the breaker script's reply array (bytes or str, per client settings)."""
    transitions = tuple((State(_text(t[0])), State(_text(t[1])), _text(t[2])) for t in raw[3])
    return Reply(
        state=State(_text(raw[0])), wait_ms=int(raw[1]), permitted=bool(int(raw[2])),
        transitions=transitions, calls=int(raw[4]), failures=int(raw[5]), slow=int(raw[6]),
        total_ms=int(raw[7]), rejected=int(raw[8]), drift=bool(int(raw[9])),
        stored_config=_text(raw[10]), now_ms=int(raw[11]), since_ms=int(raw[12]),
        probes_in_flight=int(raw[13]),
        transition_rates=tuple((_rate(t, 3), _rate(t, 4)) for t in raw[3]),
    )


def _rate(entry: Sequence[Any], i: int) -> float:
    """A transition entry's rate (percent); -1 when absent (an older script)."""
    return float(_text(entry[i])) if len(entry) > i else -1.0


def rate(part: int, whole: int, minimum: int) -> float:
    """Percentage of `part` in `whole`, or -1 below the minimum number of calls."""
    if whole <= 0 or whole < minimum:
        return -1.0
    return round(part * 100.0 / whole, 2)


class BreakerCodec:
    """Everything about one breaker that is neither I/O nor a front end."""

    def __init__(self, name: str, config: BreakerConfig, prefix: str = DEFAULT_PREFIX) -> None:
        self.name = name
        self.config = config
        self.keys = BreakerKeys.build(name, prefix)
        self.wire = config.to_wire()
        self._slow_ms = to_ms(config.slow_call_duration)
        self._lock = threading.Lock()
        self._view: State | None = None          # None: unknown, ask Redis
        self._open_deadline = 0.0                # monotonic seconds
        self._view_now_ms = 0
        self._own_transition_ms = -1             # server ms of this process's last transition
        self._drift_warned = False
        self.config_drift: str | None = None     # stored config when it differs from ours
        self.not_permitted = 0
        #: This process's finished calls by outcome value, and rejections by the
        #: state that rejected them ("UNKNOWN": Redis unavailable, fail_closed).
        self.outcomes: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock and this process's own (zero) counts."""
        self._lock = threading.Lock()
        self.not_permitted = 0
        self.outcomes = Counter()
        self.rejections = Counter()

    # -- building script calls ------------------------------------------------
    def _call(self, op: str, *extra: Any) -> ScriptCall:
        keys = self.keys
        return ScriptCall(keys.script_keys, (op, self.name, self.wire, keys.channel, *extra))

    def acquire_call(self) -> tuple[ScriptCall, str]:
        token = secrets.token_hex(8)
        return self._call("acquire", token), token

    def state_call(self) -> ScriptCall:
        return self._call("state")

    def set_call(self, target: str, reason: str, actor: str = "") -> ScriptCall:
        return self._call("set", target, reason, actor)

    def record_call(self, permit: Permit, outcome: Outcome, duration: float) -> ScriptCall | None:
        """The record script call for one finished call, or None when nothing is recorded."""
        with self._lock:
            self.outcomes[outcome.value] += 1
        if outcome is Outcome.IGNORED:
            if not permit.token:
                return None
            return self._call("record", permit.token, 0, 0, 0, 0)
        return self._call("record", permit.token, *self._counts(outcome, duration))

    def batched_counts(self, outcome: Outcome, duration: float) -> Counts | None:
        """Batched mode: the counts one finished call (no probe) adds, None when ignored."""
        with self._lock:
            self.outcomes[outcome.value] += 1
        return None if outcome is Outcome.IGNORED else self._counts(outcome, duration)

    def batch_call(self, counts: Counts) -> ScriptCall:
        """The record script call carrying accumulated counts (no probe token)."""
        return self._call("record", "", *counts)

    def _counts(self, outcome: Outcome, duration: float) -> Counts:
        ms = max(0, to_ms(duration))
        failed = outcome is Outcome.FAILURE
        return (0 if failed else 1, 1 if failed else 0, 1 if ms > self._slow_ms else 0, ms)

    def outcome(self, error: BaseException | None) -> Outcome:
        """How a finished call counts (error None: it returned normally)."""
        return Outcome.SUCCESS if error is None else classify_exception(self.config, error)

    # -- local decisions ---------------------------------------------------------
    def step(self, now: float) -> Step:
        """Decide from the local view whether a round trip is needed before the call."""
        view = self._view
        if view in (State.CLOSED, State.DISABLED, State.METRICS_ONLY):
            return Step.PERMIT
        if view is State.OPEN and now < self._open_deadline:
            return Step.REJECT
        return Step.ACQUIRE

    def local_rejection(self, now: float) -> CallNotPermitted:
        self._count_rejection(State.OPEN.value)
        return CallNotPermitted(self.name, State.OPEN, self._open_deadline - now)

    def forget_view(self) -> None:
        """Redis could not be asked: the next call must ask (or use the fallback) again."""
        self._view = None

    def invalidate(self, at_ms: int) -> bool:
        """A transition made elsewhere at server time `at_ms` (pub/sub): unless a reply
        already told us of it, the next call asks Redis. True when the view was dropped."""
        with self._lock:
            if at_ms < self._view_now_ms or at_ms == self._own_transition_ms:
                return False
            # A reply of the same millisecond may predate the transition: accept newer only.
            self._view_now_ms = at_ms + 1
            self._view = None
            return True

    def apply(self, reply: Reply, now: float, source: str = "redis") -> list[Transition]:
        """Refresh the local view from a Redis reply; return the transitions it made."""
        if source == "redis":
            with self._lock:
                if reply.now_ms >= self._view_now_ms:
                    self._view_now_ms = reply.now_ms
                    self._view = reply.state
                    self._open_deadline = now + reply.wait_ms / 1000.0
                if reply.transitions:
                    self._own_transition_ms = reply.now_ms
            if reply.drift:
                self._note_drift(reply.stored_config)
            elif self.config_drift is not None:
                self.config_drift = None
        rates = reply.transition_rates or ((-1.0, -1.0),) * len(reply.transitions)
        return [Transition(self.name, a, b, why, reply.now_ms, source, *rate_pair)
                for (a, b, why), rate_pair in zip(reply.transitions, rates, strict=True)]

    def admission(self, reply: Reply, token: str) -> Permit:
        """Turn an acquire reply into a permit, or raise CallNotPermitted."""
        if reply.permitted:
            uses_probe = reply.state is State.HALF_OPEN
            return Permit(token if uses_probe else "")
        self._count_rejection(reply.state.value)
        raise CallNotPermitted(self.name, reply.state, reply.wait_ms / 1000.0)

    def redis_unavailable(self, error: BaseException, retry_after: float) -> CallNotPermitted:
        """The fail_closed rejection (the Redis error becomes its cause)."""
        self._count_rejection("UNKNOWN")
        rejection = CallNotPermitted(self.name, "UNKNOWN", retry_after,
                                     reason=f"redis unavailable: {error}")
        rejection.__cause__ = error
        return rejection

    def _count_rejection(self, state: str) -> None:
        with self._lock:
            self.not_permitted += 1
            self.rejections[state] += 1

    def metrics(self, reply: Reply) -> BreakerMetrics:
        governing = self.config
        if reply.drift:  # the stored config decides: report rates as its minimum sees them
            try:
                governing = BreakerConfig.from_wire(reply.stored_config)
            except ValueError:
                pass
        minimum = (governing.permitted_calls_in_half_open if reply.state is State.HALF_OPEN
                   else governing.effective_minimum_calls)
        return BreakerMetrics(
            state=reply.state,
            failure_rate=rate(reply.failures, reply.calls, minimum),
            slow_call_rate=rate(reply.slow, reply.calls, minimum),
            calls=reply.calls, failed=reply.failures, slow=reply.slow,
            not_permitted=self.not_permitted, rejected_fleet_wide=reply.rejected,
            probes_in_flight=reply.probes_in_flight,
        )

    def _note_drift(self, stored: str) -> None:
        """Remember the stored config and warn once per process per (name, configs) pair,
        naming each field that differs (one warning: `logging.captureWarnings` routes it
        to the log)."""
        self.config_drift = stored
        key = (self.keys.state, self.wire, stored)
        if self._drift_warned or key in _DRIFT_WARNED:
            return
        self._drift_warned = True
        _DRIFT_WARNED.add(key)
        try:
            fields = config_differences(self.config, BreakerConfig.from_wire(stored))
        except ValueError:
            fields = []
        differs = "; ".join(f"{f}: here {a!r}, stored {b!r}" for f, a, b in fields) or \
            f"wire {self.wire!r} vs stored {stored!r}"
        warnings.warn(f"circuit breaker {self.name!r}: this process's config differs from "
                      f"the fleet's stored config ({differs}); the stored config governs "
                      f"until reset() (stored wire {stored})", ConfigDriftWarning,
                      stacklevel=4)


#: Drift already warned about in this process: (state key, our wire, stored wire).
_DRIFT_WARNED: set[tuple[str, str, str]] = set()


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

    #: The Redis client (set by the front end; per event loop in asyncio).
    _client: Any

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

    def owed_record(self, permit: Permit, error: BaseException | None, duration: float,
                    outcome: Outcome | None = None) -> Owed | None:
        """The record this call still owes Redis, for a Policy to pipeline with others."""
        call = self._record_call(permit, error, duration, outcome)
        if call is None:
            return None

        def unavailable(failure: BaseException | None) -> None:
            if failure is not None:
                self._redis_failed(failure)
            self._fallback(call, acquiring=False)

        return Owed(self._client, PendingCall(self._script, call.keys, call.args,
                                              self._health.usable, self._redis_reply,
                                              unavailable))

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
            log_transition(event)
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
