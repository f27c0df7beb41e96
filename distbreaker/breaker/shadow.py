"""Shadow configs: candidate configs fed the live outcomes, never deciding admission.

A breaker carries up to `MAX_SHADOWS` named candidates, declared in its config
(``shadow=``, the registry's ``shadow:``) or set at run time by an operator
(``distbreaker shadow NAME --config candidate.yaml --for 1h``). Every record of
the live breaker, from every worker (sync, asyncio, PHP), feeds each candidate in
the same script call (lua/lib/breaker_shadow.lua), which keeps its own window and
state machine and counts what it would have done: its trips, the calls it would
have rejected and the failures that would thereby have been avoided.

This module is pure: the script calls' arguments, the hello suffix that declares
a config's shadows, and the decoding of the shadow hash and its history
(docs/KEY_SCHEMA.md, "Shadow configs"). Reads are in `distbreaker.readside`
(`read_shadows`, `read_shadow_history`), actions in `distbreaker.operate`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._runtime.options import to_ms
from .._runtime.scripts import text
from .config import MAX_SHADOWS, SHADOW_NAME, BreakerConfig

__all__ = [
    "DECLARED_LEASE",
    "HEADER_BYTES",
    "MAX_SHADOWS",
    "SHADOWED",
    "STATE_FIELDS",
    "ShadowView",
    "candidate",
    "clear_args",
    "decode_shadow_event",
    "decode_shadows",
    "hello_suffix",
    "set_args",
    "shadow_history_key",
    "shadow_key",
    "shadow_ring_key",
    "validate_shadow_name",
]

#: Bit 32 of the live record's `seq` field: set while the breaker has shadows.
SHADOWED = 1 << 32
#: Seconds a declared shadow lives past the last hello that declared it.
DECLARED_LEASE = 60.0
#: A shadow's state (big-endian i8 each): HOT_FIELDS, written by every record, in its
#: ring's header (`shadow_ring_key`), and COLD_FIELDS, written by transitions and would-be
#: rejections, in the shadow hash's `s<slot>`.
HOT_FIELDS = ("code", "calls", "failures", "slow", "total_ms", "head", "wsec", "seen",
              "seen_failures", "ttl_at")
COLD_FIELDS = ("since", "open_until", "opens", "hp_done", "hp_fail", "hp_slow", "started",
               "trips", "rejected", "avoided", "open_ms", "ep_at", "ep_rejected", "ep_avoided",
               "ep_ms")
STATE_FIELDS = HOT_FIELDS + COLD_FIELDS
_STATES = ("CLOSED", "OPEN", "HALF_OPEN")


def shadow_key(state_key: str) -> str:
    """The shadow hash of the breaker whose state record is `state_key`."""
    return f"{state_key}:shadow"


def shadow_ring_key(state_key: str, slot: int) -> str:
    """The string of shadow `slot` (1..MAX_SHADOWS): its header (what every record
    changes, from byte 0) and its window; docs/KEY_SCHEMA.md "Shadow configs"."""
    return f"{state_key}:shadow:w{slot}"


#: The bytes of a ring's header a reader decodes (HOT_FIELDS, 8 each).
HEADER_BYTES = 8 * len(HOT_FIELDS)
#: The header's `seen` field is epoch * SEEN_SPAN + seen (lua/lib/breaker_shadow.lua).
SEEN_SPAN = 1 << 40


def shadow_history_key(state_key: str) -> str:
    """The shadows' history stream (never the live breaker's: nothing is confused)."""
    return f"{state_key}:shadow:events"


def validate_shadow_name(name: object) -> str:
    if not isinstance(name, str) or not SHADOW_NAME.fullmatch(name):
        raise ValueError(f"a shadow name is 1-40 letters, digits, '_', '.' or '-', "
                         f"got {name!r}")
    return name


def candidate(base: BreakerConfig, changes: Mapping[str, Any]) -> BreakerConfig:
    """The candidate config: `base` (the config in force) with `changes` applied
    (ValueError names the setting)."""
    try:
        return base.replace(shadow={"candidate": dict(changes)}).shadow[0][1]
    except ValueError as error:  # the placeholder name would only confuse
        raise ValueError(str(error).removeprefix("shadow 'candidate': ")) from None


def hello_suffix(shadows: Sequence[tuple[str, BreakerConfig]]) -> str:
    """What a worker's hello carries to declare its config's shadows ('' for none):
    ``#<name>=<wire>|<name>=<wire>`` after ``<fp>@<worker>``."""
    if not shadows:
        return ""
    return "#" + "|".join(f"{name}={config.to_wire()}" for name, config in shadows)


