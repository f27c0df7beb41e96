"""The pool's pure core, shared by the sync and asyncio front ends (no I/O).

It builds the ``lua/pool.lua`` calls, decodes their replies, classifies outcomes
(Envoy's kinds: success, 5xx, gateway failure, local-origin failure) and decides what a
Redis outage means for a pick (fail open: a member this process last saw healthy). Every
ejection decision is the script's: this module only reports what the script did.
"""

from __future__ import annotations

import dataclasses
import random
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .._runtime import forking
from .._runtime.classify import parse_retry_after, retry_after_of, status_of
from .._runtime.events import Event, Listeners
from .._runtime.health import shared_health
from .._runtime.keys import DEFAULT_PREFIX, PoolKeys, validate_name
from .._runtime.options import to_ms, to_seconds
from .._runtime.scripts import PendingCall, load_script, text
from .config import Members, PoolConfig, build_pool_config, normalize_members, validate_member

SCRIPT_NAME = "pool"

#: Member states (the wire's integers are their indexes).
STATES = ("healthy", "ejected", "probing")
#: Why a member was ejected (the wire's integer is the index; 0: never ejected).
REASONS = ("", "consecutive_5xx", "consecutive_gateway_failure",
           "consecutive_local_origin_failure", "success_rate", "failure_percentage",
           "latency", "retry_after", "operator", "probe_failed")
#: Operator overrides on a member (wire integers: the index).
OVERRIDES = ("", "forced_ejection", "exempt")
#: Pick modes (wire integers).
MODES = ("normal", "panic", "probe")

#: The kinds of events a pool's listeners get (per process): what a call of this process
#: did to a member (ejected, capped: not ejected because of max_ejection_percent, probing,
#: recovered, unejected), and picked (every pick; `reason`: the member).
EVENT_KINDS = ("ejected", "capped", "probing", "recovered", "unejected", "exempted", "picked")
DEFAULT_EVENT_KINDS = ("ejected", "capped", "probing", "recovered", "unejected", "exempted")

#: Outcomes (Envoy's): s success, e 5xx, g gateway failure (502/503/504),
#: l local-origin failure (connect refused, reset, timeout: no response at all).
OUTCOMES = {"success": "s", "5xx": "e", "gateway": "g", "local": "l",
            "s": "s", "e": "e", "g": "g", "l": "l"}
GATEWAY_STATUSES = frozenset((502, 503, 504))
#: Exception class names (anywhere in the MRO) that mean no response: a local-origin failure.
_LOCAL_NAMES = ("ConnectError", "ConnectionError", "ConnectTimeout", "Timeout",
                "TimeoutError", "TimeoutException", "ReadTimeout", "RemoteProtocolError",
                "ClientConnectorError", "ServerDisconnectedError")

#: The member record's fields on the wire, in order (docs/KEY_SCHEMA.md, Pool).
RECORD_FIELDS = ("state", "until_ms", "weight", "probe_successes", "ewma_us", "multiplier",
                 "consecutive_5xx", "consecutive_gateway", "consecutive_local", "ok", "failed",
                 "latency_ms", "latency_n", "prev_ok", "prev_failed", "prev_latency_ms",
                 "prev_latency_n", "override", "why", "ejected_at_ms", "ejections", "capped",
                 "slow", "prev_slow")


