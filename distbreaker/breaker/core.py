"""The breaker's pure core, shared by the sync and asyncio front ends (no I/O).

It builds script calls, decodes replies, keeps this process's view of the fleet
state and decides what a call needs: a local permit (CLOSED, 0 round trips), a local
rejection (a known OPEN wait) or an `acquire` call, whose reply it turns into a permit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import logging
import os
import random
import secrets
import socket
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from enum import Enum
from types import TracebackType
from typing import Any

from .._runtime import forking
from .._runtime.classify import (
    Outcome,
    ResultRecordedAsFailure,
    classify_exception,
    classify_result,
)
from .._runtime.connection import db_of
from .._runtime.events import Event, Listeners, rejection_event
from .._runtime.fault_feed import FEEDS, FaultFeed
from .._runtime.faults import UNDISTURBED, Disturbance, Fault
from .._runtime.health import RedisHealth, shared_health
from .._runtime.keys import DEFAULT_PREFIX, BreakerKeys, validate_name
from .._runtime.local import LocalScriptRunner
from .._runtime.options import Seconds, to_ms, to_seconds
from .._runtime.scripts import Owed, PendingCall, ScriptCall, load_script, text
from .._runtime.subscriber import SUBSCRIBERS, Subscription, listen_source
from ..errors import CallNotPermitted, ConfigDriftWarning, InjectedFault, InjectedRejection
from .config import (
    BreakerConfig,
    RedisErrorPolicy,
    WindowType,
    build_config,
    config_differences,
)
from .events import Listener, Transition, log_transition
from .sampling import Sampler
from .shadow import hello_suffix
from .state import State

logger = logging.getLogger("distbreaker")
SCRIPT_NAME = "breaker"

#: The event kinds a breaker's listeners can ask for (see `BreakerCore.add_listener`).
EVENT_KINDS = ("success", "error", "ignored_error", "slow", "not_permitted", "reset",
               "failure_rate_exceeded", "slow_call_rate_exceeded", "transition",
               "fault_injected")


class Step(str, Enum):
    """What a protected call must do before running."""

    PERMIT = "permit"    # run now, no round trip
    REJECT = "reject"    # fail fast, no round trip
    ACQUIRE = "acquire"  # ask Redis (or the local fallback) with the acquire script
    RAMP = "ramp"        # slow start after a recovery turned this call down (no round trip)
    LOCAL_OPEN = "local_open"  # open for this worker only (quorum trip not met)


#: Outcome counts as the record script takes them: (successes, failures, slow, total_ms).
Counts = tuple[int, int, int, int]


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
    #: Why the breaker is in its state, and who put it there (operator actions).
    reason: str = ""
    actor: str = ""
    #: Why the history XADD or the PUBLISH of this call's transition failed ('' if not).
    event_errors: str = ""
    #: Server ms when the operator's override of the current state ends (0: none).
    override_until_ms: int = 0
    #: calls..total_ms are the half-open probes' figures (HALF_OPEN, and an OPEN that
    #: a half-open verdict made).
    probe_figures: bool = False
    #: The rates were exceeded but failures came from too few workers (quorum trip):
    #: the breaker stays CLOSED fleet-wide; the reporting worker opens for itself.
    quorum_blocked: bool = False
    #: A hello's answer about the operator's recording switch (element 21, while one
    #: exists); None in other replies (breaker/sampling.py).
    recording: str | None = None

    @property
    def override_left(self) -> float | None:
        """Seconds until the operator's override ends; None when it does not expire."""
        if not self.override_until_ms:
            return None
        return max(0, self.override_until_ms - self.now_ms) / 1000.0


@dataclasses.dataclass(frozen=True)
class Permit:
    """Permission to run one call; `token` is the half-open probe lease, if any.

    `lease_deadline` (monotonic seconds, 0: none) is when a probe's lease ends: the
    time its acquire was sent plus the governing `half_open_lease`.
    """

    token: str = ""
    lease_deadline: float = 0.0


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


@dataclasses.dataclass(frozen=True)
class LocalCounts:
    """This process's own figures (no Redis): finished calls by outcome value, and
    rejections by the state that rejected them ("UNKNOWN": Redis unavailable)."""

    outcomes: Mapping[str, int]
    rejections: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class AcquireStep:
    """The local decision of `acquire()` (a known OPEN wait raises instead).

    PERMIT: run now, no round trip. ACQUIRE: send `call`, whose result is the Permit
    (or which raises CallNotPermitted); `token` is the half-open probe lease it asks
    for, to hand back if the call is cancelled before its reply arrives.
    """

    step: Step
    call: PendingCall | None = None
    token: str = ""


_PERMITTED = AcquireStep(Step.PERMIT)


class OwnOutcomes:
    """This process's own recent outcomes, kept only when the quorum trip is on: a
    quorum-pending reply opens this worker's own view only when its OWN outcomes, alone,
    exceed the rates (Resilience4j's per-process rule), so a healthy worker is never
    rejected because other workers fail. The same window shape as the breaker's: the
    last `sliding_window_size` outcomes, or per-second buckets over that many seconds."""

    def __init__(self, config: BreakerConfig) -> None:
        self._size = config.sliding_window_size
        self._time = config.sliding_window_type is WindowType.TIME_BASED
        self._minimum = config.effective_minimum_calls
        self._failure = config.failure_rate_threshold
        self._slow = config.slow_call_rate_threshold
        #: count window: (failed, slow) per outcome; time window: [second, calls,
        #: failures, slow] per second
        self._items: deque[Any] = deque(maxlen=None if self._time else self._size)

    def add(self, failures: int, calls: int, slow: int, now: float) -> None:
        if calls <= 0:
            return
        if not self._time:
            for i in range(min(calls, self._size)):
                self._items.append((i < failures, i < slow))
            return
        second = int(now)
        if self._items and self._items[-1][0] == second:
            bucket = self._items[-1]
            bucket[1] += calls
            bucket[2] += failures
            bucket[3] += slow
        else:
            self._items.append([second, calls, failures, slow])
        self._evict(now)

    def _evict(self, now: float) -> None:
        while self._items and self._items[0][0] <= int(now) - self._size:
            self._items.popleft()

    def exceeded(self, now: float) -> bool:
        """Would this process's outcomes alone trip the breaker?"""
        if self._time:
            self._evict(now)
            calls = sum(b[1] for b in self._items)
            failures = sum(b[2] for b in self._items)
            slow = sum(b[3] for b in self._items)
        else:
            calls = len(self._items)
            failures = sum(1 for f, _ in self._items if f)
            slow = sum(1 for _, s in self._items if s)
        if calls <= 0 or calls < self._minimum:
            return False
        return (failures * 100.0 >= self._failure * calls
                or slow * 100.0 >= self._slow * calls)


#: Seconds between a worker's hellos (the rollout hash counts a worker as running its
#: config for a minute after its last one: lua/lib/breaker_rollout.lua).
HELLO_INTERVAL = 20.0


