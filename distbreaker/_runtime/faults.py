"""Fleet-wide fault injection, without I/O: what an injection is, which names it
covers, and what it does to one call.

An operator stores injections in Redis (`lua/inject.lua`, `distbreaker inject`); each
process whose breakers allow it keeps the ones in force in a `FaultTable`
(`_runtime/fault_feed.py` refreshes it) and asks it, per call, what to inject. Kept
apart from the breaker so the hot path of a breaker that does not allow injection
never touches it.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .keys import namespace

KINDS = ("reject", "error", "latency")
#: How long a worker's "I allow injection on NAME" registration lasts without a refresh.
REGISTRATION_MS = 30_000
#: How often a worker re-reads the injections without being told (pub/sub lost).
REFRESH_S = 5.0
#: The longest injection: it must always end by itself.
MAX_DURATION_S = 7 * 24 * 3600.0
#: The longest injected latency: a worker's sleep must end too (lua/inject.lua's limit).
MAX_LATENCY_S = 600.0


def fault_keys(prefix: str) -> list[str]:
    """KEYS of lua/inject.lua: the injections hash and its log stream (one slot)."""
    base = f"{namespace(prefix)}:{{inject}}:fi"
    return [base, f"{base}:log"]


def selector_pattern(selector: str) -> re.Pattern[str]:
    """A selector as a regular expression: '*' any run of characters, '?' one
    character, anything else itself (the script's rule, lua/inject.lua)."""
    parts = ("." if c == "?" else ".*" if c == "*" else re.escape(c) for c in selector)
    return re.compile("".join(parts) + r"\Z", re.S)


def check_spec(kind: str, rate: float, status: int | None = None,
               latency: float | None = None) -> dict[str, Any]:
    """The spec JSON fields of one injection, validated (ValueError names the option)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1] (e.g. 0.05 or '5%'), got {rate!r}")
    spec: dict[str, Any] = {"kind": kind, "rate": float(rate)}
    if kind == "error":
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status in [100, 599], got {status!r}")
        spec["status"] = status
    if kind == "latency":
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) \
                or not 0 < latency <= MAX_LATENCY_S:
            raise ValueError(f"latency must be in (0, {MAX_LATENCY_S:g}] seconds, "
                             f"got {latency!r}")
        spec["latency_ms"] = max(1, round(latency * 1000))
    return spec


def parse_rate(text: str) -> float:
    """'5%', '0.05' or '1' as a rate in (0, 1]."""
    raw = text.strip()
    try:
        rate = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"not a rate: {text!r} (e.g. 5% or 0.05)") from None
    if not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 100%], got {text!r}")
    return rate


@dataclass(frozen=True)
class Fault:
    """One injection in force."""

    selector: str
    kind: str
    rate: float
    until_ms: int
    status: int = 503
    latency: float = 0.0
    actor: str = ""
    reason: str = ""

    def covers(self, name: str) -> bool:
        return selector_pattern(self.selector).match(name) is not None

    def describe(self) -> str:
        """'error 503 at 5% on llm:* (by alice: game day)'."""
        what = {"error": f"error {self.status}", "latency": f"latency {self.latency:g}s",
                "reject": "reject"}[self.kind]
        by = f"by {self.actor}" if self.actor else ""
        why = ": ".join(p for p in (by, self.reason) if p)
        return f"{what} at {self.rate:.4g} on {self.selector}" + (f" ({why})" if why else "")

    def as_dict(self, now_ms: int) -> dict[str, Any]:
        return {"selector": self.selector, "kind": self.kind, "rate": self.rate,
                "status": self.status if self.kind == "error" else None,
                "latency_s": self.latency if self.kind == "latency" else None,
                "until_ms": self.until_ms, "remaining_s": max(0, self.until_ms - now_ms) / 1000,
                "actor": self.actor, "reason": self.reason}


def parse_field(field: str, value: str) -> Fault | None:
    """One ``f:<kind>:<selector>`` field of the hash as a Fault (None: not one, or foreign)."""
    if not field.startswith("f:"):
        return None
    kind, _, selector = field[2:].partition(":")
    head, _, body = value.partition(" ")
    try:
        spec = json.loads(body)
        fault = Fault(selector=selector, kind=kind, rate=float(spec["rate"]),
                      until_ms=int(head), status=int(spec.get("status") or 503),
                      latency=float(spec.get("latency_ms") or 0) / 1000,
                      actor=str(spec.get("actor", "")), reason=str(spec.get("reason", "")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return fault if kind in KINDS and 0 < fault.rate <= 1 else None


def parse_flat(flat: Sequence[Any]) -> tuple[int, list[Fault], dict[str, int]]:
    """A `read` / `list` reply: (server ms, the injections, registrations name -> until ms)."""
    def text(x: Any) -> str:
        return x.decode() if isinstance(x, bytes) else str(x)

    now_ms = int(flat[0])
    faults, allowed = [], {}
    for i in range(1, len(flat) - 1, 2):
        field, value = text(flat[i]), text(flat[i + 1])
        if field.startswith("a:"):
            try:
                allowed[field[2:]] = int(value)
            except ValueError:
                continue
        else:
            fault = parse_field(field, value)
            if fault is not None:
                faults.append(fault)
    return now_ms, faults, allowed


@dataclass(frozen=True)
class Disturbance:
    """What to inject into one permitted call: an error in its place, latency before it."""

    error: Fault | None = None
    latency: float = 0.0


UNDISTURBED = Disturbance()


class FaultTable:
    """The injections in force in one namespace, as this process last read them, each
    ending on the local monotonic clock at its server end."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random) -> None:
        self._clock, self._rand = clock, rand
        self._faults: tuple[tuple[Fault, float], ...] = ()
        self._by_name: dict[str, tuple[tuple[Fault, float], ...]] = {}
        self._lock = threading.Lock()
        #: Injections applied by this process, by kind.
        self.applied: dict[str, int] = dict.fromkeys(KINDS, 0)

    def replace(self, now_ms: int, faults: Sequence[Fault], read_at: float) -> None:
        """Take a fresh read (server time `now_ms`, made at local monotonic `read_at`)."""
        ends = tuple((f, read_at + (f.until_ms - now_ms) / 1000) for f in faults)
        with self._lock:
            self._faults, self._by_name = ends, {}

    def faults(self) -> list[Fault]:
        now = self._clock()
        return [f for f, end in self._faults if end > now]

    def _covering(self, name: str) -> tuple[tuple[Fault, float], ...]:
        found = self._by_name.get(name)
        if found is None:
            with self._lock:
                found = tuple(e for e in self._faults if e[0].covers(name))
                self._by_name[name] = found
        return found

    def _rolled(self, name: str, kinds: tuple[str, ...]) -> list[tuple[Fault, float]]:
        """The injections of `kinds` covering `name` whose roll hit this call, each with
        the seconds it has left."""
        covering = self._covering(name)
        if not covering:
            return []
        now = self._clock()
        return [(f, end - now) for f, end in covering
                if f.kind in kinds and end > now and self._rand() < f.rate]

    def rejection(self, name: str) -> Fault | None:
        """The injected rejection this call gets (checked at acquire), if any."""
        hit = self._rolled(name, ("reject",))
        if not hit:
            return None
        self.applied["reject"] += 1
        return hit[0][0]

    def disturbance(self, name: str) -> Disturbance:
        """The injected error and latency this permitted call gets (checked just before
        the protected function would run). An injected latency never outlasts its
        injection: a call that would sleep past the end sleeps until the end."""
        hit = self._rolled(name, ("error", "latency"))
        if not hit:
            return UNDISTURBED
        error = next((f for f, _ in hit if f.kind == "error"), None)
        latency = max((min(f.latency, left) for f, left in hit if f.kind == "latency"),
                      default=0.0)
        if error is not None:
            self.applied["error"] += 1
        if latency:
            self.applied["latency"] += 1
        return Disturbance(error, latency)
