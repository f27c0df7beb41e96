"""Breaker configuration: a frozen, validated dataclass and its wire form.

Durations are seconds (`float` or `datetime.timedelta`) here and integer
milliseconds on the wire. The wire form (`to_wire()`) is what every script
call carries; it doubles as the config fingerprint stored beside the state.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeAlias

from .._runtime.options import (
    RedisErrorPolicy,
    Seconds,
    check_int,
    check_percent,
    check_redis_options,
    exception_types,
    merge_options,
    to_ms,
    to_seconds,
)
from .sampling import MAX_SAMPLES, parse_rate
from .state import State

WIRE_VERSION = "1"


class WindowType(str, Enum):
    """Kind of sliding window (Resilience4j names)."""

    COUNT_BASED = "COUNT_BASED"
    TIME_BASED = "TIME_BASED"


class RecordMode(str, Enum):
    """How outcomes reach Redis: one record per call, or counts flushed in batches."""

    EXACT = "exact"
    BATCHED = "batched"


_WINDOW_ALIASES = {"COUNT": WindowType.COUNT_BASED, "TIME": WindowType.TIME_BASED}
#: Wire codes of the optional fields 13 (initial state) and 14 (after max half-open).
_INITIAL_CODES = {State.CLOSED: "C", State.FORCED_OPEN: "F", State.METRICS_ONLY: "M",
                  State.DISABLED: "D"}
_AFTER_HALF_OPEN_CODES = {State.OPEN: "O", State.CLOSED: "C"}
MAX_COUNT_WINDOW = 100_000
MAX_TIME_WINDOW = 3_600
#: Shadow configs (docs/guides/shadow.md): at most this many per breaker, named so.
MAX_SHADOWS = 3
SHADOW_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,40}")
#: `shadow`: candidate name -> a BreakerConfig, or a mapping of the fields that differ
#: from this config (normalised to ((name, BreakerConfig), ...)).
Shadows: TypeAlias = Mapping[str, Any] | tuple[tuple[str, Any], ...]












@dataclasses.dataclass(frozen=True)
class BreakerConfig:
    """Resilience4j's circuit breaker settings, with Resilience4j's defaults.

    `half_open_lease` bounds how long a half-open probe may stay unreported
    before its slot is handed to another worker (a SIGKILLed worker's probe).
    `key_ttl` is how long an idle breaker's keys live in Redis.
    `initial_state` is the state a new breaker starts in (CLOSED, FORCED_OPEN,
    METRICS_ONLY, DISABLED; again whenever its keys have expired);
    `transition_after_max_wait_in_half_open` where a HALF_OPEN that outlived
    `max_wait_in_half_open` goes: OPEN (default) or CLOSED (Resilience4j 2.x).
    `wait_interval_multiplier`, `max_wait_duration_in_open_state` and
    `wait_randomization_factor` make the open wait Resilience4j's
    waitIntervalFunctionInOpenState as data: the wait times multiplier^(opens in a row
    - 1), capped (0: at `key_ttl`), spread by +-factor; decided in the script by server
    time, the count reset by a close.
    `record_mode` "batched" accumulates CLOSED outcomes in the process and
    flushes them as counts at most every `flush_interval` seconds, or as soon
    as `max_batch` outcomes of one breaker are pending; while Redis is
    unreachable up to `max_pending` outcomes are kept, beyond that the
    `on_redis_error` policy takes them (see docs/ARCHITECTURE.md).
    `subscribe` listens on the events channel (one connection per server per
    process, from the first call), so a transition made by another worker or an
    operator drops this process's local view at once; `revalidate_interval` bounds
    how long a rejecting view (OPEN, FORCED_OPEN) is trusted without asking Redis,
    which bounds staleness when pub/sub is down or not permitted.
    Classification follows Resilience4j: `ignore_exceptions` / `ignore_predicate`
    win; then an exception is a failure if it is one of `record_exceptions` or
    `record_predicate` says so (with neither given, every `Exception` is a
    failure); anything else counts as a success.
    `record_result` (Resilience4j's recordResult) is asked about every value a
    call returns except None (as Resilience4j never tests a null result): True
    counts that call as a failure, the value is still returned to the caller.
    Exceptions never reach it, and results never reach the exception rules.
    `ramp_duration` > 0 turns on slow start: after HALF_OPEN -> CLOSED the fleet admits
    a share of calls growing from `ramp_start` to 1 over `ramp_duration` seconds from
    the transition's server time; each worker rejects the rest locally
    (CallNotPermitted with reason "ramping"), so a recovering dependency is not hit by
    every worker at once. Workers learn of the recovery from the reply that made it or
    from the events channel (with `subscribe`).
    `config_version` (wire field 22; 0: none) orders configs in a rollout: a config
    with a higher version replaces the one in force at its first worker's call, one
    with a lower version never does by itself; equal versions go by deploy time (the
    newest deployment wins). See docs/OPERATIONS.md, "Changing a breaker's config".
    `min_failing_workers` > 1 gates the failure-rate trip on a quorum: the breaker
    opens fleet-wide only when failures came from at least that many distinct workers
    (process ids) within `quorum_window` seconds. Until then no worker is rejected
    for other workers' failures: only a worker whose record carried failures and found
    the fleet's rates exceeded, and whose OWN recent outcomes (this process's window of
    the same shape) exceed the rates, opens its own local view for one open wait (a
    worker with a broken network path cannot open the breaker for everyone, and a
    healthy worker keeps serving).
    `allow_fault_injection` (default False: never on unless asked) lets an operator's
    `distbreaker inject` reach this breaker's calls: injected errors, latency and
    rejections, marked as injected (docs/guides/fault_injection.md). It is not part of
    the wire string: each worker decides for itself.
    `record_sample_rate` (0: off, the default; a fraction or ``"10%"``) samples that
    share of recorded outcomes (time, outcome, duration, worker) into the name's capped
    stream (at most about `record_max_samples` entries, expiring `record_ttl` after the
    last sample), in the same script call as the record: ``distbreaker record export``
    reads it, ``distbreaker replay`` replays it against candidate configs.
    ``distbreaker record start NAME --rate 10% --for 1h`` turns it on at run time.
    """

    failure_rate_threshold: float = 50.0
    slow_call_rate_threshold: float = 100.0
    slow_call_duration: Seconds = 60.0
    sliding_window_type: WindowType | str = WindowType.COUNT_BASED
    sliding_window_size: int = 100
    minimum_number_of_calls: int = 100
    wait_duration_in_open_state: Seconds = 60.0
    permitted_calls_in_half_open: int = 10
    max_wait_in_half_open: Seconds = 0.0
    half_open_lease: Seconds = 60.0
    key_ttl: Seconds = 3600.0
    record_exceptions: tuple[type[BaseException], ...] = ()
    ignore_exceptions: tuple[type[BaseException], ...] = ()
    record_predicate: Callable[[BaseException], bool] | None = None
    ignore_predicate: Callable[[BaseException], bool] | None = None
    record_result: Callable[[Any], bool] | None = None
    on_redis_error: RedisErrorPolicy | str = RedisErrorPolicy.FAIL_OPEN
    redis_timeout: Seconds = 0.25
    redis_retry_max_backoff: Seconds = 5.0
    record_mode: RecordMode | str = RecordMode.EXACT
    flush_interval: Seconds = 0.01
    max_batch: int = 1000
    max_pending: int = 10_000
    subscribe: bool = True
    revalidate_interval: Seconds = 1.0
    initial_state: State | str = State.CLOSED
    transition_after_max_wait_in_half_open: State | str = State.OPEN
    wait_interval_multiplier: float = 1.0
    max_wait_duration_in_open_state: Seconds = 0.0
    wait_randomization_factor: float = 0.0
    ramp_duration: Seconds = 0.0
    ramp_start: float = 0.1
    min_failing_workers: int = 1
    quorum_window: Seconds = 60.0
    config_version: int = 0
    allow_fault_injection: bool = False
    record_sample_rate: float | str = 0.0
    record_max_samples: int = 10_000
    record_ttl: Seconds = 86_400.0
    shadow: Shadows = ()

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "failure_rate_threshold",
            check_percent(self.failure_rate_threshold, "failure_rate_threshold"))
        put(self, "slow_call_rate_threshold",
            check_percent(self.slow_call_rate_threshold, "slow_call_rate_threshold"))
        window_type = self.sliding_window_type
        if isinstance(window_type, str) and not isinstance(window_type, WindowType):
            key = window_type.upper()
            window_type = _WINDOW_ALIASES.get(key) or (
                WindowType(key) if key in WindowType.__members__ else None)
            if window_type is None:
                raise ValueError(
                    "sliding_window_type must be COUNT_BASED or TIME_BASED, "
                    f"got {self.sliding_window_type!r}")
        if not isinstance(window_type, WindowType):
            raise ValueError(f"sliding_window_type must be COUNT_BASED or TIME_BASED, "
                             f"got {self.sliding_window_type!r}")
        put(self, "sliding_window_type", window_type)
        top = MAX_COUNT_WINDOW if window_type is WindowType.COUNT_BASED else MAX_TIME_WINDOW
        check_int(self.sliding_window_size, "sliding_window_size", 1, top)
        check_int(self.minimum_number_of_calls, "minimum_number_of_calls", 1, 1_000_000_000)
        check_int(self.permitted_calls_in_half_open, "permitted_calls_in_half_open", 1, 10_000)
        for field in ("wait_duration_in_open_state", "max_wait_in_half_open", "key_ttl"):
            put(self, field, to_seconds(getattr(self, field), field))
        for field in ("slow_call_duration", "half_open_lease"):
            put(self, field, to_seconds(getattr(self, field), field, positive=True))
        check_redis_options(self)
        if self.wait_duration_in_open_state < 0.001:
            raise ValueError("wait_duration_in_open_state must be >= 0.001 seconds, "
                             f"got {self.wait_duration_in_open_state!r}")
        floor = max(self.wait_duration_in_open_state, self.max_wait_in_half_open,
                    self.half_open_lease,
                    self.sliding_window_size if window_type is WindowType.TIME_BASED else 0)
        if self.key_ttl < floor:
            raise ValueError(f"key_ttl must be >= {floor} seconds (the longest wait, lease or "
                             f"time window), got {self.key_ttl!r}")
        put(self, "record_exceptions",
            exception_types(self.record_exceptions, "record_exceptions"))
        put(self, "ignore_exceptions",
            exception_types(self.ignore_exceptions, "ignore_exceptions"))
        for field in ("record_predicate", "ignore_predicate", "record_result"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise ValueError(f"{field} must be callable or None, got {value!r}")
        self._check_batching()
        for field, allowed in (("initial_state", _INITIAL_CODES),
                               ("transition_after_max_wait_in_half_open",
                                _AFTER_HALF_OPEN_CODES)):
            value = getattr(self, field)
            try:
                state = State(value.upper() if isinstance(value, str) else value)
            except ValueError:
                state = None
            if state not in allowed:
                raise ValueError(f"{field} must be one of "
                                 f"{', '.join(s.value for s in allowed)}, got {value!r}")
            put(self, field, state)
        self._check_wait_interval()
        self._check_recording()
        self._check_shadow()

    def _check_recording(self) -> None:
        """Outcome recording (off by default): the share of record calls sampled into the
        name's capped stream, its cap (entries) and TTL (docs/KEY_SCHEMA.md)."""
        put = object.__setattr__
        put(self, "record_sample_rate", parse_rate(self.record_sample_rate))
        check_int(self.record_max_samples, "record_max_samples", 1, MAX_SAMPLES)
        ttl = to_seconds(self.record_ttl, "record_ttl")
        if ttl < 1:
            raise ValueError(f"record_ttl must be >= 1 second, got {self.record_ttl!r}")
        put(self, "record_ttl", ttl)

    def _check_shadow(self) -> None:
        """`shadow` as ((name, candidate BreakerConfig), ...): a mapping's entries are
        the candidate's fields that differ from this config."""
        shadow = self.shadow
        items = shadow.items() if isinstance(shadow, Mapping) else shadow
        if not isinstance(items, (tuple, list)) and not isinstance(shadow, Mapping):
            raise ValueError(f"shadow must be a mapping of names to configs, got {shadow!r}")
        found: list[tuple[str, BreakerConfig]] = []
        for entry in items:
            name, candidate = entry
            if not isinstance(name, str) or not SHADOW_NAME.fullmatch(name):
                raise ValueError(f"shadow names must be 1-40 letters, digits, '_', '.' or '-', "
                                 f"got {name!r}")
            if isinstance(candidate, BreakerConfig):
                candidate = candidate.replace(shadow=()) if candidate.shadow else candidate
            elif isinstance(candidate, Mapping):
                unknown = sorted(str(f) for f in candidate
                                 if f not in _FIELD_NAMES or f == "shadow")
                if unknown:
                    raise ValueError(f"shadow {name!r}: unknown setting {unknown[0]!r}")
                try:
                    candidate = dataclasses.replace(self, shadow=(), **candidate)
                except ValueError as error:
                    raise ValueError(f"shadow {name!r}: {error}") from None
            else:
                raise ValueError(f"shadow {name!r} must be a mapping of settings or a "
                                 f"BreakerConfig, got {candidate!r}")
            found.append((name, candidate))
        if len(found) > MAX_SHADOWS:
            raise ValueError(f"shadow: at most {MAX_SHADOWS} candidates, got {len(found)}")
        if len({n for n, _ in found}) != len(found):
            raise ValueError("shadow: a name is given twice")
        object.__setattr__(self, "shadow", tuple(found))

    def _check_wait_interval(self) -> None:
        put = object.__setattr__
        for field, low, high in (("wait_interval_multiplier", 1.0, 1000.0),
                                 ("wait_randomization_factor", 0.0, 1.0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not low <= value <= high:
                raise ValueError(f"{field} must be a number in [{low:g}, {high:g}], "
                                 f"got {value!r}")
            put(self, field, float(value))
        cap = to_seconds(self.max_wait_duration_in_open_state,
                         "max_wait_duration_in_open_state")
        if cap and not self.wait_duration_in_open_state <= cap <= self.key_ttl:
            raise ValueError("max_wait_duration_in_open_state must be 0 (the key TTL) or "
                             "between wait_duration_in_open_state and key_ttl, "
                             f"got {self.max_wait_duration_in_open_state!r}")
        put(self, "max_wait_duration_in_open_state", cap)
        put(self, "ramp_duration", to_seconds(self.ramp_duration, "ramp_duration"))
        ramp = self.ramp_start
        if isinstance(ramp, bool) or not isinstance(ramp, (int, float)) or not 0 < ramp <= 1:
            raise ValueError(f"ramp_start must be a number in (0, 1], got {ramp!r}")
        put(self, "ramp_start", float(ramp))
        check_int(self.min_failing_workers, "min_failing_workers", 1, 10_000)
        check_int(self.config_version, "config_version", 0, 2**53)
        put(self, "quorum_window", to_seconds(self.quorum_window, "quorum_window",
                                              positive=True))
        try:
            put(self, "on_redis_error", RedisErrorPolicy(self.on_redis_error))
        except ValueError:
            raise ValueError("on_redis_error must be 'fail_open' or 'fail_closed', "
                             f"got {self.on_redis_error!r}") from None

    def _check_batching(self) -> None:
        put = object.__setattr__
        try:
            put(self, "record_mode", RecordMode(self.record_mode))
        except ValueError:
            raise ValueError("record_mode must be 'exact' or 'batched', "
                             f"got {self.record_mode!r}") from None
        put(self, "flush_interval", to_seconds(self.flush_interval, "flush_interval"))
        if not 0.0005 <= self.flush_interval <= 60:
            raise ValueError("flush_interval must be in [0.0005, 60] seconds, "
                             f"got {self.flush_interval!r}")
        check_int(self.max_batch, "max_batch", 1, 1_000_000)
        check_int(self.max_pending, "max_pending", self.max_batch, 1_000_000_000)
        put(self, "revalidate_interval",
            to_seconds(self.revalidate_interval, "revalidate_interval"))
        if not 0.001 <= self.revalidate_interval <= 60:
            raise ValueError("revalidate_interval must be in [0.001, 60] seconds, "
                             f"got {self.revalidate_interval!r}")
        for flag in ("subscribe", "allow_fault_injection"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")

    @property
    def batched(self) -> bool:
        """True when outcomes are flushed in batches (record_mode "batched")."""
        return self.record_mode is RecordMode.BATCHED

    @property
    def effective_minimum_calls(self) -> int:
        """Resilience4j caps the minimum at the window size for count windows."""
        if self.sliding_window_type is WindowType.COUNT_BASED:
            return min(self.minimum_number_of_calls, self.sliding_window_size)
        return self.minimum_number_of_calls

    def replace(self, **changes: Any) -> BreakerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> str:
        """The semicolon-separated form the scripts parse (see docs/KEY_SCHEMA.md)."""
        parts = [
            WIRE_VERSION,
            "C" if self.sliding_window_type is WindowType.COUNT_BASED else "T",
            str(self.sliding_window_size),
            str(self.effective_minimum_calls),
            _num(self.failure_rate_threshold),
            _num(self.slow_call_rate_threshold),
            str(to_ms(self.wait_duration_in_open_state)),
            str(self.permitted_calls_in_half_open),
            str(to_ms(self.max_wait_in_half_open)),
            str(to_ms(self.half_open_lease)),
            str(to_ms(self.key_ttl)),
            str(to_ms(self.slow_call_duration)),
        ]
        # optional fields, written up to the last non-default one (a default config's
        # string is the same as before they existed: no drift with older clients)
        extra = [_INITIAL_CODES[State(self.initial_state)],
                 _AFTER_HALF_OPEN_CODES[State(self.transition_after_max_wait_in_half_open)],
                 _num(self.wait_interval_multiplier),
                 str(to_ms(self.max_wait_duration_in_open_state)),
                 _num(self.wait_randomization_factor),
                 str(to_ms(self.ramp_duration)), _num(self.ramp_start),
                 str(self.min_failing_workers), str(to_ms(self.quorum_window)),
                 str(self.config_version)]
        defaults = ["C", "O", "1", "0", "0", "0", "0.1", "1", "60000", "0"]
        while extra and extra[-1] == defaults[len(extra) - 1]:
            extra.pop()
        return ";".join(parts + extra)

    @classmethod
    def from_wire(cls, wire: str) -> BreakerConfig:
        """Rebuild the config a wire string describes (e.g. the `cfg` stored beside a breaker).

        Only the fields the wire carries are restored; classification and Redis
        client settings keep their defaults. ``from_wire(w).to_wire() == w`` for
        any wire written by `to_wire`. Raises ValueError on a malformed string.
        """
        parts = wire.split(";") if isinstance(wire, str) else []
        if len(parts) < 12 or parts[0] != WIRE_VERSION or parts[1] not in ("C", "T"):
            raise ValueError(f"not a v{WIRE_VERSION} breaker config wire string: {wire!r}")
        try:
            size, minimum, wait, permitted, half_open, lease, ttl, slow = (
                int(p) for p in (parts[2], parts[3], *parts[6:12]))
            failure, slow_rate = float(parts[4]), float(parts[5])
            initial = {c: st for st, c in _INITIAL_CODES.items()}[
                parts[12] if len(parts) > 12 else "C"]
            after = {c: st for st, c in _AFTER_HALF_OPEN_CODES.items()}[
                parts[13] if len(parts) > 13 else "O"]
            mult = float(parts[14]) if len(parts) > 14 else 1.0
            cap = int(parts[15]) / 1000 if len(parts) > 15 else 0.0
            spread = float(parts[16]) if len(parts) > 16 else 0.0
            ramp_ms = int(parts[17]) if len(parts) > 17 else 0
            ramp_start = float(parts[18]) if len(parts) > 18 else 0.1
            quorum = int(parts[19]) if len(parts) > 19 else 1
            quorum_ms = int(parts[20]) if len(parts) > 20 else 60000
            version = int(parts[21]) if len(parts) > 21 else 0
        except (ValueError, KeyError):
            raise ValueError(f"not a v{WIRE_VERSION} breaker config wire string: "
                             f"{wire!r}") from None
        return cls(
            failure_rate_threshold=failure, slow_call_rate_threshold=slow_rate,
            slow_call_duration=slow / 1000, sliding_window_type=(
                WindowType.COUNT_BASED if parts[1] == "C" else WindowType.TIME_BASED),
            sliding_window_size=size, minimum_number_of_calls=minimum,
            wait_duration_in_open_state=wait / 1000, permitted_calls_in_half_open=permitted,
            max_wait_in_half_open=half_open / 1000, half_open_lease=lease / 1000,
            key_ttl=ttl / 1000, initial_state=initial,
            transition_after_max_wait_in_half_open=after, wait_interval_multiplier=mult,
            max_wait_duration_in_open_state=cap, wait_randomization_factor=spread,
            ramp_duration=ramp_ms / 1000, ramp_start=ramp_start,
            min_failing_workers=quorum, quorum_window=quorum_ms / 1000,
            config_version=version,
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


#: The fields the wire form carries, in wire order (the ones a fleet must agree on).
WIRE_FIELDS = ("sliding_window_type", "sliding_window_size", "minimum_number_of_calls",
               "failure_rate_threshold", "slow_call_rate_threshold",
               "wait_duration_in_open_state", "permitted_calls_in_half_open",
               "max_wait_in_half_open", "half_open_lease", "key_ttl", "slow_call_duration",
               "initial_state", "transition_after_max_wait_in_half_open",
               "wait_interval_multiplier", "max_wait_duration_in_open_state",
               "wait_randomization_factor", "ramp_duration", "ramp_start",
               "min_failing_workers", "quorum_window", "config_version")


def config_differences(ours: BreakerConfig,
                       other: BreakerConfig) -> list[tuple[str, Any, Any]]:
    """``(field, ours, other)`` for each wire-carried field where two configs differ,
    so a drift message can name them (the minimum is compared as the script sees it)."""
    def value(config: BreakerConfig, field: str) -> Any:
        if field == "minimum_number_of_calls":
            return config.effective_minimum_calls
        found = getattr(config, field)
        return found.value if isinstance(found, Enum) else found

    return [(f, value(ours, f), value(other, f)) for f in WIRE_FIELDS
            if value(ours, f) != value(other, f)]






_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(BreakerConfig))


def build_config(config: BreakerConfig | None, overrides: dict[str, Any]) -> BreakerConfig:
    """Merge constructor keyword overrides into a breaker config."""
    return merge_options(BreakerConfig, config, overrides, "breaker")