#: The longest actor or reason a shadow carries: its slot is read by every record of
#: the breaker (one HMGET), so its size is paid on the hot path.
MAX_TEXT = 200


def set_args(name: str, config: BreakerConfig, for_: float | None, actor: str,
             reason: str) -> tuple[str, ...]:
    """ARGV of the `shadow set` op (after the op name): name, wire, for ms, actor, reason."""
    for what, value in (("actor", actor), ("reason", reason)):
        if len(value) > MAX_TEXT:
            raise ValueError(f"--{what} is at most {MAX_TEXT} characters (every record of "
                             f"the breaker reads it), got {len(value)}")
    for_ms = "" if for_ is None else str(max(1, to_ms(for_)))
    return ("set", validate_shadow_name(name), config.to_wire(), for_ms, actor, reason)


def clear_args(name: str | None, actor: str, reason: str) -> tuple[str, ...]:
    """ARGV of the `shadow clear` op: one shadow, or every one (`name` None)."""
    return ("clear", "*" if name is None else validate_shadow_name(name), "", "", actor,
            reason)


def _clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%H:%M:%S UTC")


def _seconds(ms: int) -> str:
    s = ms / 1000
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


@dataclasses.dataclass(frozen=True)
class ShadowView:
    """One shadow as stored: its candidate config, where it came from, its would-be
    state and figures (`state` as the next record would find it: an OPEN whose wait
    ended reads HALF_OPEN)."""

    name: str
    wire: str
    config: BreakerConfig | None
    until_ms: int            # 0: no end
    set_at_ms: int
    source: str              # operator | declared
    actor: str
    reason: str
    state: str
    stored_state: str
    since_ms: int
    open_until_ms: int
    calls: int               # its window's
    failures: int
    slow: int
    seen: int                # outcomes fed since it was set
    seen_failures: int
    trips: int               # CLOSED -> OPEN
    rejected: int            # calls it would have rejected
    avoided: int             # failures among them
    open_ms: int             # time it would have been open (OPEN or HALF_OPEN), episodes ended
    episode_at_ms: int       # the last episode (0: none)
    episode_rejected: int
    episode_avoided: int
    episode_ms: int          # 0 while it runs
    started_ms: int
    now_ms: int

    @property
    def failure_rate(self) -> float:
        return round(self.failures * 100.0 / self.calls, 2) if self.calls else -1.0

    @property
    def open_now(self) -> bool:
        return self.stored_state != "CLOSED"

    @property
    def time_open_ms(self) -> int:
        """Would-be time open, the running episode included."""
        running = self.now_ms - self.episode_at_ms if self.open_now and self.episode_at_ms else 0
        return self.open_ms + max(0, running)

    def summary(self, clock: Callable[[int], str] = _clock) -> str:
        """The would-be story in one line, e.g. "would have opened at 12:03:05 UTC for
        40 s; 1,240 calls would have been rejected, 37 failures avoided" (`clock` formats
        a server time in ms)."""
        if not self.episode_at_ms:
            return (f"would not have opened ({self.seen:,} calls seen, "
                    f"{self.seen_failures:,} failed)")
        if self.open_now:
            head = (f"would be open since {clock(self.episode_at_ms)} "
                    f"({_seconds(self.now_ms - self.episode_at_ms)} so far)")
        else:
            head = (f"would have opened at {clock(self.episode_at_ms)} for "
                    f"{_seconds(self.episode_ms)}")
        text_ = (f"{head}; {self.episode_rejected:,} calls would have been rejected, "
                 f"{self.episode_avoided:,} failures avoided")
        if self.trips > 1:
            text_ += (f" (in all: {self.trips} trips, {self.rejected:,} rejected, "
                      f"{self.avoided:,} avoided)")
        return text_

    def as_dict(self, clock: Callable[[int], str] = _clock) -> dict[str, Any]:
        """JSON-ready (the CLI's --json, the dashboard); `clock` as for `summary`."""
        found = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "config"}
        found.update(failure_rate=self.failure_rate, time_open_ms=self.time_open_ms,
                     summary=self.summary(clock))
        return found


def _ints(raw: bytes, count: int) -> list[int]:
    raw = bytes(raw[:8 * count]).ljust(8 * count, b"\0")
    return [int.from_bytes(raw[8 * i:8 * i + 8], "big", signed=True) for i in range(count)]