@dataclasses.dataclass(frozen=True)
class MemberStatus:
    """One member as the fleet sees it (read from Redis).

    `state` "healthy", "ejected" or "probing" (back from ejection: `probe_calls` calls one
    at a time decide); `ejected_until` server time (epoch seconds) of an ejection's end,
    `why` the reason of the last ejection; `in_flight` fleet-wide picks not yet recorded;
    `success_rate` (percent, None without calls) and `mean_latency` (seconds) over the last
    closed interval, `calls` / `failures` in the current one; `ejections` since the member
    was added, `multiplier` the factor of the next ejection's base time; `override`
    "forced_ejection" (an operator's), "exempt" or ""; `capped` True while the cap refuses
    to eject it (it stays in the rotation); `slow_share` the percent of its timed calls
    slower than the pool's latency threshold in the last closed interval.
    """

    member: str
    state: str
    weight: int
    in_flight: int
    ejected_until: float | None
    why: str
    ejections: int
    multiplier: int
    consecutive_5xx: int
    consecutive_gateway_failure: int
    consecutive_local_origin_failure: int
    calls: int
    failures: int
    success_rate: float | None
    mean_latency: float | None
    latency_ewma: float | None
    override: str
    last_ejected_at: float | None
    capped: bool = False
    slow_share: float | None = None

    @property
    def ejected(self) -> bool:
        return self.state == "ejected"


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    """A pool as the fleet sees it: its members (sorted by name), how many are ejected,
    whether a pick would panic (too few healthy: every member is a candidate), the server
    time it was read at (epoch seconds), the config string of the last interval's close and
    the pool's latency threshold in force (seconds; None until an interval had enough
    timed calls)."""

    name: str
    members: tuple[MemberStatus, ...]
    ejected: int
    panic: bool
    read_at: float
    interval_started: float | None
    config_wire: str
    latency_threshold: float | None = None

    def member(self, name: str) -> MemberStatus:
        for m in self.members:
            if m.member == name:
                return m
        raise KeyError(name)

    @property
    def healthy(self) -> int:
        return len(self.members) - self.ejected


@dataclasses.dataclass(frozen=True)
class MemberChange:
    """A record / eject / uneject reply: the member's state after the call and what the
    call did to it (`event`: "", "ejected", "capped", "probing", "recovered",
    "unejected"); `state` "" when the pool has no such member."""

    member: str
    state: str
    ejected_until: float | None
    why: str
    event: str


class Pick:
    """A member chosen by `pick()`: use `member`, then record the outcome once
    (``pool.record(pick, ...)``, or leave a ``with pool.use()`` block).

    `mode` "normal", "panic" (too few healthy members: chosen among all) or "probe" (one
    of the calls a member back from ejection gets); `source` "redis" or "local" (Redis
    unreachable: chosen by this process alone, not counted fleet-wide). `status`,
    `headers`, `outcome` may be set inside a ``with`` block to say how the call went
    (an HTTP status of a response that raised nothing, for example).
    """

    __slots__ = (
        "eject_for",
        "headers",
        "member",
        "mode",
        "outcome",
        "recorded",
        "source",
        "started",
        "status",
        "token",
    )

    def __init__(self, member: str, token: str, mode: str = "normal",
                 source: str = "redis") -> None:
        self.member = member
        self.token = token
        self.mode = mode
        self.source = source
        self.started = time.monotonic()
        self.recorded = False
        self.status: int | None = None
        self.headers: Any = None
        self.outcome: str | None = None
        self.eject_for: float | None = None

    def __repr__(self) -> str:
        return f"Pick({self.member!r}, mode={self.mode!r}, source={self.source!r})"

    def __str__(self) -> str:
        return self.member