def worker_id() -> str:
    """This process as a quorum counts it: host and pid (a forked child is another)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def config_fingerprint(wire: str) -> int:
    """ARGV[2] of every breaker call: the first 12 hex digits of the SHA-1 of the config
    wire string, as an integer (the state record stores the stored config's)."""
    return int(hashlib.sha1(wire.encode()).hexdigest()[:12], 16)


#: The short reply's Reply fields but state, now_ms and since_ms (every other default).
_SHORT_REPLY: dict[str, Any] = {
    **{f.name: f.default for f in dataclasses.fields(Reply)
       if f.default is not dataclasses.MISSING},
    "wait_ms": 0, "permitted": True, "transitions": (), "calls": 0, "failures": 0, "slow": 0,
    "total_ms": 0, "rejected": 0, "drift": False, "stored_config": "", "probes_in_flight": 0}
#: A state's wire text (str or bytes, per client settings) to the State.
_STATE_OF: dict[Any, State] = {**{s.value: s for s in State},
                               **{s.value.encode(): s for s in State}}
_new_object = object.__new__
_SUCCESS = Outcome.SUCCESS.value


def decode_reply(raw: Sequence[Any]) -> Reply:
    """Decode the breaker script's reply array (bytes or str, per client settings): the
    full reply, or the short one {state, now_ms, since_ms} of a record that changed
    nothing a worker must know (the compact record's integer: `compact_answered`)."""
    if len(raw) == 3:
        # the reply of every usual record: built with one dict update, not the frozen
        # dataclass's object.__setattr__ per field (a third of the cost), equal to
        # Reply(state=..., now_ms=..., since_ms=..., <the _SHORT_REPLY values>)
        state = _STATE_OF.get(raw[0]) or State(text(raw[0]))
        reply = _new_object(Reply)
        reply.__dict__.update(_SHORT_REPLY, state=state, now_ms=int(raw[1]),
                              since_ms=int(raw[2]))
        return reply
    transitions = tuple((State(text(t[0])), State(text(t[1])), text(t[2])) for t in raw[3])
    return Reply(
        state=State(text(raw[0])), wait_ms=int(raw[1]), permitted=bool(int(raw[2])),
        transitions=transitions, calls=int(raw[4]), failures=int(raw[5]), slow=int(raw[6]),
        total_ms=int(raw[7]), rejected=int(raw[8]), drift=bool(int(raw[9])),
        stored_config=text(raw[10]), now_ms=int(raw[11]), since_ms=int(raw[12]),
        probes_in_flight=int(raw[13]),
        transition_rates=tuple((_rate(t, 3), _rate(t, 4)) for t in raw[3]),
        reason=text(raw[14]) if len(raw) > 16 else "",
        actor=text(raw[15]) if len(raw) > 16 else "",
        event_errors=text(raw[16]) if len(raw) > 16 else "",
        override_until_ms=int(raw[17]) if len(raw) > 17 else 0,
        probe_figures=bool(int(raw[18])) if len(raw) > 18 else (
            State(text(raw[0])) is State.HALF_OPEN),
        quorum_blocked=bool(int(raw[19])) if len(raw) > 19 else False,
        recording=text(raw[20]) if len(raw) > 20 else None,
    )


#: When an override ends: an aware datetime, or epoch seconds.
Until = datetime.datetime | float


def hold_args(for_: Seconds | None, until: Until | None) -> tuple[str, ...]:
    """The `set` op's ARGV[8..9] for an override that ends `for_` seconds from now (by
    server time) or at `until` (an aware datetime, or epoch seconds); () for none."""
    if for_ is None and until is None:
        return ()
    if for_ is not None and until is not None:
        raise ValueError("give for_ or until, not both")
    if for_ is not None:
        ms = to_ms(to_seconds(for_, "for_", positive=True))
        if ms < 1:
            raise ValueError(f"for_ must be at least 0.001 seconds, got {for_!r}")
        return (str(ms), "")
    if isinstance(until, datetime.datetime):
        if until.tzinfo is None:
            raise ValueError("until must be an aware datetime (with tzinfo) or epoch seconds")
        epoch = until.timestamp()
    elif isinstance(until, (int, float)) and not isinstance(until, bool):
        epoch = float(until)
    else:
        raise ValueError(f"until must be a datetime or epoch seconds, got {until!r}")
    return ("", str(round(epoch * 1000)))


def _rate(entry: Sequence[Any], i: int) -> float:
    """A transition entry's rate (percent); -1 when absent (an older script)."""
    return float(text(entry[i])) if len(entry) > i else -1.0


def rate(part: int, whole: int, minimum: int) -> float:
    """Percentage of `part` in `whole`, or -1 below the minimum number of calls."""
    if whole <= 0 or whole < minimum:
        return -1.0
    return round(part * 100.0 / whole, 2)


class BreakerCodec:
    """One breaker's protocol state: script calls, this process's view of the fleet
    state (refreshed by every reply) and its own counts. `BreakerCore` wires it to the
    Redis health, the local fallback and the listeners."""

    def __init__(self, name: str, config: BreakerConfig, prefix: str = DEFAULT_PREFIX,
                 db: int = 0) -> None:
        self.name = name
        self.config = config
        self.prefix = prefix
        #: `db`: the client's database, whose events channel the script publishes on.
        self.keys = BreakerKeys.build(name, prefix, db)
        self.wire = config.to_wire()
        self.fingerprint = config_fingerprint(self.wire)
        self._slow_ms = to_ms(config.slow_call_duration)
        #: The compact record can say this config's usual record (a count window, no
        #: quorum: its hot path; docs/KEY_SCHEMA.md, "The compact record").
        self._compact = (config.sliding_window_type is WindowType.COUNT_BASED
                         and config.min_failing_workers <= 1)
        self._lock = threading.Lock()
        self._view: State | None = None          # None: unknown, ask Redis
        #: The view Redis last gave before it became unreachable (the fallback inherits it).
        self._last_known: State | None = None
        self._open_deadline = 0.0                # monotonic end of the OPEN wait
        self._view_until = 0.0                   # a rejecting view is used until then
        self._view_reason = ""
        self._view_actor = ""
        self._override_deadline = 0.0            # monotonic end of an override (0: none)
        self._revalidate = config.revalidate_interval
        #: Slow start after a recovery: monotonic start and end of the ramp (0: none);
        #: `ramp_enabled` False when an adaptive bulkhead restarts low instead (Policy).
        self._ramp_from = 0.0
        self._ramp_until = 0.0
        #: Quorum trip: this worker alone saw the rates exceeded; it rejects locally
        #: until then (monotonic, 0: not).
        self._local_open_until = 0.0
        self._own = OwnOutcomes(config) if config.min_failing_workers > 1 else None
        self.ramp_enabled = config.ramp_duration > 0
        self._event_errors_logged = False
        self._view_now_ms = 0
        self._own_transition_ms = -1             # server ms of this process's last transition
        self._invalidated_at = -1                # server ms of the last pub/sub drop
        self._drift_warned = False
        self._next_hello = 0.0                   # monotonic: when the next hello is due
        self.said_hello = False                  # a goodbye is due at close()
        self._hello_suffix = hello_suffix(config.shadow)  # declares the config's shadows
        self._instance = secrets.token_hex(4)
        self.config_drift: str | None = None     # stored config when it differs from ours
        self.not_permitted = 0
        self._counted_since = -1                 # since_ms of the state not_permitted counts in
        #: This process's finished calls by outcome value, and rejections by the
        #: state that rejected them ("UNKNOWN": Redis unavailable, fail_closed).
        self.outcomes: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        #: Outcome recording: which record calls carry a sample (off by default).
        self.sampler = Sampler(config.record_sample_rate, config.record_max_samples,
                               to_ms(config.record_ttl))
        forking.register(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock and this process's own (zero) counts; it is
        another worker, which says hello on its first call."""
        self._lock = threading.Lock()
        self._next_hello = 0.0
        self.not_permitted = 0
        self.outcomes = Counter()
        self.rejections = Counter()
        if self._own is not None:
            self._own = OwnOutcomes(self.config)

    @property
    def view(self) -> State | None:
        """The local view of the fleet state (None: unknown)."""
        return self._view

    # -- building script calls ------------------------------------------------
    def _call(self, op: str, *extra: Any) -> ScriptCall:
        """A script call; protected calls (acquire, record) may carry a hello, reads and
        operator actions never do (they are not a worker running this config)."""
        keys = self.keys
        fp = self._fingerprint_arg() if op in ("acquire", "record") else self.fingerprint
        return ScriptCall(keys.script_keys,
                          (op, fp, self.wire, self.name, keys.channel, *extra))

    def _fingerprint_arg(self) -> int | str:
        """ARGV[2]: the fingerprint, or on this worker's first call and then every
        `HELLO_INTERVAL` seconds a hello ``<fp>@<worker>`` that registers the worker
        and its config in the rollout hash (docs/OPERATIONS.md, "Changing a breaker's
        config"). Other calls send the bare fingerprint: the hot path is unchanged."""
        now = time.monotonic()
        if now < self._next_hello:
            return self.fingerprint
        with self._lock:
            if now < self._next_hello:
                return self.fingerprint
            self._next_hello = now + HELLO_INTERVAL
            self.said_hello = True
        return f"{self.fingerprint}@{self.worker}{self._hello_suffix}"

    def goodbye_call(self) -> ScriptCall:
        """A `state` read that removes this worker from the rollout hash (`close()`): a
        worker that leaves no longer counts as running its config."""
        keys = self.keys
        return ScriptCall(keys.script_keys, ("state", f"{self.fingerprint}@{self.worker}@bye",
                                             self.wire, self.name, keys.channel))

    @property
    def worker(self) -> str:
        """This worker instance as the rollout hash names it: host, pid and a random
        suffix per breaker object (a restarted worker is a new instance)."""
        return f"{worker_id()}:{self._instance}"

    def acquire_call(self) -> tuple[ScriptCall, str]:
        token = secrets.token_hex(8)
        return self._call("acquire", token), token

    def state_call(self) -> ScriptCall:
        return self._call("state")

    def set_call(self, target: str, reason: str, actor: str = "",
                 hold: tuple[str, ...] = ()) -> ScriptCall:
        """An operator action; `hold` from `hold_args` makes it end by server time."""
        if target == "RESET":
            self.restart_counts()
        return self._call("set", target, reason, actor, *hold)

    def record_call(self, permit: Permit, outcome: Outcome, duration: float) -> ScriptCall | None:
        """The record script call for one finished call, or None when nothing is recorded."""
        with self._lock:
            self.outcomes[outcome.value] += 1
        if outcome is Outcome.IGNORED:
            if not permit.token:
                return None
            return self._call("record", permit.token, 0, 0, 0, 0)
        counts = self._counts(outcome, duration)
        self._note_own(counts)
        return self._call("record", permit.token, *counts, *self._record_tail(counts))

    def compact_record(self, duration: float) -> tuple[int, int] | None:
        """ARGV of the compact record ``(fingerprint, ms)`` of one plain success
        that lasted `duration` (exact mode, no probe: the caller checks), or None when
        only the full form can say it: a slow call, a hello due, a sample, a view other
        than CLOSED, a drift or an override (whose replies the worker needs), a time
        window or a quorum. The script answers 0 when it cannot finish a compact record
        after all; the full form is then sent. Counts nothing: `compact_answered` does."""
        if (self._view is not State.CLOSED or not self._compact or self.config_drift is not None
                or self._override_deadline or self.sampler.active):
            return None
        ms = round(duration * 1000)
        if ms > self._slow_ms or time.monotonic() >= self._next_hello:
            return None
        return (self.fingerprint, ms if ms > 0 else 0)

    def compact_answered(self, now_ms: int, now: float) -> None:
        """The compact record's answer (the server time, state CLOSED): the success
        counted and the view refreshed as `apply` does for a short CLOSED reply (since
        kept, no transition, no drift: the compact form was sent without one)."""
        with self._lock:
            self.outcomes[_SUCCESS] += 1
            self._last_known = None
            if now_ms >= self._view_now_ms:
                self._view_now_ms, self._view = now_ms, State.CLOSED
                self._open_deadline, self._view_until = now, now + self._revalidate
                self._override_deadline = 0.0
                self._view_reason = self._view_actor = ""

    def batched_counts(self, outcome: Outcome, duration: float) -> Counts | None:
        """Batched mode: the counts one finished call (no probe) adds, None when ignored."""
        with self._lock:
            self.outcomes[outcome.value] += 1
        if outcome is Outcome.IGNORED:
            return None
        counts = self._counts(outcome, duration)
        self._note_own(counts)
        return counts

    def _note_own(self, counts: Counts) -> None:
        """Quorum trip: this process's own outcomes (see `OwnOutcomes`)."""
        if self._own is not None:
            with self._lock:
                self._own.add(counts[1], counts[0] + counts[1], counts[2], time.monotonic())

    def batch_call(self, counts: Counts) -> ScriptCall:
        """The record script call carrying accumulated counts (no probe token)."""
        return self._call("record", "", *counts, *self._record_tail(counts))

    def _worker_mark(self, counts: Counts) -> tuple[str, ...]:
        """ARGV[11] of a record with failures when the quorum trip is on: this worker."""
        if self.config.min_failing_workers <= 1 or not counts[1]:
            return ()
        return (worker_id(),)

    def _record_tail(self, counts: Counts) -> tuple[str, ...]:
        """ARGV[11..]: the quorum mark, and ARGV[12] when this record is sampled (outcome
        recording; a batch is sampled whole: its counts at the flush's server time)."""
        mark = self._worker_mark(counts)
        sample = self.sampler.spec(worker_id)
        if sample is None:
            return mark
        return (*(mark or ("",)), sample)

    def _counts(self, outcome: Outcome, duration: float) -> Counts:
        ms = max(0, to_ms(duration))
        failed = outcome is Outcome.FAILURE
        return (0 if failed else 1, 1 if failed else 0, 1 if ms > self._slow_ms else 0, ms)

    def outcome(self, error: BaseException | None) -> Outcome:
        """How a finished call counts (error None: it returned normally)."""
        return Outcome.SUCCESS if error is None else classify_exception(self.config, error)

    # -- local decisions ---------------------------------------------------------
    def step(self, now: float) -> Step:
        """Decide from the local view whether a round trip is needed before the call.

        A rejecting view (OPEN, FORCED_OPEN) is trusted for at most
        `revalidate_interval` seconds (and OPEN no longer than its wait), so an
        operator's action or a missed pub/sub message is seen within that bound.
        """
        view = self._view
        if now < self._local_open_until:
            return Step.LOCAL_OPEN
        if view is State.CLOSED and now < self._ramp_until and random.random() >= \
                self._ramp_share(now):
            return Step.RAMP
        if view in (State.CLOSED, State.DISABLED, State.METRICS_ONLY):
            return Step.PERMIT
        if view in (State.OPEN, State.FORCED_OPEN) and now < self._view_until:
            return Step.REJECT
        return Step.ACQUIRE

    def _ramp_share(self, now: float) -> float:
        """The share of calls slow start admits at monotonic time `now`."""
        start = self.config.ramp_start
        return start + (1.0 - start) * (now - self._ramp_from) / self.config.ramp_duration

    def recovered(self, at_ms: int, now: float, now_ms: int) -> None:
        """The breaker closed after half-open probes at server time `at_ms` (this
        process's reply, or the events channel): slow start runs from then."""
        if not self.ramp_enabled:
            return
        started = now - max(0, now_ms - at_ms) / 1000.0
        with self._lock:
            self._ramp_from = started
            self._ramp_until = started + self.config.ramp_duration

    def local_open_rejection(self, now: float) -> CallNotPermitted:
        """A call this worker's own open view turned down (the quorum was not met)."""
        self.count_rejection("LOCAL_OPEN")
        return CallNotPermitted(
            self.name, State.OPEN, max(0.0, self._local_open_until - now),
            reason=f"open for this worker only: failures from fewer than "
                   f"{self.config.min_failing_workers} workers")

    def ramp_rejection(self, now: float) -> CallNotPermitted:
        """A call slow start turned down: retry after a share of the ramp left."""
        self.count_rejection("RAMPING")
        left = max(0.0, self._ramp_until - now)
        return CallNotPermitted(self.name, State.CLOSED, min(left, 1.0), reason="ramping")

    def local_rejection(self, now: float) -> CallNotPermitted:
        """The rejection of a call the local view turned down (no round trip)."""
        state = self._view or State.OPEN
        self.count_rejection(str.__str__(state))  # its value (.value: a slower property)
        left = self._override_deadline - now if self._override_deadline else None
        return self._rejection(state, self._open_deadline - now, self._view_reason,
                               self._view_actor, left)

    def _rejection(self, state: State, wait: float, reason: str,
                   actor: str, override_left: float | None = None) -> CallNotPermitted:
        """CallNotPermitted for `state`; FORCED_OPEN has no wait of its own: its
        retry_after is the override's remaining time, or the re-check interval."""
        if state is State.FORCED_OPEN:
            wait = max(0.0, override_left) if override_left is not None else self._revalidate
        return CallNotPermitted(self.name, state, wait, reason=reason, actor=actor)

    def forget_view(self) -> None:
        """Redis could not be asked: the next call must ask (or use the fallback) again
        (and say hello again: the last one may not have arrived). The view is kept as
        the last known fleet state, which the fallback inherits."""
        if self._view is not None:
            self._last_known = self._view
        self._view = None
        self._next_hello = 0.0

    def inherited(self, now: float) -> tuple[State | None, float, float | None]:
        """The last fleet state this process saw before Redis became unreachable: the
        state (None: none known), the seconds left of its OPEN wait, and of an
        operator's override (None: no end)."""
        state = self._view or self._last_known
        left = self._override_deadline - now if self._override_deadline else None
        return state, self._open_deadline - now, left

    def inherited_rejection(self, state: State, wait: float) -> CallNotPermitted:
        """A call turned down while Redis is unavailable by the last known fleet state
        (the local fallback loading) or a known local OPEN, without a script run."""
        self.count_rejection(state.value)
        return CallNotPermitted(self.name, state, max(0.0, wait),
                                reason="open (Redis unavailable: local fallback)")

    def seed_call(self, now: float) -> ScriptCall | None:
        """The operator `set` that makes the local fallback start from the last known
        fleet state (None: CLOSED or unknown, where a fresh local breaker starts): an
        OPEN keeps its wait (then half-open probes, as configured), FORCED_OPEN,
        DISABLED and METRICS_ONLY stay until their override ends."""
        state, open_left, override_left = self.inherited(now)
        hold: tuple[str, ...] = ()
        if override_left is not None:
            hold = hold_args(max(0.001, override_left), None)
        if state in (State.OPEN, State.HALF_OPEN):
            wait = open_left if state is State.OPEN else 0.0
            return self._call("set", "TRIP", "last known fleet state", "local",
                              *hold_args(max(0.001, wait), None))
        if state in (State.FORCED_OPEN, State.DISABLED, State.METRICS_ONLY):
            return self._call("set", state.value, "last known fleet state", "local", *hold)
        return None

    def invalidate(self, at_ms: int, recovered: bool = False) -> bool:
        """A transition made elsewhere at server time `at_ms` (pub/sub): unless a reply
        already told us of it, the next call asks Redis. True when the view was dropped.
        `recovered`: it was HALF_OPEN -> CLOSED (slow start begins)."""
        if recovered:
            self.recovered(at_ms, time.monotonic(), at_ms)
        with self._lock:
            if at_ms < self._view_now_ms or at_ms == self._own_transition_ms:
                return False
            # A reply of the same millisecond may predate the transition: accept newer only
            # (or the reply reporting that very transition: the message can outrun it).
            self._view_now_ms = at_ms + 1
            self._invalidated_at = at_ms
            self._view = None
            return True

    def apply(self, reply: Reply, now: float, source: str = "redis") -> list[Transition]:
        """Refresh the local view from a Redis reply; return the transitions it made."""
        if source == "redis":
            with self._lock:
                self._last_known = None  # Redis answers: its view governs
                if reply.now_ms >= self._view_now_ms or (
                        reply.transitions and reply.now_ms == self._invalidated_at):
                    self._view_now_ms = reply.now_ms
                    self._view = reply.state
                    self._open_deadline = now + reply.wait_ms / 1000.0
                    self._view_until = min(self._open_deadline, now + self._revalidate) \
                        if reply.state is State.OPEN else now + self._revalidate
                    left = reply.override_left
                    self._override_deadline = 0.0 if left is None else now + left
                    if left is not None:  # ask Redis once the override has ended
                        self._view_until = min(self._view_until, now + left)
                    self._view_reason, self._view_actor = reply.reason, reply.actor
                    if reply.since_ms != self._counted_since:
                        # Resilience4j restarts the not-permitted count in every state
                        self._counted_since, self.not_permitted = reply.since_ms, 0
                if reply.transitions:
                    self._own_transition_ms = reply.now_ms
            if any(a is State.HALF_OPEN and b is State.CLOSED for a, b, _ in reply.transitions):
                self.recovered(reply.now_ms, now, reply.now_ms)
            if reply.quorum_blocked and self._own_rates_exceeded(now):
                self._local_open_until = now + self.config.wait_duration_in_open_state
                logger.warning("circuit breaker %s: failure rates exceeded, but from fewer "
                               "than %d workers: open for this worker only for %.3fs",
                               self.name, self.config.min_failing_workers,
                               self.config.wait_duration_in_open_state)
            if reply.event_errors:
                self._note_event_errors(reply.event_errors)
            if reply.recording is not None:
                self.sampler.learn(reply.recording, reply.now_ms)
            if reply.drift:
                self._note_drift(reply.stored_config)
            elif self.config_drift is not None:
                self.config_drift = None
        rates = reply.transition_rates or ((-1.0, -1.0),) * len(reply.transitions)
        return [Transition(self.name, a, b, why, reply.now_ms, source, *rate_pair)
                for (a, b, why), rate_pair in zip(reply.transitions, rates, strict=True)]

    def _own_rates_exceeded(self, now: float) -> bool:
        """Quorum pending: does this worker's own view open (its own outcomes alone
        exceed the rates)? A worker is never rejected for other workers' failures."""
        if self._own is None:
            return False
        with self._lock:
            return self._own.exceeded(now)

    def admission(self, reply: Reply, token: str, sent_at: float = 0.0) -> Permit:
        """Turn an acquire reply into a permit, or raise CallNotPermitted. A probe's
        lease runs from `sent_at` (when the acquire was sent; monotonic)."""
        if reply.permitted:
            if reply.state is not State.HALF_OPEN:
                return Permit()
            return Permit(token, sent_at + self.probe_lease(reply) if sent_at else 0.0)
        self.count_rejection(reply.state.value)
        raise self._rejection(reply.state, reply.wait_ms / 1000.0, reply.reason, reply.actor,
                              reply.override_left)

    def probe_lease(self, reply: Reply) -> float:
        """The lease of a probe granted by `reply`: the stored config's when it drifts
        from this process's (the script applied the stored one)."""
        if reply.drift:
            try:
                return BreakerConfig.from_wire(reply.stored_config).half_open_lease
            except ValueError:
                pass
        return self.config.half_open_lease

    def expired_lease(self, permit: Permit, now: float) -> CallNotPermitted | None:
        """The rejection of a probe whose lease ended before its call starts (the holder
        was paused: another worker may hold the slot now), or None."""
        if not permit.token or not permit.lease_deadline or now < permit.lease_deadline:
            return None
        self.count_rejection(State.HALF_OPEN.value)
        return CallNotPermitted(self.name, State.HALF_OPEN, 0.0,
                                reason="probe lease expired before the call")

    def redis_unavailable(self, error: BaseException, retry_after: float) -> CallNotPermitted:
        """The fail_closed rejection (the Redis error becomes its cause)."""
        self.count_rejection("UNKNOWN")
        rejection = CallNotPermitted(self.name, "UNKNOWN", retry_after,
                                     reason=f"redis unavailable: {error}")
        rejection.__cause__ = error
        return rejection

    def count_rejection(self, state: str) -> None:
        with self._lock:
            self.not_permitted += 1
            self.rejections[state] += 1

    def restart_counts(self) -> None:
        """reset(): the not-permitted count starts again (Resilience4j)."""
        with self._lock:
            self.not_permitted = 0

    def local_counts(self) -> LocalCounts:
        with self._lock:
            return LocalCounts(dict(self.outcomes), dict(self.rejections))

    def metrics(self, reply: Reply) -> BreakerMetrics:
        governing = self.config
        if reply.drift:  # the stored config decides: report rates as its minimum sees them
            try:
                governing = BreakerConfig.from_wire(reply.stored_config)
            except ValueError:
                pass
        minimum = (governing.permitted_calls_in_half_open if reply.probe_figures
                   else governing.effective_minimum_calls)
        return BreakerMetrics(
            state=reply.state,
            failure_rate=rate(reply.failures, reply.calls, minimum),
            slow_call_rate=rate(reply.slow, reply.calls, minimum),
            calls=reply.calls, failed=reply.failures, slow=reply.slow,
            not_permitted=self.not_permitted, rejected_fleet_wide=reply.rejected,
            probes_in_flight=reply.probes_in_flight,
        )

    def _note_event_errors(self, errors: str) -> None:
        """The script saved a transition but could not record or publish it: say so
        once per process (other workers then learn of it only by re-checking)."""
        if not self._event_errors_logged:
            self._event_errors_logged = True
            logger.error("circuit breaker %r: a transition was saved but its history entry "
                         "or pub/sub message failed (%s); other workers see it within "
                         "revalidate_interval. Run `distbreaker doctor` to check the ACL.",
                         self.name, errors.strip("; "))

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
        try:
            ours, theirs = self.config.config_version, BreakerConfig.from_wire(
                stored).config_version
        except ValueError:
            ours = theirs = 0
        why = (f"config_version {theirs} is in force, this process has {ours}"
               if theirs > ours else "the config in force was deployed after this one")
        warnings.warn(f"circuit breaker {self.name!r}: this process's config is not the one "
                      f"in force and will not become it by itself ({why}; {differs}); the "
                      f"config in force governs this process's calls (stored wire {stored}). "
                      "Restart this worker with the config in force, raise config_version, or "
                      f"promote this one: distbreaker config adopt {self.name} "
                      f"--fingerprint {self.fingerprint}", ConfigDriftWarning, stacklevel=4)


#: Drift already warned about in this process: (state key, our wire, stored wire).
_DRIFT_WARNED: set[tuple[str, str, str]] = set()


def must_propagate(error: BaseException | None) -> bool:
    """True when the call ended with cancellation, KeyboardInterrupt or SystemExit:
    recording it (handing a half-open probe back) must never replace it with another
    error, or asyncio timeouts and task groups, and Ctrl-C, stop working."""
    return error is not None and not isinstance(error, Exception)


class _LoggedNotRaised:
    """Around the record of a call that `must_propagate` its error: a failure to record
    is logged, never raised in that error's place."""

    def __init__(self, name: str, error: BaseException | None) -> None:
        self._name = name
        self._error = error

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if not isinstance(exc, Exception):
            return False
        logger.error("circuit breaker %s: recording a call ended by %s failed: %r",
                     self._name, type(self._error).__name__, exc)
        return True


class BreakerCore:
    """What the sync and asyncio breakers share that is not I/O.

    The front ends send the `PendingCall`s built here (`send` / `send_async`): each
    carries its reply handling and its outage path (the local fallback breaker, or the
    fail_closed rejection), so a front end's only job is the round trip.
    """

    def __init__(self, name: str, config: BreakerConfig | None, prefix: str,
                 overrides: dict[str, Any], redis: Any = None) -> None:
        self.config = build_config(config, overrides)
        validate_name(name)  # before connecting: a bad name must not hold a shared client
        # The keys name the client's database (its events channel): connect first.
        client = self._connect(redis)
        self._codec = BreakerCodec(name, self.config, prefix,
                                   0 if client is None else db_of(client))
        self._script = load_script(SCRIPT_NAME)
        self._listeners = Listeners(EVENT_KINDS)
        #: Shared with the process's other components of the same Redis (one outage
        #: discovery per call, one trial per backoff period).
        self._health: RedisHealth = shared_health(redis, self.config.redis_retry_max_backoff)
        self._local = LocalScriptRunner()
        #: The local fallback answered since Redis last did (its keys are seeded).
        self._local_used = False
        #: Outcome counts of the calls passed while the fallback runtime loads (recorded
        #: into it, as one batch, when it is ready).
        self._unrecorded: Counts = (0, 0, 0, 0)
        #: The local fallback's last answer let every call through (CLOSED, DISABLED,
        #: METRICS_ONLY): acquires need no local script run, and plain successes are
        #: summed and recorded `_LOCAL_BATCH` at a time (a failure or slow call at once,
        #: with them): a full Redis must not cost more than a healthy one.
        self._local_open_to_all = False
        #: The local fallback answered OPEN: it rejects without a script run until then
        #: (monotonic; 0: not known), as a fleet OPEN view does without a round trip.
        self._local_open_until = 0.0
        self._local_successes: Counts = (0, 0, 0, 0)
        self._local_successes_since = 0.0
        self._count_window = self.config.sliding_window_type is WindowType.COUNT_BASED
        self._local_lock = threading.Lock()
        self._recovery_callbacks: list[Any] = []
        #: The flusher batched outcomes go to (record_mode "batched"; set by the front end).
        self._flusher: Any = None
        #: Subscribed to the transitions channel in this process (see _watch_transitions).
        self._watching = False
        #: Where an operator's injected faults come from (allow_fault_injection only).
        self._fault_feed: FaultFeed | None = None
        #: Injected faults this process applied to this breaker's calls, by kind.
        self.injected: Counter[str] = Counter()
        forking.register(self)

    #: The Redis client (set by the front end; per event loop in asyncio).
    _client: Any

    def _connect(self, redis: Any) -> Any:
        """The front end's constructor step, once config and name are valid: check
        `redis` (a URL or a client), keep what it needs of it, return a client (the keys
        use its database). None here: a core on its own has no client."""
        return None

    def _after_fork(self) -> None:
        """A forked child subscribes on its own first call (threads do not survive fork),
        and has a local fallback of its own (the parent's records stay the parent's)."""
        self._watching = False
        self._local_used = False
        self._unrecorded = (0, 0, 0, 0)
        self._local_open_to_all = False
        self._local_open_until = 0.0
        self._local_successes = (0, 0, 0, 0)
        self._local_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._codec.name

    @property
    def keys(self) -> Any:
        """The Redis keys of this breaker (see docs/KEY_SCHEMA.md)."""
        return self._codec.keys

    @property
    def local_view(self) -> State | None:
        """The state this process last learned from Redis (None: unknown, the next call
        asks): what decides here whether a call asks Redis, fails fast or goes ahead."""
        return self._codec.view

    @property
    def config_drift(self) -> str | None:
        """The fleet's stored config when it differs from this process's, else None."""
        return self._codec.config_drift

    @property
    def fail_closed(self) -> bool:
        return self.config.on_redis_error is RedisErrorPolicy.FAIL_CLOSED

    @property
    def client_url(self) -> str | None:
        """The URL an asyncio breaker opens one client per event loop from; None for a
        sync breaker and for one given a client."""
        return None

    @property
    def blocking_client(self) -> Any:
        """The sync breaker's client (None for an asyncio breaker)."""
        return None

    @property
    def given_async_client(self) -> Any:
        """The asyncio client an asyncio breaker was given (None otherwise)."""
        return None

    def subscription(self) -> Subscription | None:
        """Where this breaker hears the transitions other processes make (the
        subscriber's `Watched` protocol)."""
        source = listen_source(self.client_url, self.blocking_client,
                               self.given_async_client, self.config.redis_timeout)
        return None if source is None else Subscription(self.keys.channel, *source)

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and this process's fallback breaker
        answers (fail_open; under fail_closed there is no fallback: calls are rejected)."""
        return self._health.down and not self.fail_closed

    def add_listener(self, listener: Listener | Any, kinds: Any = None) -> None:
        """Call `listener(event)` for the events of `kinds` this process sees.

        Without `kinds`: `Transition`s only (made by this process's calls; each
        transition is reported by exactly one process fleet-wide). Other kinds
        (`EVENT_KINDS`, or "*" for all) are per process and get an `Event`:
        success / error / ignored_error (with `duration`, and `error`), slow (a
        finished call slower than slow_call_duration, besides its success or error),
        not_permitted (`reason`, `state`), reset, failure_rate_exceeded and
        slow_call_rate_exceeded (`rate`; in the process whose call tripped it).
        A coroutine function is scheduled on the running loop, not awaited.
        """
        self._listeners.add(listener, kinds)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def local_counts(self) -> LocalCounts:
        """This process's calls by outcome and rejections by state (for exporters)."""
        return self._codec.local_counts()

    def invalidate(self, at_ms: int, recovered: bool = False) -> bool:
        """A transition another process made at server time `at_ms` (pub/sub): unless a
        reply already reported it, the next call asks Redis. True when the view was dropped.
        `recovered`: HALF_OPEN -> CLOSED (slow start, when configured, begins)."""
        if recovered:
            self._on_recovery()
        return self._codec.invalidate(at_ms, recovered)

    def on_recovery(self, callback: Any) -> None:
        """Call `callback()` whenever this breaker closes after half-open probes (made
        here or seen on the events channel): a Policy restarts its adaptive limit."""
        self._recovery_callbacks.append(callback)

    def recover_with(self, callback: Any) -> None:
        """After each recovery call `callback()` *instead of* the slow start (a Policy
        whose adaptive bulkhead restarts its limit low: both would throttle twice)."""
        self._codec.ramp_enabled = False
        self.on_recovery(callback)

    def _on_recovery(self) -> None:
        for callback in list(self._recovery_callbacks):
            try:
                callback()
            except Exception:
                logger.exception("circuit breaker %s: recovery callback failed", self.name)

    # -- the steps around each Redis call (the front ends only send them) -------------
    def _stop_watching(self) -> None:
        """Closing: leave the transitions subscription (it ends when nobody watches)."""
        SUBSCRIBERS.unwatch(self)
        self._watching = False

    def _watch_transitions(self) -> None:
        """Subscribe (once per process) to the transitions channel, so transitions made
        elsewhere (other workers, operators) drop this breaker's local view at once."""
        self._watching = True
        if self.config.subscribe:
            SUBSCRIBERS.watch(self)

    def _acquire_step(self) -> AcquireStep:
        """Permitted locally, or the acquire call to send; raises a local rejection."""
        if not self._watching:
            self._watch_transitions()
        codec = self._codec
        now = time.monotonic()
        step = codec.step(now)
        if step is Step.PERMIT:
            return _PERMITTED
        if step is Step.REJECT:
            raise self._rejected(codec.local_rejection(now))
        if step is Step.RAMP:
            raise self._rejected(codec.ramp_rejection(now))
        if step is Step.LOCAL_OPEN:
            raise self._rejected(codec.local_open_rejection(now))
        call, token = codec.acquire_call()
        return AcquireStep(Step.ACQUIRE, self._pending(call, acquiring=True, token=token,
                                                       sent_at=now), token)

    def _pending(self, call: ScriptCall, acquiring: bool = False,
                 token: str = "", sent_at: float = 0.0) -> PendingCall:
        """`call` with its reply and outage handling. Its result: for an acquire the
        Permit (CallNotPermitted is raised), else the Reply (None: nobody answered)."""

        def answered(raw: Any) -> Any:
            reply = self._redis_reply(raw)
            return self._admit(reply, token, sent_at) if acquiring else reply

        def unavailable(error: BaseException | None) -> Any:
            self._redis_failed(error)
            reply = self._fallback(call, acquiring)
            return self._admit(reply, token, sent_at) if acquiring else reply

        return PendingCall(self._script, call.keys, call.args, self._health.usable,
                           answered, unavailable)

    def _admit(self, reply: Reply | None, token: str, sent_at: float = 0.0) -> Permit:
        """Turn the acquire reply into a permit, or raise CallNotPermitted.

        No reply while acquiring means the local fallback is still loading
        (fail_closed raises before): the call passes, nothing to protect yet.
        """
        if reply is None:
            return Permit()
        try:
            return self._codec.admission(reply, token, sent_at)
        except CallNotPermitted as rejection:
            self._rejected(rejection)
            raise

    def lease_rejection(self, permit: Permit) -> CallNotPermitted | None:
        """Checked immediately before the protected function is invoked: the rejection to
        raise (after handing the probe back, as ignored) when the permit's probe lease has
        already ended, else None."""
        return self._codec.expired_lease(permit, time.monotonic())

    def _record_call(self, permit: Permit, error: BaseException | None, duration: float,
                     outcome: Outcome | None = None) -> ScriptCall | None:
        """The record script call for a finished call, or None when nothing is recorded.

        `outcome` overrides the breaker's own classification (a Policy uses it to
        make the breaker ignore BulkheadFull and HTTP client errors).
        """
        codec = self._codec
        if outcome is None:
            outcome = codec.outcome(error)
        if self._listeners.wanted:
            self._call_events(outcome, error, duration)
        if self._flusher is not None and not permit.token and not (
                self._health.down and not self.fail_closed):
            # Batched mode, not a half-open probe: counted locally, flushed later.
            # (While Redis is down under fail_open, outcomes go to the local
            # fallback breaker at once, as in exact mode, so it still protects.)
            counts = codec.batched_counts(outcome, duration)
            if counts is not None:
                self._flusher.add(self, counts)
            return None
        return codec.record_call(permit, outcome, duration)

    def result_outcome(self, result: Any) -> Outcome | None:
        """How a returned value counts (None: no record_result, the default success)."""
        if self.config.record_result is None:
            return None
        return classify_result(self.config, result)

    # -- an operator's injected faults (only where the config allows them) -------------
    def _allow_faults(self, prefix: str) -> None:
        """allow_fault_injection: follow the prefix's injections (a thread per Redis and
        prefix, shared) and register this name as one that obeys them."""
        where = self.subscription() if self.config.allow_fault_injection else None
        if where is None:
            if self.config.allow_fault_injection:
                logger.warning("circuit breaker %s: allow_fault_injection needs a client a "
                               "thread can listen with (a URL or a sync client); no "
                               "injected fault will reach it", self.name)
            return
        self._fault_feed = FEEDS.join(self.name, where, prefix)

    def _leave_faults(self) -> None:
        feed, self._fault_feed = self._fault_feed, None
        if feed is not None:
            feed.leave(self.name)

    def _injected_rejection(self, feed: FaultFeed) -> CallNotPermitted | None:
        """The rejection an injection gives this call ("as if OPEN"), counted and
        reported apart from real ones (rejections["INJECTED"], `fault_injected`)."""
        fault = feed.table.rejection(self.name)
        if fault is None:
            return None
        self._codec.count_rejection("INJECTED")
        self.injected["reject"] += 1
        rejection = InjectedRejection(self.name, State.OPEN, 1.0,
                                      reason="fault injection: " + fault.describe(),
                                      actor=fault.actor)
        self._event("fault_injected", error=rejection, reason=fault.describe())
        return self._rejected(rejection)

    def _disturbance(self) -> Disturbance:
        """The injected error and latency of the call about to run (nothing when no
        injection covers it)."""
        feed = self._fault_feed
        if feed is None:
            return UNDISTURBED
        disturbance = feed.table.disturbance(self.name)
        if disturbance.error is not None:
            self.injected["error"] += 1
        if disturbance.latency:
            self.injected["latency"] += 1
            self._event("fault_injected", delay=disturbance.latency,
                        reason=f"latency {disturbance.latency:g}s injected")
        return disturbance

    def _injected_error(self, fault: Fault) -> InjectedFault:
        error = InjectedFault(self.name, fault.status, fault.reason, fault.actor)
        self._event("fault_injected", error=error, reason=fault.describe())
        return error

    def _event(self, kind: str, **fields: Any) -> None:
        """Emit one `Event` of `kind` if somebody listens (checked before building it)."""
        if kind in self._listeners.wanted:
            self._listeners.emit(Event(kind, "breaker", self.name, **fields))

    def _call_events(self, outcome: Outcome, error: BaseException | None,
                     duration: float) -> None:
        """The events of one finished call: its outcome, and slow (not when ignored)."""
        if outcome is Outcome.IGNORED:
            self._event("ignored_error", duration=duration, error=error)
            return
        if outcome is Outcome.FAILURE:
            self._event("error", duration=duration,
                        error=error if error is not None else ResultRecordedAsFailure(self.name))
        else:
            self._event("success", duration=duration)
        if duration * 1000 > to_ms(self.config.slow_call_duration):
            self._event("slow", duration=duration, error=error)

    def _rejected(self, rejection: CallNotPermitted) -> CallNotPermitted:
        """Emit not_permitted for `rejection` (returned, for the caller to raise)."""
        listeners = self._listeners
        if "not_permitted" in listeners.wanted:
            state = rejection.state
            why = rejection.reason or str.__str__(state)  # a State is a str: its value
            listeners.emit(rejection_event("not_permitted", "breaker", self.name, rejection,
                                           why, state), "not_permitted")
        return rejection

    def _transition_events(self, event: Transition) -> None:
        """failure_rate_exceeded / slow_call_rate_exceeded before a threshold trip."""
        if not event.reason.startswith(("failure rate", "slow call rate")):
            return
        config = self.config
        if event.failure_rate >= config.failure_rate_threshold:
            self._event("failure_rate_exceeded", rate=event.failure_rate,
                        reason=event.reason, state=event.from_state)
        if event.slow_rate >= config.slow_call_rate_threshold:
            self._event("slow_call_rate_exceeded", rate=event.slow_rate,
                        reason=event.reason, state=event.from_state)

    def _compact_args(self, permit: Permit, error: BaseException | None, duration: float,
                      outcome: Outcome | None) -> tuple[int, int] | None:
        """The exact mode's usual record in the compact form, decided without building
        the full call (the shells send it alone), or None: the full path."""
        if (error is not None or permit.token or self._flusher is not None
                or (outcome is not None and outcome is not Outcome.SUCCESS)
                or self._listeners.wanted):
            return None
        args = self._codec.compact_record(duration)
        # asked last: while Redis is down, True means this call is the one trial
        if args is None or not self._health.usable():
            return None
        return args

    def _compact_done(self, raw: Any) -> bool:
        """The compact record's reply: True when it was answered (now_ms), False when
        the script asks for the full form (0)."""
        if raw.__class__ is not int:
            return False
        self._redis_ok()  # Redis answered (a trial reported), 0 included
        if raw == 0:
            return False
        self._codec.compact_answered(raw, time.monotonic())
        return True

    def _compact_unavailable(self, permit: Permit, duration: float,
                             error: BaseException) -> None:
        """Redis did not answer the compact record: the full call's outage path (the
        local fallback records it, as for any record)."""
        call = self._codec.record_call(permit, Outcome.SUCCESS, duration)
        if call is not None:
            self._pending(call).on_unavailable(error)

    def _record_pending(self, permit: Permit, error: BaseException | None, duration: float,
                        outcome: Outcome | None = None) -> PendingCall | None:
        """The record call a finished call owes Redis now, or None (nothing to record,
        or batched)."""
        call = self._record_call(permit, error, duration, outcome)
        return None if call is None else self._pending(call)

    def _recording(self, error: BaseException | None) -> AbstractContextManager[None]:
        """Wrap sending the record of a call that ended with `error`: when that error
        must propagate, a failure to record is logged instead of raised."""
        return _LoggedNotRaised(self.name, error) if must_propagate(error) else _NO_GUARD

    def owed_record(self, permit: Permit, error: BaseException | None, duration: float,
                    outcome: Outcome | None = None) -> Owed | None:
        """The record this call still owes Redis, for a Policy to pipeline with others."""
        pending = self._record_pending(permit, error, duration, outcome)
        return None if pending is None else Owed(self._client, pending)

    # -- batched mode (the flusher sends these) ---------------------------------------
    def batch_pending(self, counts: Counts) -> PendingCall:
        """The record call carrying batched counts (no probe). Its outage path only
        notes that Redis is down: the flusher keeps the counts (see `spill_batch`)."""
        call = self._codec.batch_call(counts)
        return PendingCall(self._script, call.keys, call.args, self._health.usable,
                           self._redis_reply, self._batch_unavailable)

    def owed_batch(self, counts: Counts) -> Owed:
        """`batch_pending` with the client it must go through (the running loop's)."""
        return Owed(self._client, self.batch_pending(counts))

    def spill_batch(self, counts: Counts) -> bool:
        """Batched counts Redis could not take and that no longer fit: fail_open hands
        them to the local fallback breaker (True), fail_closed drops them (False)."""
        if self.fail_closed:
            return False
        self._fallback(self._codec.batch_call(counts), acquiring=False)
        return True

    def _batch_unavailable(self, error: BaseException | None) -> None:
        self._redis_failed(error)

    # -- replies --------------------------------------------------------------------
    def _redis_reply(self, raw: Any) -> Reply:
        """A protected call's script reply from Redis: Redis is healthy again."""
        self._redis_ok()
        return self._publish(decode_reply(raw), "redis")

    def _admin_reply(self, raw: Any, call: ScriptCall | None = None) -> Reply:
        """An operator action's or read's reply (these never use the fallback)."""
        reply = self._publish(decode_reply(raw), "redis")
        if call is not None and call.args[0] == "set" and call.args[5] == "RESET" \
                and "reset" in self._listeners.wanted:
            self._event("reset", reason=str(call.args[6]), state=reply.state)
        return reply

    def _local_reply(self, call: ScriptCall) -> Reply | None:
        """The local fallback breaker's reply; None while its runtime is still loading."""
        raw = self._local.run(self._script, call.keys, call.args)
        return None if raw is None else decode_reply(raw)

    def _publish(self, reply: Reply, source: str) -> Reply:
        if reply.transitions and source == "redis":
            recovered = any(a is State.HALF_OPEN and b is State.CLOSED
                            for a, b, _ in reply.transitions)
            SUBSCRIBERS.made_transition(self, reply.now_ms, recovered)
            if recovered:
                self._on_recovery()
        for event in self._codec.apply(reply, time.monotonic(), source):
            log_transition(event)
            if self._listeners.wanted:
                self._transition_events(event)
                self._listeners.emit(event, "transition")
        return reply

    def _redis_failed(self, error: BaseException | None) -> None:
        """Redis failed this call (`error`), or is in backoff (None: another component
        of the same Redis found it down): the next call asks again (or the fallback)."""
        if error is not None:
            self._health.failed(error)
        self._codec.forget_view()

    def _redis_ok(self) -> None:
        if self._local_used:  # Redis answers again: the fleet's state governs
            self._local_used = False
            self._unrecorded = (0, 0, 0, 0)
            self._local_open_to_all = False
            self._local_open_until = 0.0
            self._local_successes = (0, 0, 0, 0)
            self._local.reset(self.keys.script_keys)
        self._health.succeeded()

    def _fallback(self, call: ScriptCall, acquiring: bool) -> Reply | None:
        """Redis is unavailable: the local breaker answers, or (fail_closed) nobody."""
        if self.fail_closed:
            if acquiring:
                error = self._health.last_error or ConnectionError("redis unavailable")
                raise self._rejected(self._codec.redis_unavailable(error, self._health.retry_in()))
            return None
        if not self._local.ready():
            return self._loading_fallback(call, acquiring)
        if not self._local_used:
            self._start_local()
        if acquiring and self._local_open_until:
            left = self._local_open_until - time.monotonic()
            if left > 0:
                raise self._rejected(self._codec.inherited_rejection(State.OPEN, left))
        if self._local_open_to_all:
            if acquiring:
                return None  # permitted, as the local breaker would answer
            call = self._local_batch(call)  # type: ignore[assignment]
            if call is None:
                return None
        reply = self._local_reply(call)
        if reply is None:
            return None
        self._local_open_to_all = reply.state in _OPEN_TO_ALL
        self._local_open_until = time.monotonic() + reply.wait_ms / 1000.0 if (
            reply.state is State.OPEN and reply.wait_ms > 0) else 0.0
        return self._publish(reply, "local")

    def _local_batch(self, call: ScriptCall) -> ScriptCall | None:
        """The record to run on the local breaker now, or None: a plain success is summed
        until `_LOCAL_BATCH` are pending (a time window: or the first of them is 1 s
        old, so it does not see old successes as new); anything else carries the
        pending ones (a count window gets the same outcomes in the same order)."""
        counts = record_counts(call)
        now = time.monotonic()
        with self._local_lock:
            pending = self._local_successes
            if counts is not None and counts[1] == 0 and counts[2] == 0:
                if not pending[0]:
                    self._local_successes_since = now
                pending = _added(pending, counts)
                if pending[0] < _LOCAL_BATCH and (
                        self._count_window or now - self._local_successes_since < 1.0):
                    self._local_successes = pending
                    return None
                self._local_successes = (0, 0, 0, 0)
                return self._codec.batch_call(pending)
            self._local_successes = (0, 0, 0, 0)
        if pending[0]:
            batch = self._codec.batch_call(pending)
            self._local.run(self._script, batch.keys, batch.args)
        return call

    def _start_local(self) -> None:
        """The first fallback call since Redis answered: the local breaker starts from the
        last fleet state this process saw, then takes the records of the calls passed
        while it loaded."""
        self._local_used = True
        self._local_open_to_all = False
        self._local_open_until = 0.0
        self._local.reset(self.keys.script_keys)
        seed = self._codec.seed_call(time.monotonic())
        if seed is not None:
            self._local.run(self._script, seed.keys, seed.args)
        # A fresh local breaker is CLOSED: it needs no script run until an outcome it
        # must count now (per-tenant breakers cost nothing to fall back on).
        self._local_open_to_all = seed is None
        with self._local_lock:
            unrecorded, self._unrecorded = self._unrecorded, (0, 0, 0, 0)
        if any(unrecorded[:2]):
            batch = self._codec.batch_call(unrecorded)
            raw = self._local.run(self._script, batch.keys, batch.args)
            if raw is not None:
                self._local_open_to_all = decode_reply(raw).state in _OPEN_TO_ALL

    def _loading_fallback(self, call: ScriptCall, acquiring: bool) -> Reply | None:
        """The fallback runtime is still loading: the last known fleet state decides. A
        known OPEN (its wait over or not), HALF_OPEN or FORCED_OPEN rejects (the local
        breaker's probes start once it is ready); otherwise the call passes and its
        outcome is counted, for the local breaker to record once it is ready."""
        if not acquiring:
            counts = record_counts(call)
            if counts is not None:
                with self._local_lock:
                    self._unrecorded = _added(self._unrecorded, counts)
            return None
        state, open_left, _ = self._codec.inherited(time.monotonic())
        if state in (State.OPEN, State.HALF_OPEN, State.FORCED_OPEN):
            raise self._rejected(self._codec.inherited_rejection(state, open_left))
        return None


_NO_GUARD = contextlib.nullcontext()
#: States in which a breaker lets every call through.
_OPEN_TO_ALL = frozenset({State.CLOSED, State.DISABLED, State.METRICS_ONLY})
#: Plain successes summed before the local fallback records them (see `_local_batch`).
_LOCAL_BATCH = 100


def _added(a: Counts, b: Counts) -> Counts:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def record_counts(call: ScriptCall) -> Counts | None:
    """The outcome counts a record call without a probe token carries (None: another op
    or a probe, which the local fallback cannot take before it exists)."""
    args = call.args
    if args[0] != "record" or args[5]:
        return None
    return (int(args[6]), int(args[7]), int(args[8]), int(args[9]))