def decode_shadows(raw: Mapping[Any, Any], now_ms: int,
                   headers: Mapping[int, bytes | None] | None = None) -> list[ShadowView]:
    """The shadow hash (HGETALL, bytes) and the rings' headers (`headers`, by slot: the
    first HEADER_BYTES of each `shadow_ring_key`) as views, by name. A field that cannot
    be decoded is skipped (the next record replaces or drops it)."""
    parts: dict[str, dict[str, Any]] = {}
    for field, value in raw.items():
        name = text(field)
        if len(name) == 2 and name[0] in "chs":  # c<slot>, s<slot> (h<slot>: older layout)
            parts.setdefault(name[1], {})[name[0]] = value
    for slot, header in (headers or {}).items():
        if header and str(slot) in parts:
            parts[str(slot)]["h"] = header
    views = []
    for _, p in sorted(parts.items()):
        if "c" not in p:
            continue
        spec = text(p["c"]).split("|", 6)
        spec += [""] * (7 - len(spec))
        until, name, wire, set_at, source, actor, reason = spec
        if not (until or "0").isdigit() or not (set_at or "0").isdigit():
            continue  # not a slot a script wrote (foreign data): skipped, as promised
        try:
            config: BreakerConfig | None = BreakerConfig.from_wire(wire)
        except ValueError:
            config = None
        n = dict(zip(STATE_FIELDS, _ints(p.get("h", b""), len(HOT_FIELDS))
                     + _ints(p.get("s", b""), len(COLD_FIELDS)), strict=True))
        n["seen"] %= SEEN_SPAN  # (the field carries its epoch above)
        stored = _STATES[n["code"]] if 0 <= n["code"] < len(_STATES) else "CLOSED"
        state = "HALF_OPEN" if stored == "OPEN" and now_ms >= n["open_until"] else stored
        views.append(ShadowView(
            name=name, wire=wire, config=config, until_ms=int(until or 0),
            set_at_ms=int(set_at or 0), source=source, actor=actor, reason=reason,
            state=state, stored_state=stored, since_ms=n["since"],
            open_until_ms=n["open_until"], calls=n["calls"], failures=n["failures"],
            slow=n["slow"], seen=n["seen"], seen_failures=n["seen_failures"],
            trips=n["trips"], rejected=n["rejected"], avoided=n["avoided"],
            open_ms=n["open_ms"], episode_at_ms=n["ep_at"],
            episode_rejected=n["ep_rejected"], episode_avoided=n["ep_avoided"],
            episode_ms=n["ep_ms"], started_ms=n["started"], now_ms=now_ms))
    return sorted(views, key=lambda v: v.name)


_INT_FIELDS = ("at_ms", "episode_at_ms", "episode_ms", "rejected", "avoided", "seen", "trips",
               "rejected_total", "avoided_total")


def decode_shadow_event(entry_id: Any, fields: Mapping[Any, Any], name: str) -> dict[str, Any]:
    """One entry of the shadows' history: a would-be transition (kind ''), or a shadow
    set, declared, replaced, cleared, expired (kind names it)."""
    f = {text(k): text(v) for k, v in fields.items()}
    event: dict[str, Any] = {"name": name, "id": text(entry_id), "shadow": f.get("shadow", ""),
                             "kind": f.get("kind", ""), "from": f.get("from", ""),
                             "to": f.get("to", ""), "reason": f.get("reason", ""),
                             "actor": f.get("actor", "")}
    for key in ("failure_rate", "slow_rate"):
        try:
            event[key] = float(f.get(key, "-1"))
        except ValueError:
            event[key] = -1.0
    for key in _INT_FIELDS:
        if key in f:
            try:
                event[key] = int(f[key])
            except ValueError:
                pass
    return event


def describe_event(event: Mapping[str, Any], clock: Callable[[int], str] = _clock) -> str:
    """One history entry in words (the CLI's `events --shadow`)."""
    kind, shadow = event.get("kind", ""), event.get("shadow", "")
    if kind == "":
        line = (f"shadow {shadow}: would have gone {event['from']} -> {event['to']} "
                f"({event['reason']})")
        if event["to"] == "CLOSED" and event.get("episode_at_ms"):
            line += (f"; open {_seconds(event.get('episode_ms', 0))} from "
                     f"{clock(event['episode_at_ms'])}, {event.get('rejected', 0):,} calls "
                     f"would have been rejected, {event.get('avoided', 0):,} failures avoided")
        return line
    line = f"shadow {shadow} {kind}"
    if event.get("reason"):
        line += f" ({event['reason']})"
    if event.get("actor"):
        line += f" by {event['actor']}"
    if "trips" in event:
        line += (f": {event.get('seen', 0):,} calls seen, {event['trips']} trips, "
                 f"{event.get('rejected_total', 0):,} would have been rejected, "
                 f"{event.get('avoided_total', 0):,} failures avoided")
    return line