def is_local_origin(error: BaseException) -> bool:
    """No response at all (refused, reset, timed out): Envoy's local-origin failure."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return any(cls.__name__ in _LOCAL_NAMES for cls in type(error).__mro__)


def outcome_of(status: int | None = None, error: BaseException | None = None,
               outcome: str | None = None) -> str:
    """The wire outcome (s, e, g, l) of a call: an explicit `outcome`, else the HTTP
    status (502/503/504 gateway, other 5xx and 429 failures, the rest success), else the
    error (an HTTP status it carries; no response: local origin; any other: 5xx)."""
    if outcome is not None:
        try:
            return OUTCOMES[outcome]
        except KeyError:
            raise ValueError(f"outcome must be one of success, 5xx, gateway, local; "
                             f"got {outcome!r}") from None
    if status is None and error is not None:
        status = status_of(error)
        if status is None:
            return "l" if is_local_origin(error) else "e"
    if status is None:
        return "s"
    if status in GATEWAY_STATUSES:
        return "g"
    if status >= 500 or status == 429:
        return "e"
    return "s"


def decode_record(raw: str) -> list[int]:
    values = [int(x) for x in text(raw).split()]
    if len(values) != len(RECORD_FIELDS):
        raise ValueError(f"a pool member record has {len(values)} fields, expected "
                         f"{len(RECORD_FIELDS)}")
    return values


def member_status(name: str, rec: Sequence[int], in_flight: int, now_ms: int) -> MemberStatus:
    """A member's record (the wire's integers) as a `MemberStatus` at server time now_ms."""
    r = dict(zip(RECORD_FIELDS, rec, strict=True))
    state = STATES[r["state"]] if 0 <= r["state"] < len(STATES) else "healthy"
    if state == "ejected" and r["until_ms"] <= now_ms:
        state = "probing"  # written lazily by the next call
    calls = r["prev_ok"] + r["prev_failed"]
    return MemberStatus(
        member=name, state=state, weight=r["weight"], in_flight=max(0, in_flight),
        ejected_until=r["until_ms"] / 1000 if state == "ejected" else None,
        why=REASONS[r["why"]] if 0 <= r["why"] < len(REASONS) else str(r["why"]),
        ejections=r["ejections"], multiplier=r["multiplier"],
        consecutive_5xx=r["consecutive_5xx"],
        consecutive_gateway_failure=r["consecutive_gateway"],
        consecutive_local_origin_failure=r["consecutive_local"],
        calls=r["ok"] + r["failed"], failures=r["failed"],
        success_rate=100.0 * r["prev_ok"] / calls if calls else None,
        mean_latency=(r["prev_latency_ms"] / r["prev_latency_n"] / 1000
                      if r["prev_latency_n"] else None),
        latency_ewma=r["ewma_us"] / 1e6 if r["ewma_us"] else None,
        override=_override(r, now_ms),
        last_ejected_at=r["ejected_at_ms"] / 1000 if r["ejected_at_ms"] else None,
        capped=bool(r["capped"]),
        slow_share=(100.0 * r["prev_slow"] / r["prev_latency_n"] if r["prev_latency_n"]
                    else None),
    )


def _override(r: dict[str, int], now_ms: int) -> str:
    name = OVERRIDES[r["override"]] if 0 <= r["override"] < len(OVERRIDES) else ""
    if name == "exempt" and 0 < r["until_ms"] <= now_ms:
        return ""  # the exemption ended (written by the member's next record)
    return name


def decode_status(name: str, raw: Sequence[Any], panic_threshold: int | None = None) -> PoolStatus:
    """The status reply (``{now_ms, iv, cfg, lt, n, name, record, in-flight, ...}``)."""
    now_ms, iv, cfg, lt, n = int(raw[0]), int(raw[1]), text(raw[2]), int(raw[3]), int(raw[4])
    members = []
    for j in range(n):
        base = 5 + 3 * j
        members.append(member_status(text(raw[base]), decode_record(raw[base + 1]),
                                     int(raw[base + 2]), now_ms))
    ejected = sum(1 for m in members if m.ejected)
    if panic_threshold is None:
        panic_threshold = _panic_of_wire(cfg)
    panic = bool(members) and (len(members) - ejected) * 100 < panic_threshold * len(members)
    return PoolStatus(name, tuple(members), ejected, panic, now_ms / 1000,
                      iv / 1000 if iv else None, cfg, lt / 1000 if lt else None)


def _panic_of_wire(cfg: str) -> int:
    parts = cfg.split(",")
    try:
        return int(parts[23])
    except (IndexError, ValueError):
        return 50


def decode_change(member: str, raw: Sequence[Any]) -> MemberChange:
    st, until, why, event = int(raw[0]), int(raw[1]), int(raw[2]), text(raw[3])
    state = STATES[st] if 0 <= st < len(STATES) else ""
    return MemberChange(member, state, until / 1000 if state == "ejected" else None,
                        REASONS[why] if 0 <= why < len(REASONS) else str(why), event)


class PoolCore:
    """Everything about one pool that is neither I/O nor a front end."""

    def __init__(self, name: str, config: PoolConfig | None, prefix: str,
                 overrides: dict[str, Any], redis: Any = None) -> None:
        self.name = validate_name(name)
        self.config = build_pool_config(config, overrides)
        self.prefix = prefix or DEFAULT_PREFIX
        self.keys = PoolKeys.build(name, self.prefix)
        self._script = load_script(SCRIPT_NAME)
        self._health = shared_health(redis, self.config.redis_retry_max_backoff)
        self._wire = self.config.wire
        self._lock = threading.Lock()
        #: The members this process knows (config, set_members, picks), for the fallback
        #: and to put the pool back when its keys expired.
        self._known: dict[str, int] = dict(self.config.members)
        self._members_set: Members = self.config.members
        #: Members this process saw ejected, until when (monotonic): the fallback avoids them.
        self._seen_ejected: dict[str, float] = {}
        self._rng = random.Random()
        self.listeners = Listeners(EVENT_KINDS, default=DEFAULT_EVENT_KINDS)
        forking.register(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random()

    # -- calls ---------------------------------------------------------------------------
    def _args(self, op: str, *extra: Any) -> list[str]:
        return [op, self._wire, *(str(x) for x in extra)]

    def pick_pending(self, key: Any = None, avoid: Iterable[str] = (),
                     track: bool = True) -> PendingCall:
        """The pick call; its result is a `Pick` (None: the pool has no member in Redis)."""
        token = secrets.token_hex(8) if track else ""
        avoid_text = " ".join(validate_member(m) for m in avoid)
        sticky = "" if key is None else str(key)
        args = self._args("pick", token, self._rng.getrandbits(31),
                          self._rng.getrandbits(31), sticky, avoid_text)

        def answered(raw: Any) -> Pick | None:
            return self._picked(raw, token)

        def unavailable(error: BaseException | None) -> Pick | None:
            if error is not None:
                self._health.failed(error)
            return self.local_pick(key, avoid)

        return PendingCall(self._script, self.keys.script_keys, args, self._health.usable,
                           answered, unavailable)

    def _picked(self, raw: Any, token: str) -> Pick | None:
        """The member a pick's (or repick's) reply names; None: no member to pick."""
        self._health.succeeded()
        member, mode = text(raw[0]), int(raw[1])
        if mode < 0 or not member:
            return None
        if "picked" in self.listeners.wanted:
            self.event("picked", reason=member)
        return Pick(member, token, MODES[mode] if mode < len(MODES) else "normal")

    def local_pick(self, key: Any = None, avoid: Iterable[str] = ()) -> Pick | None:
        """Redis unreachable: a weighted random member this process has not seen ejected
        (a sticky key: the same member for the same key while the set is the same)."""
        now = time.monotonic()
        with self._lock:
            known = [(m, w) for m, w in self._known.items() if w > 0]
            seen = {m for m, until in self._seen_ejected.items() if until > now}
        if not known:
            return None
        avoided = set(avoid)
        cands = [(m, w) for m, w in known if m not in seen and m not in avoided] or known
        if key is not None:
            rng = random.Random(str(key))
            return Pick(rng.choices([m for m, _ in cands], [w for _, w in cands])[0], "",
                        "normal", "local")
        member = self._rng.choices([m for m, _ in cands], [w for _, w in cands])[0]
        return Pick(member, "", "normal", "local")

    def repick_pending(self, previous: Pick, outcome: str, duration: float | None,
                       eject_for: float | None, key: Any = None, avoid: Iterable[str] = (),
                       track: bool = True) -> PendingCall:
        """The record of `previous` and the pick of another member as one call; its result
        is the new `Pick` (None: no member)."""
        token = secrets.token_hex(8) if track else ""
        avoid = [validate_member(m) for m in avoid]
        sticky = "" if key is None else str(key)
        record = self._record_args(previous, outcome, duration, eject_for)
        args = self._args("repick", token, self._rng.getrandbits(31), self._rng.getrandbits(31),
                          sticky, " ".join(avoid), *record[2:])

        def answered(raw: Any) -> Pick | None:
            self._note(decode_change(previous.member, raw[3:7]))
            return self._picked(raw, token)

        def unavailable(error: BaseException | None) -> Pick | None:
            if error is not None:
                self._health.failed(error)
            return self.local_pick(key, [*avoid, previous.member])

        return PendingCall(self._script, self.keys.script_keys, args, self._health.usable,
                           answered, unavailable)

    def _record_args(self, pick: Pick | str, outcome: str, duration: float | None,
                     eject_for: float | None) -> list[str]:
        if isinstance(pick, Pick):
            member, token = pick.member, pick.token
            if pick.source != "redis":
                token = ""
        else:
            member, token = validate_member(pick), ""
        dur = -1 if duration is None else max(0, to_ms(to_seconds(duration, "duration")))
        ej = 0 if not eject_for else max(1, to_ms(to_seconds(eject_for, "eject_for")))
        return self._args("record", member, token, outcome, dur, ej)

    def finish(self, pick: Pick | str, error: BaseException | None, status: int | None,
               headers: Any, outcome: str | None, duration: float | None,
               eject_for: float | None) -> tuple[str, float | None, float | None]:
        """(wire outcome, duration, eject for) of a finished pick, marked recorded."""
        if not isinstance(pick, Pick):
            code = self.outcome_args(Pick(pick, ""), error, status=status, headers=headers,
                                     outcome=outcome, eject_for=eject_for)[0]
            return code, duration, eject_for
        if pick.recorded:
            raise ValueError(f"{pick!r} was already recorded")
        pick.recorded = True
        code, eject_for = self.outcome_args(pick, error, status=status, headers=headers,
                                            outcome=outcome, eject_for=eject_for)
        if duration is None:
            duration = max(0.0, self.clock() - pick.started)
        return code, duration, eject_for

    def record_pending(self, pick: Pick | str, outcome: str, duration: float | None,
                       eject_for: float | None) -> PendingCall:
        """The record call of `pick` (or of a member, untracked); its result is a
        `MemberChange` (None while Redis is unreachable: the outcome is dropped)."""
        args = self._record_args(pick, outcome, duration, eject_for)
        member = args[2]

        def answered(raw: Any) -> MemberChange:
            self._health.succeeded()
            change = decode_change(member, raw)
            self._note(change)
            return change

        def unavailable(error: BaseException | None) -> MemberChange | None:
            if error is not None:
                self._health.failed(error)
            return None

        return PendingCall(self._script, self.keys.script_keys, args, self._health.usable,
                           answered, unavailable)

    def outcome_args(self, pick: Pick, error: BaseException | None = None, *,
                     status: int | None = None, headers: Any = None,
                     outcome: str | None = None,
                     eject_for: float | None = None) -> tuple[str, float | None]:
        """(wire outcome, eject for seconds) of a finished call: explicit values win, then
        what was set on the pick, then the error; a 429 / 503 with Retry-After ejects the
        member for that long (LiteLLM's cooldown, fleet-wide and within the cap)."""
        status = status if status is not None else pick.status
        headers = headers if headers is not None else pick.headers
        outcome = outcome if outcome is not None else pick.outcome
        eject_for = eject_for if eject_for is not None else pick.eject_for
        code = outcome_of(status, error, outcome)
        if eject_for is None and code != "s":
            if status in (429, 503) and headers is not None:
                eject_for = parse_retry_after(_header(headers, "Retry-After"))
            elif error is not None and status_of(error) in (429, 503):
                eject_for = retry_after_of(error)
        return code, eject_for

    def members_pending(self, mode: str, members: Members) -> PendingCall:
        flat: list[Any] = []
        for name, weight in members:
            flat += [name] if mode == "remove" else [name, weight]
        return self._admin_pending(self._args("members", mode, *flat))

    def eject_args(self, member: str, duration: float | None, actor: str) -> list[str]:
        ms = 0 if duration is None else max(1, to_ms(to_seconds(duration, "duration")))
        return self._args("eject", validate_member(member), ms, actor)

    def uneject_args(self, member: str, actor: str) -> list[str]:
        return self._args("uneject", validate_member(member), actor)

    def exempt_args(self, member: str, duration: float | None, actor: str) -> list[str]:
        ms = 0 if duration is None else max(1, to_ms(to_seconds(duration, "duration")))
        return self._args("exempt", validate_member(member), ms, actor)

    def status_args(self) -> list[str]:
        return self._args("status")

    def _admin_pending(self, args: list[str]) -> PendingCall:
        def unavailable(error: BaseException | None) -> Any:
            raise error if error is not None else ConnectionError("Redis is in backoff")

        return PendingCall(self._script, self.keys.script_keys, args, lambda: True,
                           lambda raw: raw, unavailable)

    # -- members this process knows --------------------------------------------------------
    def remember(self, mode: str, members: Members) -> None:
        with self._lock:
            if mode == "replace":
                self._known = dict(members)
                self._members_set = members
            elif mode == "remove":
                gone = {m for m, _ in members}
                self._known = {m: w for m, w in self._known.items() if m not in gone}
                self._members_set = tuple((m, w) for m, w in self._members_set if m not in gone)
            else:
                self._known.update(members)
                merged = dict(self._members_set)
                merged.update(members)
                self._members_set = tuple(merged.items())

    @property
    def members_to_restore(self) -> Members:
        """The members to put back when Redis has none (the keys expired, or a new Redis)."""
        return self._members_set

    def normalize(self, members: Any) -> Members:
        return normalize_members(members)

    def learn(self, pick: Pick | None) -> None:
        if pick is not None and pick.source == "redis" and pick.member not in self._known:
            with self._lock:
                self._known.setdefault(pick.member, 1)

    def _note(self, change: MemberChange) -> None:
        if change.state == "ejected" and change.ejected_until is not None:
            left = max(0.0, change.ejected_until - time.time())
            with self._lock:
                self._seen_ejected[change.member] = time.monotonic() + left
        elif change.member in self._seen_ejected:
            with self._lock:
                self._seen_ejected.pop(change.member, None)
        if change.event and change.event in self.listeners.wanted:
            self.event(change.event, reason=change.why, state=change.member)

    def note_change(self, change: MemberChange) -> MemberChange:
        self._note(change)
        return change

    def decode_status(self, raw: Sequence[Any]) -> PoolStatus:
        return decode_status(self.name, raw, self.config.healthy_panic_threshold)

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    @staticmethod
    def decode_history(entries: Sequence[Any], member: str | None,
                       count: int) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for entry_id, fields in entries:
            item = {"id": text(entry_id)}
            item.update({text(k): text(v) for k, v in dict(fields).items()})
            if "why" in item:
                why = int(item["why"]) if item["why"].isdigit() else -1
                item["why"] = REASONS[why] if 0 <= why < len(REASONS) else item["why"]
            if member is None or item.get("member") == member:
                out.append(item)
            if len(out) >= count:
                break
        return out

    # -- events ----------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        self.listeners.emit(Event(kind, "pool", self.name, **fields))

    def add_listener(self, listener: Any, kinds: Any = None) -> None:
        """Call `listener(Event)` for this process's pool events of `kinds` (default: what
        this process's calls did to members: ejected, capped, probing, recovered,
        unejected; "picked" on request). `Event.state` is the member, `reason` why."""
        self.listeners.add(listener, kinds)

    def remove_listener(self, listener: Any) -> None:
        self.listeners.remove(listener)

    @property
    def local_fallback_active(self) -> bool:
        """True while Redis is marked unreachable and picks are made locally."""
        return self._health.down

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, members={len(self._known)})"


def _header(headers: Any, name: str) -> Any:
    try:
        value = headers.get(name)
        if value is None:
            value = headers.get(name.lower())
        return value
    except AttributeError:
        return None
