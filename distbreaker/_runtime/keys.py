"""The key schema (v2): every Redis key and channel distbreaker uses.

All keys of one protected name share the hash tag ``{name}`` so that every
script touches a single Redis Cluster slot. See docs/KEY_SCHEMA.md.
"""

from __future__ import annotations

import dataclasses
import functools
import re

#: name_chars.REFUSED_CHAR restricted to ASCII (control characters and the space: the
#: same rule, tests/unit checks it), searched instead of the whole Unicode class for an
#: ASCII name: ~30x faster (operator tools check the names of thousands of keys), and
#: the Unicode class (a few ms to compile) is imported only for a name that needs it.
_ASCII_REFUSED = re.compile(r"[\x00-\x20\x7f]")


def _refused(text: str) -> re.Match[str] | None:
    if text.isascii():
        return _ASCII_REFUSED.search(text)
    from .name_chars import REFUSED_CHAR

    return REFUSED_CHAR.search(text)

SCHEMA_VERSION = "2"
DEFAULT_PREFIX = "distbreaker"
MAX_NAME_LENGTH = 200
MAX_PREFIX_LENGTH = 100


def validate_name(name: object) -> str:
    """A protected name: 1-200 printable characters, no whitespace or control characters,
    not starting with '}' (all keys of a name must share one Redis Cluster hash slot)."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a str, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"name must be 1-{MAX_NAME_LENGTH} characters, got {len(name)}")
    bad = _refused(name)  # Unicode 14.0's rule, whatever Python's Unicode
    if bad:
        raise ValueError(f"name must not contain whitespace or control characters, "
                         f"got {bad.group()!r} in {name!r}")
    if name.startswith("}"):  # "{}...": an empty hash tag, so each key would get its own slot
        raise ValueError(f"name must not start with '}}' (Redis Cluster would spread its "
                         f"keys over several slots), got {name!r}")
    return name


def validate_prefix(prefix: object) -> str:
    """A key prefix: printable, no whitespace, no braces (they would steal the hash tag)."""
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, got {type(prefix).__name__}")
    if not 1 <= len(prefix) <= MAX_PREFIX_LENGTH:
        raise ValueError(f"prefix must be 1-{MAX_PREFIX_LENGTH} characters, got {len(prefix)}")
    if "{" in prefix or "}" in prefix or _refused(prefix):
        raise ValueError(f"prefix must not contain braces, whitespace or control "
                         f"characters, got {prefix!r}")
    return prefix


def namespace(prefix: str) -> str:
    """The versioned namespace every key starts with, e.g. ``distbreaker:v1``."""
    if isinstance(prefix, str):
        return _namespace(prefix)
    return f"{validate_prefix(prefix)}:v{SCHEMA_VERSION}"  # raises: not a str


@functools.lru_cache(maxsize=64)
def _namespace(prefix: str) -> str:
    """`namespace` of a str, cached: an operator tool builds the keys of thousands of
    names under one prefix, and the prefix check's character class costs microseconds."""
    return f"{validate_prefix(prefix)}:v{SCHEMA_VERSION}"


def events_channel(prefix: str = DEFAULT_PREFIX, db: int = 0) -> str:
    """The pub/sub channel every transition of every breaker in database `db` is
    published on. Pub/sub ignores databases, so each one has its own channel:
    ``<ns>:events`` for db 0 (and Redis Cluster), ``<ns>:events:db<N>`` otherwise."""
    base = f"{namespace(prefix)}:events"
    return base if db == 0 else f"{base}:db{db}"


@dataclasses.dataclass(frozen=True)
class BreakerKeys:
    """Keys of one circuit breaker, in the order the breaker script takes them."""

    state: str    # string: the state record (header and window slots)
    meta: str     # hash: stored config, reason, actor, drift
    probes: str
    history: str
    channel: str

    @classmethod
    def build(cls, name: str, prefix: str = DEFAULT_PREFIX, db: int = 0) -> BreakerKeys:
        base = _base(name, prefix)
        return cls(
            state=f"{base}:cb",
            meta=f"{base}:cb:meta",
            probes=f"{base}:cb:probes",
            history=f"{base}:cb:events",
            channel=events_channel(prefix, db),
        )

    @property
    def script_keys(self) -> list[str]:
        """KEYS of a breaker call: the state record only; the script derives the meta,
        probes and history keys from it (each argument costs Redis time on every call)."""
        return [self.state]


def _base(name: str, prefix: str) -> str:
    return f"{namespace(prefix)}:{{{validate_name(name)}}}"


@dataclasses.dataclass(frozen=True)
class BulkheadKeys:
    """Keys of one fleet-wide bulkhead (same hash tag as the breaker of that name)."""

    leases: str   # zset: holder id -> lease deadline (server ms)
    meta: str     # hash: counters (rejected, waiting, ...)
    notify: str   # list: one element pushed per release, BLPOPed by waiters

    @classmethod
    def build(cls, name: str, prefix: str = DEFAULT_PREFIX) -> BulkheadKeys:
        base = _base(name, prefix)
        return cls(leases=f"{base}:bh", meta=f"{base}:bh:meta", notify=f"{base}:bh:notify")


@dataclasses.dataclass(frozen=True)
class BudgetKeys:
    """Keys of one fleet-wide retry budget (same hash tag as the breaker of that name)."""

    slices: str   # string: the window, budget layout 2 (docs/KEY_SCHEMA.md)

    @classmethod
    def build(cls, name: str, prefix: str = DEFAULT_PREFIX) -> BudgetKeys:
        return cls(slices=f"{_base(name, prefix)}:rb2")

    @property
    def layout1(self) -> str:
        """The hash of budget layout 1, which workers before it write (readers show it
        while no layout-2 window exists: a fleet rolling over to layout 2)."""
        return self.slices[:-1]


@dataclasses.dataclass(frozen=True)
class RateLimiterKeys:
    """Keys of one fleet-wide rate limiter (same hash tag as the breaker of that name)."""

    bucket: str   # hash: the GCRA arrival time, counters, an operator's limit

    @classmethod
    def build(cls, name: str, prefix: str = DEFAULT_PREFIX) -> RateLimiterKeys:
        return cls(bucket=f"{_base(name, prefix)}:rl")


@dataclasses.dataclass(frozen=True)
class PoolKeys:
    """Keys of one fleet-wide pool (its own hash tag: every member's record in one slot, so
    one script call sees the whole pool and enforces max_ejection_percent atomically)."""

    members: str  # hash: layout version, interval start, each member's record and in-flight
    leases: str   # zset: "<token> <member>" -> lease deadline (server ms) of picks in flight
    history: str  # stream: member events (ejected, capped, probing, recovered, unejected)

    @classmethod
    def build(cls, name: str, prefix: str = DEFAULT_PREFIX) -> PoolKeys:
        base = _base(name, prefix)
        return cls(members=f"{base}:pool", leases=f"{base}:pool:leases",
                   history=f"{base}:pool:events")

    @property
    def script_keys(self) -> list[str]:
        return [self.members, self.leases, self.history]
